"""How an artifact executes on a CPU: where its heavy ops run (the route) and on how many threads.

These are the choices that differ by integer factors on a small CPU (measured on this project's
2-core machines): a model of small matmuls runs faster as TVM kernels alone than through
oneDNN's calls (each costs about a microsecond of fixed work, and the library's OpenMP threads
wake per call), and a model too small to share out runs faster, and much steadier beside other
processes, on one thread than on two.

- route ``library``: heavy ops go to the library the target enables (oneDNN on x86, XNNPACK on
  aarch64), as its dispatch rules say; ``tvm``: every op is a TVM kernel, and the device needs
  no library beyond TVM's runtime.
- threads ``0`` (every core of the machine that runs it) or ``1``.

Each option's latency is priced by its own learner (``learn``) from the whole model's features
at a shape (``features.region_features`` over one region holding every node), fitted on
``costmodel collect --execution`` timings, quiet and beside as many CPU-bound processes as the
target has cores (``busy``). The plan picks the option of least expected latency over the
profiled shapes among those whose runtime footprint fits ``--max-runtime-mb``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from edgec.compiler import native
from edgec.compiler.backends import backend_for
from edgec.core.model import Model
from edgec.core.regions import whole_model
from edgec.core.targets import Target
from edgec.costmodel import learn
from edgec.costmodel.features import FEATURE_NAMES, region_features, vector
from edgec.runtime.footprint import runtime_footprint

ROUTES = ("library", "tvm")
# The learners the hand rules' latency is chosen from (by held-out error): few models to learn
# from, so the physically shaped roofline and the small ridge, not the trees. Another option's
# ratio to it has no roofline shape: the ridges (trees, nested in leave-one-model-out, took
# minutes to fit and are left out).
LEARNERS = ("roofline", "ridge-core")
RATIO_LEARNERS = ("ridge-core", "ridge")
# The busy levels options are timed and priced at: quiet, and as many CPU-bound processes as the
# target's cores.
LOADS = ("quiet", "busy")


@dataclass(frozen=True)
class ExecutionOption:
    """One way to execute: ``route`` (``library`` or ``tvm``) and ``threads`` (0: every core)."""

    route: str
    threads: int

    @property
    def label(self) -> str:
        return f"{self.route}, {'all threads' if self.threads == 0 else f'{self.threads} thread'}"

    def key(self, load: str) -> str:
        """The name the option's prices are saved under, per load (``quiet`` or ``busy``)."""
        return f"{self.route}/{self.threads}/{load}"

    def to_json(self) -> dict[str, Any]:
        return {"route": self.route, "threads": self.threads}


# The hand rules on a target with a library (``hand_rules``).
HAND_RULES = ExecutionOption("library", 0)


def load_of(busy: int) -> str:
    """The load whose prices stand for ``busy`` background processes."""
    return "busy" if busy > 0 else "quiet"


def library_route(target: Target) -> str | None:
    """The library the target's file enables (``dnnl``, ``xnnpack``), or None."""
    backend = backend_for(target)
    return next((name for name in backend.library_routes if target.libraries.get(name)), None)


def options_for(target: Target) -> list[ExecutionOption]:
    """The options a target has: both routes when it enables a library, both thread counts on a
    CPU of more than one core; a GPU target has one (its kernels run on the device)."""
    backend = backend_for(target)
    if backend.device != "cpu":
        return [HAND_RULES]
    routes = ROUTES if library_route(target) else ("tvm",)
    cores = int(target.tvm.get("num-cores", 1) or 1)
    threads = (0, 1) if cores > 1 else (0,)
    return [ExecutionOption(route, count) for route in routes for count in threads]


def offered(options: Sequence[ExecutionOption], load: str) -> list[ExecutionOption]:
    """The options a plan may choose at ``load``. Beside busy processes, not TVM's kernels on
    every core: TVM's thread pool then collapses (measured on the zoo, 2 cores beside 2 busy
    processes: 15-250 ms a call against 0.07-0.7 ms quiet on 8 of 23 models), at random, which
    no price learned from a few timings foresees."""
    if load != "busy":
        return list(options)
    return [o for o in options if not (o.route == "tvm" and o.threads == 0)]


def runtime_files(target: Target, route: str) -> dict[str, int]:
    """Bytes per shared library a device needs to run ``target``'s artifacts on ``route``."""
    library = library_route(target) if route == "library" else None
    dependencies = native.ROUTE_DEPENDENCIES.get(library, ()) if library else ()
    return runtime_footprint(dependencies, target.arch)


def execution_features(model: Model, target: Target, dims: Mapping[str, int],
                       trips: Mapping[str, float] | None = None) -> dict[str, float]:
    """The features of the whole ``model`` run at graph dims ``dims``."""
    return region_features(model, whole_model(model), dims, "symbolic", target, trips,
                           static=not model.dynamic_dims)


def fit(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Prices per option and load (``ExecutionOption.key``) from ``rows`` (kind ``execution``:
    ``route``, ``threads``, ``load``, ``features``, ``ms``, ``model``, ``model_sha256``,
    ``shape``).

    The hand rules' latency is learned as such (``LEARNERS``); every other option's as its
    ratio to the hand rules' at the same model, shape and load (``RATIO_LEARNERS``): the choice
    between options is a ratio, and an error in a model's absolute level, which two separate
    fits each make, cancels in it. Each learner is the one of least leave-one-model-out error.
    Returns ``{key: {"latency": learner JSON, "relative_to": the hand rules' key or None,
    "held_out": scores, "rows", "models"}}``.
    """
    by_key: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_key.setdefault(ExecutionOption(row["route"], row["threads"]).key(row["load"]),
                          []).append(row)
    routes = {row["route"] for row in rows}
    baseline = hand_rules([ExecutionOption(route, 0) for route in routes])
    fitted = {}
    for key, group in sorted(by_key.items()):
        load = group[0]["load"]
        base_key = baseline.key(load)
        relative = key != base_key and base_key in by_key
        if relative:
            base_ms = {(r["model_sha256"], r["shape"]): r["ms"] for r in by_key[base_key]}
            group = [r for r in group if (r["model_sha256"], r["shape"]) in base_ms]
        if not group:
            continue
        x = np.asarray([vector(r["features"], FEATURE_NAMES) for r in group])
        y = np.log(np.asarray([max(r["ms"], 1e-4) for r in group]))
        if relative:
            y -= np.log(np.asarray([max(base_ms[(r["model_sha256"], r["shape"])], 1e-4)
                                    for r in group]))
        models = [r["model"] for r in group]
        selection = learn.select_learner(x, y, models, RATIO_LEARNERS if relative else LEARNERS)
        fitted[key] = {"latency": learn.make(selection.learner).fit(x, y).to_json(),
                       "relative_to": base_key if relative else None,
                       "held_out": selection.held_out, "rows": len(group),
                       "models": sorted(set(models))}
    return fitted


class ExecutionPrices:
    """The fitted learners of :func:`fit`, predicting milliseconds per option and load."""

    def __init__(self, fitted: Mapping[str, Any]) -> None:
        self.fitted = dict(fitted)
        self._learners = {key: learn.from_json(doc["latency"]) for key, doc in fitted.items()}

    def covers(self, options: Sequence[ExecutionOption], load: str) -> bool:
        return all(option.key(load) in self._learners for option in options)

    def predict_ms(self, option: ExecutionOption, load: str,
                   features: Sequence[Mapping[str, float]]) -> np.ndarray:
        x = np.asarray([vector(f, FEATURE_NAMES) for f in features])
        return np.exp(self._log_ms(option.key(load), x))

    def _log_ms(self, key: str, x: np.ndarray) -> np.ndarray:
        log_ms = self._learners[key].predict(x)
        base = self.fitted[key].get("relative_to")
        return log_ms + self._log_ms(base, x) if base else log_ms


def expected_ms(prices: ExecutionPrices, option: ExecutionOption, load: str,
                features: Sequence[Mapping[str, float]], shares: Sequence[float]) -> float:
    """The share-weighted latency of ``option`` over the profiled shapes (their features)."""
    return float(np.dot(prices.predict_ms(option, load, features), np.asarray(shares)))


def decide(model: Model, target: Target, distribution: Sequence[tuple[Mapping[str, int], float]],
           trips: Mapping[str, float], prices: ExecutionPrices | None, learned: bool,
           max_runtime_mb: float = 0.0, busy: int = 0) -> dict[str, Any]:
    """The execution a plan records: ``{"route", "threads", "load", "reason", "options"}``.

    ``learned``: pick the option of least predicted expected latency over ``distribution``
    (``prices`` at the load ``busy`` stands for); otherwise the hand rules (``hand_rules``).
    Either way only options ``offered`` at that load whose runtime footprint fits
    ``max_runtime_mb`` (0: no limit) are chosen, and each option's row says its footprint and,
    with prices, its predicted expected latency. Raises ValueError when no option fits the
    budget.
    """
    load = load_of(busy)
    options = options_for(target)
    baseline = hand_rules(options)
    choosable = offered(options, load)
    footprints = {route: sum(runtime_files(target, route).values()) / 1e6
                  for route in {o.route for o in options}}
    fits = [o for o in choosable if not max_runtime_mb or footprints[o.route] <= max_runtime_mb]
    if not fits:
        raise ValueError(f"--max-runtime-mb {max_runtime_mb:g}: the smallest runtime for target "
                         f"'{target.name}' needs {min(footprints.values()):.1f} MB (TVM's "
                         f"runtime with no library); raise the budget")
    predicted: dict[ExecutionOption, float] = {}
    if prices is not None and model.proto is not None and prices.covers(options, load):
        features = [execution_features(model, target, dims, trips) for dims, _ in distribution]
        shares = [share for _, share in distribution]
        predicted = {o: expected_ms(prices, o, load, features, shares) for o in options}
    budget = f"the runtime budget ({max_runtime_mb:g} MB)"
    if learned and predicted:
        chosen = min(fits, key=lambda o: (predicted[o], options.index(o)))
        best = min(choosable, key=lambda o: (predicted[o], options.index(o)))
        where = f"beside {busy} busy process(es)" if busy else "on a quiet machine"
        reason = (f"least predicted expected latency {where}: {predicted[chosen]:.4f} ms; the "
                  f"hand rules ({baseline.label}) {predicted[baseline]:.4f} ms")
        if best != chosen:
            reason += (f"; {budget} excludes {best.label} ({footprints[best.route]:.1f} MB, "
                       f"predicted {predicted[best]:.4f} ms): it costs "
                       f"{predicted[chosen] / predicted[best] - 1:.0%} latency")
    else:
        chosen = baseline if baseline in fits else next(
            (o for o in fits if o.threads == 0), fits[0])
        if chosen == baseline:
            reason = f"the hand rules ({baseline.label})"
        elif baseline not in choosable:
            reason = f"{chosen.label}: {baseline.label} is not offered beside busy processes"
        else:
            reason = (f"{chosen.label}: {budget} excludes the library "
                      f"({footprints[baseline.route]:.1f} MB)")
        if learned:
            reason += (f"; no learned execution prices for target '{target.name}' at load "
                       f"'{load}' (`edgec costmodel collect --execution`, then `edgec costmodel "
                       f"train`)")
        if chosen != baseline and predicted:
            reason += (f"; predicted {predicted[chosen]:.4f} ms against "
                       f"{predicted[baseline]:.4f} ms for the hand rules")
    table = [{**o.to_json(), "runtime_mb": round(footprints[o.route], 2), "fits": o in fits,
              "offered": o in choosable,
              "expected_ms": round(predicted[o], 5) if o in predicted else None,
              "chosen": o == chosen} for o in options]
    return {**chosen.to_json(), "load": load, "reason": reason, "options": table}


def hand_rules(options: Sequence[ExecutionOption]) -> ExecutionOption:
    """What edgec did before the choice was learned: the target's library (when it has one),
    every core."""
    return HAND_RULES if HAND_RULES in options else ExecutionOption("tvm", 0)


def library_fallback(execution: Mapping[str, Any]) -> ExecutionOption | None:
    """The option a build with int8 or bf16 layers (library calls only) takes when its plan
    chose TVM kernels only: the library option the plan priced least among those offered within
    its budget (every core first when unpriced, as the hand rules); None when the budget
    excludes the library."""
    candidates = [o for o in execution.get("options", []) if o["route"] == "library"
                  and o.get("fits", True) and o.get("offered", True)]
    if not candidates:
        return None
    best = min(candidates, key=lambda o: (o.get("expected_ms") is None,
                                          o.get("expected_ms") or 0.0, o["threads"]))
    return ExecutionOption("library", int(best["threads"]))


def chosen_option(execution: Mapping[str, Any]) -> ExecutionOption:
    """The option a plan's ``execution`` record names (the hand rules for a plan made before
    edgec chose one)."""
    if not execution:
        return HAND_RULES
    return ExecutionOption(execution["route"], int(execution["threads"]))
