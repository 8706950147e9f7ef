"""``edgec costmodel collect --execution``: time whole models under each execution option
(library route or TVM kernels only, every core or one thread; ``costmodel.execution``), quiet and
beside as many CPU-bound processes as the machine has cores, into the target's store.

Each model is profiled and planned with the fixed default policy, then built once per route.
Thread pools are per process and start with the first model loaded, so each thread count is
timed in its own process (``python -m edgec.tools.costmodel.time_execution``), which times every
route's artifact at every profiled shape, in rotated rounds, quiet and then busy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from edgec.core.model import Model
from edgec.core.samples import Sample, sample_dims
from edgec.core.targets import Target
from edgec.costmodel import execution
from edgec.costmodel.decide import dims_key
from edgec.costmodel.features import loop_trips
from edgec.costmodel.store import append_measurements
from edgec.errors import EdgecError, describe
from edgec.runtime import default_threads
from edgec.stages.build import build
from edgec.stages.plan import PlanSettings, plan
from edgec.stages.profile import profile

# Seconds of calls per shape, artifact and round; rounds per load (the median is kept); the
# most frequent shapes timed per model (every option at every shape multiplies: 8 options).
MIN_SECONDS = 0.1
ROUNDS = 3
MAX_SHAPES = 4
# The longest a thread count's timing process may take for one model.
TIMEOUT_S = 1800


def collect_execution(target: Target, cases: Sequence[tuple[str, Model, list[Sample]]],
                      passes: int = 1,
                      progress: Callable[[str], None] = lambda line: None) -> list[dict[str, Any]]:
    """Time each ``(name, model, samples)`` under every execution option of ``target``,
    ``passes`` times; append the rows (kind ``execution``) to the target's store and return
    them. A route that does not build for a model is left out of its rows, and said."""
    options = execution.options_for(target)
    rows: list[dict[str, Any]] = []
    for name, model, samples in cases:
        prof = profile(model, samples)
        the_plan = plan(model, prof, target, PlanSettings())
        trips = loop_trips(prof.control_flow)
        groups: dict[str, list[int]] = defaultdict(list)
        dims_of: dict[str, dict[str, int]] = {}
        for index, sample in enumerate(samples):
            dims = sample_dims(model, sample)
            groups[dims_key(dims)].append(index)
            dims_of[dims_key(dims)] = dims
        groups = dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:MAX_SHAPES])
        features = {key: execution.execution_features(model, target, dims_of[key], trips)
                    for key in groups}
        with tempfile.TemporaryDirectory(prefix="edgec-execution-") as tmp:
            folder = Path(tmp)
            for index, sample in enumerate(samples):
                np.savez(folder / f"sample_{index:04d}.npz", **sample.arrays)
            artifacts = {}
            for route in dict.fromkeys(o.route for o in options):
                chosen = replace(the_plan, execution={"route": route, "threads": 0})
                try:
                    artifacts[route] = str(build(model, chosen, [target]).save(
                        folder / f"{route}.edgec"))
                except EdgecError as exc:
                    progress(f"{name}: the {route} route does not build ({describe(exc)})")
            if not artifacts:
                continue
            spec = {"artifacts": artifacts, "groups": {
                key: [str(folder / f"sample_{i:04d}.npz") for i in indices]
                for key, indices in groups.items()}, "busy": default_threads(),
                "min_seconds": MIN_SECONDS, "rounds": ROUNDS}
            (folder / "spec.json").write_text(json.dumps(spec))
            for index in range(passes):
                for threads in dict.fromkeys(o.threads for o in options):
                    timed = _time_in_process(folder / "spec.json", threads or default_threads())
                    for route, by_load in timed.items():
                        for load, by_shape in by_load.items():
                            rows += [{
                                "kind": "execution", "model": name, "model_sha256": model.sha256,
                                "target": target.name, "shape": key, "dims": dims_of[key],
                                "route": route, "threads": threads, "load": load,
                                "busy": spec["busy"] if load == "busy" else 0, "ms": ms,
                                "features": features[key], "source": "collect", "pass": index,
                            } for key, ms in by_shape.items()]
                progress(f"{name} pass {index}: " + ", ".join(
                    f"{r['route']}/{r['threads'] or 'all'}/{r['load']} {r['ms']:.3f} ms"
                    for r in rows if r["model"] == name and r["pass"] == index
                    and r["shape"] == next(iter(groups))))
        append_measurements(target, [r for r in rows if r["model"] == name])
    return rows


def _time_in_process(spec: Path, threads: int) -> dict[str, dict[str, dict[str, float]]]:
    """Run the timing process for ``threads``; its result: route -> load -> shape -> ms."""
    command = [sys.executable, "-m", "edgec.tools.costmodel.time_execution", str(spec),
               str(threads)]
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "TVM_NUM_THREADS")}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        raise EdgecError(f"timing the execution options took over {TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgecError(f"timing the execution options failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])
