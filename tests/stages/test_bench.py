import contextlib
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import MLP_SHAPES, mlp_model, mlp_samples
from edgec.stages import bench as bench_module
from edgec.stages.bench import (BenchResult, BenchSettings, bench, compare_outputs, latency_stats,
                                summary_line, time_calls)
from edgec.errors import EdgecError, StageInputError
from edgec.core.model import from_proto
from edgec.stages.report import report
from edgec.core.samples import Sample


def test_latency_stats_are_percentiles():
    stats = latency_stats(list(range(1, 101)))
    assert stats["p50_ms"] == 50.5 and stats["p90_ms"] == pytest.approx(90.1)
    assert stats["min_ms"] == 1 and stats["max_ms"] == 100 and stats["runs"] == 100


def test_min_seconds_repeats_whole_passes_until_the_time_has_passed(monkeypatch):
    """A clock that each call moves by 0.25 s: two samples, one run each, is 0.5 s a pass, so
    --min-seconds 1 takes two passes (4 calls) and --min-seconds 0 one."""
    now = [0.0]
    monkeypatch.setattr(bench_module, "time", SimpleNamespace(perf_counter=lambda: now[0],
                                                              sleep=lambda seconds: None))

    def call(arrays):
        now[0] += 0.25
        return {"y": np.zeros(1, np.float32)}

    model = from_proto(mlp_model(), "mlp")
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples([(1, 2), (2, 3)]))]
    stats, outputs = time_calls(call, model, samples, BenchSettings(runs=1, warmup=0, min_seconds=1.0), "x")
    assert stats["runs"] == 4 and stats["p50_ms"] == 250.0 and len(outputs) == 2
    assert time_calls(call, model, samples, BenchSettings(runs=1, warmup=0), "x")[0]["runs"] == 2
    with pytest.raises(EdgecError, match="--min-seconds"):
        BenchSettings(min_seconds=-1).check()


def test_summary_line_names_every_baseline_and_what_rpc_times_include():
    stats = {"p50_ms": 2.0}
    data = {"edgec": {"p50_ms": 1.0}, "accuracy": {"max_abs": 1e-6}, "run": {"mode": "local"},
            "baselines": {name: {**stats, "ratio_p50": 0.5}
                          for name in ("onnxruntime", "onnxruntime-1t", "tvm-plain")}}
    line = summary_line(BenchResult(data))
    assert "tvm-plain 2.000 ms (edgec/tvm-plain 0.500)" in line and "round trip" not in line
    assert "onnxruntime-1t 2.000 ms (edgec/onnxruntime-1t 0.500)" in line
    rpc = summary_line(BenchResult({**data, "run": {"mode": "rpc"}}))
    assert "include the RPC network round trip" in rpc and len(rpc.splitlines()) == 1


def test_compare_outputs_measures_abs_rel_and_cosine():
    ref = {"y": np.array([1.0, 2.0, -4.0], np.float32)}
    same = compare_outputs(ref, ref)
    assert same == {"max_abs": 0.0, "max_rel": 0.0, "cosine_min": pytest.approx(1.0)}
    off = compare_outputs({"y": np.array([1.0, 2.0, -3.0], np.float32)}, ref)
    assert off["max_abs"] == 1.0 and off["max_rel"] == 0.25 and off["cosine_min"] < 0.999
    assert math.isinf(compare_outputs({"y": np.zeros(2, np.float32)}, ref)["max_abs"])
    nan = {"y": np.array([np.nan], np.float32)}
    assert compare_outputs(nan, nan)["max_abs"] == 0.0
    assert math.isinf(compare_outputs({"y": np.array([1.0], np.float32)}, nan)["max_abs"])


def test_bench_measures_both_runtimes_and_accuracy(mlp_artifact, tmp_path):
    model = from_proto(mlp_model(), "mlp")
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES + [(4, 9)]))]
    result = bench(mlp_artifact, model, samples, BenchSettings(runs=3, warmup=1),
                   baselines=("onnxruntime", "onnxruntime-1t", "tvm-plain"))
    for stats in (result["edgec"], result["onnxruntime"], *result["baselines"].values()):
        assert 0 < stats["p50_ms"] <= stats["p90_ms"] <= stats["p99_ms"] and stats["runs"] == 33
    assert set(result["baselines"]) == {"onnxruntime", "onnxruntime-1t", "tvm-plain"}
    assert result["runtime_files"]["libtvm_runtime.so"] > 1_000_000 and result["peak_rss_mb"] > 0
    assert result["accuracy"]["top1_agreement"] == {"y": 1.0}
    assert result["accuracy"]["max_rel"] < 1e-5 and result["accuracy"]["cosine_min"] > 0.99999
    assert result["artifact_bytes"] == mlp_artifact.stat().st_size
    assert {row["shape"] for row in result["per_shape"]} >= {"batch=1,seq=8", "batch=4,seq=9"}
    assert result["ratio_p50"] == pytest.approx(result["edgec"]["p50_ms"] / result["onnxruntime"]["p50_ms"], rel=1e-3)
    loaded = BenchResult.load(result.save(tmp_path / "r.json"))
    assert loaded["edgec"] == result["edgec"]

    files = report([loaded]).files
    assert "| mlp | x86_64 |" in files["report.md"] and "batch=4,seq=9" in files["report.md"]
    assert files["report.csv"].splitlines()[0].startswith("model,target,edgec_p50_ms")
    assert len(files["report.csv"].splitlines()) == 2


def test_unknown_baseline_is_refused(mlp_artifact):
    with pytest.raises(EdgecError, match="unknown baseline"):
        bench(mlp_artifact, from_proto(mlp_model()), [Sample("s", mlp_samples([(1, 2)])[0])],
              baselines=("pytorch-magic",))


def test_bench_refuses_another_model(mlp_artifact):
    other = from_proto(mlp_model(seed=9))
    with pytest.raises(StageInputError, match="another model"):
        bench(mlp_artifact, other, [Sample("s", mlp_samples([(1, 2)])[0])])


def test_busy_runs_background_processes_only_while_bench_measures(mlp_artifact, tmp_path,
                                                                   monkeypatch, capsys):
    """`edgec bench --busy 2`: two processes, alive while the systems are measured, gone (reaped)
    once bench returns; the result and the summary line say so."""
    from edgec.cli import main

    started = []
    real = bench_module.busy_processes

    @contextlib.contextmanager
    def recording(count):
        with real(count) as pids:
            started.append([(pid, Path(f"/proc/{pid}").exists()) for pid in pids])
            yield pids

    monkeypatch.setattr(bench_module, "busy_processes", recording)
    out = tmp_path / "r.json"
    assert main(["bench", str(mlp_artifact), "--samples", str(mlp_artifact.parent / "samples"),
                 "--runs", "2", "--busy", "2", "--baselines", "onnxruntime", "-o", str(out)]) == 0
    assert len(started) == 1 and len(started[0]) == 2
    pids = [pid for pid, alive in started[0] if alive]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert not any(Path(f"/proc/{pid}").exists() for pid in pids)
    assert BenchResult.load(out)["settings"]["busy"] == 2
    assert "beside 2 busy background processes" in capsys.readouterr().out
    with pytest.raises(EdgecError, match="--busy"):
        BenchSettings(busy=-1).check()
