"""The report stage: turn bench results into files a person or a CI job reads, and gate regressions.

Writes into the output folder: ``report.md`` (fits a CI job summary), ``report.html`` (matplotlib
plots as inline SVG and a drawing of the split; no network, no JavaScript), ``report.csv`` and
``report.json`` (one row per result, keyed as :data:`COLUMNS`), and ``benchmark-action.json``
(the format github-action-benchmark reads: ``name``, ``unit``, ``value``, smaller is better).

The tables for people (Markdown, HTML) have spelled-out headers and show a percentile only where
enough calls were measured for it (:data:`MIN_CALLS`); the files for machines keep every key.

``compare`` holds results against a baseline report: latency is compared as ``ratio_p50`` (edgec
over onnxruntime measured in the same run, so a slower CI machine is not a regression), accuracy
as ``max_rel`` and ``cosine_min``.
"""

from __future__ import annotations

import functools
import html
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import matplotlib
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from edgec.errors import EdgecError, StageInputError
from edgec.fileio import write_text
from edgec.stages.bench import BenchResult

COLUMNS = (
    "model", "target", "edgec_p50_ms", "edgec_p90_ms", "edgec_p99_ms", "onnxruntime_p50_ms",
    "ratio_p50", "max_abs", "max_rel", "cosine_min", "artifact_bytes", "load_ms",
)
HEADERS = {
    "model": "model", "target": "target", "edgec_p50_ms": "edgec p50 ms",
    "edgec_p90_ms": "edgec p90 ms", "edgec_p99_ms": "edgec p99 ms",
    "onnxruntime_p50_ms": "onnxruntime p50 ms", "ratio_p50": "edgec / onnxruntime p50",
    "max_abs": "max abs diff", "max_rel": "max rel diff", "cosine_min": "min cosine",
    "artifact_bytes": "artifact bytes", "load_ms": "load ms",
}
# A percentile is shown from this many calls up: below it, the p-th percentile rests on fewer than
# one call above it and is the maximum, or an interpolation towards it (p99 of 10 calls).
MIN_CALLS = {"p50_ms": 1, "p90_ms": 10, "p99_ms": 100}
# One colour per system, one per kind of function that ran a shape; no colour means two things.
SYSTEM_COLOURS = {"edgec": "#1f77b4", "onnxruntime": "#ff7f0e", "onnxruntime-1t": "#d62728",
                  "tvm-plain": "#7f7f7f"}
_OTHER_SYSTEM_COLOURS = ("#17becf", "#e377c2", "#bcbd22")
SERVED_COLOURS = {"static": "#9467bd", "specialized": "#2ca02c", "symbolic": "#8c564b",
                  "mixed": "#e6a100"}
SERVED_LABELS = {"static": "static (every dim fixed)", "specialized": "a specialized function",
                 "symbolic": "the symbolic function (fallback)",
                 "mixed": "specialized in some regions, symbolic in others"}
# Deterministic SVG: ids from a fixed salt, text as text (the page's fonts), no creation date.
_SVG_RC = {"svg.hashsalt": "edgec-report", "svg.fonttype": "none", "font.size": 10,
           "font.family": ["DejaVu Sans", "sans-serif"], "axes.spines.top": False,
           "axes.spines.right": False, "axes.grid": True, "grid.color": "#e4e4e4",
           "axes.axisbelow": True}
_SVG_METADATA = {"Date": None, "Creator": None}


class RegressionError(EdgecError):
    """A latency or accuracy got worse than the allowed margin against the baseline."""

    exit_code = 11


class BaselineMismatchError(EdgecError):
    """No result matches a row of the baseline (model and target), so nothing was compared."""

    exit_code = 13


def _fmt(value: Any) -> str:
    """A table cell: floats to four significant digits, missing values as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
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


def _colour(system: str, systems: list[str]) -> str:
    others = [s for s in systems if s not in SYSTEM_COLOURS]
    if system in SYSTEM_COLOURS:
        return SYSTEM_COLOURS[system]
    return _OTHER_SYSTEM_COLOURS[others.index(system) % len(_OTHER_SYSTEM_COLOURS)]


def _shown(stats: dict[str, Any], key: str) -> float | None:
    """``stats[key]`` where enough calls were measured for that percentile, else None."""
    return stats.get(key) if stats.get("runs", 0) >= MIN_CALLS.get(key, 1) else None


def _percentile_note(calls: int) -> str:
    return (f"Percentiles need enough calls: p90 is shown from {MIN_CALLS['p90_ms']} calls, p99 "
            f"from {MIN_CALLS['p99_ms']} (this run: {calls} calls of edgec); bench with more "
            f"--runs or --min-seconds for tails.")


def _dims(shape: str) -> dict[str, int]:
    """``batch=1,seq=8`` -> {"batch": 1, "seq": 8}; ``static`` -> {}."""
    if shape == "static":
        return {}
    return {name: int(value) for name, value in (part.split("=") for part in shape.split(","))}


def served_by(result: BenchResult, shape: str) -> str:
    """Which kind of function the artifact ran for ``shape``: ``static``, ``specialized``,
    ``symbolic`` (the fallback, or a region the plan left symbolic) or ``mixed`` (specialized in
    some regions, symbolic in others), from the plan the artifact was built with."""
    dims, kinds = _dims(shape), set()
    for region in result["plan"].get("regions", []):
        specs = region.get("specializations", [])
        if region.get("mode") == "static":
            kinds.add("static")
        elif any(all(dims.get(d) == v for d, v in spec.items()) for spec in specs):
            kinds.add("specialized")
        else:
            kinds.add("symbolic")
    if not kinds or kinds == {"static"}:
        return "static" if kinds else "symbolic"
    if "symbolic" in kinds:
        return "symbolic" if kinds == {"symbolic"} else "mixed"
    return "specialized"


def summary_row(result: BenchResult) -> dict[str, Any]:
    """One flat row per bench result, keyed as :data:`COLUMNS`: what the tables show and what
    ``compare`` reads."""
    return {
        "model": result["model"], "target": result["target"],
        "edgec_p50_ms": result["edgec"]["p50_ms"], "edgec_p90_ms": result["edgec"]["p90_ms"],
        "edgec_p99_ms": result["edgec"]["p99_ms"],
        "onnxruntime_p50_ms": result["onnxruntime"]["p50_ms"], "ratio_p50": result["ratio_p50"],
        "max_abs": result["accuracy"]["max_abs"], "max_rel": result["accuracy"]["max_rel"],
        "cosine_min": result["accuracy"]["cosine_min"],
        "artifact_bytes": result["artifact_bytes"], "load_ms": result["load_ms"],
    }


def summary_frame(results: list[BenchResult]) -> pd.DataFrame:
    """:func:`summary_row` of every result, one row each, columns in :data:`COLUMNS` order."""
    return pd.DataFrame([summary_row(r) for r in results], columns=list(COLUMNS))


def _summary_for_people(results: list[BenchResult]) -> pd.DataFrame:
    """The summary with human headers, and edgec's p90/p99 blank where too few calls back them."""
    frame = summary_frame(results).astype(object)
    for key in ("edgec_p90_ms", "edgec_p99_ms"):
        frame[key] = [_shown(r["edgec"], key.removeprefix("edgec_")) for r in results]
    return frame.rename(columns=HEADERS)


def shape_frame(result: BenchResult) -> pd.DataFrame:
    """One row per shape and system: the shape, its dims, which function served it, the number
    of samples and that system's latency statistics, shapes ordered by their dims."""
    rows = [{"shape": row["shape"], **{f"dim:{k}": v for k, v in _dims(row["shape"]).items()},
             "samples": row["samples"], "served": served_by(result, row["shape"]),
             "system": system, **row[system]}
            for row in result["per_shape"] for system in _systems(result) if system in row]
    frame = pd.DataFrame(rows)
    dims = sorted(c for c in frame.columns if c.startswith("dim:"))
    return frame.sort_values(dims + ["shape"], kind="stable").reset_index(drop=True) if dims else frame


def _shape_table(result: BenchResult) -> pd.DataFrame:
    """Per shape, for people: samples, which function served it, each system's p50 (and p90
    where enough calls back it) and edgec's ratio to onnxruntime."""
    frame = shape_frame(result)
    table = frame.drop_duplicates("shape")[["shape", "samples", "served"]].set_index("shape")
    table["served"] = table["served"].map(lambda kind: {"symbolic": "symbolic fallback"}.get(kind, kind))
    for system in _systems(result):
        mine = frame[frame["system"] == system].set_index("shape")
        table[f"{system} p50 ms"] = mine["p50_ms"]
        table[f"{system} p90 ms"] = [None if runs < MIN_CALLS["p90_ms"] else p90
                                     for runs, p90 in zip(mine["runs"], mine["p90_ms"])]
    ratios = {row["shape"]: row["ratio_p50"] for row in result["per_shape"]}
    table["edgec / onnxruntime p50"] = [ratios[shape] for shape in table.index]
    table = table.dropna(axis=1, how="all")  # no p90 column where no shape had the calls
    return table.reset_index().rename(columns={"served": "served by"})


def _markdown_table(frame: pd.DataFrame) -> list[str]:
    cells = frame.astype(object).map(_fmt)
    return (["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
            + ["| " + " | ".join(row) + " |" for row in cells.itertuples(index=False)])


def _html_table(frame: pd.DataFrame) -> str:
    return frame.astype(object).map(_fmt).to_html(index=False, border=0, escape=True)


def _calls(results: list[BenchResult]) -> int:
    return min((r["edgec"]["runs"] for r in results), default=0)


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
            "Latency per call in ms, every system measured in the same run; edgec / onnxruntime p50 "
            "is the ratio of their medians (lower is better); accuracy against onnxruntime's outputs. "
            + _percentile_note(_calls(results)),
            "",
        ]
    lines += _markdown_table(_summary_for_people(results))
    for result in results:
        lines += ["", f"## {result['model']} on {result['target']}", ""]
        lines += _split_lines(result)
        lines += _quantization_lines(result)
        lines += _runtime_lines(result)
        lines += [""] + _markdown_table(_shape_table(result))
    return "\n".join(lines) + "\n"


def _csv(results: list[BenchResult]) -> str:
    return summary_frame(results).to_csv(index=False, lineterminator="\n")


def _benchmark_action(results: list[BenchResult]) -> str:
    entries = []
    for result in results:
        key = f"{result['model']}/{result['target']}"
        entries.append({"name": f"{key} edgec p50", "unit": "ms", "value": result["edgec"]["p50_ms"]})
        entries.append({"name": f"{key} edgec/onnxruntime p50", "unit": "ratio",
                        "value": result["ratio_p50"]})
    return json.dumps(entries, indent=1) + "\n"


# --- HTML: matplotlib's SVG, inline ----------------------------------------------------------------

def _styled(chart: Callable[[BenchResult], str]) -> Callable[[BenchResult], str]:
    """``chart`` drawn under the report's matplotlib settings, whatever the caller's are."""

    @functools.wraps(chart)
    def draw(result: BenchResult) -> str:
        with matplotlib.rc_context(_SVG_RC):
            return chart(result)

    return draw


def _svg(figure: Figure) -> str:
    """The figure as an inline ``<svg>`` element, the same bytes for the same figure."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata=_SVG_METADATA, bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _spread(stats: dict[str, Any]) -> tuple[float, float, str]:
    """Whisker ends around the median: min, and p90 where enough calls back it, else max; and
    the name of the upper end."""
    high = _shown(stats, "p90_ms")
    return (stats["min_ms"], stats["max_ms"], "max") if high is None else (stats["min_ms"], high, "p90")


def _latency_bars(axes, labels: list[str], systems: list[str], stats: list[dict[str, dict]],
                  hatched: list[bool]) -> None:
    """Grouped horizontal bars on ``axes``: one group per label (top to bottom), one bar per
    system at its p50 (the value written beside it), whiskers from min to p90 (or max); edgec's
    bar hatched where ``hatched`` says (a shape the symbolic function ran). The axis ends a
    little past the longest bar: a whisker beyond it is cut there and its end written out."""
    height = 0.8 / len(systems)
    bars = [(index, number, system, row[system])
            for index, row in enumerate(stats) for number, system in enumerate(systems)
            if system in row]
    longest = max(stats_["p50_ms"] for *_, stats_ in bars)
    limit = 1.2 * max(min(_spread(stats_)[1], 1.6 * longest) for *_, stats_ in bars)
    for index, number, system, row in bars:
        y = index + (number - (len(systems) - 1) / 2) * height
        low, high, upper = _spread(row)
        p50 = row["p50_ms"]
        axes.barh([y], [p50], height=height * 0.9, color=_colour(system, systems),
                  hatch="///" if system == "edgec" and hatched[index] else None,
                  edgecolor="white", linewidth=0)
        axes.plot([low, min(high, limit)], [y, y], color="#333", linewidth=0.8)
        axes.plot([low], [y], marker="|", color="#333", markersize=4)
        axes.plot([min(high, limit)], [y], marker=">" if high > limit else "|", color="#333",
                  markersize=4)
        text = f"{p50:.3g}" + (f"  ({upper} {high:.3g})" if high > limit else "")
        axes.annotate(text, (min(high, limit), y), xytext=(4, 0), textcoords="offset points",
                      va="center", fontsize=8, color="#333", annotation_clip=False)
    axes.set_yticks(range(len(labels)), labels)
    axes.set_ylim(len(labels) - 0.5, -0.5)
    axes.set_xlim(0, limit)
    axes.set_xlabel("latency per call (ms)")
    axes.grid(axis="y", visible=False)


@_styled
def _overall_chart(result: BenchResult) -> str:
    systems = _systems(result)
    figure = Figure(figsize=(7.5, 0.4 * len(systems) + 1.2), layout="constrained")
    axes = figure.add_subplot()
    _latency_bars(axes, ["all calls"], systems, [{s: _overall(result, s) for s in systems}], [False])
    figure.legend(handles=[Patch(color=_colour(s, systems), label=s) for s in systems],
                  loc="outside right upper", fontsize=8, frameon=False)
    axes.set_title("Every call of every shape: median per system", loc="left", fontsize=11)
    return _svg(figure)


@_styled
def _shape_chart(result: BenchResult) -> str:
    """Per-shape bars; each shape's label says, in its colour, which edgec function ran it; ""
    for a single shape, which the chart of every call shows already."""
    frame = shape_frame(result)
    systems = _systems(result)
    shapes = list(dict.fromkeys(frame["shape"]))
    if len(shapes) < 2:
        return ""
    served = frame.drop_duplicates("shape").set_index("shape")["served"]
    stats = [{row["system"]: row for row in frame[frame["shape"] == shape].to_dict("records")}
             for shape in shapes]
    figure = Figure(figsize=(7.5, 0.2 * len(shapes) * len(systems) + 0.2 * len(shapes) + 1.8),
                    layout="constrained")
    axes = figure.add_subplot()
    words = {"symbolic": "symbolic fallback"}
    _latency_bars(axes, [f"{shape}  ({words.get(served[shape], served[shape])})" for shape in shapes],
                  systems, stats, [served[shape] in ("symbolic", "mixed") for shape in shapes])
    for label, shape in zip(axes.get_yticklabels(), shapes):
        label.set_color(SERVED_COLOURS[served[shape]])
    kinds = [k for k in SERVED_COLOURS if k in set(served)]
    handles = ([Patch(color=_colour(s, systems), label=s) for s in systems]
               + [Patch(facecolor=SYSTEM_COLOURS["edgec"], hatch="///", edgecolor="white",
                        label="edgec on the symbolic function")] * ("symbolic" in kinds)
               + [Line2D([], [], color=SERVED_COLOURS[k], marker="s", linestyle="",
                         label=f"shape label: {SERVED_LABELS[k]}") for k in kinds])
    figure.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    axes.set_title("Per shape: median per system, and which edgec function ran it", loc="left",
                   fontsize=11)
    return _svg(figure)


@_styled
def _dim_chart(result: BenchResult) -> str:
    """p50 against the dim that takes the most values, one panel per value of the other dims
    (a batch size, say), so that no line mixes them; "" when no dim varies."""
    frame = shape_frame(result)
    dims = [c for c in frame.columns if c.startswith("dim:")]
    if not dims:
        return ""
    x = max(sorted(dims), key=lambda d: frame[d].nunique())
    if frame[x].nunique() < 2:
        return ""
    others = [d for d in dims if d != x]
    every = list(frame.groupby(others, sort=True)) if others else [((), frame)]
    panels = every[:6]  # the first six; the tables list every shape
    figure = Figure(figsize=(min(3.2 * len(panels), 11), 3.6), layout="constrained")
    axes_list = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    systems = _systems(result)
    for axes, (key, panel) in zip(axes_list, panels):
        values = key if isinstance(key, tuple) else (key,)
        for system in systems:
            mine = panel[panel["system"] == system].sort_values(x)
            if mine.empty:
                continue
            colour = _colour(system, systems)
            on_top = 3 if system == "edgec" else 2
            axes.plot(mine[x], mine["p50_ms"], color=colour, linewidth=1.5, zorder=on_top)
            for _, row in mine.iterrows():
                symbolic = system == "edgec" and row["served"] in ("symbolic", "mixed")
                axes.plot([row[x]], [row["p50_ms"]], marker="o", markersize=5, color=colour,
                          markerfacecolor="white" if symbolic else colour, zorder=on_top)
        axes.set_xticks(sorted(panel[x].unique()))
        axes.set_xlabel(x[4:])
        axes.set_title(", ".join(f"{d[4:]}={v}" for d, v in zip(others, values)) or "", fontsize=10)
    axes_list[0].set_ylim(0, 1.08 * frame["p50_ms"].max())  # shared by every panel
    axes_list[0].set_ylabel("median latency per call (ms)")
    handles = ([Line2D([], [], color=_colour(s, systems), marker="o", label=s) for s in systems]
               + [Line2D([], [], color=SYSTEM_COLOURS["edgec"], marker="o", markerfacecolor="white",
                         linestyle="", label="edgec on the symbolic function")])
    figure.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8,
                  frameon=False)
    title = f"Median latency against {x[4:]}"
    if others:
        title += ", one panel per " + ", ".join(d[4:] for d in others)
    if len(every) > len(panels):
        title += f" (the first {len(panels)} of {len(every)})"
    figure.suptitle(title, x=0.01, ha="left", fontsize=11)
    return _svg(figure)


def _svg_split(result: BenchResult) -> str:
    """The plan's regions as boxes coloured by how they are compiled, with their shapes."""
    regions = result["plan"].get("regions", [])
    box_w, box_h, gap = 260, 110, 30
    modes = {"static": "static", "specialized": "specialized", "symbolic": "symbolic"}
    width = max(len(regions) * (box_w + gap), 130 * len(modes)) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{box_h + 70}" role="img">'
             f'<title>split of {html.escape(result["model"])}</title>']
    for index, region in enumerate(regions):
        x = 10 + index * (box_w + gap)
        colour = SERVED_COLOURS.get(region["mode"], "#999")
        parts.append(f'<rect x="{x}" y="10" width="{box_w}" height="{box_h}" rx="8" fill="{colour}" '
                     f'stroke="#222"/>')
        parts.append(f'<text x="{x + 10}" y="30" fill="white" font-weight="bold">{html.escape(region["name"])}: '
                     f'{html.escape(region["mode"])}</text>')
        lines = [",".join(f"{k}={v}" for k, v in s.items()) for s in region["specializations"][:4]]
        if region.get("fallback"):
            lines.append("else: symbolic fallback")
        for number, text in enumerate(lines):
            parts.append(f'<text x="{x + 10}" y="{52 + 15 * number}" fill="white" font-size="12">'
                         f'{html.escape(text[:40])}</text>')
    for number, mode in enumerate(modes):
        x = 10 + 130 * number
        parts.append(f'<rect x="{x}" y="{box_h + 30}" width="14" height="14" '
                     f'fill="{SERVED_COLOURS[mode]}"/>'
                     f'<text x="{x + 20}" y="{box_h + 42}" font-size="12">{mode}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{html.escape(caption)}</figcaption></figure>" if svg else ""


def _html(results: list[BenchResult]) -> str:
    body = ["<h1>edgec benchmark report</h1>"]
    if results:
        machine = results[0]["machine"]
        body.append(f"<p>{html.escape(machine['cpu'])}, {machine['cores']} cores. Latency per call "
                    f"in ms, every system measured in the same run. "
                    f"{html.escape(_percentile_note(_calls(results)))}</p>")
    body.append(_html_table(_summary_for_people(results)))
    whiskers = (f"Bars: median (p50), its value beside; whiskers: min to p90 (to max under "
                f"{MIN_CALLS['p90_ms']} calls; an arrow: cut at the axis' end, its value written "
                f"out).")
    for result in results:
        title = f"{result['model']} on {result['target']}"
        calls = result["edgec"]["runs"]
        body.append(f"<h2>{html.escape(title)}</h2><h3>Split</h3>")
        body.append(_svg_split(result))
        body.append("<ul>" + "".join(f"<li>{html.escape(line[2:])}</li>"
                                     for line in _split_lines(result)) + "</ul>")
        body.append("<h3>Latency</h3>")
        body.append(_figure(_overall_chart(result), f"{whiskers} {calls} calls per system."))
        body.append(_figure(_shape_chart(result), whiskers + " Each shape's label, in its "
                            "colour, says which function of the artifact ran it; hatched "
                            "edgec bars ran the symbolic fallback."))
        body.append(_figure(_dim_chart(result), "Medians per shape; a filled dot: edgec ran a "
                            "specialized (or static) function, a hollow one: the symbolic "
                            "fallback."))
        body.append(_html_table(_shape_table(result)))
    style = ("body{font-family:'DejaVu Sans',sans-serif;margin:24px;max-width:1100px}"
             "table{border-collapse:collapse;margin:12px 0}"
             "td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px}th{background:#f3f3f3}"
             "svg{display:block;margin:12px 0;max-width:100%;height:auto}figure{margin:0 0 18px}"
             "figcaption{font-size:13px;color:#444}")
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


# What each gated metric compares, and when its value counts as worse than the baseline's by more
# than the margin m (0.1 = 10%): a latency ratio and an error may grow by m, cosine may not drop.
_GATES = {
    "ratio_p50": lambda before, now, m: now > before * (1 + m),
    "max_rel": lambda before, now, m: now > before * (1 + m) + 1e-6,
    "cosine_min": lambda before, now, m: now < before - 1e-4,
}


def compare(results: list[BenchResult], baseline: list[dict[str, Any]], max_regression: float
            ) -> tuple[str, list[str]]:
    """A Markdown table of each result against the baseline row for the same model and target,
    and the list of what regressed beyond ``max_regression`` (0.1 = 10%). A result without a
    baseline row is listed as new; raises :class:`BaselineMismatchError` when no result has one,
    since a gate that compared nothing must not pass."""
    keys = ["model", "target"]
    base = pd.DataFrame(baseline, columns=list(COLUMNS)).drop_duplicates(keys, keep="last")
    joined = summary_frame(results).merge(base, on=keys, how="left", suffixes=("", "_baseline"),
                                          indicator=True)
    if not (joined["_merge"] == "both").any():
        now = list(zip(joined["model"], joined["target"]))
        raise BaselineMismatchError(
            f"no result matches the baseline, so nothing was compared: results {_names(now)}, "
            f"baseline {_names(list(zip(base['model'], base['target'])))}; bench the baseline's "
            f"targets and name models as it does (`--target`, `--name` on compile/build), or "
            f"make a baseline from these results")
    rows, regressions = [], []
    for _, row in joined.iterrows():
        where = {"model": row["model"], "target": row["target"]}
        if row["_merge"] != "both":
            rows.append({**where, "metric": "all", "baseline": None, "now": None, "change": None,
                         "verdict": "new"})
            continue
        for metric, worse in _GATES.items():
            before, now = row[f"{metric}_baseline"], row[metric]
            regressed = worse(before, now, max_regression)
            rows.append({**where, "metric": metric, "baseline": before, "now": now,
                         "change": f"{(now - before) / before:+.1%}" if before else None,
                         "verdict": "REGRESSED" if regressed else "ok"})
            if regressed:
                regressions.append(f"{row['model']}/{row['target']} {metric} {_fmt(before)} -> "
                                   f"{_fmt(now)}")
    table = pd.DataFrame(rows, columns=["model", "target", "metric", "baseline", "now", "change",
                                        "verdict"])
    return "\n".join(_markdown_table(table)) + "\n", regressions


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
