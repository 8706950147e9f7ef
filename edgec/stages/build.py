"""The build stage: lower a model as its plan says into one library per target, packed as an artifact."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from edgec.compiler import pipeline
from edgec.compiler.backends import backend_for
from edgec.compiler.transform.shape_dispatch import (add_shape_dispatch, lower_regions, pad_spec,
                                                     region_functions)
from edgec.compiler.transform.value_dispatch import add_value_dispatch
from edgec.core.model import Model, from_proto
from edgec.core.provenance import tool_versions
from edgec.core.regions import RegionCut, region_model
from edgec.core.targets import Target
from edgec.costmodel.execution import chosen_option, library_fallback
from edgec.errors import EdgecError, ModelError, describe
from edgec.runtime.artifact import Artifact, FORMAT_VERSION, sha256_hex
from edgec.runtime.signature import TensorSpec
from edgec.stages.plan import Plan, check_matches
from edgec.stages.quantize import BF16_FEATURE, Quantization


def _functions(plan: Plan) -> list[dict[str, Any]]:
    """The VM functions the build creates, as ``edgec inspect`` shows them."""
    if plan.multi_region:
        return [{"name": "main", "kind": "calls regions"}] + region_functions(plan.regions)
    region = plan.regions[0]
    if region.mode == "static":
        return [{"name": "main", "kind": "static"}]
    functions = [{"name": "main", "kind": "dispatch" if region.specializations else "symbolic"}]
    if region.padding.get("used") and region.specializations:
        functions[0]["pads"] = list(region.padding["dims"])
    functions += [
        {"name": f"spec_{i}", "kind": "specialized", "dims": s["dims"], "share": s["share"]}
        for i, s in enumerate(region.specializations)
    ]
    if region.specializations:
        functions.append({"name": "generic", "kind": "symbolic fallback"})
    return functions


def fixed_inputs(model: Model, plan: Plan) -> list[TensorSpec]:
    """The model's inputs, those the plan fixed carrying the value they are compiled for."""
    specs = []
    for spec in model.inputs:
        fixed = plan.constant_inputs.get(spec.name)
        if fixed is not None:
            spec = dataclasses.replace(spec, fixed_shape=tuple(fixed["shape"]),
                                       fixed_value=tuple(fixed["value"]))
        specs.append(spec)
    return specs


def _programs(model: Model, plan: Plan, native_loops: bool) -> list[tuple[list[TensorSpec], Any]]:
    """The Relax modules to try compiling, best first, each with the inputs as the manifest
    records them.

    Inputs the plan fixed are compiled as their values. When the model also imports without
    them, the first choice is a ``main`` that falls back to that general program for other
    values (nothing to refuse); the second, and the only one otherwise, is the fixed program
    alone, whose manifest marks the inputs ``fixed`` so the runtimes refuse other values.
    """
    inputs = fixed_inputs(model, plan)
    constants = {spec.name: spec.fixed_array() for spec in inputs if spec.fixed_value is not None}
    fixed = pipeline.import_model(model, constants, native_loops)
    if not constants or any(isinstance(d, str) for s in inputs if s.name in constants for d in s.dims):
        return [(inputs, fixed)]  # a value check needs the input's shape fixed too
    try:
        general = pipeline.import_model(model, native_loops=native_loops)
    except ModelError:  # no general path
        return [(inputs, fixed)]
    return [(list(model.inputs), add_value_dispatch(fixed, general, constants)), (inputs, fixed)]


def _compile(mod: Any, targets: list[Target], options: pipeline.Options,
             dump_ir: pipeline.DumpIR | None) -> list[tuple[Any, pipeline.Record]]:
    """Each target's library compiled from ``mod``, and what its passes recorded."""
    return [pipeline.compile(mod, target, options, dump_ir) for target in targets]


def _regions_module(model: Model, plan: Plan, native_loops: bool, exact_dispatch: bool):
    """The plan's regions, each imported alone, called in order by ``main``."""
    regions = [{"name": r.name, "inputs": r.inputs, "outputs": r.outputs,
                "specializations": [s["dims"] for s in r.specializations],
                "padding": r.padding, "exact_dispatch": exact_dispatch} for r in plan.regions]
    modules = [pipeline.import_model(from_proto(
        region_model(model, RegionCut(r.nodes, r.inputs, r.outputs, ""), r.name),
        f"{model.name}.{r.name}"), native_loops=native_loops) for r in plan.regions]
    return lower_regions(model, regions, modules)


def build(model: Model, plan: Plan, targets: list[Target], targets_chosen: str = "given",
          quantization: Quantization | None = None, exact_dispatch: bool = False,
          dump_ir: str | Path | None = None) -> Artifact:
    """Compile ``model`` for each target as ``plan`` says and return the artifact.

    One VM program per target holds the shape-specialized functions, the dispatch in ``main``
    that picks one or falls back to the symbolic function, and the weights. ``targets_chosen``
    says in the manifest how the targets were picked ("given", or why edgec picked them).
    ``quantization`` (the quantize stage's result) turns its layers into int8 kernels and int8
    weights; the manifest records what the program holds (``Quantization.as_compiled``): a
    layer the program has no int8 form of is fp32 there. Nothing passed in is changed.
    ``exact_dispatch`` also keeps, beside a padding dispatch, the dispatch without its buckets
    (``NAME__exact``; ``costmodel collect`` times both). ``dump_ir``: a folder to write the
    module into after each phase (``edgec.compiler.pipeline``).
    """
    check_matches(model, plan.model_sha256, "plan")
    if not targets:
        raise EdgecError("no target given; pass --target (see `edgec targets`)")
    active = quantization is not None and quantization.active
    if active:
        check_matches(model, quantization.model_sha256, "quantize")
    functions = _functions(plan)
    # edgec's native loops (recurrent layers) run on the CPU: not in a module built for a GPU.
    native_loops = all(backend_for(target).native_kernels for target in targets)
    route = chosen_option(plan.execution)
    lowering = quantization.lowering(model.proto) if active else None
    if route.route == "tvm" and lowering is not None and lowering.mode != "fp16":
        # int8 and bf16 layers exist only as library calls: the library route, if it fits.
        route = library_fallback(plan.execution)
        if route is None:
            raise EdgecError(f"the plan runs every op as a TVM kernel ({plan.execution['reason']})"
                             f", but edgec's int8 and bf16 layers are library calls; quantize "
                             f"with fp16 or none, or plan with a larger --max-runtime-mb")
    options = pipeline.Options(native_loops=native_loops, quantized=lowering,
                               library=route.route == "library")
    dump = pipeline.DumpIR(dump_ir) if dump_ir is not None else None
    if plan.multi_region:
        inputs = list(model.inputs)  # the plan keeps a model with fixed inputs whole
        try:
            mod = _regions_module(model, plan, native_loops, exact_dispatch)
        except (ModelError, ValueError) as exc:
            # A region that does not import alone (an op needing a constant another region
            # computes) must not cost the model: compile it whole, symbolic, and say so.
            mod = pipeline.import_model(model, native_loops=native_loops)
            functions = [{"name": "main", "kind": "symbolic",
                          "note": f"regions not lowered separately: {describe(exc)}"}]
        if dump is not None:
            dump.write("specialize", mod)
        compiled = _compile(mod, targets, options, dump)
    else:
        specializations = [s["dims"] for s in plan.regions[0].specializations]
        programs = _programs(model, plan, native_loops)
        for attempt, (inputs, mod) in enumerate(programs):
            try:
                padding = pad_spec(plan.regions[0].padding, [i.name for i in inputs],
                                   [o.name for o in model.outputs])
                mod = add_shape_dispatch(mod, specializations, padding=padding,
                                         exact_dispatch=exact_dispatch)
                if dump is not None:
                    dump.write("specialize", mod)
                compiled = _compile(mod, targets, options, dump)
                break
            except EdgecError:  # the general fallback may not compile: keep only the fixed program
                if attempt == len(programs) - 1:
                    raise
    libraries: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    quantized_calls: dict[str, int] = {}
    for target, (library, record) in zip(targets, compiled):
        device = backend_for(target).device
        for layer, calls in record.quantized_calls.items():
            quantized_calls[layer] = quantized_calls.get(layer, 0) + calls
        file = f"lib/{target.name}.so"
        files[file] = library.data
        features = list(target.cpu_features)
        bf16 = ([l["name"] for l in quantization.layers if l["precision"] == "bf16"]
                if active else [])
        if any(record.quantized_calls.get(name) for name in bf16):
            features.append(BF16_FEATURE)  # without it oneDNN emulates bf16, slower than fp32
        libraries[target.name] = {
            "file": file, "sha256": sha256_hex(library.data), "bytes": len(library.data),
            "arch": target.arch, "cpu_features": features,
            "kind": target.kind, "device": device,
            # Where kernels run; the VM's control flow and shape dispatch always run on the CPU.
            "placement": {"kernels": device, "control_flow": "cpu"},
            "tvm_target": target.tvm, "functions": functions,
            "native_dependencies": library.native_dependencies,
            "tuning": library.tuning,
            "tvm_kernels_parallel": library.tvm_kernels_parallel,
            "vm_exec_mode": library.vm_exec_mode,
            "linked_functions": library.linked_functions,
            # How it executes (the plan's choice, or the library route a quantized build
            # needs): the route, and the runtimes' default thread count (0: every core).
            "route": route.route,
            "threads": route.threads,
        }
    if active:
        quantization = quantization.as_compiled(quantized_calls)
    manifest = {
        "format_version": FORMAT_VERSION,
        "model": {"name": model.name, "sha256": model.sha256, "opset": model.opset,
                  "source": model.path},
        "inputs": [s.to_json() for s in inputs],
        "outputs": [s.to_json() for s in model.outputs],
        "plan": plan.summary(),
        "quantization": (quantization.manifest() if quantization is not None
                         and quantization.settings.mode != "none" else {"mode": "none"}),
        "libraries": libraries,
        "targets_chosen": targets_chosen,
        "versions": tool_versions(),
    }
    return Artifact(manifest, files)
