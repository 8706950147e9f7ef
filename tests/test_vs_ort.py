"""benchmarks/vs_ort.py in its CI mode: the report's exact shape, one row per transformer sequence
length, ratios and geomeans consistent with the rows (no timing asserts: timings are noisy)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_small_run_writes_the_report(tmp_path):
    output = tmp_path / "vs_ort.json"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "vs_ort.py"), "--small",
                             "-o", str(output)], cwd=REPO, capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    assert set(report) == {"models", "geomean_static", "geomean_dynamic"}
    names = [row["name"] for row in report["models"]]
    assert names[0] == "cnn" and all(n.startswith("transformer seq=") for n in names[1:])
    assert len(names) >= 3  # the transformer's samples have at least two sequence lengths
    for row in report["models"]:
        assert set(row) == {"name", "kind", "edgec_ms", "onnxruntime_ms", "ratio"}
        assert row["kind"] == ("static" if row["name"] == "cnn" else "dynamic")
        assert row["edgec_ms"] > 0 and row["onnxruntime_ms"] > 0
        assert row["ratio"] == pytest.approx(row["edgec_ms"] / row["onnxruntime_ms"], rel=1e-3)
    dynamic = [r["ratio"] for r in report["models"] if r["kind"] == "dynamic"]
    assert report["geomean_static"] == pytest.approx(report["models"][0]["ratio"], rel=1e-3)
    assert report["geomean_dynamic"] == pytest.approx(
        math.exp(sum(map(math.log, dynamic)) / len(dynamic)), rel=1e-3)
    table = output.with_suffix(".md").read_text()
    assert "| cnn | static |" in table and "geomean dynamic" in table


def test_markdown_table_and_geomean():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import vs_ort
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert vs_ort.geomean([1.0, 4.0]) == 2.0 and vs_ort.geomean([]) is None
    report = {"models": [{"name": "m", "kind": "static", "edgec_ms": 2.0, "onnxruntime_ms": 1.0,
                          "ratio": 2.0}], "geomean_static": 2.0, "geomean_dynamic": None}
    table = vs_ort.markdown(report)
    assert "| m | static | 2.000 | 1.000 | 2.000 |" in table
    assert "geomean static | | | | 2.000" in table and "geomean dynamic" not in table
