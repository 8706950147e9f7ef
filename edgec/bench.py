"""The bench stage: latency, accuracy and size of an artifact beside onnxruntime, in the same run.

edgec and onnxruntime run one after the other (never interleaved, onnxruntime's threads do not
spin), each with its warm-up, on the same samples. Latencies are per call, wall clock; the ratio is
edgec's median over onnxruntime's median, so machine noise that hits both cancels out.
"""

from __future__ import annotations

import os
import platform
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import runtime
from .errors import EdgecError
from .fileio import load_json_value, save_json_value
from .model import Model
from .plan import check_matches
from .provenance import tool_versions
from .reference import reference_session
from .samples import Sample, sample_dims

BENCH_VERSION = 1


@dataclass(frozen=True)
class BenchSettings:
    """How many calls to make per sample, and with how many threads."""

    runs: int = 10
    warmup: int = 2
    threads: int = 2

    def check(self) -> None:
        if self.runs < 1 or self.warmup < 0 or self.threads < 1:
            raise EdgecError("--runs and --threads must be at least 1, --warmup at least 0")


def latency_stats(samples_ms: list[float]) -> dict[str, float]:
    """Percentiles and moments of a list of latencies in milliseconds."""
    values = np.asarray(samples_ms, dtype=np.float64)
    pct = np.percentile(values, [50, 90, 99])
    return {
        "p50_ms": round(float(pct[0]), 4), "p90_ms": round(float(pct[1]), 4),
        "p99_ms": round(float(pct[2]), 4), "mean_ms": round(float(values.mean()), 4),
        "std_ms": round(float(values.std()), 4), "min_ms": round(float(values.min()), 4),
        "max_ms": round(float(values.max()), 4), "runs": int(values.size),
    }


def compare_outputs(actual: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> dict[str, float]:
    """Max abs difference, the same relative to the reference's scale, and cosine similarity.

    Taken over every output; a shape mismatch counts as infinitely wrong.
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
        if not (np.isfinite(ref64).all() and np.isfinite(got64).all()):
            same = np.array_equal(ref64, got64, equal_nan=True)
            diff = 0.0 if same else float("inf")
            max_abs, max_rel = max(max_abs, diff), max(max_rel, diff)
            cosine_min = min(cosine_min, 1.0 if same else -1.0)
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


def bench(
    artifact_path: str | Path,
    model: Model,
    samples: list[Sample],
    settings: BenchSettings = BenchSettings(),
    target: str | None = None,
) -> BenchResult:
    """Benchmark the artifact at ``artifact_path`` against onnxruntime running ``model``.

    ``model`` must be the model the artifact was built from. Every sample is run ``warmup`` times
    unmeasured, then ``runs`` times measured, first all with edgec, then all with onnxruntime.
    """
    settings.check()
    if not samples:
        raise EdgecError("no samples to bench; pass at least one .npz file")
    start = time.perf_counter()
    compiled = runtime.load(artifact_path, target=target, threads=settings.threads)
    load_ms = (time.perf_counter() - start) * 1e3
    check_matches(model, compiled.manifest["model"]["sha256"], "build")
    reference = reference_session(model.proto, threads=settings.threads)

    shapes = [_shape_key(sample_dims(model, s)) for s in samples]
    results = {}
    for name, call in (("edgec", compiled.run), ("onnxruntime", reference.run)):
        per_shape: dict[str, list[float]] = defaultdict(list)
        outputs = []
        for sample, shape in zip(samples, shapes):
            for _ in range(settings.warmup):
                call(sample.arrays)
            for _ in range(settings.runs):
                t0 = time.perf_counter()
                out = call(sample.arrays)
                per_shape[shape].append((time.perf_counter() - t0) * 1e3)
            outputs.append({k: np.array(v) for k, v in out.items()})
        results[name] = (per_shape, outputs)

    accuracy_rows = [compare_outputs(got, ref) for got, ref in
                     zip(results["edgec"][1], results["onnxruntime"][1])]
    accuracy = {
        "max_abs": max(r["max_abs"] for r in accuracy_rows),
        "max_rel": max(r["max_rel"] for r in accuracy_rows),
        "cosine_min": min(r["cosine_min"] for r in accuracy_rows),
        "per_sample": [{"sample": s.name, **r} for s, r in zip(samples, accuracy_rows)],
    }
    summary = {}
    for name, (per_shape, _) in results.items():
        everything = [t for times in per_shape.values() for t in times]
        summary[name] = latency_stats(everything)
    per_shape_rows = []
    for shape in dict.fromkeys(shapes):
        e = latency_stats(results["edgec"][0][shape])
        o = latency_stats(results["onnxruntime"][0][shape])
        per_shape_rows.append({
            "shape": shape, "samples": shapes.count(shape), "edgec": e, "onnxruntime": o,
            "ratio_p50": round(e["p50_ms"] / o["p50_ms"], 4) if o["p50_ms"] > 0 else None,
        })
    artifact_bytes = Path(artifact_path).stat().st_size
    library = compiled.manifest["libraries"][compiled.target]
    data = {
        "model": compiled.manifest["model"]["name"],
        "artifact": str(artifact_path),
        "target": compiled.target,
        "edgec": summary["edgec"],
        "onnxruntime": summary["onnxruntime"],
        "ratio_p50": round(summary["edgec"]["p50_ms"] / summary["onnxruntime"]["p50_ms"], 4),
        "accuracy": accuracy,
        "artifact_bytes": artifact_bytes,
        "library_bytes": library["bytes"],
        "load_ms": round(load_ms, 3),
        "per_shape": per_shape_rows,
        "plan": compiled.manifest.get("plan", {}),
        "settings": vars(settings),
        "samples": len(samples),
        "machine": machine_info(),
        "versions": tool_versions(),
    }
    return BenchResult(data)
