"""Timing every option of every region of a model on its samples.

One build holds everything: each region specialized for its hot shapes, so its symbolic function
(``NAME__generic``) and its static ones (``NAME__spec_i``) are all in one VM program and callable
by name. Regions are run in order to get each one's real inputs, then each function is timed
alone on them, on one thread, in CPU time (see ``_time_interleaved``). ``main`` is timed as well, so
the sum of the regions can be checked against the whole.
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Mapping

from edgec import runtime
from edgec.core.model import Model
from edgec.core.samples import Sample, sample_dims
from edgec.core.targets import Target
from edgec.costmodel.decide import dims_key, padded_space, region_space, run_option
from edgec.costmodel.features import loop_trips, region_features
from edgec.stages.build import build
from edgec.stages.plan import Plan, PlanSettings, plan, region_padding
from edgec.stages.profile import Profile


def _time_interleaved(calls: list[Callable[[], Any]], runs: int, warmup: int, batches: int) -> list[float]:
    """Per call, the least over ``batches`` of the median of ``runs`` timed calls, in ms.

    Time is the calling thread's CPU time (``CLOCK_THREAD_CPUTIME_ID``): with one VM thread the
    kernels run on the calling thread, so this is the call's latency on an idle core, and time
    the thread spends descheduled by other processes (the shared build machines run at a load of
    several per core) does not count. The calls take turns batch by batch, so what load still
    does (caches, clock speed) hits every option alike; the least batch median is kept. Kernels
    handed to oneDNN run on its OpenMP threads unless ``OMP_NUM_THREADS=1`` was set before the
    process loaded it (the CLI's ``collect`` and ``plan --policy oracle`` do): else part of
    their time would not count.
    """
    for call in calls:
        for _ in range(warmup):
            call()
    best = [float("inf")] * len(calls)
    for _ in range(batches):
        for index, call in enumerate(calls):
            times = []
            for _ in range(runs):
                start = time.thread_time()
                call()
                times.append((time.thread_time() - start) * 1e3)
            best[index] = min(best[index], statistics.median(times))
    return best


def _outputs(result: Any, count: int) -> list[Any]:
    if count == 1:
        return [result]
    return [result[i] for i in range(count)]


def all_options_plan(model: Model, prof: Profile, target: Target, max_specializations: int,
                     samples: list[Sample] | None = None) -> Plan:
    """The plan that compiles every region with its ``max_specializations`` hottest shapes, with
    regions named ``region_K`` and lowered as separate functions even for a one-region model.
    A region that may pad (``plan.region_padding``, checked on ``samples``) also gets the
    largest profiled shape, the first bucket of ``decide.padded_space``, and pads to them all."""

    base = plan(model, prof, target, PlanSettings("specialize-seen", max_specializations, 0.0),
                one_program=False)
    distribution = prof.shape_distribution()
    whole = len(base.regions) == 1
    regions = []
    for index, region in enumerate(base.regions):
        cut = region.cut(model)
        padding = {}
        specializations = region.specializations
        if region.dims and samples and not base.constant_inputs:
            padding = region_padding(model, cut, index, list(region.dims), distribution, samples, whole)
            if padding["dims"]:
                padding["used"] = True
                space = padded_space(region_space(index, list(region.dims), distribution,
                                                  len(cut.nodes)), tuple(padding["dims"]))
                largest, share = space.hot[0]
                if dict(largest) not in [s["dims"] for s in specializations]:
                    specializations = specializations + [{"dims": dict(largest), "share": round(share, 4)}]
        regions.append(dataclasses.replace(region, name=f"region_{index}", inputs=cut.inputs,
                                           outputs=cut.outputs, padding=padding,
                                           specializations=specializations,
                                           mode="specialized" if specializations else region.mode))
    return dataclasses.replace(base, regions=regions)


@dataclasses.dataclass
class Measured:
    """Rows (one per region, option and shape), the build, and main's own times by shape."""

    rows: list[dict[str, Any]]
    build: dict[str, Any]
    main_ms: dict[str, float]

    def table(self) -> Callable[[int, str, Mapping[str, int]], float]:
        """``(region index, option, graph dims) -> ms``, as ``plan(..., measured=)`` takes it."""
        return latency_table(self.rows)


def latency_table(rows: list[dict[str, Any]]) -> Callable[..., float]:
    """A lookup over measured rows (of one model). Options: ``symbolic`` (one function),
    ``specialized`` (dispatch to a static copy), ``fallback`` (dispatch that finds no copy),
    ``padded`` (dispatch that pads to a bucket: collect timed the least bucket the shape fits;
    another bucket's time is that minus the measured static run at the first plus the one at the
    second)."""
    values: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    buckets: dict[tuple[int, str], dict[str, int]] = {}
    specialized_at: dict[tuple[int, str], list[float]] = defaultdict(list)
    for row in rows:
        values[(row["region_index"], row["option"], dims_key(row["dims"]))].append(row["ms"])
        if row["option"] == "padded":
            buckets[(row["region_index"], dims_key(row["dims"]))] = row["bucket"]
    merged = {k: statistics.median(v) for k, v in values.items()}
    static_rows = [r for r in rows if r["option"] == "specialized"]

    def static_ms(index: int, bucket: Mapping[str, int]) -> float | None:
        key = (index, dims_key(bucket))
        if key not in specialized_at:
            for r in static_rows:
                if r["region_index"] == index and all(r["dims"].get(d) == v for d, v in bucket.items()):
                    specialized_at[key].append(r["ms"])
        return statistics.median(specialized_at[key]) if specialized_at[key] else None

    def lookup(index: int, option: str, graph_dims: Mapping[str, int],
               bucket: Mapping[str, int] | None = None) -> float:
        key = dims_key(graph_dims)
        if option == "padded":
            if (index, option, key) in merged:
                timed = merged[(index, option, key)]
                timed_bucket = buckets[(index, key)]
                if bucket is None or dims_key(bucket) == dims_key(timed_bucket):
                    return timed
                there, here = static_ms(index, timed_bucket), static_ms(index, bucket)
                if there is not None and here is not None:
                    return max(timed - there + here, here)
            option = "fallback"
        if (index, option, key) in merged:
            return merged[(index, option, key)]
        if option == "specialized" and (index, "fallback", key) in merged:
            # Not a hot shape at collect time: a static copy of it was never built; what comes
            # closest is the dispatch into the fallback.
            return merged[(index, "fallback", key)]
        return merged[(index, "symbolic", key)]

    return lookup


def measure_model(model: Model, prof: Profile, samples: list[Sample], target: Target,
                  max_specializations: int = 3, runs: int = 5, warmup: int = 2, batches: int = 3,
                  per_shape: int = 1, threads: int | None = 1, source: str = "collect",
                  pass_index: int = 0) -> Measured:
    """Build ``model`` with every option and time each region's functions at each seen shape."""

    the_plan = all_options_plan(model, prof, target, max_specializations, samples)
    cuts = [r.cut(model) for r in the_plan.regions]
    start = time.perf_counter()
    artifact = build(model, the_plan, [target], exact_dispatch=True)
    compile_s = time.perf_counter() - start
    library = artifact.manifest["libraries"][target.name]
    node_copies = sum(len(r.nodes) * (1 + len(r.specializations)) for r in the_plan.regions)
    weights = sum(len(i.raw_data) for i in model.proto.graph.initializer)
    build_row = {"kind": "build", "model": model.name, "model_sha256": model.sha256,
                 "target": target.name, "node_copies": node_copies,
                 "compile_s": round(compile_s, 3), "library_bytes": library["bytes"],
                 "weight_bytes": weights, "source": source, "pass": pass_index}
    trips = loop_trips(prof.control_flow)
    by_shape: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_shape[dims_key(sample_dims(model, sample))].append(sample)

    rows = []
    main_ms = {}
    with tempfile.TemporaryDirectory(prefix="edgec-measure-") as tmp:
        compiled = runtime.load(artifact.save(Path(tmp) / "all.edgec"), target=target.name,
                                threads=threads)
        vm = compiled._vm
        for key, group in by_shape.items():
            times: dict[tuple[int, str], list[float]] = defaultdict(list)
            buckets: dict[tuple[int, str], dict[str, int]] = {}
            dims = sample_dims(model, group[0])
            main_times = []
            for sample in group[:per_shape]:
                args = compiled.to_device_args(sample.arrays)
                main_times.append(_time_interleaved([lambda: compiled.raw_call(args)], runs, warmup,
                                                    batches)[0])
                env = {spec.name: arg for spec, arg in zip(compiled.inputs, args)}
                for index, region in enumerate(the_plan.regions):
                    region_args = [env[name] for name in region.inputs]
                    result = vm[region.name](*region_args)
                    env.update(zip(region.outputs, _outputs(result, len(region.outputs))))
                    # symbolic: the one function, no dispatch. With specializations the region's
                    # own function dispatches: to a static copy at a hot shape ("specialized"),
                    # to the least bucket the shape fits, padded ("padded"), else, after checking
                    # every hot shape, to the fallback ("fallback"; a padding region's
                    # ``__exact`` dispatch has no buckets, so it is timed at every other shape).
                    functions = {"symbolic": vm[f"{region.name}__generic" if region.specializations
                                                else region.name]}
                    spec_dims = [s["dims"] for s in region.specializations]
                    pad_dims = region.padding.get("dims", []) if region.padding.get("used") else []
                    projected = {d: dims[d] for d in region.dims}
                    hit, bucket = run_option(spec_dims, pad_dims, projected)
                    if region.specializations:
                        functions[hit] = vm[region.name]
                        if hit == "padded":
                            buckets[(index, "padded")] = bucket
                        if pad_dims and hit != "specialized":
                            functions["fallback"] = vm[f"{region.name}__exact"]
                    calls = [lambda f=f: f(*region_args) for f in functions.values()]
                    for option, ms in zip(functions, _time_interleaved(calls, runs, warmup, batches)):
                        times[(index, option)].append(ms)
            main_ms[key] = round(statistics.median(main_times), 5)
            for (index, option), values in times.items():
                region = the_plan.regions[index]
                bucket = buckets.get((index, option))
                rows.append({
                    "kind": "region", "model": model.name, "model_sha256": model.sha256,
                    "target": target.name, "region": region.name, "region_index": index,
                    "boundary": region.boundary, "nodes": len(region.nodes), "option": option,
                    "dims": dims, **({"bucket": bucket} if bucket else {}),
                    "features": region_features(model, cuts[index], dims, option, target, trips,
                                                region.mode == "static", bucket=bucket),
                    "ms": round(statistics.median(values), 5), "runs": runs, "batches": batches, "source": source,
                    "pass": pass_index,
                })
    return Measured(rows, build_row, main_ms)
