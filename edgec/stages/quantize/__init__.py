"""The quantize stage, between plan and build: which layers run in int8, how, and whether the
result stays within an accuracy budget.

Modes (``edgec compile --quantize``):

- ``int8-weight``: weights stored int8 (per output channel, symmetric); the kernels dequantize
  each weight once, on its first call, and run fp32 arithmetic. A quarter of the weight bytes,
  fp32 speed and near-fp32 accuracy.
- ``int8-dynamic``: dense layers quantize their input per call (its min and max) and run u8 x s8
  integer matmuls; convolutions and embeddings are weight-only.
- ``int8-static``: dense and conv layers quantize their input with parameters calibrated from the
  profile's activation ranges (``--calibration percentile|minmax|entropy``, ``--quant-scheme
  asymmetric|symmetric``); layers with no recorded range fall back to dynamic (dense) or
  weight-only (conv); embeddings are weight-only.
- ``bf16``: dense and conv layers compute in bf16 through oneDNN's AVX-512-bf16 and AMX kernels
  (weights packed as bf16, the input converted per call, f32 accumulation and output,
  activations NHWC between library calls); needs an x86 target with oneDNN and a CPU with
  ``avx512_bf16`` (the artifact then requires it); embeddings, the ops between layers, and
  layers with too little work per element for bf16 to pay (``BF16_MIN_REDUCTION``,
  ``BF16_MIN_FAN_OUT``: depthwise and narrow convolutions) stay fp32. The guard keeps the most
  sensitive layers fp32.
- ``auto``: each layer starts at its most compact arithmetic (static, then dynamic, weight-only,
  fp32) and the guard moves the most sensitive ones down a step at a time until the budget
  holds. Then cost decides: integer arithmetic pays only on large enough layers (the zoo
  transformer's 64-wide matmuls: int8-dynamic 1.05x fp32, int8-static 1.0x; squeezenet's
  convolutions: int8-static 0.70x), so the guard also compiles the
  variant with every integer layer weight-only, times both on the held-out samples in the same
  run, and keeps the faster one within budget; ``cost`` records both timings. Where bf16 is
  available (``bf16_available``) a third variant, every dense and conv layer bf16, is built and
  timed alongside, and the fastest within budget is kept.
- ``fp16``: for CUDA targets (the first ``--target`` must be one): their programs' matmuls,
  convolutions and the ops between in half precision with fp32 accumulation
  (``edgec.compiler.transform.fp16``); a CPU target in the same artifact stays fp32. All or nothing: over
  budget (simulated), every layer stays fp32. The artifact is measured on this machine's GPU,
  or the manifest says why not.

The accuracy guard compares against fp32 (onnxruntime on the original model) on held-out samples:
lowest cosine and max abs per output, top-1 agreement for classifier outputs; ``drop`` (see
``accuracy.compare``) must not exceed ``--max-accuracy-drop``. It ranks layers by sensitivity
(the drop with only that layer quantized, simulated in the ONNX graph by onnxruntime), keeps the
most sensitive in fp32 (or, for ``auto``, at a safer precision) until the simulated drop is within
budget. This stage decides and returns a frozen ``Quantization``; the compiler lowers it as data
(``edgec.compiler.transform.quantized``), and ``edgec.compile`` (``edgec.driver.build_guarded``)
measures the compiled artifact, demoting further and rebuilding should it exceed the budget. The
manifest and the report list the layers kept in fp32 and both measurements.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


from edgec.compiler.backends import backend_for
from edgec.compiler.transform.quantized import QuantizedLowering
from edgec.core.model import Model
from edgec.core.provenance import tool_versions
from edgec.core.quant_layers import Layer, PRECISIONS, find_layers
from edgec.core.quant_schemes import (ActivationParams, CALIBRATIONS, SCHEMES, activation_params,
                                      integer_weight_levels)
from edgec.core.reference import reference_session
from edgec.core.samples import Sample
from edgec.core.targets import Target
from edgec.errors import CompileError, EdgecError, SamplesError
from edgec.fileio import load_json_value, save_json_value
from edgec.runtime import host_cpu_features
from edgec.stages.plan import check_matches
from edgec.stages.profile import Profile
from edgec.stages.quantize import accuracy, simulate

MODES = ("none", "int8-weight", "int8-dynamic", "int8-static", "bf16", "fp16", "auto")
# The CPU feature oneDNN's bf16 kernels need (as /proc/cpuinfo names it); elsewhere it emulates.
BF16_FEATURE = "avx512_bf16"
QUANTIZE_VERSION = 1

__all__ = ["MODES", "BF16_FEATURE", "QuantizeSettings", "Quantization", "quantize",
           "held_out_split", "bf16_available", "bf16_problem", "bf16_slower"]


@dataclass(frozen=True)
class QuantizeSettings:
    """The knobs of the quantize stage; saved with its result."""

    mode: str = "none"
    max_accuracy_drop: float = 0.01
    calibration: str = "percentile"
    scheme: str = "asymmetric"

    def check(self) -> None:
        if self.mode not in MODES:
            raise EdgecError(f"unknown quantize mode '{self.mode}'; known: {', '.join(MODES)}")
        if not 0.0 <= self.max_accuracy_drop <= 1.0:
            raise EdgecError("--max-accuracy-drop must lie between 0 and 1 (0.01 = 1%)")
        if self.calibration not in CALIBRATIONS:
            raise EdgecError(f"unknown calibration '{self.calibration}'; known: {', '.join(CALIBRATIONS)}")
        if self.scheme not in SCHEMES:
            raise EdgecError(f"unknown quantization scheme '{self.scheme}'; known: {', '.join(SCHEMES)}")


@dataclass(frozen=True)
class Quantization:
    """The quantize stage's result, a frozen decision: a precision per layer and the accuracy it
    was measured at. Changes (``as_compiled``, ``demoted``, ``with_accuracy``) return new values.

    ``layers``: per quantizable layer, ``name``, ``op``, ``kind``, ``precision``, ``activation``
    (uint8 scale and zero, static layers), ``sensitivity`` (simulated drop with only this layer
    quantized) and ``reason``. ``accuracy``: ``simulated`` (onnxruntime, fake-quantized graph)
    and, once built, ``measured`` (the compiled artifact), each as ``accuracy.compare`` returns.
    """

    model_name: str
    model_sha256: str
    settings: QuantizeSettings
    layers: list[dict[str, Any]] = field(default_factory=list)
    accuracy: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=tool_versions)
    cost: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return any(layer["precision"] != "fp32" for layer in self.layers)

    def decisions(self) -> dict[str, dict[str, Any]]:
        return {layer["name"]: layer for layer in self.layers}

    def fp32_layers(self) -> list[str]:
        return [layer["name"] for layer in self.layers if layer["precision"] == "fp32"]

    def lowering(self, proto) -> QuantizedLowering:
        """What the compiler reads of this decision (``transform.quantized``)."""
        return QuantizedLowering(self.settings.mode, self.settings.scheme,
                                 copy.deepcopy(self.decisions()), proto)

    def _with_layers(self, layers: list[dict[str, Any]], **changes: Any) -> "Quantization":
        return dataclasses.replace(self, layers=layers, **changes)

    def as_compiled(self, calls: dict[str, int]) -> "Quantization":
        """This decision as a program holds it: the quantized layers the build found no int8
        (or bf16) form for (``calls``: calls rewritten per layer, 0 or missing) recorded as fp32,
        e.g. a convolution the library does not run."""
        layers = copy.deepcopy(self.layers)
        for layer in layers:
            if layer["precision"] != "fp32" and not calls.get(layer["name"]):
                form = "bf16" if layer["precision"] == "bf16" else "int8"
                layer["reason"] = (f"fp32: planned {layer['precision']}, but the compiled program "
                                   f"has no {form} form of it (a layer the library does not run)")
                layer["precision"] = "fp32"
                layer["activation"] = None
        return self._with_layers(layers)

    def compiled_in(self, artifact_manifest: dict[str, Any]) -> "Quantization":
        """``as_compiled`` as an artifact's manifest records it (what its build found)."""
        held = {layer["name"]: layer for layer in artifact_manifest["quantization"].get("layers", [])}
        return self.as_compiled({name: int(layer["precision"] != "fp32")
                                 for name, layer in held.items()})

    def demoted(self, name: str, drop: float) -> "Quantization":
        """Layer ``name`` one step safer (``_demote``), because the drop exceeded the budget."""
        layers = copy.deepcopy(self.layers)
        _demote(next(l for l in layers if l["name"] == name), self.settings, drop)
        return self._with_layers(layers)

    def with_accuracy(self, **entries: Any) -> "Quantization":
        """This decision with ``entries`` added to (or replacing some of) its accuracy record."""
        return dataclasses.replace(self, accuracy={**self.accuracy, **entries})

    def most_sensitive(self) -> str | None:
        """The quantized layer the guard demotes next."""
        return _most_sensitive(self.decisions())

    def manifest(self) -> dict[str, Any]:
        """The part an artifact's manifest keeps."""
        return {
            "mode": self.settings.mode, "calibration": self.settings.calibration,
            "scheme": self.settings.scheme, "max_accuracy_drop": self.settings.max_accuracy_drop,
            "layers": [{k: layer[k] for k in ("name", "op", "precision", "reason")}
                       for layer in self.layers],
            "fp32_layers": self.fp32_layers(), "accuracy": self.accuracy,
            **({"cost": self.cost} if self.cost else {}),
        }

    def save(self, path: str | Path) -> Path:
        payload = {"model": {"name": self.model_name, "sha256": self.model_sha256},
                   "settings": vars(self.settings), "layers": self.layers,
                   "accuracy": self.accuracy, "cost": self.cost, "versions": self.versions}
        return save_json_value(path, "quantize", QUANTIZE_VERSION, payload)

    @classmethod
    def load(cls, path: str | Path) -> "Quantization":
        doc = load_json_value(path, "quantize", QUANTIZE_VERSION)
        return cls(doc["model"]["name"], doc["model"]["sha256"],
                   QuantizeSettings(**doc["settings"]), doc["layers"], doc["accuracy"],
                   doc["versions"], doc.get("cost", {}))


def bf16_problem(target: Target) -> str | None:
    """Why ``--quantize bf16`` cannot build for ``target`` on this machine, or None."""
    if not target.libraries.get("dnnl") or "avx512f" not in target.cpu_features:
        return (f"--quantize bf16 runs on oneDNN's AVX-512-bf16 kernels, which target "
                f"'{target.name}' lacks (it needs [libraries] dnnl and avx512f, as x86_64-avx512 "
                f"has); use --quantize int8-weight, int8-dynamic, int8-static or auto")
    if BF16_FEATURE not in host_cpu_features():
        return (f"--quantize bf16: this machine's CPU lacks {BF16_FEATURE}, and the accuracy guard "
                f"runs the artifact here; build on a CPU with it (Zen 4, Cooper Lake, Sapphire "
                f"Rapids or later) or use an int8 mode")
    return None


# A bf16 layer converts its input to bf16 on every call and feeds AMX tiles 32 values deep: below
# these, that conversion and the padded tiles cost more than bf16 saves. Per layer of
# mobilenet_v3_large (oneDNN 2.6, 2 cores, Sapphire Rapids), bf16 was slower than fp32 on every
# depthwise convolution (a reduction of 9 or 25), on its RGB stem (27) and on 12 of the 13 1x1
# ones of 16-80 output channels, and faster on 15 of the 17 of 112 or more (the other two within
# 4 us).
BF16_MIN_REDUCTION = 32
BF16_MIN_FAN_OUT = 96


def bf16_slower(layer: Layer) -> str | None:
    """Why ``layer`` stays fp32 in bf16 mode, or None: too little work per element."""
    if layer.reduction < BF16_MIN_REDUCTION:
        return (f"fp32: bf16 is slower where a layer sums under {BF16_MIN_REDUCTION} products "
                f"per output (this one {layer.reduction})")
    if layer.fan_out < BF16_MIN_FAN_OUT:
        return (f"fp32: bf16 is slower where each input feeds under {BF16_MIN_FAN_OUT} "
                f"products (this one {layer.fan_out}), the per-call conversion dominating")
    return None


def bf16_available(target: Target) -> bool:
    """Whether ``target`` built here can run dense and conv layers in bf16."""
    return bf16_problem(target) is None


def held_out_split(samples: Sequence[Sample]) -> tuple[list[Sample], list[Sample]]:
    """(calibration, held-out) when no held-out samples are given: every fourth sample is held
    out (at least one); with a single sample, it serves both."""
    held = [s for i, s in enumerate(samples) if i % 4 == 3] or list(samples[-1:])
    calibration = [s for s in samples if s not in held] or list(samples)
    return calibration, held


def _initial_precision(layer: Layer, mode: str, ranges: dict[str, Any],
                       integer: bool = True) -> tuple[str, str]:
    """A layer's precision under ``mode`` before the guard, and why; ``integer``: whether the
    target has integer kernels (without, ``auto`` is weight-only)."""
    has_range = layer.activation in ranges
    if layer.kind == "embedding" or mode == "int8-weight":
        return "int8-weight", f"{mode}: weights int8"
    if not integer:
        return "int8-weight", f"{mode}: weights int8 (the target has no integer kernels)"
    if mode == "int8-dynamic":
        if layer.kind == "dense":
            return "int8-dynamic", "int8-dynamic: input quantized per call"
        return "int8-weight", "int8-dynamic: convolutions are weight-only (static needs calibration)"
    # int8-static and auto
    if has_range:
        return "int8-static", f"{mode}: input calibrated from the profile's range"
    if layer.kind == "dense":
        return "int8-dynamic", f"{mode}: no profiled range for '{layer.activation}', dynamic"
    return "int8-weight", f"{mode}: no profiled range for '{layer.activation}', weight-only"


def quantize(model: Model, prof: Profile, target: Target, settings: QuantizeSettings,
             held_out: Sequence[Sample]) -> Quantization:
    """Decide each layer's precision for ``target`` within ``settings.max_accuracy_drop``."""
    settings.check()
    check_matches(model, prof.model_sha256, "profile")
    result = Quantization(model.name, model.sha256, settings)
    if settings.mode == "none":
        return result
    backend = backend_for(target)
    if settings.mode == "fp16" and not backend.fp16:
        raise CompileError(
            f"--quantize fp16 is for GPU targets and '{target.name}' is a CPU target; use "
            f"int8-weight, int8-dynamic, int8-static or auto, or a CUDA --target (cuda-sm89, "
            f"cuda-sm90, jetson-orin) first")
    integer = bool(target.libraries.get("dnnl"))  # oneDNN's integer kernels (x86)
    xnnpack = bool(target.libraries.get("xnnpack"))
    if settings.mode not in ("fp16", "bf16") and not integer and not xnnpack:
        raise CompileError(
            f"target '{target.name}' has no int8 kernels (they need [libraries] dnnl = true or "
            f"xnnpack = true); compile without --quantize")
    if settings.mode == "bf16" and (problem := bf16_problem(target)):
        raise CompileError(problem)
    if settings.mode in ("int8-static", "int8-dynamic") and not integer:
        raise CompileError(
            f"--quantize {settings.mode} needs integer kernels, which target '{target.name}' "
            f"lacks (XNNPACK's int8 here takes no per-channel scales); use --quantize int8-weight "
            f"or auto")
    if not held_out:
        raise SamplesError("the accuracy guard needs held-out samples; pass --held-out-samples")
    layers = find_layers(model.proto)
    if not layers:
        return result.with_accuracy(simulated=None, note="no layer with a constant weight")
    if prof.reference_error:
        raise CompileError(f"cannot quantize '{model.name}': the accuracy guard runs it with "
                           f"onnxruntime, which failed: {prof.reference_error}")

    # As the target's kernels take integer layers' weights (7-bit on x86 without VNNI).
    weight_levels = integer_weight_levels(target.arch, target.cpu_features)
    activations: dict[str, ActivationParams] = {}
    entries: dict[str, dict[str, Any]] = {}
    for layer in layers:
        if settings.mode == "fp16" and layer.kind == "embedding":
            precision, reason = "fp32", "fp32: fp16 converts matmuls and convolutions, not gathers"
        elif settings.mode == "fp16":
            precision, reason = "fp16", f"fp16: the {target.name} program in half precision"
        elif settings.mode == "bf16" and layer.kind == "embedding":
            precision, reason = "fp32", "fp32: bf16 converts matmuls and convolutions, not gathers"
        elif settings.mode == "bf16" and (slow := bf16_slower(layer)):
            precision, reason = "fp32", slow
        elif settings.mode == "bf16" and layer.kind == "dense":
            precision, reason = "bf16", ("bf16: input and weights in bf16, f32 accumulation "
                                         "(fp32 in calls too small to gain: the shim's Bf16Pays)")
        elif settings.mode == "bf16":
            precision, reason = "bf16", "bf16: input and weights in bf16, f32 accumulation"
        else:
            precision, reason = _initial_precision(layer, settings.mode, prof.ranges, integer)
        if precision == "int8-static":
            if settings.calibration == "entropy" and "abs_hist" not in prof.ranges[layer.activation]:
                raise CompileError(
                    f"--calibration entropy needs the profile's histogram of '{layer.activation}', "
                    f"which this profile lacks (made by an older edgec); run `edgec profile` again")
            activations[layer.name] = activation_params(
                prof.ranges[layer.activation], settings.calibration, settings.scheme)
        entries[layer.name] = {"name": layer.name, "op": layer.op, "kind": layer.kind,
                               "precision": precision, "reason": reason, "sensitivity": None,
                               "activation": (activations[layer.name].to_json()
                                              if layer.name in activations else None)}

    inputs = [s.arrays for s in held_out]
    session = reference_session(model.proto, optimize=False)
    reference = [session.run(x) for x in inputs]
    classifiers = accuracy.classifier_outputs(model.outputs)

    def evaluate(precisions: dict[str, str]) -> dict[str, Any]:
        proto = simulate.simulated_model(model.proto, layers, precisions, activations,
                                         settings.scheme, weight_levels)
        return accuracy.compare(reference, simulate.run(proto, inputs), classifiers)

    def sensitivity(name: str) -> float:
        return evaluate({name: entries[name]["precision"]})["drop"]

    for name, entry in entries.items():
        entry["sensitivity"] = sensitivity(name)
    current = {name: e["precision"] for name, e in entries.items()}
    measured = evaluate(current)
    if settings.mode == "fp16" and measured["drop"] > settings.max_accuracy_drop:
        # ToMixedPrecision converts the whole program: no layer can stay fp32 alone.
        for entry in entries.values():
            entry["precision"], entry["reason"] = "fp32", (
                f"kept fp32: the fp16 program's drop {measured['drop']:.3g} (simulated) exceeded "
                f"the budget {settings.max_accuracy_drop:g}, and fp16 converts every layer or none")
        measured = evaluate({})
    while measured["drop"] > settings.max_accuracy_drop:
        name = _most_sensitive(entries)
        if name is None:
            break
        _demote(entries[name], settings, measured["drop"])
        if entries[name]["precision"] != "fp32":
            entries[name]["sensitivity"] = sensitivity(name)
        current[name] = entries[name]["precision"]
        measured = evaluate(current)
    return dataclasses.replace(result, layers=list(entries.values()),
                               accuracy={"simulated": measured, "held_out_samples": len(held_out)})


def _most_sensitive(entries: dict[str, dict[str, Any]]) -> str | None:
    candidates = [e for e in entries.values() if e["precision"] != "fp32"]
    if not candidates:
        return None
    return max(candidates, key=lambda e: e["sensitivity"] or 0.0)["name"]


def _demote(entry: dict[str, Any], settings: QuantizeSettings, drop: float) -> None:
    """One step down: fp32 (fixed modes, and bf16 in ``auto``'s bf16 variant), or the next safer
    precision (``auto``)."""
    options = PRECISIONS[entry["kind"]]
    if settings.mode == "auto" and entry["precision"] in options:
        precision = options[options.index(entry["precision"]) + 1]
    else:
        precision = "fp32"
    entry["reason"] = (f"{'kept fp32' if precision == 'fp32' else precision}: most sensitive "
                       f"layer ({entry['sensitivity']:.3g} alone at {entry['precision']}) while "
                       f"the drop {drop:.3g} exceeded the budget {settings.max_accuracy_drop:g}")
    entry["precision"] = precision
    if precision != "int8-static":
        entry["activation"] = None
