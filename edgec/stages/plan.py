"""The plan stage: decide, from a profile, how each region of a model is compiled.

A plan cuts the model into regions (``edgec.core.regions``: at control flow and data-dependent-shape
ops) and gives each an option:

- ``static``: the region has no symbolic dim; one static function.
- ``symbolic``: one function for every shape.
- ``specialized``: static copies for its hot shapes (assignments of the graph's symbolic dims that
  reach the region) with the symbolic function as fallback for every other shape.

- ``padded``: (``auto`` and ``oracle`` only) a specialized region whose shapes that match no
  static copy run the least larger one (a bucket): inputs zero-padded, outputs sliced back. Only
  where ``edgec.core.padding`` proves no op mixes positions along the padded dims and onnxruntime
  confirms it on the samples; the first bucket is the largest profiled shape.

Policies (the planner decides and records; only ``build`` lowers):

- ``specialize-seen``: per region, the most frequent shapes with a share of at least ``min_share``,
  up to ``max_specializations``.
- ``symbolic``: no specialization.
- ``specialize-then-generalize``: torch.compile's rule: the first shape (here the most frequent
  one) is specialized, every other shape generalizes to the symbolic function.
- ``auto``: per region, the number of hot shapes (0..max) whose expected latency over the
  profiled distribution, as the target's learned cost model predicts it, is least; then the
  compile-time and artifact-size budgets (predicted by the same model) are enforced.
- ``oracle``: as ``auto`` but from measured latencies of every option (``costmodel.measure``);
  for small models, it compiles and times them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from edgec.core import padding
from edgec.core.model import Model
from edgec.core.provenance import tool_versions
from edgec.core.regions import RegionCut, cut_regions, region_dims, region_model
from edgec.core.targets import Target
from edgec.costmodel import decide, execution
from edgec.costmodel.features import loop_trips, region_features
from edgec.costmodel.model import CostModel, default_path, load_for
from edgec.errors import EdgecError, StageInputError
from edgec.fileio import load_json_value, save_json_value
from edgec.stages.profile import Profile

PLAN_VERSION = 1
POLICIES = ("specialize-seen", "symbolic", "specialize-then-generalize", "auto", "oracle")
FIXED_POLICIES = ("symbolic", "specialize-seen", "specialize-then-generalize")


@dataclass(frozen=True)
class PlanSettings:
    """The knobs a plan was made with; saved with it. A budget of 0 means none."""

    policy: str = "specialize-seen"
    max_specializations: int = 4
    min_share: float = 0.1
    max_artifact_mb: float = 0.0
    compile_budget_s: float = 0.0
    # The native libraries a device must hold (TVM's runtime, oneDNN...), in MB; 0: no limit.
    max_runtime_mb: float = 0.0
    # CPU-bound processes expected beside the model on the device: auto prices the execution
    # options (route, threads) as measured beside as many as the target's cores when above 0.
    busy: int = 0

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise EdgecError(f"unknown plan policy '{self.policy}'; known: {', '.join(POLICIES)}")
        if self.max_specializations < 0:
            raise EdgecError("--max-specializations must be 0 or more")
        if not 0.0 <= self.min_share <= 1.0:
            raise EdgecError("--min-share must lie between 0 and 1")
        if self.max_artifact_mb < 0 or self.compile_budget_s < 0 or self.max_runtime_mb < 0:
            raise EdgecError("--max-artifact-mb, --compile-budget-s and --max-runtime-mb must be "
                             "0 (no limit) or more")
        if self.busy < 0:
            raise EdgecError("--busy must be 0 or more")


@dataclass(frozen=True)
class Region:
    """A part of the model and how it is compiled.

    ``specializations`` lists the dim assignments compiled as static functions, each with the share
    of profiled samples it serves (and, for a whole-model region, the reference latency). ``inputs``
    and ``outputs`` are the values it reads and hands on (empty lists: the graph's own), ``dims``
    the graph dims it can specialize on, ``options`` the table the planner chose from.
    """

    name: str
    nodes: list[str]
    mode: str
    specializations: list[dict[str, Any]]
    fallback: bool
    dynamic_nodes: list[str]
    reason: str
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    boundary: str = ""
    dims: list[str] = field(default_factory=list)
    options: list[dict[str, Any]] = field(default_factory=list)
    # Padding to buckets (``edgec.core.padding``): {"used", "dims", "inputs", "outputs", "proofs",
    # "refused", "check"}; empty when the region has no dim the profile could pad.
    padding: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "nodes": self.nodes, "mode": self.mode,
            "specializations": self.specializations, "fallback": self.fallback,
            "dynamic_nodes": self.dynamic_nodes, "reason": self.reason,
            "inputs": self.inputs, "outputs": self.outputs, "boundary": self.boundary,
            "dims": self.dims, "options": self.options, "padding": self.padding,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Region":
        return cls(doc["name"], doc["nodes"], doc["mode"], doc["specializations"],
                   doc["fallback"], doc["dynamic_nodes"], doc["reason"],
                   doc.get("inputs", []), doc.get("outputs", []), doc.get("boundary", ""),
                   doc.get("dims", []), doc.get("options", []), doc.get("padding", {}))

    def cut(self, model: Model):
        return RegionCut(self.nodes, self.inputs or [i.name for i in model.proto.graph.input],
                         self.outputs or [o.name for o in model.proto.graph.output], self.boundary)


@dataclass(frozen=True)
class Plan:
    """Regions and their compile decisions for one model and target.

    ``predicted`` holds what the cost model expects of the plan (expected latency, compile
    seconds, artifact bytes) when one was used; ``extra`` keeps keys other stages add to the JSON.
    """

    model_name: str
    model_sha256: str
    target: str
    settings: PlanSettings
    regions: list[Region]
    coverage: float
    versions: dict[str, str] = field(default_factory=tool_versions)
    # Shape-like inputs compiled as a fixed value: {name: {"dtype", "shape", "value", "reason"}}.
    constant_inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    predicted: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # How the artifact executes (``costmodel.execution.decide``): route, threads, why, options.
    execution: dict[str, Any] = field(default_factory=dict)

    def save(self, path: str | Path) -> Path:
        payload = {
            **self.extra,
            "model": {"name": self.model_name, "sha256": self.model_sha256},
            "target": self.target,
            "settings": vars(self.settings),
            "coverage": self.coverage,
            "regions": [r.to_json() for r in self.regions],
            "constant_inputs": self.constant_inputs,
            "predicted": self.predicted,
            "execution": self.execution,
            "versions": self.versions,
        }
        return save_json_value(path, "plan", PLAN_VERSION, payload)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        doc = load_json_value(path, "plan", PLAN_VERSION)
        known = {"kind", "format_version", "model", "target", "settings", "coverage", "regions",
                 "predicted", "constant_inputs", "versions", "execution"}
        settings = {k: v for k, v in doc["settings"].items() if k in PlanSettings.__dataclass_fields__}
        return cls(
            model_name=doc["model"]["name"], model_sha256=doc["model"]["sha256"],
            target=doc["target"], settings=PlanSettings(**settings),
            regions=[Region.from_json(r) for r in doc["regions"]],
            coverage=doc["coverage"], versions=doc["versions"],
            constant_inputs=doc.get("constant_inputs", {}),
            predicted=doc.get("predicted", {}),
            extra={k: v for k, v in doc.items() if k not in known},
            execution=doc.get("execution", {}),
        )

    @property
    def multi_region(self) -> bool:
        """Whether build lowers it as several region functions called by ``main``."""
        return len(self.regions) > 1 or bool(self.regions and self.regions[0].inputs)

    def summary(self) -> dict[str, Any]:
        """The part of the plan an artifact's manifest keeps (bench times regions from it)."""
        return {
            "policy": self.settings.policy, "coverage": self.coverage,
            "predicted": self.predicted,
            "regions": [
                {"name": r.name, "mode": r.mode, "fallback": r.fallback,
                 "specializations": [s["dims"] for s in r.specializations], "reason": r.reason,
                 "inputs": r.inputs, "outputs": r.outputs, "boundary": r.boundary,
                 "predicted_ms": next((o.get("predicted_ms", {}) for o in r.options if o.get("chosen")), {})}
                for r in self.regions
            ],
            "constant_inputs": {name: c["reason"] for name, c in self.constant_inputs.items()},
            "execution": {k: v for k, v in self.execution.items() if k != "options"},
        }

    def explain(self) -> str:
        """A table per region: its options, predicted cost, which was chosen and why."""
        lines = [f"plan for {self.model_name} on {self.target}, policy {self.settings.policy}"]
        if self.predicted:
            lines.append("predicted: " + ", ".join(f"{k} {v}" for k, v in self.predicted.items()))
        lines += _execution_lines(self.execution)
        for region in self.regions:
            lines.append("")
            lines.append(f"region {region.name} ({len(region.nodes)} nodes"
                         f"{', ' + region.boundary if region.boundary else ''}; dims "
                         f"{', '.join(region.dims) or 'none'}): {region.mode}")
            if region.options:
                # The option's label last and whole: its shapes tell the rows apart.
                lines.append(f"  {'expected ms':>12s} {'compile s':>10s} {'chosen':>7s}  option")
                for option in region.options:
                    expected = option.get("expected_ms")
                    compile_s = option.get("compile_s")
                    lines.append(
                        f"  {(f'{expected:.4f}' if expected is not None else '-'):>12s} "
                        f"{(f'{compile_s:.2f}' if compile_s is not None else '-'):>10s} "
                        f"{('yes' if option.get('chosen') else ''):>7s}  {option['option']}")
            lines.append(f"  why: {region.reason}")
            lines += [f"  padding {dim}: {decision}"
                      for dim, decision in _padding_decisions(region.padding)]
            if region.padding.get("check"):
                lines.append(f"  padding check: {region.padding['check']}")
        return "\n".join(lines)


def _execution_lines(record: dict[str, Any]) -> list[str]:
    """The execution decision as explain shows it: each option, its runtime footprint and
    predicted expected latency, which was chosen and why."""
    if not record:
        return []
    threads = "every core" if record["threads"] == 0 else f"{record['threads']} thread"
    lines = ["", f"execution ({record['load']} machine): {record['route']} route, {threads}",
             f"  {'expected ms':>12s} {'runtime MB':>10s} {'chosen':>7s}  route, threads"]
    for option in record.get("options", []):
        expected = option.get("expected_ms")
        fits = ("  (not offered beside busy processes)" if not option.get("offered", True)
                else "" if option.get("fits", True) else "  (over --max-runtime-mb)")
        lines.append(f"  {(f'{expected:.4f}' if expected is not None else '-'):>12s} "
                     f"{option['runtime_mb']:>10.2f} {('yes' if option.get('chosen') else ''):>7s}"
                     f"  {option['route']}, {option['threads'] or 'all'}{fits}")
    lines.append(f"  why: {record['reason']}")
    return lines


def _padding_decisions(padding: dict[str, Any]) -> list[tuple[str, str]]:
    """Per dim of a region's ``padding`` (policies auto and oracle), the decision first (padded or
    not) and then why, so a proof of safety never reads as the decision."""
    decisions = []
    proofs, refused = padding.get("proofs", {}), padding.get("refused", {})
    for dim in dict.fromkeys([*proofs, *refused]):
        proof = proofs.get(dim)
        if dim in refused:
            decision = f"not padded: {refused[dim]}" + (f" (proved safe: {proof})" if proof else "")
        elif padding.get("used"):
            decision = f"padded (proved safe: {proof})"
        else:
            decision = (f"proved safe, not chosen: an option without padding has the lower "
                        f"expected latency (proof: {proof})")
        decisions.append((dim, decision))
    return decisions


def check_matches(model: Model, model_sha256: str, what: str) -> None:
    """Refuse a saved stage result that was made for another model."""
    if model_sha256 != model.sha256:
        raise StageInputError(
            f"the {what} was made for another model (sha256 {model_sha256[:12]}…, this model "
            f"{model.sha256[:12]}…); rerun `edgec {what}` on this model"
        )


# Where an oracle's or a test's latencies come from: (region index, option, graph dims) -> ms.
LatencyTable = Callable[[int, str, Mapping[str, int]], float]


def plan(model: Model, prof: Profile, target: Target, settings: PlanSettings = PlanSettings(),
         cost_model=None, measured: LatencyTable | None = None, samples: list | None = None,
         *, one_program: bool | None = None) -> Plan:
    """Decide how to compile ``model`` for ``target`` from what ``prof`` observed.

    ``auto`` uses ``cost_model`` (default: the target's committed one); ``oracle`` needs
    ``measured`` (see ``costmodel.measure.latency_table``). Both may pad a region's shapes to
    buckets where ``edgec.core.padding`` proves it safe and ``samples`` (the profiled ones) confirm it.
    Both also choose the execution (library route and threads, ``costmodel.execution``) by the
    cost model's learned prices; the fixed policies keep the hand rules. Every policy keeps the
    runtime within ``settings.max_runtime_mb``.

    ``one_program``: None plans the model as one program when its regions all choose alike (see
    :func:`_choices_alike`); False keeps the regions (measuring and evaluating them needs that);
    True plans one program.
    """
    settings.check()
    planned = _plan_regions(model, prof, target, settings, cost_model, measured, samples,
                            one_program=one_program)
    return replace(planned, execution=_execution(model, prof, target, settings, cost_model))


def _execution(model: Model, prof: Profile, target: Target, settings: PlanSettings,
               cost_model) -> dict[str, Any]:
    """The plan's execution record (``costmodel.execution.decide``): learned for ``auto`` and
    ``oracle`` (regions are timed there, not executions), the hand rules otherwise."""
    learned = settings.policy in ("auto", "oracle")
    wanted = learned or settings.max_runtime_mb  # prices decide, or say what the budget costs
    if cost_model is None and wanted and default_path(target).is_file():
        cost_model = CostModel.load(default_path(target))
    prices = cost_model.execution_prices() if cost_model is not None else None
    try:
        return execution.decide(model, target, prof.shape_distribution() or [({}, 1.0)],
                                loop_trips(prof.control_flow), prices, learned,
                                settings.max_runtime_mb, settings.busy)
    except ValueError as exc:
        raise StageInputError(str(exc)) from None


def _plan_regions(model: Model, prof: Profile, target: Target, settings: PlanSettings,
                  cost_model=None, measured: LatencyTable | None = None,
                  samples: list | None = None, *, one_program: bool | None = None) -> Plan:
    """``plan`` without the execution decision: the regions and their options."""
    check_matches(model, prof.model_sha256, "profile")
    fixed = constant_inputs(model, prof)
    # Inputs compiled as constants are folded into the whole graph's import: such a model stays
    # one region. A PyTorch program is one region too (regions cut ONNX graphs).
    cuts = cut_regions(model, whole=bool(fixed) or one_program is True)
    dynamic_nodes = [name for name, _ in model.control_flow]
    distribution = prof.shape_distribution()
    whole = len(cuts) == 1
    if not model.dynamic_dims and whole:
        region = Region("main", cuts[0].nodes, "static", [], False, dynamic_nodes,
                        "every input dim is fixed: one static function")
        return Plan(model.name, model.sha256, target.name, settings, [region], 1.0,
                    constant_inputs=fixed)

    spaces = []
    all_dims = []
    paddings: list[dict[str, Any]] = []
    for index, cut in enumerate(cuts):
        dims = region_dims(model, cut)
        all_dims.append(dims)
        graph_dims = [d for d in dims if d in model.dynamic_dims]
        spaces.append(decide.region_space(index, graph_dims, distribution, len(cut.nodes)))
        paddings.append(region_padding(model, cut, index, graph_dims, distribution, samples, whole)
                        if settings.policy in ("auto", "oracle") and model.proto is not None
                        and not fixed else {})

    latency, cost_model = _latency_source(model, prof, target, settings, cuts, cost_model, measured)
    budgets = decide.Budgets(settings.compile_budget_s, settings.max_artifact_mb * 1e6)
    if cost_model is not None:
        budgets.seconds_of = cost_model.compile_seconds
        budgets.bytes_of = cost_model.library_bytes
        budgets.fixed_bytes = float(sum(len(i.raw_data) for i in model.proto.graph.initializer))
    elif settings.compile_budget_s or settings.max_artifact_mb:
        if default_path(target).is_file():
            loaded = CostModel.load(default_path(target))
            budgets.seconds_of, budgets.bytes_of = loaded.compile_seconds, loaded.library_bytes
            budgets.fixed_bytes = float(sum(len(i.raw_data) for i in model.proto.graph.initializer))
        else:
            raise StageInputError(f"--compile-budget-s and --max-artifact-mb need a cost model for "
                                  f"target '{target.name}'; run `edgec costmodel train` first")

    ks, whys = [], []
    plain_spaces = list(spaces)
    for index, space in enumerate(plain_spaces):
        pad_dims = tuple(paddings[index].get("dims", ()))
        k, why, chosen_space = _policy_choice(space, settings, distribution, latency,
                                              prof.sample_count, pad_dims)
        spaces[index] = chosen_space
        ks.append(k)
        whys.append(why)
    if latency is not None:
        def loss(space, k):
            return (decide.expected_ms(space, k - 1, distribution, latency)
                    - decide.expected_ms(space, k, distribution, latency))
    else:
        def loss(space, k):
            return space.hot[k - 1][1]
    wanted = list(ks)
    ks, notes = decide.fit_budgets(spaces, ks, budgets, loss)
    for index, (want, got) in enumerate(zip(wanted, ks)):
        if got < want:
            whys[index] += (f"; cut to {got} specialization(s) to fit the predicted compile-time/"
                            f"artifact budget")
    if notes and notes[-1].startswith("budget cannot"):
        whys = [w + f"; {notes[-1]}" for w in whys]

    reference = {tuple(sorted(s["dims"].items())): s["reference_ms"] for s in prof.shapes}
    regions = []
    for index, (cut, space, k, why) in enumerate(zip(cuts, spaces, ks, whys)):
        name = "main" if whole else f"region_{index}"
        options = _options_table(plain_spaces[index], space, k, settings, distribution, latency,
                                 budgets, paddings[index].get("dims", ())) if space.dims else []
        padding = dict(paddings[index])
        if padding:
            padding["used"] = bool(space.pad_dims and k > 0)
            if padding["used"]:
                why += ("; shapes not specialized that fit a bucket run it padded ("
                        f"{', '.join(space.pad_dims)}): {'; '.join(padding['proofs'].values())}; "
                        f"checked: {padding['check']}")
        chosen = []
        for shape, share in space.hot[:k]:
            entry = {"dims": dict(shape), "share": round(share, 4)}
            if whole:
                entry["reference_ms"] = reference.get(tuple(sorted(shape)))
            chosen.append(entry)
        if not all_dims[index]:
            mode, fallback, why = "static", False, "no symbolic dim reaches this region: one static function"
        elif chosen:
            mode, fallback = "specialized", True
        else:
            mode, fallback = "symbolic", True
            if not space.dims:
                why = (f"its dims ({', '.join(all_dims[index])}) depend on values, not on the "
                       f"profiled input dims: one symbolic function")
        regions.append(Region(
            name, cut.nodes, mode, chosen, fallback,
            [n for n in dynamic_nodes if n in cut.nodes], why,
            [] if whole else cut.inputs, [] if whole else cut.outputs, cut.boundary,
            list(space.dims), options, padding))
    coverage = _coverage(spaces, ks, distribution)
    predicted = {}
    if latency is not None:
        predicted["expected_ms"] = round(sum(decide.expected_ms(s, k, distribution, latency)
                                             for s, k in zip(spaces, ks)), 5)
    seconds, size = decide.totals(spaces, ks, budgets)
    if seconds is not None:
        predicted["compile_s"] = round(seconds, 2)
        predicted["artifact_mb"] = round(size / 1e6, 3)
    if one_program is None and not whole and _choices_alike(regions):
        merged = _plan_regions(model, prof, target, settings, cost_model, measured, samples,
                               one_program=True)
        # Measured on moe: 9 regions took 52 us per call, the one program 35 us.
        note = (f"one program, not {len(regions)} regions: every region chose the same "
                f"specializations, and each region boundary costs a VM call with its argument "
                f"checks")
        return replace(merged, regions=[replace(r, reason=f"{r.reason}; {note}")
                                        for r in merged.regions])
    return Plan(model.name, model.sha256, target.name, settings, regions, coverage, predicted=predicted,
                constant_inputs=fixed)


def _choices_alike(regions: list[Region]) -> bool:
    """Whether one program specialized like the region with the most dims would run every region
    as its own plan does: no region pads, and every other region's specializations are that
    region's, restricted to its own dims.

    Regions let each part of a model choose its own option; when none does, cutting only adds
    the calls between regions (fixed policies choose alike by construction: every region sees the
    same input-dim distribution).
    """
    if any(region.padding.get("used") for region in regions):
        return False
    chosen = [(set(region.dims), {tuple(sorted(spec["dims"].items()))
                                  for spec in region.specializations})
              for region in regions if region.dims]
    if not chosen:
        return True
    widest_dims, widest = max(chosen, key=lambda entry: len(entry[0]))
    return all(specs == {tuple((d, v) for d, v in shape if d in dims) for shape in widest}
               for dims, specs in chosen)


def region_padding(model: Model, cut, index: int, dims: list[str], distribution, samples,
                   whole: bool) -> dict[str, Any]:
    """The padding a region may use (``edgec.core.padding.region_padding``) on its ONNX graph."""

    proto = model.proto if whole else region_model(model, cut, f"region_{index}")
    return padding.region_padding(model, cut, proto, dims, distribution, samples)


def _coverage(spaces, ks, distribution) -> float:
    """The share of samples every region of which runs a specialized (or static) function,
    padded or not."""

    covered = 0.0
    for graph_dims, share in distribution:
        if all(not s.dims or decide.option_at(s, k, graph_dims)[0] in ("specialized", "padded")
               for s, k in zip(spaces, ks)) and \
                any(k > 0 for k in ks):
            covered += share
    return round(covered, 4)


def _latency_source(model, prof, target, settings, cuts, cost_model, measured):
    """The latency function the plan predicts with (the one ``auto`` and ``oracle`` decide by;
    the fixed policies only record it, and it is None for them without a cost model), and the
    cost model (for budgets)."""
    if model.proto is None:  # the cost model's features are read from the ONNX graph
        if settings.policy in ("auto", "oracle"):
            raise EdgecError(f"policy {settings.policy} plans ONNX models; plan a PyTorch program "
                             f"with --policy specialize-seen, specialize-then-generalize or symbolic")
        if settings.compile_budget_s or settings.max_artifact_mb:
            raise EdgecError("--compile-budget-s and --max-artifact-mb need the cost model, which "
                             "reads ONNX models; leave them out for a PyTorch program")
        return None, None
    if settings.policy == "oracle":
        if measured is None:
            raise EdgecError("policy oracle measures every option: pass samples "
                             "(`edgec plan --policy oracle --samples DIR`)")
        return measured, cost_model

    if settings.policy != "auto":
        # A fixed policy decides without the cost model; with one at hand, the plan still
        # records its predictions (bench sets them beside its measurements).
        if cost_model is None and not default_path(target).is_file():
            return None, None
        try:
            cost_model = cost_model or CostModel.load(default_path(target))
        except EdgecError:
            return None, None
    cost_model = cost_model or load_for(target)
    trips = loop_trips(prof.control_flow)
    static_regions = [not region_dims(model, cut) for cut in cuts]
    cache: dict[tuple, float] = {}

    def predict(index: int, option: str, graph_dims: Mapping[str, int],
                bucket: Mapping[str, int] | None = None) -> float:
        key = (index, option, tuple(sorted(graph_dims.items())),
               tuple(sorted(bucket.items())) if bucket else ())
        if key not in cache:
            feats = region_features(model, cuts[index], graph_dims, option, target, trips,
                                    static=static_regions[index], bucket=bucket)
            cache[key] = float(cost_model.predict_ms([feats])[0])
        return cache[key]

    if settings.policy != "auto":
        try:
            predict(0, "symbolic", prof.shape_distribution()[0][0] if prof.shapes else {})
        except Exception:  # predictions are a record only here: a model they fail on plans without
            return None, cost_model
    return predict, cost_model


def _policy_choice(space, settings: PlanSettings, distribution, latency, samples: int,
                   pad_dims: tuple[str, ...] = ()):
    """How many hot shapes the policy specializes in this region, why, and the space chosen
    from (``space`` itself, or its padded variant, ``decide.padded_space``)."""

    if not space.dims:
        return 0, "no profiled dim reaches this region", space
    limit = min(settings.max_specializations, len(space.hot))
    policy = settings.policy
    if policy == "symbolic":
        return 0, "policy symbolic: one symbolic function", space
    if policy == "specialize-then-generalize":
        k = min(1, limit)
        return k, ("policy specialize-then-generalize: the most frequent shape is specialized, "
                   "every other generalizes to the symbolic fallback"), space
    if policy == "specialize-seen":
        k = 0
        while k < limit and space.hot[k][1] >= settings.min_share:
            k += 1
        if k == 0:
            return 0, f"no shape reached {settings.min_share:.0%} of {samples} samples: symbolic", space
        coverage = sum(share for _, share in space.hot[:k])
        return k, (f"policy specialize-seen: {k} shape(s) each seen in at least "
                   f"{settings.min_share:.0%} of {samples} samples cover {coverage:.0%}; every "
                   f"other shape runs the symbolic fallback"), space
    source = "predicted" if policy == "auto" else "measured"
    # Candidates: (space, k). The padded variant's first bucket is the largest profiled shape.
    candidates = [(space, k) for k in range(limit + 1)]
    padded = decide.padded_space(space, pad_dims) if pad_dims else None
    if padded is not None:
        candidates += [(padded, k) for k in range(1, limit + 1)]
    costs = [decide.expected_ms(s, k, distribution, latency) for s, k in candidates]
    # The least expected latency; an exact tie goes to fewer functions (less to compile), then to
    # no padding. What more functions cost is the budgets' business.
    best = min(range(len(candidates)),
               key=lambda i: (costs[i], candidates[i][1], bool(candidates[i][0].pad_dims)))
    chosen, k = candidates[best]
    if k == 0:
        why = (f"{policy}: symbolic is the least {source} expected latency "
               f"({costs[0]:.4f} ms; best other option {min(costs[1:], default=costs[0]):.4f} ms)")
    elif chosen.pad_dims:
        why = (f"{policy}: {k} bucket(s), the largest profiled shape first, with every smaller "
               f"shape padded to the least bucket it fits, gives the least {source} expected "
               f"latency, {costs[best]:.4f} ms against {costs[0]:.4f} ms symbolic and "
               f"{min(costs[1:limit + 1], default=costs[0]):.4f} ms for the best unpadded option")
    else:
        why = (f"{policy}: specializing the {k} hottest shape(s) gives the least {source} "
               f"expected latency, {costs[best]:.4f} ms against {costs[0]:.4f} ms symbolic")
    return k, why, chosen


def _options_table(plain, chosen_space, chosen_k, settings, distribution, latency,
                   budgets, pad_dims=()) -> list[dict[str, Any]]:
    variants = [plain]
    if chosen_space.pad_dims:
        variants.append(chosen_space)
    elif pad_dims and settings.policy in ("auto", "oracle"):
        variants.append(decide.padded_space(plain, tuple(pad_dims)))
    rows = []
    for space in variants:
        for k in range(1 if space.pad_dims else 0, min(settings.max_specializations, len(space.hot)) + 1):
            shapes = [decide.dims_key(dict(s)) for s, _ in space.hot[:k]]
            option = ("symbolic" if k == 0 else
                      f"padded to buckets [{'; '.join(shapes)}]" if space.pad_dims else
                      f"specialized [{'; '.join(shapes)}]")
            row: dict[str, Any] = {
                "option": option, "specializations": k, "padded": bool(space.pad_dims),
                "chosen": k == chosen_k and space is chosen_space}
            if latency is not None:
                row["expected_ms"] = round(decide.expected_ms(space, k, distribution, latency), 5)
                row["predicted_ms"] = {
                    decide.dims_key(g): round(decide.latency_at(space, k, g, latency), 5)
                    for g, _ in distribution}
            if budgets.seconds_of is not None:
                # This region's share: the fixed cost of a build is counted once, in plan.predicted.
                row["compile_s"] = round(budgets.seconds_of(space.nodes * (1 + k)) - budgets.seconds_of(0), 3)
            rows.append(row)
    return rows


def constant_inputs(model: Model, prof: Profile) -> dict[str, dict[str, Any]]:
    """Shape-like inputs that took one value in every profiled sample: compiled as that value.

    The runtime refuses another value (the fix is to recompile with samples covering it).
    """
    fixed: dict[str, dict[str, Any]] = {}
    for name, seen in prof.values.items():
        if len(seen) == 1 and seen[0]["count"] == prof.sample_count:
            fixed[name] = {
                "dtype": model.input(name).dtype, "shape": seen[0]["shape"],
                "value": seen[0]["value"],
                "reason": f"shape-like input with the same value in all {prof.sample_count} samples",
            }
    return fixed
