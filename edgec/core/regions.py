"""Cutting a model into regions, and each region as an ONNX model of its own.

A region is a run of top-level nodes that the plan compiles one way (symbolic, or specialized for
some shapes with a symbolic fallback). Regions end at control flow (``If``, ``Loop``, ``Scan``)
and at operators whose output shape depends on input values (``NonZero`` ...), each of which is a
region of its own: past such a point the profiled input dims no longer fix the shapes, and a
control-flow op is already a call into functions of its own. A model without them is one region.

Only ONNX is needed here (no compiler): the plan cuts, ``compiler.dispatch`` lowers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx
from onnx import helper

from edgec.core.model import Model, subgraphs

CONTROL_FLOW = ("If", "Loop", "Scan")
# Operators whose output shape depends on input values, not only on input shapes.
DATA_DEPENDENT_OPS = ("NonZero", "Unique", "Compress", "NonMaxSuppression")
# Operators cheap to recompute on small integer tensors (shape arithmetic). A value they compute
# that a later region needs is recomputed there, so that region still sees shape logic it can
# fold (a known target shape for a Reshape) instead of an opaque tensor.
_SHAPE_OPS = ("Constant", "Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice",
              "Cast", "Add", "Sub", "Mul", "Div", "Identity", "Range", "ReduceProd", "Max", "Min",
              "Equal", "Where", "ConstantOfShape")


@dataclass(frozen=True)
class RegionCut:
    """The nodes of one region (graph order), the values it reads from before it, those it hands
    on, and the boundary op it holds (``""`` for a run of ordinary nodes)."""

    nodes: list[str]
    inputs: list[str]
    outputs: list[str]
    boundary: str


def used_names(node: onnx.NodeProto) -> list[str]:
    """Names a node reads, the outer-scope names its subgraphs read included."""
    names = [n for n in node.input if n]

    def visit(graph: onnx.GraphProto, bound: set[str]) -> None:
        bound = bound | {v.name for v in graph.input} | {i.name for i in graph.initializer}
        for inner in graph.node:
            names.extend(n for n in inner.input if n and n not in bound)
            for sub in subgraphs(inner):
                visit(sub, bound)
            bound |= set(inner.output)

    for sub in subgraphs(node):
        visit(sub, set())
    return list(dict.fromkeys(names))


@functools.lru_cache(maxsize=8)
def _inferred(serialized: bytes) -> onnx.ModelProto:
    proto = onnx.ModelProto.FromString(serialized)
    try:
        return onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # inference is best effort: untyped values are handled by the callers
        return proto


def inferred_types(model: Model) -> dict[str, onnx.ValueInfoProto]:
    """Every top-level value's type as ONNX shape inference (with data propagation) gives it."""
    graph = _inferred(model.serialized()).graph
    return {v.name: v for v in list(graph.value_info) + list(graph.input) + list(graph.output)}


def _small_int_values(model: Model) -> set[str]:
    found = set()
    for name, value in inferred_types(model).items():
        ttype = value.type.tensor_type
        if ttype.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) and \
                ttype.HasField("shape") and len(ttype.shape.dim) <= 1:
            found.add(name)
    return found


def whole_model(model: Model) -> RegionCut:
    """The whole model as one region."""
    return RegionCut(model.node_names, [i.name for i in model.inputs],
                     [o.name for o in model.outputs], "")


def cut_regions(model: Model, whole: bool = False) -> list[RegionCut]:
    """Cut the top-level graph at control flow and data-dependent-shape ops (see the module doc).

    ``whole`` (and a PyTorch program, whose graph is not ONNX) gives one region.
    """
    if whole or model.proto is None:
        return [whole_model(model)]
    graph = model.proto.graph
    nodes = list(graph.node)
    runs: list[tuple[list[int], str]] = []
    current: list[int] = []
    for index, node in enumerate(nodes):
        if node.op_type in CONTROL_FLOW or node.op_type in DATA_DEPENDENT_OPS:
            if current:
                runs.append((current, ""))
            runs.append(([index], node.op_type))
            current = []
        else:
            current.append(index)
    if current:
        runs.append((current, ""))
    if len(runs) == 1:
        return [RegionCut([n.name for n in nodes], [i.name for i in graph.input],
                          [o.name for o in graph.output], runs[0][1])]

    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    initializers = {init.name for init in graph.initializer}
    small_int = _small_int_values(model)
    graph_outputs = [o.name for o in graph.output]
    members: list[list[int]] = []
    for run, _ in runs:
        chosen = set(run)
        pending = [name for i in run for name in used_names(nodes[i])]
        while pending:
            source = producer.get(pending.pop())
            if source is None or source in chosen:
                continue
            node = nodes[source]
            if node.op_type in _SHAPE_OPS and all(out in small_int for out in node.output if out):
                chosen.add(source)
                pending.extend(used_names(node))
        members.append(sorted(chosen))
    cuts = []
    for k, (indices, (_, boundary)) in enumerate(zip(members, runs)):
        produced = {out for i in indices for out in nodes[i].output if out}
        reads = [name for i in indices for name in used_names(nodes[i])]
        inputs = [n for n in dict.fromkeys(reads) if n not in produced and n not in initializers]
        later_members = [set(other) for other in members[k + 1:]]
        outputs = []
        for i in indices:
            for out in nodes[i].output:
                if not out:
                    continue
                # Hand a value on when a later region reads it without computing it itself.
                needed = out in graph_outputs or any(
                    producer[out] not in other and any(out in used_names(nodes[j]) for j in other)
                    for other in later_members)
                if needed and out not in outputs:
                    outputs.append(out)
        cuts.append(RegionCut([nodes[i].name for i in indices], inputs, outputs, boundary))
    # A value passed between regions needs a tensor type of known rank (the region functions'
    # signatures); where shape inference cannot give one, the model stays one region.
    types = inferred_types(model)
    for cut in cuts:
        for value in cut.inputs + cut.outputs:
            known = types.get(value)
            if known is None or not known.type.HasField("tensor_type") or \
                    not known.type.tensor_type.elem_type or not known.type.tensor_type.HasField("shape"):
                return [RegionCut([n.name for n in nodes], [i.name for i in graph.input],
                                  [o.name for o in graph.output], "")]
    return cuts


def region_model(model: Model, cut: RegionCut, name: str) -> onnx.ModelProto:
    """The ONNX model that runs ``cut``'s nodes from its inputs to its outputs.

    Types of intermediate values come from ONNX shape inference on the whole model. A dim it
    names is kept (so ``batch`` stays ``batch`` across regions); a dim it cannot name (a
    data-dependent one) gets a name of its own, ``VALUE_dAXIS``, symbolic in that region.
    """
    types = inferred_types(model)
    by_name = {n.name: n for n in model.proto.graph.node}
    chosen = [by_name[n] for n in cut.nodes]

    def value_info(value: str) -> onnx.ValueInfoProto:
        known = types.get(value)
        if known is None or not known.type.tensor_type.elem_type or \
                not known.type.tensor_type.HasField("shape"):
            raise ValueError(f"region {name}: ONNX shape inference gives no type for '{value}'")
        copy = onnx.ValueInfoProto.FromString(known.SerializeToString())
        ident = "".join(ch if ch.isalnum() else "_" for ch in value)
        for axis, dim in enumerate(copy.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value") and (not dim.dim_param or dim.dim_param.startswith("unk__")):
                dim.dim_param = f"{ident}_d{axis}"
        return copy

    used = {n for node in chosen for n in used_names(node)}
    graph = helper.make_graph(
        chosen, name, [value_info(v) for v in cut.inputs], [value_info(v) for v in cut.outputs],
        [init for init in model.proto.graph.initializer if init.name in used])
    sub = helper.make_model(graph, opset_imports=list(model.proto.opset_import))
    sub.ir_version = model.proto.ir_version
    return sub


def region_dims(model: Model, cut: RegionCut) -> list[str]:
    """The symbolic dims of a region's inputs, in order of first appearance."""
    if cut.inputs == [i.name for i in model.inputs]:
        return list(model.dynamic_dims)
    seen: list[str] = []
    for value in region_model(model, cut, "probe").graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value") and dim.dim_param not in seen:
                seen.append(dim.dim_param)
    return seen
