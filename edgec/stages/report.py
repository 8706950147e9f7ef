"""The report stage: turn bench results into files a person or a CI job reads, and gate regressions.

Writes into the output folder: ``report.md`` (fits a CI job summary), ``report.html`` (plots as
inline SVG and a drawing of the split; no network, no JavaScript), ``report.csv`` and
``report.json`` (one row per result), and ``benchmark-action.json`` (the format
github-action-benchmark reads: ``name``, ``unit``, ``value``, smaller is better).

``compare`` holds results against a baseline report: latency is compared as ``ratio_p50`` (edgec
over onnxruntime measured in the same run, so a slower CI machine is not a regression), accuracy
as ``max_rel`` and ``cosine_min``.
"""

from __future__ import annotations

import csv
import html
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgec.errors import EdgecError, StageInputError
from edgec.fileio import write_text
from edgec.stages.bench import BenchResult

_COLUMNS = (
    "model", "target", "edgec_p50_ms", "edgec_p90_ms", "edgec_p99_ms", "onnxruntime_p50_ms",
    "ratio_p50", "max_abs", "max_rel", "cosine_min", "artifact_bytes", "load_ms",
)
_MODE_COLOURS = {"static": "#4C78A8", "specialized": "#54A24B", "symbolic": "#F58518"}
_SERIES_COLOURS = ("#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2")


class RegressionError(EdgecError):
    """A latency or accuracy got worse than the allowed margin against the baseline."""

    exit_code = 11


class BaselineMismatchError(EdgecError):
    """No result matches a row of the baseline (model and target), so nothing was compared."""

    exit_code = 13


def summary_row(result: BenchResult) -> dict[str, Any]:
    """One flat row per bench result: what the tables show and what ``compare`` reads."""
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


def _systems(result: BenchResult) -> list[str]:
    return ["edgec"] + list(result.data.get("baselines", {"onnxruntime": None}))


def _overall(result: BenchResult, system: str) -> dict[str, Any]:
    """Whole-run latency statistics of one system."""
    if system in ("edgec", "onnxruntime"):
        return result[system]
    return result["baselines"][system]


def _split_lines(result: BenchResult) -> list[str]:
    lines = []
    for region in result["plan"].get("regions", []):
        specs = "; ".join(",".join(f"{k}={v}" for k, v in s.items()) for s in region["specializations"])
        lines.append(f"- region `{region['name']}`: {region['mode']}"
                     + (f" [{specs}]" if specs else "") + f" — {region['reason']}")
    return lines


def _quantization_lines(result: BenchResult) -> list[str]:
    """What was quantized, which layers stayed fp32 and the accuracy measured on held-out
    samples (empty for fp32 artifacts)."""
    quant = result.data.get("quantization") or {"mode": "none"}
    if quant.get("mode", "none") == "none":
        return []
    counts: dict[str, int] = {}
    for layer in quant.get("layers", []):
        counts[layer["precision"]] = counts.get(layer["precision"], 0) + 1
    lines = [f"- quantization `{quant['mode']}` ({quant.get('calibration')} calibration, "
             f"{quant.get('scheme')}): " + ", ".join(f"{n} {p}" for p, n in sorted(counts.items()))]
    measured = quant.get("accuracy", {}).get("measured") or quant.get("accuracy", {}).get("simulated")
    if measured:
        kind = "measured" if quant["accuracy"].get("measured") else "simulated"
        per_output = "; ".join(
            f"{name}: min cosine {o['min_cosine']:.5f}, max abs {o['max_abs']:.3g}"
            + (f", top-1 agreement {o['top1_agreement']:.3f}" if "top1_agreement" in o else "")
            for name, o in measured["outputs"].items())
        lines.append(f"- accuracy vs fp32 ({kind}, {measured['samples']} held-out samples): drop "
                     f"{measured['drop']:.3g} of budget {quant.get('max_accuracy_drop')}; {per_output}")
    if quant.get("fp32_layers"):
        lines.append("- kept fp32: " + ", ".join(f"`{name}`" for name in quant["fp32_layers"]))
    return lines


def _runtime_lines(result: BenchResult) -> list[str]:
    """What the device must hold to run the library, per route: TVM's runtime (every library)
    and each native library the library dispatch linked (oneDNN, XNNPACK)."""
    files = result.data.get("runtime_files") or {}
    if not files:
        return []
    tvm = {name: size for name, size in files.items() if name.startswith("libtvm")}
    routes = [f"TVM runtime {sum(tvm.values()) / 1e6:.1f} MB ({', '.join(sorted(tvm))})"] if tvm else []
    routes += [f"{name} {size / 1e6:.1f} MB" for name, size in files.items() if name not in tvm]
    return [f"- runtime on the device: {sum(files.values()) / 1e6:.1f} MB: " + "; ".join(routes)]


def _markdown(results: list[BenchResult]) -> str:
    lines = ["# edgec benchmark report", ""]
    if results:
        machine, versions = results[0]["machine"], results[0]["versions"]
        lines += [
            f"Machine: {machine['cpu']} ({machine['cores']} cores, {machine['machine']}); "
            f"edgec {versions['edgec']}, TVM {versions['tvm']}, onnxruntime {versions['onnxruntime']}.",
            "Latency per call in ms, every system measured in the same run; ratio = edgec p50 / "
            "onnxruntime p50 (lower is better); accuracy against onnxruntime's outputs.",
            "",
        ]
    lines.append("| " + " | ".join(_COLUMNS) + " |")
    lines.append("|" + "---|" * len(_COLUMNS))
    for result in results:
        row = summary_row(result)
        lines.append("| " + " | ".join(_fmt(row[c]) for c in _COLUMNS) + " |")
    for result in results:
        systems = _systems(result)
        lines += ["", f"## {result['model']} on {result['target']}", ""]
        lines += _split_lines(result)
        lines += _quantization_lines(result)
        lines += _runtime_lines(result)
        lines += ["", "| shape | samples | " + " | ".join(f"{s} p50" for s in systems) + " | ratio |",
                  "|---|---|" + "---|" * len(systems) + "---|"]
        for row in result["per_shape"]:
            cells = " | ".join(_fmt(row[s]["p50_ms"]) if s in row else "" for s in systems)
            lines.append(f"| {row['shape']} | {row['samples']} | {cells} | {_fmt(row['ratio_p50'])} |")
    return "\n".join(lines) + "\n"


def _csv(results: list[BenchResult]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for result in results:
        writer.writerow(summary_row(result))
    return buffer.getvalue()


def _benchmark_action(results: list[BenchResult]) -> str:
    entries = []
    for result in results:
        key = f"{result['model']}/{result['target']}"
        entries.append({"name": f"{key} edgec p50", "unit": "ms", "value": result["edgec"]["p50_ms"]})
        entries.append({"name": f"{key} edgec/onnxruntime p50", "unit": "ratio",
                        "value": result["ratio_p50"]})
    return json.dumps(entries, indent=1) + "\n"


# --- HTML: small hand-written SVG charts, so the report needs nothing to render -------------------

def _svg_bars(title: str, labels: list[str], series: dict[str, list[float]], unit: str) -> str:
    """Grouped horizontal bars: one group per label, one bar per series."""
    bar, gap, left, width = 14, 10, 170, 420
    groups = max(len(labels), 1)
    height = 40 + groups * (len(series) * bar + gap) + 20 * len(series)
    peak = max([v for values in series.values() for v in values if v is not None] or [1.0]) or 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 90}" height="{height}" '
             f'role="img"><title>{html.escape(title)}</title>',
             f'<text x="4" y="16" font-weight="bold">{html.escape(title)}</text>']
    y = 30
    for index, label in enumerate(labels):
        parts.append(f'<text x="4" y="{y + bar}" font-size="12">{html.escape(label[:26])}</text>')
        for number, (name, values) in enumerate(series.items()):
            value = values[index]
            if value is None:
                continue
            length = max(1.0, width * value / peak)
            colour = _SERIES_COLOURS[number % len(_SERIES_COLOURS)]
            parts.append(f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{bar - 2}" '
                         f'fill="{colour}"><title>{html.escape(name)}: {value:.4g} {unit}</title></rect>')
            parts.append(f'<text x="{left + length + 4:.1f}" y="{y + bar - 3}" font-size="11">'
                         f'{value:.3g}</text>')
            y += bar
        y += gap
    for number, name in enumerate(series):
        colour = _SERIES_COLOURS[number % len(_SERIES_COLOURS)]
        parts.append(f'<rect x="{left}" y="{y}" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{left + 16}" y="{y + 11}" font-size="12">{html.escape(name)}</text>')
        y += 18
    parts.append("</svg>")
    return "".join(parts)


def _svg_lines(title: str, xlabel: str, series: dict[str, list[tuple[float, float]]]) -> str:
    """Latency against one dim: a polyline with markers per series."""
    left, top, width, height = 60, 30, 460, 220
    points = [p for values in series.values() for p in values]
    if not points:
        return ""
    xmin, xmax = min(p[0] for p in points), max(p[0] for p in points)
    ymax = max(p[1] for p in points) or 1.0
    xspan = (xmax - xmin) or 1.0

    def sx(x: float) -> float:
        return left + width * (x - xmin) / xspan

    def sy(y: float) -> float:
        return top + height - height * y / ymax

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 150}" height="{top + height + 50}" '
             f'role="img"><title>{html.escape(title)}</title>',
             f'<text x="4" y="16" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{left}" y1="{top + height}" x2="{left + width}" y2="{top + height}" stroke="#333"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + height}" stroke="#333"/>',
             f'<text x="{left + width / 2}" y="{top + height + 36}" font-size="12">{html.escape(xlabel)}</text>',
             f'<text x="4" y="{top + 10}" font-size="11">{ymax:.3g} ms</text>',
             f'<text x="{left - 4}" y="{top + height + 14}" font-size="11">{xmin:g}</text>',
             f'<text x="{left + width - 10}" y="{top + height + 14}" font-size="11">{xmax:g}</text>']
    for number, (name, values) in enumerate(series.items()):
        colour = _SERIES_COLOURS[number % len(_SERIES_COLOURS)]
        ordered = sorted(values)
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in ordered)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in ordered:
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}">'
                         f'<title>{html.escape(name)} {xlabel}={x:g}: {y:.4g} ms</title></circle>')
        parts.append(f'<text x="{left + width + 10}" y="{top + 14 + 16 * number}" font-size="12" '
                     f'fill="{colour}">{html.escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _svg_split(result: BenchResult) -> str:
    """The plan's regions as boxes coloured by how they are compiled, with their shapes."""
    regions = result["plan"].get("regions", [])
    box_w, box_h, gap = 260, 110, 30
    width = max(len(regions) * (box_w + gap), 130 * len(_MODE_COLOURS)) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{box_h + 70}" role="img">'
             f'<title>split of {html.escape(result["model"])}</title>']
    for index, region in enumerate(regions):
        x = 10 + index * (box_w + gap)
        colour = _MODE_COLOURS.get(region["mode"], "#999")
        parts.append(f'<rect x="{x}" y="10" width="{box_w}" height="{box_h}" rx="8" fill="{colour}" '
                     f'fill-opacity="0.85" stroke="#222"/>')
        parts.append(f'<text x="{x + 10}" y="30" fill="white" font-weight="bold">{html.escape(region["name"])}: '
                     f'{html.escape(region["mode"])}</text>')
        lines = [",".join(f"{k}={v}" for k, v in s.items()) for s in region["specializations"][:4]]
        if region.get("fallback"):
            lines.append("else: symbolic fallback")
        for number, text in enumerate(lines):
            parts.append(f'<text x="{x + 10}" y="{52 + 15 * number}" fill="white" font-size="12">'
                         f'{html.escape(text[:40])}</text>')
    for number, (mode, colour) in enumerate(_MODE_COLOURS.items()):
        x = 10 + 130 * number
        parts.append(f'<rect x="{x}" y="{box_h + 30}" width="14" height="14" fill="{colour}"/>'
                     f'<text x="{x + 20}" y="{box_h + 42}" font-size="12">{mode}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _dim_series(result: BenchResult) -> tuple[str, dict[str, list[tuple[float, float]]]]:
    """Per-shape p50 against the dim that varies most, per system."""
    shapes = [dict(part.split("=") for part in row["shape"].split(",")) for row in result["per_shape"]
              if row["shape"] != "static"]
    if not shapes:
        return "", {}
    dims = {d for shape in shapes for d in shape}
    dim = max(sorted(dims), key=lambda d: len({shape.get(d) for shape in shapes}))
    series: dict[str, list[tuple[float, float]]] = {}
    for system in _systems(result):
        totals: dict[float, list[float]] = {}
        for row, shape in zip(result["per_shape"], shapes):
            if system in row and dim in shape:
                totals.setdefault(float(shape[dim]), []).append(row[system]["p50_ms"])
        series[system] = [(x, sum(v) / len(v)) for x, v in totals.items()]
    return dim, series


def _html(results: list[BenchResult]) -> str:
    body = ["<h1>edgec benchmark report</h1>"]
    if results:
        machine = results[0]["machine"]
        body.append(f"<p>{html.escape(machine['cpu'])}, {machine['cores']} cores. Latency per call "
                    f"in ms, every system measured in the same run.</p>")
    rows = [summary_row(r) for r in results]
    body.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in _COLUMNS) + "</tr>")
    for row in rows:
        body.append("<tr>" + "".join(f"<td>{html.escape(_fmt(row[c]))}</td>" for c in _COLUMNS) + "</tr>")
    body.append("</table>")
    for result in results:
        systems = _systems(result)
        title = f"{result['model']} on {result['target']}"
        body.append(f"<h2>{html.escape(title)}</h2><h3>Split</h3>")
        body.append(_svg_split(result))
        body.append("<ul>" + "".join(f"<li>{html.escape(line[2:])}</li>" for line in _split_lines(result))
                    + "</ul>")
        body.append(_svg_bars("p50 latency: edgec and baselines", ["all samples"],
                              {s: [_overall(result, s)["p50_ms"]] for s in systems}, "ms"))
        labels = [row["shape"] for row in result["per_shape"]]
        for stat in ("p50_ms", "p99_ms"):
            body.append(_svg_bars(f"{stat[:-3]} latency per shape", labels,
                                  {s: [row[s][stat] if s in row else None for row in result["per_shape"]]
                                   for s in systems}, "ms"))
        dim, series = _dim_series(result)
        if dim:
            body.append(_svg_lines(f"p50 latency against {dim}", dim, series))
    style = ("body{font-family:sans-serif;margin:24px;max-width:1100px}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}svg{display:block;margin:12px 0}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>edgec report</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


@dataclass(frozen=True)
class Report:
    """Rendered report files, by file name."""

    files: dict[str, str]

    def save(self, directory: str | Path) -> list[Path]:
        directory = Path(directory)
        return [write_text(directory / name, text) for name, text in sorted(self.files.items())]


def report(results: list[BenchResult]) -> Report:
    """Render ``results`` as Markdown, HTML, CSV, JSON and github-action-benchmark JSON."""
    rows = [summary_row(r) for r in results]
    return Report({
        "report.md": _markdown(results),
        "report.html": _html(results),
        "report.csv": _csv(results),
        "report.json": json.dumps({"kind": "report", "results": rows}, indent=1) + "\n",
        "benchmark-action.json": _benchmark_action(results),
    })


# --- regression gate ---------------------------------------------------------------------------

def load_baseline(path: str | Path) -> list[dict[str, Any]]:
    """Summary rows from a saved ``report.json`` or a single bench result."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StageInputError(f"baseline '{path}' does not exist; pass a report.json or a bench result") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise StageInputError(f"baseline '{path}' is not JSON; pass a report.json or a bench result") from None
    if isinstance(doc, dict) and doc.get("kind") == "report":
        return doc["results"]
    if isinstance(doc, dict) and doc.get("kind") == "bench":
        return [summary_row(BenchResult.load(path))]
    raise StageInputError(f"baseline '{path}' is neither a report.json nor a bench result")


def compare(results: list[BenchResult], baseline: list[dict[str, Any]], max_regression: float
            ) -> tuple[str, list[str]]:
    """A Markdown table of each result against the baseline row for the same model and target,
    and the list of what regressed beyond ``max_regression`` (0.1 = 10%). A result without a
    baseline row is listed as new; raises :class:`BaselineMismatchError` when no result has one,
    since a gate that compared nothing must not pass."""
    by_key = {(row["model"], row["target"]): row for row in baseline}
    now = [(r["model"], r["target"]) for r in results]
    if not set(now) & set(by_key):
        raise BaselineMismatchError(
            f"no result matches the baseline, so nothing was compared: results {_names(now)}, "
            f"baseline {_names(list(by_key))}; name the model as the baseline does (`--name` on "
            f"compile/build) or make a baseline from these results")
    lines = ["| model | target | metric | baseline | now | change | verdict |", "|---|---|---|---|---|---|---|"]
    regressions = []
    for result in results:
        row = summary_row(result)
        old = by_key.get((row["model"], row["target"]))
        if old is None:
            lines.append(f"| {row['model']} | {row['target']} | all | — | — | — | new |")
            continue
        checks = [
            ("ratio_p50", old["ratio_p50"], row["ratio_p50"],
             row["ratio_p50"] > old["ratio_p50"] * (1 + max_regression)),
            ("max_rel", old["max_rel"], row["max_rel"],
             row["max_rel"] > old["max_rel"] * (1 + max_regression) + 1e-6),
            ("cosine_min", old["cosine_min"], row["cosine_min"],
             row["cosine_min"] < old["cosine_min"] - 1e-4),
        ]
        for metric, before, now, worse in checks:
            change = f"{(now - before) / before:+.1%}" if before else "—"
            verdict = "REGRESSED" if worse else "ok"
            lines.append(f"| {row['model']} | {row['target']} | {metric} | {_fmt(before)} | {_fmt(now)} | "
                         f"{change} | {verdict} |")
            if worse:
                regressions.append(f"{row['model']}/{row['target']} {metric} {_fmt(before)} -> {_fmt(now)}")
    return "\n".join(lines) + "\n", regressions


def _names(keys: list[tuple[str, str]]) -> str:
    return ", ".join(f"{model}/{target}" for model, target in dict.fromkeys(keys)) or "none"


def parse_margin(text: str) -> float:
    """``10%`` or ``0.1`` -> 0.1."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise EdgecError(f"--max-regression '{text}' is not a number or a percentage like 10%") from None
    if value < 0:
        raise EdgecError("--max-regression must not be negative")
    return value
