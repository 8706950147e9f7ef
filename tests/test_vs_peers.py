"""benchmarks/vs_peers.py: the report's exact shape and its geomean arithmetic on made-up timings
(no measuring), and, where OpenVINO is installed, a small run end to end (no timing asserts)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ROW_KEYS = {"name", "suite", "kind", "edgec_ms", "onnxruntime_ms", "openvino_ms", "edgec_error",
            "openvino_error"}
GEOMEAN_KEYS = {"real_vs_ort", "real_vs_openvino", "zoo_static_vs_ort", "zoo_dynamic_vs_ort"}


@pytest.fixture(scope="module")
def vs_peers():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import vs_peers
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return vs_peers


def _measured(name, suite, kind, edgec, ort, openvino, error=1e-6):
    return {"name": name, "suite": suite, "kind": kind,
            "per_round": {"edgec": edgec, "onnxruntime": ort, "openvino": openvino},
            "error": {"edgec": error, "openvino": None if openvino is None else error}}


def _check_schema(report):
    assert {"models", "geomean"} <= set(report)
    assert set(report["geomean"]) == GEOMEAN_KEYS
    for row in report["models"]:
        assert set(row) == ROW_KEYS
        assert row["suite"] in ("real", "zoo") and row["kind"] in ("static", "dynamic")


def test_report_schema_and_geomeans_from_fake_timings(vs_peers):
    measured = [
        # per-round medians: the row's time is their median
        _measured("resnet", "zoo", "static", [2.0, 9.0, 2.2], [1.0, 1.1, 0.9], [0.5, 0.5, 0.5]),
        _measured("moe", "zoo", "dynamic", [1.0, 1.0, 1.0], [4.0, 4.0, 4.0], [8.0, 8.0, 8.0]),
        _measured("tagger", "zoo", "dynamic", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]),
        _measured("hf_bert", "real", "dynamic", [3.0], [1.0], [1.0]),
        _measured("hf_vit", "real", "dynamic", [3.0], [9.0], None),  # OpenVINO failed
        _measured("hf_t5", "real", "static", None, [1.0], [1.0]),  # edgec failed
    ]
    failures = [{"name": "hf_vit", "system": "openvino", "error": "load: RuntimeError: no"},
                {"name": "hf_t5", "system": "edgec", "error": "compile: it did not"}]
    setup = {"threads": 2, "rounds": 3, "runs": 10, "warmup": 2, "busy": 0, "machine": "cpu",
             "versions": {"openvino": "2026.4.1", "onnxruntime": "1.32.0"}}
    not_built = [{"name": "tv_x", "reason": "no torchvision"}]
    report = vs_peers.build_report(measured, failures, not_built, setup)
    _check_schema(json.loads(json.dumps(report)))
    rows = {r["name"]: r for r in report["models"]}
    assert rows["resnet"]["edgec_ms"] == 2.2 and rows["resnet"]["onnxruntime_ms"] == 1.0
    assert rows["hf_vit"]["openvino_ms"] is None and rows["hf_vit"]["openvino_error"] is None
    assert rows["hf_t5"]["edgec_ms"] is None and rows["hf_t5"]["onnxruntime_ms"] == 1.0
    geomean = report["geomean"]
    assert geomean["zoo_static_vs_ort"] == pytest.approx(2.2, abs=1e-4)
    assert geomean["zoo_dynamic_vs_ort"] == pytest.approx(math.sqrt(0.25 * 1.0), abs=1e-4)
    assert geomean["real_vs_ort"] == pytest.approx(math.sqrt(3.0 * (3.0 / 9.0)), abs=1e-4)
    assert geomean["real_vs_openvino"] == pytest.approx(3.0, abs=1e-4)  # hf_bert only
    assert vs_peers.geomeans([])["real_vs_ort"] is None
    assert vs_peers.spread([2.0, 9.0, 2.2]) == pytest.approx(7.0 / 2.2, abs=1e-4)

    table = vs_peers.markdown(report)
    assert "| resnet | zoo | static | 2.200 | 1.000 | 0.500 | 2.200 | 4.400 |" in table
    assert "| hf_vit | real | dynamic | 3.000 | 9.000 |  | 0.333 |  |" in table
    assert "- geomean zoo static vs ort: 2.200" in table
    assert "largest 318%" in table and "3 round(s)" in table
    assert "- hf_t5 (edgec): compile: it did not" in table and "- tv_x: no torchvision" in table


def test_update_replaces_only_the_remeasured_rows_and_says_so(vs_peers):
    setup = {"threads": 2, "rounds": 3, "runs": 10, "warmup": 2, "busy": 0, "machine": "cpu",
             "versions": {"openvino": "2026.4.1", "onnxruntime": "1.32.0"}}
    old = vs_peers.build_report(
        [_measured("moe", "zoo", "dynamic", [4.0], [1.0], [8.0]),
         _measured("tagger", "zoo", "dynamic", [1.0], [1.0], [2.0]),
         _measured("rnn", "zoo", "dynamic", [9.0], [1.0], [2.0])],
        [{"name": "rnn", "system": "openvino", "error": "load: no"}], [], setup)
    new = vs_peers.build_report([_measured("rnn", "zoo", "dynamic", [1.0], [1.0], [2.0])], [],
                                [], {**setup, "rounds": 5, "date": "2026-12-06"})
    merged = vs_peers.merge_reports(old, new)
    _check_schema(json.loads(json.dumps(merged)))
    assert [r["name"] for r in merged["models"]] == ["moe", "tagger", "rnn"]
    assert {r["name"]: r["edgec_ms"] for r in merged["models"]} == {
        "moe": 4.0, "tagger": 1.0, "rnn": 1.0}
    assert merged["failures"] == [] and merged["per_round_ms"]["rnn"]["edgec"] == [1.0]
    assert merged["geomean"]["zoo_dynamic_vs_ort"] == pytest.approx(4.0 ** (1 / 3), abs=1e-4)
    table = vs_peers.markdown(merged)
    assert "Re-measured later (2026-12-06, 2 threads, 5 round(s), busy 0): rnn." in table
    assert "3 round(s) in one process" in table  # the original run's settings stay


def test_a_system_that_fails_gets_null_and_its_error_and_the_others_run(vs_peers, mlp_dir,
                                                                         tmp_path, monkeypatch):
    """edgec's compile fails (made to): its column is null with the error, onnxruntime and
    OpenVINO are still timed, beside one busy process, and OpenVINO's outputs checked."""
    pytest.importorskip("openvino")
    monkeypatch.setattr(vs_peers.real_models, "compile_model", lambda *a: {
        "compiled": False, "error": "edgec: error: made to fail"})
    entry = {"name": "mlp", "suite": "zoo", "kind": "dynamic", "folder": mlp_dir, "split": None}
    args = argparse.Namespace(threads=1, rounds=2, runs=1, warmup=0, busy=1, timeout=300)
    rows, failures = vs_peers.measure(entry, tmp_path, args)
    assert failures == [{"name": "mlp", "system": "edgec",
                         "error": "compile: edgec: error: made to fail"}]
    row = vs_peers.make_row(rows[0]["name"], "zoo", "dynamic", rows[0]["per_round"],
                            rows[0]["error"])
    assert row["edgec_ms"] is None and row["edgec_error"] is None
    assert row["onnxruntime_ms"] > 0 and row["openvino_ms"] > 0 and row["openvino_error"] < 1e-5
    assert len(rows[0]["per_round"]["openvino"]) == 2


@pytest.mark.slow
def test_small_run_end_to_end(tmp_path):
    pytest.importorskip("openvino")
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "vs_peers.py"), "--small",
                             "--rounds", "1", "--out", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "vs_peers.json").read_text())
    _check_schema(report)
    suites = {row["suite"] for row in report["models"]}
    assert "zoo" in suites
    for row in report["models"]:
        if row["name"] in ("cnn", "hf_bert"):  # small, and every system runs them
            assert row["edgec_ms"] > 0 and row["onnxruntime_ms"] > 0 and row["openvino_ms"] > 0
            assert row["edgec_error"] <= 1e-3 and row["openvino_error"] <= 1e-3
    assert all(len(v) == 1 for per in report["per_round_ms"].values() for v in per.values() if v)
    assert "| cnn | zoo | static |" in (tmp_path / "vs_peers.md").read_text()
