"""benchmarks/quantize.py in its CI mode: one row per mode with fp32 first, ratios consistent with
the rows, int8 artifacts smaller than fp32's and close to its outputs (no timing asserts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # four compiles and a timing process: ~20 s
def test_small_run_writes_the_report(tmp_path):
    output = tmp_path / "quantize.json"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "quantize.py"), "--small",
                             "-o", str(output)], cwd=REPO, capture_output=True, text=True,
                            timeout=1200)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(output.read_text())
    rows = report["rows"]
    assert [r["mode"] for r in rows] == ["none", "int8-weight", "int8-dynamic", "int8-static"]
    fp32 = rows[0]
    assert fp32["size_ratio"] == 1.0 and fp32["latency_ratio"] == 1.0 and fp32["cosine_min"] > 0.9999
    for row in rows:
        assert row["model"] == "cnn" and row["latency_ms"] > 0 and row["fp32_layers"] == []
        assert row["size_ratio"] == pytest.approx(row["artifact_bytes"] / fp32["artifact_bytes"],
                                                  rel=1e-3)
        assert row["latency_ratio"] == pytest.approx(row["latency_ms"] / fp32["latency_ms"],
                                                     rel=1e-3)
    for row in rows[1:]:  # int8 weights: a smaller file, outputs close to fp32's
        assert row["size_ratio"] < 0.9 and row["cosine_min"] > 0.99
    table = output.with_suffix(".md").read_text()
    assert "| cnn | int8-static |" in table and "median of the rounds' medians" in table


def test_markdown_row():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import quantize
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    report = {"rows": [{"model": "digits", "mode": "int8-static", "artifact_bytes": 100,
                        "size_ratio": 0.25, "cosine_min": 0.9991234, "latency_ms": 0.5,
                        "latency_ratio": 0.8, "held_out_accuracy": 0.98, "fp32_layers": ["fc"],
                        "guard_drop": 0.00123}],
              "setup": {"target": "x86_64", "threads": 1, "rounds": 5, "runs": 10, "warmup": 3}}
    table = quantize.markdown(report)
    assert ("| digits | int8-static | 100 | 0.250 | 0.999123 | 1.23e-03 | 0.500 | 0.800 | 98.00% "
            "| fc |") in table
    assert "Geomean latency / fp32, int8-static: 0.800 over 1 model(s)." in table
