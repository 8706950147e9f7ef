"""The hardening matrix (issue 9): every way a user's input, environment or interruption can go
wrong gets a one-line error with its class's exit code, no traceback unless asked for, and no
partial output. One test per row; rows already covered elsewhere are referenced, not repeated.

| row                                             | library level                                   | CLI (here unless named)             |
| ----------------------------------------------- | ----------------------------------------------- | ----------------------------------- |
| corrupt ONNX (garbage bytes)                    | test_model::test_missing_file_and_garbage_...   | test_corrupt_or_truncated_onnx      |
| truncated ONNX                                  | test_corrupt_or_truncated_onnx                  | test_corrupt_or_truncated_onnx      |
| unsupported op                                  | test_conformance::test_unsupported_operator_... | test_unsupported_op                 |
| graph with a cycle / nodes out of order         | test_graph_with_a_cycle                         | test_graph_with_a_cycle             |
| missing initializer                             | test_missing_initializer                        | test_missing_initializer            |
| samples: wrong names, dtypes, ranks, sizes      | test_samples::test_bad_samples_name_the_problem | test_samples_that_do_not_fit        |
| pickled / unreadable samples                    | test_samples::test_pickled_object_arrays_...,   | test_cli::test_user_errors_...      |
|                                                 | test_samples::test_unreadable_and_missing_...   |                                     |
| NaN and Inf inputs                              | test_nan_and_inf_inputs_run_and_are_compared    | test_nan_and_inf_samples_compile_and_bench |
| input shape outside the declared dims           | test_runtime::test_bad_inputs_are_refused_...   | test_input_outside_the_declared_dims |
| out-of-range gather indices                     | test_runtime::test_out_of_range_indices_...     |                                     |
| corrupt artifact: flipped bytes, truncated      | test_artifact::test_flipped_and_truncated_...   | test_corrupt_artifact               |
| checksum mismatch                               | test_artifact::test_checksum_mismatch_is_named  | test_corrupt_artifact               |
| member escaping the folder: ../, absolute       | test_artifact::test_member_paths_escaping_...   | (C++: test_cpp_host::test_bad_...)  |
| symlink member, unlisted member                 | test_artifact::test_symlink_members_and_...     |                                     |
| artifact of a newer format version              | test_artifact::test_newer_format_version_...    | test_corrupt_artifact               |
| malformed manifest (inputs/outputs/model)       | test_malformed_manifest_fields                  |                                     |
| unsigned / wrong-key / tampered signed artifact | test_signing                                    | test_signing::test_cli_...          |
| missing cross compiler                          |                                                 | test_missing_cross_compiler         |
| missing qemu                                    | edgec itself never starts an emulator: only tests/runtime/test_qemu_arm.py does, and it skips naming the tool |
| target file with a typo                         | test_targets::test_typo_in_target_file_is_named | test_target_file_with_a_typo        |
| compile killed midway (SIGKILL)                 |                                                 | test_killed_midway                  |
| bench killed midway (SIGKILL)                   |                                                 | test_killed_midway                  |
| tune killed midway, two tuners on one database  | the tuning tests (tune owns its database)       |                                     |
| disk full (ENOSPC)                              | test_disk_full_write_leaves_nothing,            | test_disk_full_cli,                 |
|                                                 | test_disk_full_when_the_runtime_unpacks_a_...   | test_disk_full_on_a_real_tiny_...   |
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import mlp_model, mlp_samples, write_samples
from edgec import fileio, runtime
from edgec.stages.bench import compare_outputs
from edgec.cli import main
from edgec.errors import (ArtifactError, ModelError, OutputFileError, SamplesError, TargetError,
                          ToolchainError)
from edgec.core.locations import TARGETS_DIR
from edgec.core.model import from_proto, load_model
from edgec.core.reference import reference_session
from edgec.runtime.artifact import FORMAT_VERSION, Artifact

REPO = Path(__file__).resolve().parent.parent
TARGETS = TARGETS_DIR


def _edgec(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(REPO)}
    environ.pop("EDGEC_DEBUG", None)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "edgec", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, env=environ)


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def check_cli_error(args: list, error: type, output: Path, capfd, monkeypatch) -> str:
    """The CLI contract for one user error: run as a process, it prints one line and exits with
    the class's code, no traceback, no output file (nor temporary); ``--debug`` and
    ``EDGEC_DEBUG=1`` show the traceback. Returns the message."""
    plain = _edgec(*args)
    assert plain.returncode == error.exit_code, plain.stderr
    lines = plain.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgec: error: "), plain.stderr
    assert "Traceback" not in plain.stderr
    assert not output.exists() and not _leftovers(output.parent)
    capfd.readouterr()
    monkeypatch.delenv("EDGEC_DEBUG", raising=False)
    assert main(["--debug", *map(str, args)]) == error.exit_code
    flagged = capfd.readouterr().err
    monkeypatch.setenv("EDGEC_DEBUG", "1")
    assert main([str(a) for a in args]) == error.exit_code
    from_env = capfd.readouterr().err
    monkeypatch.delenv("EDGEC_DEBUG")
    for err in (flagged, from_env):
        assert "Traceback (most recent call last)" in err and error.__name__ in err
        assert err.strip().splitlines()[-1] == lines[0]
    assert not output.exists()
    return lines[0]


def _model_with(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


# -- models ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["garbage", "truncated", "empty"])
def test_corrupt_or_truncated_onnx(mlp_dir, tmp_path, capfd, monkeypatch, kind):
    data = mlp_model().SerializeToString()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes({"garbage": bytes(range(256)) * 4, "truncated": data[: len(data) * 2 // 3],
                     "empty": b""}[kind])
    with pytest.raises(ModelError):
        load_model(bad)
    out = tmp_path / "out" / "a.edgec"
    out.parent.mkdir()
    message = check_cli_error(["compile", bad, "--samples", mlp_dir / "samples", "--target", "x86_64",
                               "-o", out], ModelError, out, capfd, monkeypatch)
    assert str(bad) in message


def test_unsupported_op(tmp_path, capfd, monkeypatch):
    model = _model_with(
        [helper.make_node("TfIdfVectorizer", ["x"], ["y"], name="tfidf", mode="TF", min_gram_length=1,
                          max_gram_length=1, max_skip_count=0, ngram_counts=[0], ngram_indexes=[0],
                          pool_int64s=[1])],
        [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = _save(model, tmp_path / "tfidf.onnx")
    np.savez(tmp_path / "s.npz", x=np.array([1, 2, 1, 3], np.int64))
    out = tmp_path / "out" / "a.edgec"
    out.parent.mkdir()
    message = check_cli_error(["compile", path, "--samples", tmp_path / "s.npz", "--target", "x86_64",
                               "-o", out], ModelError, out, capfd, monkeypatch)
    assert "TfIdfVectorizer" in message


def _relu(name, src, dst):
    return helper.make_node("Relu", [src], [dst], name=name)


def test_graph_with_a_cycle(tmp_path, capfd, monkeypatch):
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    cyclic = _model_with([_relu("a", "b_out", "a_out"), _relu("b", "a_out", "b_out"),
                          helper.make_node("Add", ["x", "a_out"], ["y"], name="add")], *io)
    with pytest.raises(ModelError, match="has a cycle: nodes a, b, add wait on each other"):
        from_proto(cyclic)
    unsorted = _model_with([helper.make_node("Add", ["x", "r"], ["y"], name="add"), _relu("r", "x", "r")], *io)
    with pytest.raises(ModelError, match="node 'add' comes before the node producing its input"):
        from_proto(unsorted)
    path = _save(cyclic, tmp_path / "cyclic.onnx")
    np.savez(tmp_path / "s.npz", x=np.ones(2, np.float32))
    out = tmp_path / "out" / "p.json"
    out.parent.mkdir()
    check_cli_error(["profile", path, "--samples", tmp_path / "s.npz", "-o", out], ModelError, out,
                    capfd, monkeypatch)


def test_missing_initializer(mlp_dir, tmp_path, capfd, monkeypatch):
    model = mlp_model()
    del model.graph.initializer[:]
    with pytest.raises(ModelError, match="'matmul' \\(MatMul\\) reads 'W', which no graph input, "
                                         "initializer or node provides"):
        from_proto(model)
    path = _save(model, tmp_path / "noweights.onnx")
    out = tmp_path / "out" / "a.edgec"
    out.parent.mkdir()
    check_cli_error(["compile", path, "--samples", mlp_dir / "samples", "--target", "x86_64", "-o", out],
                    ModelError, out, capfd, monkeypatch)


# -- samples and inputs ---------------------------------------------------------------------


@pytest.mark.parametrize("arrays, message", [
    ({"z": np.zeros((1, 2, 16), np.float32)}, "missing x; unexpected z"),
    ({"x": np.zeros((1, 2, 16), np.int32)}, "is int32, the model expects float32"),
    ({"x": np.zeros((2, 16), np.float32)}, "has rank 2"),
    ({"x": np.zeros((1, 2, 12), np.float32)}, "has 12 at axis 2, the model fixes it to 16"),
])
def test_samples_that_do_not_fit(mlp_dir, tmp_path, capfd, monkeypatch, arrays, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    out = tmp_path / "out" / "p.json"
    out.parent.mkdir()
    got = check_cli_error(["profile", mlp_dir / "model.onnx", "--samples", tmp_path / "bad.npz", "-o", out],
                          SamplesError, out, capfd, monkeypatch)
    assert message in got


def test_input_outside_the_declared_dims(mlp_artifact, tmp_path, capfd, monkeypatch):
    np.savez(tmp_path / "in.npz", x=np.zeros((1, 3, 17), np.float32))
    out = tmp_path / "out" / "y.npz"
    out.parent.mkdir()
    message = check_cli_error(["run", mlp_artifact, "--inputs", tmp_path / "in.npz", "-o", out],
                              SamplesError, out, capfd, monkeypatch)
    assert "has 17 at axis 2, the model fixes it to 16" in message


def _nan_inf_input(shape) -> np.ndarray:
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    x[0, 0, 0] = np.nan
    x[0, 1, :] = np.inf
    x[0, 2, 3] = -np.inf
    return x


def test_nan_and_inf_inputs_run_and_are_compared(tmp_path):
    """Decided behaviour: NaN/Inf inputs are accepted (no check refuses them) and run; they
    propagate through arithmetic as in onnxruntime. A model without max/min-based ops matches
    onnxruntime element for element, NaN for NaN. (TVM compiles Relu, Clip, Max/Min and max
    pooling to IEEE maxNum/minNum, which returns the non-NaN operand, so there a NaN can become a
    number where onnxruntime keeps NaN; bench then reports the mismatch, as checked below.)"""
    from edgec.stages.build import build
    from edgec.stages.plan import plan
    from edgec.stages.profile import profile
    from edgec.core.samples import Sample
    from edgec.core.targets import load_target

    proto = mlp_model()
    proto.graph.node[1].op_type = "Sigmoid"  # no max/min: NaN and Inf propagate as in onnxruntime
    model = from_proto(proto, "mlp_sigmoid")
    samples = [Sample(f"s{i}", s) for i, s in enumerate(mlp_samples([(1, 8), (1, 8), (2, 4)]))]
    samples[0].arrays["x"][...] = _nan_inf_input((1, 8, 16))  # profiling sees NaN and Inf too
    target = load_target("x86_64")
    path = build(model, plan(model, profile(model, samples), target), [target]).save(tmp_path / "m.edgec")
    compiled, reference = runtime.load(path), reference_session(proto)
    for shape in [(1, 8, 16), (3, 5, 16)]:  # specialized and symbolic fallback
        x = _nan_inf_input(shape)
        got, want = compiled.run({"x": x})["y"], reference.run({"x": x})["y"]
        assert np.isnan(want).any() and np.isfinite(want).any()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
        assert compare_outputs({"y": got}, {"y": want})["max_abs"] < 1e-5

    # The accuracy metrics: matching NaN/Inf are no error and the finite rest is measured; a
    # NaN on one side only is an infinite error, not a crash or a NaN metric.
    ref = np.array([np.nan, np.inf, 1.0, 2.0], np.float32)
    close = compare_outputs({"y": ref + np.float32(1e-3)}, {"y": ref})
    assert 0 < close["max_abs"] < 2e-3 and close["cosine_min"] > 0.99
    lost = compare_outputs({"y": np.array([0.0, np.inf, 1.0, 2.0], np.float32)}, {"y": ref})
    assert lost == {"max_abs": float("inf"), "max_rel": float("inf"), "cosine_min": -1.0}


@pytest.mark.slow  # compile and bench as processes: ~15 s
def test_nan_and_inf_samples_compile_and_bench(tmp_path):
    """The CLI on samples holding NaN and Inf: compile and bench finish, the profile's activation
    ranges stay finite, and bench's result is valid JSON with the mismatch Relu makes (see above)
    reported as an infinite error."""
    onnx.save(mlp_model(), str(tmp_path / "model.onnx"))
    samples = mlp_samples([(1, 8), (1, 8), (2, 4)])
    samples[0]["x"] = _nan_inf_input((1, 8, 16))
    write_samples(tmp_path / "samples", samples)
    built = _edgec("compile", tmp_path / "model.onnx", "--samples", tmp_path / "samples", "--target",
                   "x86_64", "--save-stages", tmp_path / "stages", "-o", tmp_path / "m.edgec")
    assert built.returncode == 0, built.stderr
    ranges = json.loads((tmp_path / "stages" / "profile.json").read_text())["ranges"]
    # each range holds scalars and, for layers quantization calibrates, a histogram list
    assert ranges and all(np.isfinite(v).all() for r in ranges.values() for v in r.values())
    benched = _edgec("bench", tmp_path / "m.edgec", "--samples", tmp_path / "samples", "--runs", "2",
                     "--warmup", "1", "--baselines", "onnxruntime", "-o", tmp_path / "r.json")
    assert benched.returncode == 0, benched.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    per_sample = {s["sample"]: s["max_abs"] for s in result["accuracy"]["per_sample"]}
    assert per_sample["sample_000"] == float("inf")  # Relu(NaN): 0 here, NaN in onnxruntime
    assert per_sample["sample_001"] < 1e-4 and per_sample["sample_002"] < 1e-4


# -- artifacts ------------------------------------------------------------------------------


@pytest.mark.parametrize("damage, message", [
    ("flipped", "corrupt|checksum|not a zip|incomplete"),
    ("truncated", "not an edgec artifact|corrupt"),
    ("newer", "upgrade edgec"),
    ("checksum", "checksum mismatch"),
])
def test_corrupt_artifact(mlp_artifact, mlp_dir, tmp_path, capfd, monkeypatch, damage, message):
    import re

    data = mlp_artifact.read_bytes()
    artifact = Artifact.from_bytes(data)
    if damage == "flipped":
        bad = bytearray(data)
        bad[len(bad) // 2] ^= 0x55
        bad = bytes(bad)
    elif damage == "truncated":
        bad = data[: len(data) // 2]
    elif damage == "newer":
        bad = Artifact({**artifact.manifest, "format_version": FORMAT_VERSION + 1}, artifact.files).to_bytes()
    else:
        (name,) = artifact.files
        library = bytearray(artifact.files[name])
        library[len(library) // 2] ^= 0x01
        bad = Artifact(artifact.manifest, {name: bytes(library)}).to_bytes()
    path = tmp_path / "bad.edgec"
    path.write_bytes(bad)
    out = tmp_path / "out" / "y.npz"
    out.parent.mkdir()
    got = check_cli_error(["run", path, "--inputs", mlp_dir / "samples" / "sample_000.npz", "-o", out],
                          ArtifactError, out, capfd, monkeypatch)
    assert re.search(message, got)


@pytest.mark.parametrize("field, value", [
    ("inputs", [{"name": "x", "dtype": "float32", "dims": [-1, 16]}]),
    ("inputs", [{"name": 3, "dtype": "float32", "dims": []}]),
    ("outputs", "y"),
    ("outputs", [{"name": "y", "dtype": "float32", "dims": [1], "bounds": [0]}]),
    ("model", None),
])
def test_malformed_manifest_fields(mlp_artifact, field, value):
    """Fields the checksums do not cover are still checked before the runtime relies on them."""
    artifact = Artifact.from_bytes(mlp_artifact.read_bytes())
    bad = Artifact({**artifact.manifest, field: value}, artifact.files).to_bytes()
    with pytest.raises(ArtifactError, match=f"invalid {field}|invalid model entry"):
        Artifact.from_bytes(bad)


# -- environment ----------------------------------------------------------------------------


def test_missing_cross_compiler(mlp_dir, tmp_path, capfd, monkeypatch):
    text = (TARGETS / "arm64-cortex-a72.toml").read_text()
    text = text.replace('cross_compiler = "aarch64-linux-gnu-g++"',
                        'cross_compiler = "riscv64-linux-gnu-g++-99"')
    assert "riscv64" in text
    target = tmp_path / "riscv-board.toml"
    target.write_text(text)
    out = tmp_path / "out" / "a.edgec"
    out.parent.mkdir()
    message = check_cli_error(["compile", mlp_dir / "model.onnx", "--samples", mlp_dir / "samples",
                               "--target", target, "-o", out], ToolchainError, out, capfd, monkeypatch)
    assert "cross compiler 'riscv64-linux-gnu-g++-99'" in message
    assert "apt-get install g++-riscv64-linux-gnu" in message


def test_target_file_with_a_typo(mlp_dir, tmp_path, capfd, monkeypatch):
    target = tmp_path / "mine.toml"
    target.write_text((TARGETS / "arm64-cortex-a72.toml").read_text()
                      .replace("cross_compiler =", "cross_compiller =").replace("[run]", "[rnu]"))
    out = tmp_path / "out" / "a.edgec"
    out.parent.mkdir()
    message = check_cli_error(["compile", mlp_dir / "model.onnx", "--samples", mlp_dir / "samples",
                               "--target", target, "-o", out], TargetError, out, capfd, monkeypatch)
    assert "'rnu' (did you mean 'run'?)" in message
    target.write_text((TARGETS / "arm64-cortex-a72.toml").read_text().replace("cross_compiler =", "cross_compiller ="))
    with pytest.raises(TargetError, match="'build.cross_compiller' \\(did you mean 'build.cross_compiler'\\?\\)"):
        from edgec.core.targets import load_target

        load_target(target)


# -- interruptions --------------------------------------------------------------------------

# Runs the CLI in a child that stops at a chosen point, says so, and waits to be killed:
#   write:   in the middle of writing the output (half of it in the temporary file)
#   build:   after compiling, before writing
#   measure: after bench's measurements, before its result is written
_STALLING_CLI = textwrap.dedent("""
    import sys, time
    import edgec.fileio as fileio

    def pause():
        print("EDGEC-PAUSED", flush=True)
        time.sleep(300)

    point = sys.argv[1]
    if point == "write":
        real_atomic_write = fileio.atomic_write

        def stalled(path, write, mode=None):
            def half(tmp):
                write(tmp)
                with open(tmp, "r+b") as handle:
                    handle.truncate(tmp.stat().st_size // 2)
                pause()
            return real_atomic_write(path, half, mode)

        fileio.atomic_write = stalled
    elif point == "build":
        import edgec.stages.build
        real_build = edgec.stages.build.build
        edgec.stages.build.build = lambda *a, **k: (real_build(*a, **k), pause())
    elif point == "measure":
        import edgec.stages.bench
        edgec.stages.bench.compare_outputs = lambda *a, **k: pause()
    from edgec.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def _kill_at(point: str, args: list) -> None:
    child = subprocess.Popen([sys.executable, "-c", _STALLING_CLI, point, *map(str, args)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        for line in child.stdout:
            if line.strip() == "EDGEC-PAUSED":
                break
        else:
            pytest.fail(f"the child ended before '{point}': {child.wait()} {child.stderr.read()[-2000:]}")
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()


@pytest.mark.parametrize("command, point", [
    pytest.param("compile", "build", marks=pytest.mark.slow),  # compiles twice: ~20 s
    pytest.param("compile", "write", marks=pytest.mark.slow),
    ("bench", "measure"), ("bench", "write"),
])
def test_killed_midway(mlp_dir, mlp_artifact, tmp_path, command, point):
    """SIGKILL (which nothing can catch) mid-run leaves no output file, only a temporary one when
    killed mid-write; a rerun succeeds and removes that leftover."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    if command == "compile":
        out = out_dir / "a.edgec"
        args = ["compile", mlp_dir / "model.onnx", "--samples", mlp_dir / "samples", "--target",
                "x86_64", "-o", out]
    else:
        out = out_dir / "r.json"
        args = ["bench", mlp_artifact, "--samples", mlp_dir / "samples", "--model", mlp_dir / "model.onnx",
                "--runs", "1", "--warmup", "0", "--baselines", "onnxruntime", "-o", out]
    _kill_at(point, args)
    assert not out.exists()
    leftovers = _leftovers(out_dir)
    assert len(leftovers) == (1 if point == "write" else 0), leftovers
    if leftovers:
        assert leftovers[0].startswith(f".{out.name}.")

    rerun = _edgec(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert _leftovers(out_dir) == []
    if command == "compile":
        runtime.load(out).run({"x": np.ones((1, 8, 16), np.float32)})
    else:
        assert json.loads(out.read_text())["kind"] == "bench"


def test_a_live_writers_temporary_file_is_left_alone(tmp_path):
    """Only temporaries of dead processes are removed: a concurrent writer's survives."""
    live = tmp_path / f".a.txt.{os.getppid()}.abc.tmp"
    dead_pid = 2 ** 22 + 12345  # above the default pid_max: no such process
    dead = tmp_path / f".a.txt.{dead_pid}.abc.tmp"
    other = tmp_path / f".b.txt.{dead_pid}.abc.tmp"
    for path in (live, dead, other):
        path.write_text("partial")
    fileio.write_text(tmp_path / "a.txt", "whole")
    assert live.exists() and not dead.exists() and other.exists()
    assert (tmp_path / "a.txt").read_text() == "whole"


# -- full disk ------------------------------------------------------------------------------


def _enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_disk_full_write_leaves_nothing(tmp_path, monkeypatch):
    """ENOSPC while writing (half the data got out) and at fsync: OutputFileError naming the path
    and 'free space', the old file untouched, no temporary file left."""
    target = tmp_path / "result.json"
    target.write_text("old")
    real_write_bytes = Path.write_bytes

    def half_then_full(self, data):
        real_write_bytes(self, data[: len(data) // 2])
        _enospc()

    monkeypatch.setattr(Path, "write_bytes", half_then_full)
    with pytest.raises(OutputFileError, match=f"cannot write '{target}'.*free space in '{tmp_path}'"):
        fileio.write_bytes(target, b"x" * 10000)
    monkeypatch.undo()
    assert target.read_text() == "old" and _leftovers(tmp_path) == []

    monkeypatch.setattr(fileio.os, "fsync", _enospc)
    with pytest.raises(OutputFileError, match="free space"):
        fileio.write_text(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old" and _leftovers(tmp_path) == []


def test_disk_full_cli(mlp_artifact, mlp_dir, tmp_path, capfd, monkeypatch):
    """In-process (the simulated ENOSPC needs this process): exit code, one line, traceback only
    with --debug, nothing left."""
    out = tmp_path / "out" / "y.npz"
    out.parent.mkdir()
    args = ["run", str(mlp_artifact), "--inputs", str(mlp_dir / "samples" / "sample_000.npz"), "-o", str(out)]
    monkeypatch.delenv("EDGEC_DEBUG", raising=False)
    monkeypatch.setattr(fileio.os, "fsync", _enospc)
    capfd.readouterr()
    assert main(args) == OutputFileError.exit_code
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"edgec: error: cannot write '{out}'")
    assert "free space" in err and "Traceback" not in err
    assert main(["--debug", *args]) == OutputFileError.exit_code
    assert "Traceback (most recent call last)" in capfd.readouterr().err
    assert not out.exists() and _leftovers(out.parent) == []


def test_disk_full_when_the_runtime_unpacks_a_library(mlp_artifact, monkeypatch):
    monkeypatch.setattr(Path, "write_bytes", _enospc)
    with pytest.raises(OutputFileError, match="cannot unpack the 'x86_64' library .*free space there "
                                              "or point TMPDIR elsewhere"):
        runtime.load(mlp_artifact)


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 16 KiB tmpfs (needs root and permission to mount; skipped otherwise)."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_disk_full_on_a_real_tiny_filesystem(mlp_artifact, tmp_path, tiny_filesystem):
    np.savez(tmp_path / "in.npz", x=np.ones((1, 1024, 16), np.float32))  # 32 KiB of outputs
    out = tiny_filesystem / "y.npz"
    result = _edgec("run", mlp_artifact, "--inputs", tmp_path / "in.npz", "-o", out)
    assert result.returncode == OutputFileError.exit_code, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"cannot write '{out}'" in result.stderr and "free space" in result.stderr
    assert list(tiny_filesystem.iterdir()) == []
