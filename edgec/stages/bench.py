"""The bench stage: latency, accuracy and size of an artifact beside its baselines, in the same run.

edgec and each baseline run one after the other (never interleaved), each with its warm-up, on
the same samples, after a pause (``SETTLE_S``) in which the previous system's threads go idle:
onnxruntime runs with its default spinning threads, as its users run it. Latencies are per call, wall clock; ratios are
edgec's median over the baseline's median, so machine noise that hits both cancels out. With
``busy`` set, that many CPU-bound background processes run while every system is measured.
"""

from __future__ import annotations

import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from edgec import runtime
from edgec.core import remote
from edgec.core.busy import busy_processes
from edgec.core.model import Model
from edgec.core.provenance import tool_versions
from edgec.core.reference import reference_for, reference_session
from edgec.core.regions import cut_regions
from edgec.core.samples import Sample, sample_dims
from edgec.core.targets import load_target
from edgec.costmodel.decide import dims_key
from edgec.costmodel.features import region_features
from edgec.costmodel.store import append_measurements
from edgec.errors import EdgecError
from edgec.fileio import load_json_value, save_json_value
from edgec.runtime.footprint import runtime_footprint
from edgec.stages.build import build
from edgec.stages.plan import Plan, PlanSettings, Region, check_matches

BENCH_VERSION = 1


@dataclass(frozen=True)
class BenchSettings:
    """How many calls to make per sample, for how long at least, and with how many threads.

    Each system makes ``runs`` measured calls per sample; with ``min_seconds``, it repeats such
    passes over the samples until that much time has passed (as trtexec's ``--duration``), so a
    fast model gets enough calls for its tail percentiles. ``busy`` CPU-bound background processes
    (``edgec.core.busy``) run while the systems are measured: a machine that is not the runtime's
    alone, as an edge device's cores seldom are.
    """

    runs: int = 10
    warmup: int = 2
    threads: int = 2
    min_seconds: float = 0.0
    busy: int = 0

    def check(self) -> None:
        if (self.runs < 1 or self.warmup < 0 or self.threads < 1 or not self.min_seconds >= 0
                or self.busy < 0):
            raise EdgecError("--runs and --threads must be at least 1, --warmup, --min-seconds "
                             "and --busy at least 0")


_PERCENTILES = {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 0.99}


def _stats_table(frame: pd.DataFrame, by: str | list[str]) -> pd.DataFrame:
    """Latency statistics of ``frame``'s ``ms`` column per group of ``by`` (groups in the order
    they first appear): percentiles (linear interpolation, as numpy's), mean, population std,
    min and max, rounded to 0.1 us, and the number of calls."""
    groups = frame.groupby(by, sort=False)["ms"]
    table = pd.concat({name: groups.quantile(q) for name, q in _PERCENTILES.items()}, axis=1)
    table["mean_ms"], table["std_ms"] = groups.mean(), groups.std(ddof=0)
    table["min_ms"], table["max_ms"] = groups.min(), groups.max()
    table = table.round(4)
    table["runs"] = groups.size()
    return table


def _stats_dict(row: pd.Series) -> dict[str, float]:
    """One row of :func:`_stats_table` as the plain JSON values a bench result holds."""
    return {key: int(value) if key == "runs" else float(value) for key, value in row.items()}


def latency_stats(samples_ms: list[float]) -> dict[str, float]:
    """Percentiles and moments of a list of latencies in milliseconds."""
    frame = pd.DataFrame({"ms": np.asarray(samples_ms, dtype=np.float64), "all": 0})
    return _stats_dict(_stats_table(frame, "all").iloc[0])


def compare_outputs(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict[str, float]:
    """Max abs difference, the same relative to the reference's scale, and cosine similarity.

    Taken over every output; a shape mismatch, or NaN/Inf where the reference has none (or the
    other way round), counts as infinitely wrong.
    """
    max_abs, max_rel, cosine_min = 0.0, 0.0, 1.0
    for name, ref in expected.items():
        got = actual[name]
        if got.shape != ref.shape:
            return {"max_abs": float("inf"), "max_rel": float("inf"), "cosine_min": -1.0}
        ref64 = ref.astype(np.float64).ravel()
        got64 = got.astype(np.float64).ravel()
        if ref64.size == 0:
            continue
        finite = np.isfinite(ref64) & np.isfinite(got64)
        if not finite.all():
            # NaN and Inf (from NaN/Inf inputs) must sit at the same places with the same value;
            # the finite rest is then compared as usual.
            if not np.array_equal(ref64[~finite], got64[~finite], equal_nan=True):
                max_abs, max_rel, cosine_min = float("inf"), float("inf"), -1.0
                continue
            ref64, got64 = ref64[finite], got64[finite]
            if ref64.size == 0:
                continue
        diff = float(np.abs(got64 - ref64).max())
        scale = max(float(np.abs(ref64).max()), 1e-12)
        norms = float(np.linalg.norm(ref64) * np.linalg.norm(got64))
        cosine = float(ref64 @ got64 / norms) if norms > 0 else (1.0 if diff == 0 else 0.0)
        max_abs, max_rel = max(max_abs, diff), max(max_rel, diff / scale)
        cosine_min = min(cosine_min, cosine)
    return {"max_abs": max_abs, "max_rel": max_rel, "cosine_min": cosine_min}


@dataclass(frozen=True)
class BenchResult:
    """Measurements of one artifact on one machine. ``data`` is the saved JSON document."""

    data: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def save(self, path: str | Path) -> Path:
        return save_json_value(path, "bench", BENCH_VERSION, self.data)

    @classmethod
    def load(cls, path: str | Path) -> "BenchResult":
        doc = load_json_value(path, "bench", BENCH_VERSION)
        return cls({k: v for k, v in doc.items() if k not in ("kind", "format_version")})


def machine_info() -> dict[str, Any]:
    """CPU model, core count and OS of this machine."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "machine": platform.machine(),
            "system": platform.system()}


def _shape_key(dims: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(dims.items())) or "static"


def git_commit() -> str:
    """The commit of the edgec checkout this code runs from, or "" outside a git checkout."""
    try:
        result = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "HEAD"],
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def _planned_threads(artifact_path: str | Path, target: str | None, require_signature: Any) -> int:
    """The thread count the artifact's plan chose for ``target``'s library (0: none chosen, run
    on the bench's): auto may choose one thread where a second only costs wake-ups."""
    manifest = runtime.open_artifact(artifact_path, require_signature).manifest
    name = load_target(target).name if target and target.endswith(".toml") else target
    chosen = runtime.select_target(manifest, name, str(artifact_path))
    return int(manifest["libraries"][chosen].get("threads") or 0)


def top1_agreement(actual: list[dict[str, np.ndarray]], expected: list[dict[str, np.ndarray]]) -> dict[str, float]:
    """Per float output with a class axis (last dim > 1): how often the argmax agrees."""
    agreement = {}
    for name, ref in expected[0].items():
        if ref.dtype.kind != "f" or ref.ndim == 0 or ref.shape[-1] < 2:
            continue
        hits = total = 0
        for got, want in zip(actual, expected):
            if got[name].shape != want[name].shape:
                continue
            same = np.argmax(got[name], axis=-1) == np.argmax(want[name], axis=-1)
            hits += int(same.sum())
            total += same.size
        agreement[name] = round(hits / total, 6) if total else 0.0
    return agreement


class _Progress:
    """One line on stderr updated in place, only when stderr is a terminal."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label, self.done = total, label, 0
        self.enabled = sys.stderr.isatty()

    def step(self, what: str) -> None:
        self.done += 1
        if self.enabled:
            sys.stderr.write(f"\r{self.label} {self.done}/{self.total} {what[:40]:40s}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


# Seconds between two systems' measurements: onnxruntime's pool spins for a few ms after a run
# (0.04 s of CPU in the 0.5 s after). Timed right after it, edgec's efficientnet_b0 ran up to
# 1.3x slower in some rounds; after a pause of 20 ms or more, in none of 24 (2 cores).
SETTLE_S = 0.1


def _measure(call: Callable, samples: list[Sample], shapes: list[str], settings: BenchSettings,
             progress: _Progress, name: str) -> tuple[dict[str, list[float]], list[dict[str, np.ndarray]]]:
    """Latency per call grouped by shape, and the outputs of the first pass's last call on each
    sample. Passes over the samples repeat until ``settings.min_seconds`` have passed."""
    per_shape: dict[str, list[float]] = defaultdict(list)
    outputs = []
    began = time.perf_counter()
    while not outputs or time.perf_counter() - began < settings.min_seconds:
        first = not outputs
        for sample, shape in zip(samples, shapes):
            for _ in range(settings.warmup if first else 0):
                call(sample.arrays)
            for _ in range(settings.runs):
                start = time.perf_counter()
                out = call(sample.arrays)
                per_shape[shape].append((time.perf_counter() - start) * 1e3)
            if first:
                outputs.append({k: np.array(v) for k, v in out.items()})
                progress.step(f"{name} {sample.name}")
    return per_shape, outputs


def time_calls(call: Callable, model: Model, samples: list[Sample], settings: BenchSettings,
               name: str) -> tuple[dict[str, float], list[dict[str, np.ndarray]]]:
    """One system alone, with this module's timer: its latency stats over every measured call, and
    its outputs per sample, after the settling pause. For comparisons of systems in turn."""
    settings.check()
    time.sleep(SETTLE_S)
    shapes = [_shape_key(sample_dims(model, s)) for s in samples]
    progress = _Progress(len(samples), name)
    per_shape, outputs = _measure(call, samples, shapes, settings, progress, name)
    progress.close()
    return latency_stats([t for ts in per_shape.values() for t in ts]), outputs


def _region_timings(compiled, model: Model, samples: list[Sample], shapes: list[str],
                    edgec_per_shape: dict[str, list[float]], settings: BenchSettings) -> list[dict[str, Any]]:
    """Per region and shape: the measured time of the function the plan runs there, next to the
    time the plan predicted (``None`` when it was made without a cost model).

    A plan of several regions is timed region by region (each region's function called alone on
    the inputs the regions before it produced); a one-region plan's time is ``main``'s.
    """

    if not isinstance(compiled, runtime.Model):
        return []  # only a local VM's times are the cost model's (not RPC's, not qemu's)
    regions = compiled.manifest.get("plan", {}).get("regions", [])
    cuts = cut_regions(model)
    if not regions or len(cuts) != len(regions):
        return []
    multi = any(r.get("inputs") for r in regions)
    built = {f["name"] for f in compiled.manifest["libraries"][compiled.target]["functions"]}
    if multi and not all(r["name"] in built for r in regions):
        return []  # the build compiled the model whole (see build.build): no region to time
    rows = []
    for sample, shape in zip(samples, shapes):
        if any(row["shape"] == shape for row in rows):
            continue
        dims = sample_dims(model, sample)
        if multi:
            args = compiled.to_device_args(sample.arrays)
            env = {spec.name: arg for spec, arg in zip(compiled.inputs, args)}
            times = []
            for region in regions:
                function = compiled._vm[region["name"]]
                region_args = [env[name] for name in region["inputs"]]
                result = function(*region_args)
                outs = [result] if len(region["outputs"]) == 1 else [result[i] for i in range(len(region["outputs"]))]
                env.update(zip(region["outputs"], outs))
                for _ in range(settings.warmup):
                    function(*region_args)
                calls = []
                for _ in range(settings.runs):
                    start = time.perf_counter()
                    function(*region_args)
                    calls.append((time.perf_counter() - start) * 1e3)
                times.append(float(np.median(calls)))
        else:
            times = [float(np.median(edgec_per_shape[shape]))]
        for index, (region, ms) in enumerate(zip(regions, times)):
            specs = region.get("specializations", [])
            hit = any(all(dims.get(d) == v for d, v in spec.items()) for spec in specs)
            option = "symbolic" if not specs else "specialized" if hit else "fallback"
            rows.append({"region": region["name"], "region_index": index, "shape": shape,
                         "dims": dims, "option": option,
                         "measured_ms": round(ms, 5),
                         "predicted_ms": region.get("predicted_ms", {}).get(dims_key(dims))})
    return rows


def record_measurements(target_name: str, model: Model, rows: list[dict[str, Any]],
                        threads: int) -> None:
    """Append bench's per-region timings to the target's measurement store (ONNX models only:
    the cost model's features are read from the ONNX graph)."""

    if model.proto is None:
        return
    target = load_target(target_name)
    cuts = cut_regions(model)
    append_measurements(target, [{
        "kind": "region", "model": model.name, "model_sha256": model.sha256, "target": target.name,
        "region": row["region"], "region_index": row["region_index"],
        "boundary": cuts[row["region_index"]].boundary, "nodes": len(cuts[row["region_index"]].nodes),
        "option": row["option"], "dims": row["dims"],
        "features": region_features(model, cuts[row["region_index"]], row["dims"], row["option"], target),
        "ms": row["measured_ms"], "predicted_ms": row["predicted_ms"], "threads": threads,
        "source": "bench", "pass": 0,
    } for row in rows])


BASELINES = ("onnxruntime", "onnxruntime-1t", "tvm-plain")


def _plain_tvm_build(model: Model, target_name: str, tmp: Path) -> Callable:
    """The same model built by TVM with no plan (symbolic, no specialization), loaded to run."""

    target = load_target(target_name)
    nodes = cut_regions(model, whole=True)[0].nodes
    plain = Plan(model.name, model.sha256, target.name, PlanSettings(policy="symbolic"),
                 [Region("main", nodes, "symbolic" if model.dynamic_dims else "static", [],
                         bool(model.dynamic_dims), [], "baseline: TVM without edgec's plan")], 0.0)
    path = build(model, plain, [target]).save(tmp / "tvm-plain.edgec")
    return runtime.load(path).run


def bench(
    artifact_path: str | Path,
    model: Model,
    samples: list[Sample],
    settings: BenchSettings = BenchSettings(),
    target: str | None = None,
    baselines: tuple[str, ...] = ("onnxruntime", "onnxruntime-1t"),
    require_signature: Any = None,
) -> BenchResult:
    """Benchmark the artifact at ``artifact_path`` against baselines running ``model``.

    ``model`` must be the model the artifact was built from. edgec runs on the thread count its
    plan chose, where it chose one (``costmodel.execution``). Each system runs every sample
    ``warmup`` times unmeasured, then ``runs`` times measured; systems run one after the other,
    edgec first, all beside ``settings.busy`` CPU-bound background processes. The reference is
    always measured, and accuracy and the ratio are against it: ``onnxruntime``
    (``settings.threads`` threads) for an ONNX model, ``torch`` (the program run eagerly) for a
    PyTorch program, which has no ONNX graph for onnxruntime's baselines (the result's ``notes``
    say so). Other baselines: ``onnxruntime-1t`` (one thread) and ``tvm-plain`` (the same model
    built by TVM with no plan, which compiles it here). The result's ``reference`` names the
    reference system, whose stats are under that key.
    """
    settings.check()
    unknown = sorted(set(baselines) - set(BASELINES))
    if unknown:
        raise EdgecError(f"unknown baseline(s) {', '.join(unknown)}; known: {', '.join(BASELINES)}")
    if not samples:
        raise EdgecError("no samples to bench; pass at least one .npz file")
    notes = []
    reference = "onnxruntime"
    if model.kind == "torch":
        reference = "torch"
        dropped = [b for b in baselines if b.startswith("onnxruntime")]
        baselines = tuple(b for b in baselines if b not in dropped)
        notes.append(f"'{model.name}' is a PyTorch program: accuracy and ratio are against torch "
                     f"running it eagerly"
                     + (f"; not run, for want of an ONNX model: {', '.join(dropped)}"
                        if dropped else ""))
    edgec_threads = _planned_threads(artifact_path, target, require_signature) or settings.threads
    start = time.perf_counter()
    # Where the target file says: here, on a device behind an RPC tracker, or under qemu.
    compiled = remote.load(artifact_path, target=target, threads=edgec_threads,
                           require_signature=require_signature)
    load_ms = (time.perf_counter() - start) * 1e3
    check_matches(model, compiled.manifest["model"]["sha256"], "build")
    shapes = [_shape_key(sample_dims(model, s)) for s in samples]
    systems = ["edgec", reference] + [b for b in baselines if b != reference]
    progress = _Progress(len(samples) * len(systems), "bench")
    measured: dict[str, tuple[dict[str, list[float]], list[dict[str, np.ndarray]]]] = {}
    with busy_processes(settings.busy):
        time.sleep(SETTLE_S)
        measured["edgec"] = _measure(compiled.run, samples, shapes, settings, progress, "edgec")
        region_rows = _region_timings(compiled, model, samples, shapes, measured["edgec"][0],
                                      settings)
        peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        with tempfile.TemporaryDirectory(prefix="edgec-bench-") as tmp:
            for name in systems[1:]:
                if name == "tvm-plain":
                    call = _plain_tvm_build(model, compiled.target, Path(tmp))
                elif name == "torch":
                    call = reference_for(model).run
                else:
                    threads = 1 if name == "onnxruntime-1t" else settings.threads
                    call = reference_session(model.proto, threads=threads, spinning=True).run
                time.sleep(SETTLE_S)
                measured[name] = _measure(call, samples, shapes, settings, progress, name)
    progress.close()

    reference_outputs = measured[reference][1]
    rows = [compare_outputs(got, ref) for got, ref in zip(measured["edgec"][1], reference_outputs)]
    accuracy = {
        "max_abs": max(r["max_abs"] for r in rows),
        "max_rel": max(r["max_rel"] for r in rows),
        "cosine_min": min(r["cosine_min"] for r in rows),
        "top1_agreement": top1_agreement(measured["edgec"][1], reference_outputs),
        "per_sample": [{"sample": s.name, **r} for s, r in zip(samples, rows)],
    }
    calls = pd.DataFrame([(system, shape, ms) for system, (per_shape, _) in measured.items()
                          for shape, times in per_shape.items() for ms in times],
                         columns=["system", "shape", "ms"])
    summary = {system: _stats_dict(row) for system, row in _stats_table(calls, "system").iterrows()}
    by_shape = _stats_table(calls, ["shape", "system"])
    per_shape_rows = []
    for shape in dict.fromkeys(shapes):
        stats = {name: _stats_dict(by_shape.loc[(shape, name)]) for name in measured}
        per_shape_rows.append({
            "shape": shape, "samples": shapes.count(shape), **stats,
            "ratio_p50": _ratio(stats["edgec"], stats[reference]),
        })
    library = compiled.manifest["libraries"][compiled.target]
    footprint = runtime_footprint(library.get("native_dependencies", []),
                                  library.get("arch"))
    data = {
        "model": compiled.manifest["model"]["name"],
        "artifact": str(artifact_path),
        "target": compiled.target,
        "run": {"mode": remote.run_mode(target), "device": compiled.device,
                "timing": remote.TIMING[remote.run_mode(target)]},
        "edgec": summary["edgec"],
        "reference": reference,
        reference: summary[reference],
        "ratio_p50": _ratio(summary["edgec"], summary[reference]),
        "baselines": {name: {**summary[name], "ratio_p50": _ratio(summary["edgec"], summary[name])}
                      for name in systems[1:]},
        "accuracy": accuracy,
        "artifact_bytes": Path(artifact_path).stat().st_size,
        "library_bytes": library["bytes"],
        "runtime_bytes": sum(footprint.values()),
        "runtime_files": footprint,
        "load_ms": round(load_ms, 3),
        "peak_rss_mb": round(peak_rss_mb, 1),
        "per_shape": per_shape_rows,
        "regions": region_rows,
        "plan": compiled.manifest.get("plan", {}),
        "quantization": compiled.manifest.get("quantization", {"mode": "none"}),
        "settings": vars(settings),
        "samples": len(samples),
        "machine": {**machine_info(), "threads": settings.threads,
                    "edgec_threads": edgec_threads},
        "versions": tool_versions(),
        "git_commit": git_commit(),
    }
    if notes:
        data["notes"] = notes
    return BenchResult(data)


def summary_line(result: BenchResult) -> str:
    """One line for the terminal: edgec's p50 and each baseline's with edgec's ratio to it, the
    largest difference from onnxruntime, and what the timings hold where they are not plain
    wall clock on this machine (an RPC round trip, qemu), and the background load it ran beside."""
    parts = [f"edgec p50 {result['edgec']['p50_ms']:.3f} ms"]
    for name, stats in result["baselines"].items():
        ratio = "n/a" if stats["ratio_p50"] is None else f"{stats['ratio_p50']:.3f}"
        parts.append(f"{name} {stats['p50_ms']:.3f} ms (edgec/{name} {ratio})")
    line = "; ".join(parts) + f"; max abs diff {result['accuracy']['max_abs']:.3g}"
    busy = result.data.get("settings", {}).get("busy", 0)
    if busy:
        line += f"; beside {busy} busy background process{'es' if busy > 1 else ''}"
    mode = result.data.get("run", {}).get("mode", "local")
    if mode == "rpc":
        line += ("; edgec's times and ratios include the RPC network round trip and the transfer "
                 "of inputs and outputs")
    elif mode == "qemu":
        line += "; edgec's times are not meaningful (qemu emulation), its outputs are"
    return line


def _ratio(edgec: dict[str, float], other: dict[str, float]) -> float | None:
    return round(edgec["p50_ms"] / other["p50_ms"], 4) if other["p50_ms"] > 0 else None
