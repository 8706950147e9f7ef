"""The report stage: turn bench results into files a person or a CI job reads.

Writes ``report.md`` (fits a CI job summary), ``report.csv`` and ``report.json`` (one row per
result) into the output folder.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bench import BenchResult
from .fileio import write_text

_COLUMNS = (
    "model", "target", "edgec_p50_ms", "edgec_p90_ms", "edgec_p99_ms", "onnxruntime_p50_ms",
    "ratio_p50", "max_abs", "max_rel", "cosine_min", "artifact_bytes", "load_ms",
)


def summary_row(result: BenchResult) -> dict[str, Any]:
    """One flat row per bench result: what the tables show."""
    return {
        "model": result["model"], "target": result["target"],
        "edgec_p50_ms": result["edgec"]["p50_ms"], "edgec_p90_ms": result["edgec"]["p90_ms"],
        "edgec_p99_ms": result["edgec"]["p99_ms"],
        "onnxruntime_p50_ms": result["onnxruntime"]["p50_ms"], "ratio_p50": result["ratio_p50"],
        "max_abs": result["accuracy"]["max_abs"], "max_rel": result["accuracy"]["max_rel"],
        "cosine_min": result["accuracy"]["cosine_min"],
        "artifact_bytes": result["artifact_bytes"], "load_ms": result["load_ms"],
    }


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _markdown(results: list[BenchResult]) -> str:
    lines = ["# edgec benchmark report", ""]
    if results:
        machine = results[0]["machine"]
        versions = results[0]["versions"]
        lines += [
            f"Machine: {machine['cpu']} ({machine['cores']} cores, {machine['machine']}); "
            f"edgec {versions['edgec']}, TVM {versions['tvm']}, onnxruntime {versions['onnxruntime']}.",
            "Latency per call in ms, edgec against onnxruntime in the same run; ratio = edgec p50 / "
            "onnxruntime p50 (lower is better); accuracy against onnxruntime's outputs.",
            "",
        ]
    lines.append("| " + " | ".join(_COLUMNS) + " |")
    lines.append("|" + "---|" * len(_COLUMNS))
    for result in results:
        row = summary_row(result)
        lines.append("| " + " | ".join(_fmt(row[c]) for c in _COLUMNS) + " |")
    for result in results:
        lines += ["", f"## {result['model']} on {result['target']}", ""]
        plan = result["plan"]
        for region in plan.get("regions", []):
            specs = "; ".join(",".join(f"{k}={v}" for k, v in s.items()) for s in region["specializations"])
            lines.append(f"- region `{region['name']}`: {region['mode']}"
                         + (f" [{specs}]" if specs else "") + f" — {region['reason']}")
        lines += ["", "| shape | samples | edgec p50 | onnxruntime p50 | ratio |", "|---|---|---|---|---|"]
        for row in result["per_shape"]:
            lines.append(f"| {row['shape']} | {row['samples']} | {_fmt(row['edgec']['p50_ms'])} | "
                         f"{_fmt(row['onnxruntime']['p50_ms'])} | {_fmt(row['ratio_p50'])} |")
    return "\n".join(lines) + "\n"


def _csv(results: list[BenchResult]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for result in results:
        writer.writerow(summary_row(result))
    return buffer.getvalue()


@dataclass(frozen=True)
class Report:
    """Rendered report files, by file name."""

    files: dict[str, str]

    def save(self, directory: str | Path) -> list[Path]:
        directory = Path(directory)
        return [write_text(directory / name, text) for name, text in sorted(self.files.items())]


def report(results: list[BenchResult]) -> Report:
    """Render ``results`` as Markdown, CSV and JSON."""
    rows = [summary_row(r) for r in results]
    return Report({
        "report.md": _markdown(results),
        "report.csv": _csv(results),
        "report.json": json.dumps({"results": rows}, indent=1) + "\n",
    })
