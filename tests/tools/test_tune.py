"""``edgec tune``: records land in the target's database, builds apply them, a killed tune resumes
from what it kept, and concurrent tuners lose nothing. A two-kernel model and a few trials keep
each tune short (MetaSchedule's worker processes still take a while to start: marked slow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgec.runtime
from edgec.tools import tune as tune_lib
from edgec.stages.build import build
from edgec.compiler import tuning_database
from edgec.core import locations
from edgec.core.model import from_proto
from edgec.stages.plan import plan
from edgec.stages.profile import profile
from edgec.core.samples import Sample
from edgec.core.targets import load_target

REPO = Path(__file__).resolve().parents[2]
TARGET = "x86_64"


def pool_model() -> onnx.ModelProto:
    """x[1, 8, 16, 16] -> MaxPool 2x2 -> + bias -> Relu -> mean over H, W: two TVM kernels, no
    convolution (nothing for oneDNN)."""
    bias = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8, 1, 1)
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Add", ["p", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["r"]),
         helper.make_node("ReduceMean", ["r"], ["y"], axes=[2, 3], keepdims=0)],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.fixture
def model_path(tmp_path):
    path = tmp_path / "pool.onnx"
    onnx.save(pool_model(), str(path))
    return path


def _env(db_root: Path) -> dict[str, str]:
    return {**os.environ, "EDGEC_AUTOTUNE_DIR": str(db_root), "PYTHONPATH": str(REPO)}


def _tune_cmd(model_path: Path, trials: int, seed: int = 0) -> list[str]:
    return [sys.executable, "-m", "edgec", "tune", str(model_path), "--target", TARGET,
            "--trials", str(trials), "--seed", str(seed)]


def _record_lines(db_root: Path) -> list[str]:
    path = db_root / TARGET / tuning_database.RECORDS_FILE
    if not path.is_file():
        return []
    lines = []
    for raw in path.read_bytes().split(b"\n"):
        try:
            doc = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if "record" in doc:
            lines.append(raw.decode())
    return lines


def _run_tune(model_path: Path, db_root: Path, trials: int, seed: int = 0) -> str:
    result = subprocess.run(_tune_cmd(model_path, trials, seed), cwd=REPO, env=_env(db_root),
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tuning [" in result.stderr  # the progress line
    assert "Unknown schedule rule" not in result.stderr  # TOPI's pool_max rule is registered
    return result.stdout


@pytest.mark.slow
def test_tune_records_and_build_applies_them(model_path, tmp_path, monkeypatch):
    db_root = tmp_path / "autotune"
    out = _run_tune(model_path, db_root, trials=4)
    records = _record_lines(db_root)
    assert len(records) >= 4, out
    monkeypatch.setenv("EDGEC_AUTOTUNE_DIR", str(db_root))
    model = from_proto(pool_model(), name="pool")
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)
    the_plan = plan(model, profile(model, [Sample("s0", {"x": x})]), load_target(TARGET))
    artifact = build(model, the_plan, [load_target(TARGET)])
    tuning = artifact.manifest["libraries"][TARGET]["tuning"]
    assert tuning["database"] == str(db_root / TARGET)
    assert tuning["records"] == len(records)
    # 4 trials over 2 kernels: 2 each (before, the first kernel's batch took all 4)
    assert tuning["tuned_kernels"] == tuning["kernels"] == 2
    path = artifact.save(tmp_path / "pool.edgec")
    got = edgec.runtime.load(path, target=TARGET).run({"x": x})["y"]
    want = ort.InferenceSession(pool_model().SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_killed_tune_keeps_records_and_resumes(model_path, tmp_path):
    db_root = tmp_path / "autotune"
    proc = subprocess.Popen(_tune_cmd(model_path, trials=200), cwd=REPO, env=_env(db_root),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while len(_record_lines(db_root)) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, "tune ended before it could be killed"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the tune and its builder/runner workers
        proc.wait()
    kept = _record_lines(db_root)
    assert len(kept) >= 2
    # A writer killed mid-line leaves a torn last line: make sure there is one.
    with open(db_root / TARGET / tuning_database.RECORDS_FILE, "ab") as handle:
        handle.write(b'{"key": "12345", "record": [[[0, "Get')
    out = _run_tune(model_path, db_root, trials=len(kept) + 2)
    assert f"{len(kept)} trials already in" in out
    after = _record_lines(db_root)
    assert after[:len(kept)] == kept and len(after) >= len(kept) + 2
    text = (db_root / TARGET / tuning_database.RECORDS_FILE).read_bytes()
    assert all(json.loads(line) for line in text.splitlines())  # the torn line was cut off


@pytest.mark.slow
def test_concurrent_tunes_lose_no_records(model_path, tmp_path):
    db_root = tmp_path / "autotune"
    procs = [subprocess.Popen(_tune_cmd(model_path, trials=4, seed=seed), cwd=REPO,
                              env=_env(db_root), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for seed in (1, 2)]
    ran = 0
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-2000:]
        # "... N run now; ..." counts the records this process committed.
        ran += int(out.split(" run now")[0].rsplit(", ", 1)[1])
    records = _record_lines(db_root)
    assert ran >= 4 and len(records) == ran
    database = tuning_database.TuningDatabase(db_root / TARGET / tuning_database.RECORDS_FILE)
    assert len(database) == ran and database.skipped_lines == 0


def test_no_database_is_none_and_tune_requires_num_cores(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEC_AUTOTUNE_DIR", str(tmp_path))
    target = load_target(TARGET)
    assert tuning_database.open_database(target, must_exist=False) is None
    with pytest.raises(tune_lib.StageInputError, match="edgec tune"):
        tuning_database.open_database(target)
    no_cores = load_target(TARGET).__class__(**{**target.__dict__, "tvm": {
        k: v for k, v in target.tvm.items() if k != "num-cores"}})
    with pytest.raises(tune_lib.StageInputError, match="num-cores"):
        tune_lib.tune(None, no_cores, trials=4)


def _kernel(n: int):
    """A small elementwise kernel as MetaSchedule sees one: an IRModule with "main"."""
    import tvm
    from tvm import te

    a = te.placeholder((n, 16), name="a")
    b = te.compute((n, 16), lambda i, j: a[i, j] * 2.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def _record(database, mod, seconds: float):
    import tvm
    from tvm.s_tir import meta_schedule as ms

    workload = database.commit_workload(mod)
    sch = tvm.s_tir.Schedule(mod)
    sch.vectorize(sch.get_loops(sch.get_sblock("b"))[-1])  # a record needs a schedule step
    trace = sch.trace
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    database.commit_tuning_record(ms.database.TuningRecord(trace, workload, [seconds], target))


def test_database_file_survives_torn_lines_and_shared_writers(tmp_path):
    """Two writers on one file (as two tune processes), then a torn last line: a reader gets
    every whole record, and the next append cuts the torn line off first."""
    path = tmp_path / "db" / tuning_database.RECORDS_FILE
    first, second = tuning_database.TuningDatabase(path), tuning_database.TuningDatabase(path)
    _record(first, _kernel(8), 0.003)
    _record(second, _kernel(8), 0.001)   # the same kernel, committed by the other writer
    _record(second, _kernel(32), 0.002)
    _record(first, _kernel(8), 0.002)
    with open(path, "ab") as handle:
        handle.write(b'{"key": "1", "record": [[[0, "Ge')  # killed mid-line
    reader = tuning_database.TuningDatabase(path)
    assert len(reader) == 4 and reader.skipped_lines == 1
    assert reader.records_for(_kernel(8)) == 3
    best = reader.get_top_k(reader.commit_workload(_kernel(8)), 1)[0]
    assert float(best.run_secs[0]) == pytest.approx(0.001)
    _record(reader, _kernel(32), 0.001)
    lines = path.read_bytes().splitlines()
    assert all(json.loads(line) for line in lines)  # the torn line is gone
    assert len(tuning_database.TuningDatabase(path)) == 5


def test_shipped_records_are_read_and_new_ones_go_to_the_users_file(tmp_path, monkeypatch):
    """The target's database reads the records shipped with edgec and the user's; a new record
    goes to the user's file only, with its kernel's workload line, so that file stands alone."""
    shipped = tmp_path / "shipped"
    monkeypatch.setattr(locations, "SHIPPED_AUTOTUNE_DIR", shipped)
    monkeypatch.setenv("EDGEC_AUTOTUNE_DIR", str(tmp_path / "user"))
    shipped_file = shipped / TARGET / tuning_database.RECORDS_FILE
    _record(tuning_database.TuningDatabase(shipped_file), _kernel(8), 0.002)
    before = shipped_file.read_bytes()
    target = load_target(TARGET)
    database = tuning_database.open_database(target)
    assert len(database) == 1 and database.path == tmp_path / "user" / TARGET / shipped_file.name
    _record(database, _kernel(8), 0.001)
    assert shipped_file.read_bytes() == before
    alone = tuning_database.TuningDatabase(database.path)
    assert len(alone) == 1 and alone.skipped_lines == 0 and alone.records_for(_kernel(8)) == 1
    both = tuning_database.open_database(target)
    assert both.records_for(_kernel(8)) == 2
    best = both.get_top_k(both.commit_workload(_kernel(8)), 1)[0]
    assert float(best.run_secs[0]) == pytest.approx(0.001)


def test_tune_refuses_a_target_this_machine_cannot_run():
    with pytest.raises(tune_lib.StageInputError, match="cannot run on this machine"):
        tune_lib.tune(None, load_target("arm64-cortex-a72"), trials=4)


@pytest.mark.parametrize("remaining, kernels, before, per_round, says", [
    (8, 6, 0, 1, "8 trials for 6 kernels: 1 for each in turn, then the other 2 to the kernels"),
    (64, 6, 0, 10, "64 trials for 6 kernels: 10 for each in turn, then the other 4"),
    (200, 2, 0, 16, "200 trials for 2 kernels: 16 for each in turn, then the other 168"),
    (4, 6, 3, 1, "warning: 4 trials for 6 kernels: 2 get no trial and keep the default schedule; "
                 "pass --trials 9 or more"),
])
def test_trials_are_split_over_kernels_and_said_up_front(remaining, kernels, before, per_round,
                                                         says):
    got_per_round, line = tune_lib.split_trials(remaining, kernels, before)
    assert got_per_round == per_round and line.startswith(says) and "\n" not in line


@pytest.mark.slow
def test_pool_schedule_rules_are_registered_without_changing_the_design_space(capfd):
    """TOPI marks pooling blocks with "meta_schedule.pool_max", which TVM registers for no CPU
    target: MetaSchedule warned per block, then scheduled it with its generic rules. edgec
    registers the rule as that: the same design spaces, and no warning."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from edgec.compiler import pipeline

    tasks, tune_target = tune_lib.tuning_tasks(
        pipeline.import_model(from_proto(pool_model(), "pool")), load_target(TARGET))

    def spaces() -> list[str]:
        found = []
        for task in tasks:
            generator = ms.space_generator.PostOrderApply(
                sch_rules=[ms.schedule_rule.ApplyCustomRule()], postprocs=[], mutator_probs={})
            context = ms.TuneContext(mod=task.dispatched[0], target=tune_target,
                                     space_generator=generator)
            found += [str(space.mod) for space in context.generate_design_space()]
        return found

    name = "s_tir.meta_schedule.cpu.meta_schedule.pool_max"
    if tvm.get_global_func(name, allow_missing=True) is not None:
        pytest.skip("registered earlier in this process: nothing to compare against")
    unregistered = spaces()
    assert "Unknown schedule rule" in capfd.readouterr().err
    tune_lib.register_pool_rules()
    assert spaces() == unregistered
    assert "Unknown schedule rule" not in capfd.readouterr().err
