"""``edgec.compile``: profile, plan, quantize and build chained, as every tool and the CLI run them.

The driver owns what sits between the stages: the held-out split of the samples for the accuracy
guard, the oracle policy's measurement of every option, and the guard itself, which builds with a
quantization decision, measures the artifact on held-out samples and, while it is over budget,
keeps the next most sensitive layer in fp32 and builds again. ``benchmark`` is bench with its
measurements added to the target's cost-model store.

Each stage stays a plain function of values; the driver passes values on and never changes one.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from edgec import runtime
from edgec.compiler.backends import backend_for
from edgec.core import remote
from edgec.core.model import Model, from_proto
from edgec.core.quant_layers import find_layers
from edgec.core.quant_schemes import INTEGER_PRECISIONS
from edgec.core.sequences import flatten as flatten_structured
from edgec.core.reference import reference_session
from edgec.core.samples import Sample
from edgec.core.targets import Target, default_target
from edgec.errors import CompileError, EdgecError, ModelError
from edgec.runtime.artifact import Artifact
from edgec.stages.bench import BenchResult, BenchSettings, bench, record_measurements
from edgec.stages.build import build
from edgec.stages.measure import measure_model
from edgec.stages.plan import Plan, PlanSettings, plan
from edgec.stages.profile import Profile, profile
from edgec.stages.quantize import (Quantization, QuantizeSettings, accuracy, bf16_available,
                                   bf16_slower, held_out_split, quantize)

# A compiled artifact over budget (the simulation was optimistic) is rebuilt at most this often.
MAX_REBUILDS = 2


@dataclass(frozen=True)
class CompileSettings:
    """Everything ``compile`` decides by, besides the model, samples and targets."""

    plan: PlanSettings = field(default_factory=PlanSettings)
    quantize: QuantizeSettings = field(default_factory=QuantizeSettings)
    dump_ir: str | Path | None = None  # write the module after each compiler phase here
    # A plan whose specializations (shape or value) do not build falls back to the symbolic
    # program, said in ``Compiled.notes`` and the manifest. EDGEC_NO_FALLBACK=1 makes it an
    # error instead: the test suite runs so, so that compiler bugs do not hide behind it.
    fallback: bool = field(default_factory=lambda: os.environ.get("EDGEC_NO_FALLBACK", "")
                           in ("", "0"))

    def check(self) -> None:
        self.plan.check()
        self.quantize.check()


@dataclass(frozen=True)
class Compiled:
    """What ``compile`` made: each stage's value, the artifact last."""

    profile: Profile
    plan: Plan
    quantization: Quantization
    artifact: Artifact
    targets_chosen: str = "given"
    notes: tuple[str, ...] = ()  # what the user should know: a fallback taken, and why


def default_targets() -> tuple[list[Target], str]:
    """The best target this machine runs, and the manifest's words for how it was chosen."""
    target = default_target()
    return [target], (f"default: {target.name}, the target with the most CPU features the build "
                      f"machine has")


def compile(model: Model, samples: Sequence[Sample],  # noqa: A001 - edgec.compile, by design
            targets: Sequence[Target] | None = None,
            settings: CompileSettings = CompileSettings(),
            held_out: Sequence[Sample] | None = None) -> Compiled:
    """Profile ``model`` on ``samples``, plan for the first target, quantize as ``settings`` say
    and build for every target (default: the best one this machine runs).

    With quantization and no ``held_out`` samples, every fourth sample is held out for the
    accuracy guard (it then neither profiles nor calibrates). The oracle policy times every
    option on ``samples`` before planning. Raises EdgecError subclasses with one-line messages.
    """
    settings.check()
    if model.structured:
        return _compile_structured(model, samples, targets, settings, held_out)
    if targets:
        targets, chosen = list(targets), "given"
    else:
        targets, chosen = default_targets()
    profiling = list(samples)
    guard: list[Sample] = []
    if settings.quantize.mode != "none":
        if held_out is not None:
            guard = list(held_out)
        else:
            profiling, guard = held_out_split(profiling)
    prof, the_plan = profile_and_plan(model, profiling, targets[0], settings.plan, samples)
    quant = quantize(model, prof, targets[0], settings.quantize, guard)
    try:
        artifact, quant = _build(model, the_plan, targets, quant, guard, chosen, settings)
        return Compiled(prof, the_plan, quant, artifact, chosen)
    except (CompileError, ModelError) as exc:
        simpler = _simpler_plans(model, prof, the_plan, targets[0]) if settings.fallback else []
        if not simpler:
            raise
        failure = exc
    for simple in simpler:
        try:
            artifact, quant = _build(model, simple, targets, quant, guard, chosen, settings)
        except (CompileError, ModelError):
            continue
        unfixed = (" without fixed inputs" if the_plan.constant_inputs and not simple.constant_inputs
                   else "")
        note = (f"the {the_plan.settings.policy} plan did not build ({failure}); built the "
                f"{simple.settings.policy} plan{unfixed} instead")
        manifest = {**artifact.manifest,
                    "fallback": {"from": the_plan.summary(), "reason": str(failure)}}
        return Compiled(prof, simple, quant, Artifact(manifest, artifact.files), chosen, (note,))
    raise failure


def _compile_structured(model: Model, samples: Sequence[Sample], targets: Sequence[Target] | None,
                        settings: CompileSettings, held_out: Sequence[Sample] | None) -> Compiled:
    """``compile`` for a model with sequence or optional inputs or outputs: compiled as the
    tensor-only model they resolve to for the samples, the manifest recording the mapping."""
    if model.kind != "onnx":
        raise ModelError("sequence and optional values are supported for ONNX models only")
    every = list(samples) + list(held_out or [])
    flat = flatten_structured(model.proto, [s.arrays for s in every])
    tensor_model = from_proto(flat.proto, model.name, model.path)
    flat_samples = [Sample(s.name, arrays) for s, arrays in zip(every, flat.samples)]
    compiled = compile(tensor_model, flat_samples[:len(samples)], targets, settings,
                       flat_samples[len(samples):] if held_out is not None else None)
    manifest = {**compiled.artifact.manifest, "boundary": flat.boundary,
                "model": {**compiled.artifact.manifest["model"], "sha256": model.sha256}}
    return replace(compiled, artifact=Artifact(manifest, compiled.artifact.files))


def _build(model: Model, the_plan: Plan, targets: list[Target], quant: Quantization,
           guard: Sequence[Sample], chosen: str,
           settings: CompileSettings) -> tuple[Artifact, Quantization]:
    if quant.active:
        return build_guarded(model, the_plan, targets, quant, guard, chosen,
                             dump_ir=settings.dump_ir)
    return build(model, the_plan, targets, targets_chosen=chosen, dump_ir=settings.dump_ir), quant


def _simpler_plans(model: Model, prof: Profile, the_plan: Plan, target: Target) -> list[Plan]:
    """Plans that build more often than ``the_plan``, simplest last: every region symbolic, then
    also no input compiled as a fixed value. Empty when ``the_plan`` is already that simple."""
    symbolic = replace(plan(model, prof, target, replace(the_plan.settings, policy="symbolic")),
                       execution=the_plan.execution)  # the execution the plan chose stays
    plans = []
    specialized = any(r.specializations for r in the_plan.regions)
    if specialized:
        plans.append(symbolic)
    if symbolic.constant_inputs:
        plans.append(replace(symbolic, constant_inputs={}))
    return plans


def profile_and_plan(model: Model, samples: Sequence[Sample], target: Target,
                     settings: PlanSettings = PlanSettings(),
                     timing_samples: Sequence[Sample] | None = None) -> tuple[Profile, Plan]:
    """The profile on ``samples`` and the plan made from it for ``target``; ``timing_samples``
    (default: ``samples``) are those the oracle policy times and padding proofs are checked on."""
    prof = profile(model, list(samples))
    return prof, make_plan(model, prof, target, settings,
                           samples if timing_samples is None else timing_samples)


def make_plan(model: Model, prof: Profile, target: Target, settings: PlanSettings,
              samples: Sequence[Sample] | None = None) -> Plan:
    """Plan; for the oracle policy, first time every option of every region on ``samples``."""
    settings.check()
    measured = None
    if settings.policy == "oracle":
        if not samples:
            raise EdgecError("--policy oracle times every option: pass --samples")
        kernels_on_calling_thread()
        measured = measure_model(model, prof, list(samples), target,
                                 settings.max_specializations, source="oracle").table()
    return plan(model, prof, target, settings, measured=measured,
                samples=list(samples) if samples is not None else None)


def kernels_on_calling_thread() -> None:
    """Region timings are CPU time of the calling thread (``stages.measure``): oneDNN's OpenMP
    pool must not take work off it. Read when OpenMP starts, so set before any model loads."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def benchmark(artifact_path: str | Path, model: Model, samples: Sequence[Sample],
              settings: BenchSettings = BenchSettings(), target: str | None = None,
              baselines: Sequence[str] = ("onnxruntime", "onnxruntime-1t"),
              require_signature: str | Path | None = None) -> BenchResult:
    """Bench the artifact (``stages.bench``) and add its per-region timings to the target's
    cost-model measurements, from which ``edgec costmodel train`` learns."""
    result = bench(artifact_path, model, list(samples), settings, target=target,
                   baselines=tuple(baselines), require_signature=require_signature)
    if result["regions"]:
        # The target as given (a .toml path is not a name load_target finds), else the library's.
        record_measurements(target or result["target"], model, result["regions"], settings.threads)
    return result


# ---------------------------------------------------------------------------------------------
# The quantization guard


def measure_accuracy(artifact_path: Path, model: Model, held_out: Sequence[Sample],
                     target: str | None = None) -> dict[str, Any]:
    """The compiled artifact's accuracy against fp32 (onnxruntime) on ``held_out``, run where
    ``target``'s file says (here, under qemu or through RPC)."""
    compiled = remote.load(artifact_path, target=target)
    session = reference_session(model.proto)
    reference = [session.run(s.arrays) for s in held_out]
    outputs = [compiled.run(s.arrays) for s in held_out]
    return accuracy.compare(reference, outputs, accuracy.classifier_outputs(model.outputs))


def build_guarded(model: Model, the_plan: Plan, targets: list[Target], quant: Quantization,
                  held_out: Sequence[Sample], targets_chosen: str = "given",
                  dump_ir: str | Path | None = None) -> tuple[Artifact, Quantization]:
    """Build with ``quant`` and measure the artifact on ``held_out``; while it is over budget,
    keep the next most sensitive layer in fp32 and rebuild (at most ``MAX_REBUILDS`` times).
    With ``auto``, also weigh the weight-only and bf16 variants by measured latency
    (``stages.quantize``).
    Returns the artifact, whose manifest records the measured accuracy, and the decision it
    holds."""
    if quant.settings.mode == "fp16":
        return _build_fp16(model, the_plan, targets, quant, held_out, targets_chosen, dump_ir)
    artifact, quant = _build_within_budget(model, the_plan, targets, quant, held_out,
                                           targets_chosen, dump_ir)
    if quant.settings.mode != "auto":
        return artifact, quant
    integer = any(l["precision"] in INTEGER_PRECISIONS for l in quant.layers)
    # The guard's decision, then what else auto may pick: integer layers weight-only, and
    # (where the target and this CPU have bf16) every dense and conv layer in bf16.
    variants = {"integer" if integer else "weight-only": (artifact, quant)}
    if integer:
        variants["weight-only"] = _variant(
            quant, INTEGER_PRECISIONS, "int8-weight", model, the_plan, targets,
            held_out, targets_chosen, dump_ir)
    if bf16_available(targets[0]) and any(l["kind"] != "embedding" for l in quant.layers):
        slow = {l.name: why for l in find_layers(model.proto) if (why := bf16_slower(l))}
        variants["bf16"] = _variant(
            quant, ("int8-static", "int8-dynamic", "int8-weight", "fp32"), "bf16", model, the_plan,
            targets, held_out, targets_chosen, dump_ir, kept_fp32=slow)
    if len(variants) == 1:
        return artifact, quant
    budget = quant.settings.max_accuracy_drop
    names = [name for name, (_, q) in variants.items()
             if q is quant or q.accuracy["measured"]["drop"] <= budget]
    timings = _latencies([variants[n][0] for n in names], held_out, _runnable(artifact, targets))
    cost = {f"{name.replace('-', '_')}_ms": ms for name, ms in zip(names, timings)}
    cost["how"] = "median over held-out samples of the median of interleaved calls"
    chosen = names[int(np.argmin(timings))]
    built, decision = variants[chosen]
    decision = replace(decision, cost={**cost, "chosen": chosen})
    return _with_quantization(built, decision), decision


def _variant(quant: Quantization, precisions: tuple[str, ...], to: str, model: Model,
             the_plan: Plan, targets: list[Target], held_out: Sequence[Sample],
             targets_chosen: str, dump_ir: str | Path | None,
             kept_fp32: Mapping[str, str] | None = None) -> tuple[Artifact, Quantization]:
    """``quant`` with its dense and conv layers at ``precisions`` moved to ``to`` (those named in
    ``kept_fp32`` to fp32, for the reason given), built within the budget
    (``_build_within_budget`` keeps the most sensitive fp32)."""
    layers = []
    for layer in quant.layers:
        layer = dict(layer)
        if layer["name"] in (kept_fp32 or {}):
            layer["precision"], layer["activation"] = "fp32", None
            layer["reason"] = kept_fp32[layer["name"]]
        elif layer["kind"] != "embedding" and layer["precision"] in precisions:
            layer["reason"] = f"{to}: faster than {layer['precision']} as measured (see cost)"
            layer["precision"], layer["activation"] = to, None
        layers.append(layer)
    alternative = replace(quant, layers=layers,
                          accuracy={"simulated": None, "held_out_samples": len(held_out)})
    return _build_within_budget(model, the_plan, targets, alternative, held_out, targets_chosen,
                                dump_ir)


def _with_quantization(artifact: Artifact, quant: Quantization) -> Artifact:
    """``artifact`` whose manifest records ``quant``."""
    return Artifact({**artifact.manifest, "quantization": quant.manifest()}, artifact.files)


def _latencies(artifacts: list[Artifact], samples: Sequence[Sample], target: str | None,
               runs: int = 15) -> list[float]:
    """Per artifact, the median over ``samples`` of the median of ``runs`` calls, the artifacts'
    calls interleaved so that they share the machine's state."""
    with tempfile.TemporaryDirectory(prefix="edgec-quantize-") as tmp:
        models = [runtime.load(a.save(Path(tmp) / f"candidate{i}.edgec"), target=target)
                  for i, a in enumerate(artifacts)]
        per_sample: list[list[float]] = [[] for _ in models]
        for sample in samples:
            args = [m.to_device_args(sample.arrays) for m in models]
            for m, a in zip(models, args):
                m.raw_call(a)  # warm-up: first calls create and pack
            times: list[list[float]] = [[] for _ in models]
            for _ in range(runs):
                for i, (m, a) in enumerate(zip(models, args)):
                    start = time.perf_counter()
                    m.raw_call(a)
                    times[i].append((time.perf_counter() - start) * 1e3)
            for i, t in enumerate(times):
                per_sample[i].append(float(np.median(t)))
    return [round(float(np.median(t)), 4) for t in per_sample]


def _build_within_budget(model: Model, the_plan: Plan, targets: list[Target], quant: Quantization,
                         held_out: Sequence[Sample], targets_chosen: str,
                         dump_ir: str | Path | None) -> tuple[Artifact, Quantization]:
    for attempt in range(MAX_REBUILDS + 1):
        artifact = build(model, the_plan, targets, targets_chosen, quantization=quant,
                         dump_ir=dump_ir)
        quant = quant.compiled_in(artifact.manifest)
        if not quant.active:
            return artifact, quant
        with tempfile.TemporaryDirectory(prefix="edgec-quantize-") as tmp:
            path = artifact.save(Path(tmp) / "candidate.edgec")
            measured = measure_accuracy(path, model, held_out, target=_runnable(artifact, targets))
        quant = quant.with_accuracy(measured=measured)
        artifact = _with_quantization(artifact, quant)
        name = quant.most_sensitive()
        if measured["drop"] <= quant.settings.max_accuracy_drop or name is None \
                or attempt == MAX_REBUILDS:
            return artifact, quant
        quant = quant.demoted(name, measured["drop"])
    return artifact, quant


def _build_fp16(model: Model, the_plan: Plan, targets: list[Target], quant: Quantization,
                held_out: Sequence[Sample], targets_chosen: str,
                dump_ir: str | Path | None) -> tuple[Artifact, Quantization]:
    """Build with the fp16 targets' programs in half precision and measure the first one on this
    machine's GPU; without one, the manifest says why nothing was measured (the simulated
    accuracy stands)."""
    artifact = build(model, the_plan, targets, targets_chosen, quantization=quant, dump_ir=dump_ir)
    quant = quant.compiled_in(artifact.manifest)
    gpu = next(t.name for t in targets if backend_for(t).fp16)
    capability = runtime._cuda_capability()  # a string says why there is no usable GPU
    if isinstance(capability, str):
        quant = quant.with_accuracy(
            measured=None, not_measured=f"no GPU to run '{gpu}' on the build machine: {capability}")
    else:
        with tempfile.TemporaryDirectory(prefix="edgec-quantize-") as tmp:
            path = artifact.save(Path(tmp) / "candidate.edgec")
            quant = quant.with_accuracy(measured=measure_accuracy(path, model, held_out, target=gpu))
    return _with_quantization(artifact, quant), quant


def _runnable(artifact: Artifact, targets: list[Target]) -> str | None:
    """The target whose library the guard measures: the first this machine runs, else the first
    whose target file says how to run it elsewhere (under qemu, on a device through RPC)."""
    try:
        return runtime.select_target(artifact.manifest, None, "the artifact being built")
    except EdgecError:
        pass
    for target in targets:
        if target.run.get("mode", "local") != "local":
            return target.name
    raise CompileError("the accuracy guard measures the compiled artifact; add a --target this "
                       "machine can run, or one whose target file says how to run it ([run] mode)")
