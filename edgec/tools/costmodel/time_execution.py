"""Time artifacts at each shape with one thread count, quiet and busy (``collect_execution``).

    python -m edgec.tools.costmodel.time_execution SPEC.json THREADS

SPEC holds ``artifacts`` (route -> path), ``groups`` (shape key -> sample files), ``busy`` (the
background processes of the busy load), ``min_seconds`` and ``rounds``. Prints one JSON line:
route -> load -> shape key -> median ms per call. Its own process: the thread pools start once,
with the first model loaded.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from edgec import runtime
from edgec.core.busy import busy_processes


def _per_call_ms(model, samples, min_seconds: float) -> float:
    """Mean ms per call over repeated passes through ``samples`` lasting at least
    ``min_seconds`` (one pass at least)."""
    calls = 0
    start = time.perf_counter()
    while True:
        for sample in samples:
            model.run(sample)
        calls += len(samples)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed / calls * 1e3


def _parallel_kernels(path: str) -> bool:
    """Whether the artifact's TVM kernels run on TVM's thread pool (no library calls)."""
    libraries = runtime.open_artifact(path).manifest["libraries"]
    return any(entry.get("tvm_kernels_parallel", True) for entry in libraries.values())


def main(argv: list[str]) -> None:
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    threads = int(argv[1])
    # TVM's pool takes its size from the first model loaded: a library whose TVM kernels are
    # parallel (the tvm route's) first, or its kernels would run on the one thread a library
    # route's serial kernels ask for.
    paths = spec["artifacts"]
    order = sorted(paths, key=lambda route: not _parallel_kernels(paths[route]))
    models = {route: runtime.load(paths[route], threads=threads) for route in order}
    groups = {key: [dict(np.load(f)) for f in files] for key, files in spec["groups"].items()}
    result: dict[str, dict[str, dict[str, float]]] = {route: {} for route in models}
    for load, busy in (("quiet", 0), ("busy", int(spec["busy"]))):
        with busy_processes(busy):
            for model in models.values():  # warm: first calls create the kernels' state
                for samples in groups.values():
                    for sample in samples:
                        model.run(sample)
            times: dict[tuple[str, str], list[float]] = {}
            routes = list(models)
            for round_index in range(int(spec["rounds"])):
                shift = round_index % len(routes)
                for route in routes[shift:] + routes[:shift]:
                    for key, samples in groups.items():
                        times.setdefault((route, key), []).append(
                            _per_call_ms(models[route], samples, float(spec["min_seconds"])))
        for (route, key), values in times.items():
            result[route].setdefault(load, {})[key] = round(statistics.median(values), 5)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
