"""The build stage: lower a model as its plan says into one library per target, packed as an artifact."""

from __future__ import annotations

from typing import Any

from .compiler.codegen import codegen_for
from .compiler.dispatch import add_shape_dispatch, lower_regions, region_functions
from .compiler.frontend import import_onnx
from .errors import EdgecError, ModelError, describe
from .model import Model
from .plan import Plan, check_matches
from .provenance import tool_versions
from .runtime.artifact import FORMAT_VERSION, Artifact, sha256_hex
from .targets import Target


def _functions(plan: Plan) -> list[dict[str, Any]]:
    """The VM functions the build creates, as ``edgec inspect`` shows them."""
    if plan.multi_region:
        return [{"name": "main", "kind": "calls regions"}] + region_functions(plan.regions)
    region = plan.regions[0]
    if region.mode == "static":
        return [{"name": "main", "kind": "static"}]
    functions = [{"name": "main", "kind": "dispatch" if region.specializations else "symbolic"}]
    functions += [
        {"name": f"spec_{i}", "kind": "specialized", "dims": s["dims"], "share": s["share"]}
        for i, s in enumerate(region.specializations)
    ]
    if region.specializations:
        functions.append({"name": "generic", "kind": "symbolic fallback"})
    return functions


def build(model: Model, plan: Plan, targets: list[Target]) -> Artifact:
    """Compile ``model`` for each target as ``plan`` says and return the artifact.

    One VM program per target holds the shape-specialized functions, the dispatch in ``main``
    that picks one or falls back to the symbolic function, and the weights.
    """
    check_matches(model, plan.model_sha256, "plan")
    if not targets:
        raise EdgecError("no target given; pass --target (see `edgec targets`)")
    functions = _functions(plan)
    if plan.multi_region:
        try:
            mod = lower_regions(model, [
                {"name": r.name, "nodes": r.nodes, "inputs": r.inputs, "outputs": r.outputs,
                 "specializations": [s["dims"] for s in r.specializations]} for r in plan.regions])
        except (ModelError, ValueError) as exc:
            # A region that does not import alone (an op needing a constant another region
            # computes) must not cost the model: compile it whole, symbolic, and say so.
            mod = import_onnx(model)
            functions = [{"name": "main", "kind": "symbolic",
                          "note": f"regions not lowered separately: {describe(exc)}"}]
    else:
        specializations = [s["dims"] for s in plan.regions[0].specializations]
        mod = add_shape_dispatch(import_onnx(model), specializations)
    libraries: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    for target in targets:
        codegen = codegen_for(target)
        library = codegen.compile(mod, target)
        file = f"lib/{target.name}.so"
        files[file] = library.data
        libraries[target.name] = {
            "file": file, "sha256": sha256_hex(library.data), "bytes": len(library.data),
            "arch": target.arch, "cpu_features": list(target.cpu_features),
            "kind": target.kind, "device": codegen.device,
            "tvm_target": target.tvm, "functions": functions,
            "native_dependencies": library.native_dependencies,
        }
    manifest = {
        "format_version": FORMAT_VERSION,
        "model": {"name": model.name, "sha256": model.sha256, "opset": model.opset,
                  "source": model.path},
        "inputs": [s.to_json() for s in model.inputs],
        "outputs": [s.to_json() for s in model.outputs],
        "plan": plan.summary(),
        "quantization": {"mode": "none"},
        "libraries": libraries,
        "versions": tool_versions(),
    }
    return Artifact(manifest, files)
