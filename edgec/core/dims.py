"""Symbolic input dims that the graph says are one: exporters name every unknown dim apart.

tf2onnx writes ``unk__12`` and ``unk__13`` for the batch of two inputs, paddle2onnx writes ``-1``
for both, others write ``?``; the loader gives each its own name. When the graph then adds the two
inputs, or multiplies one by the other's transpose, the sizes must agree at run time, and the
compiler needs to know it: TVM cannot broadcast two different symbolic dims, or contract over
them. ``unify_dims`` follows the top-level graph and gives such dims one name:

- elementwise ops with numpy broadcasting (Add, Mul, Where, ...): aligned dims that are both
  symbolic are the same dim (a symbolic dim that is 1 at run time while the other is not is not
  handled: no exporter writes a broadcast of size 1 as a symbolic dim);
- MatMul / Gemm: the contracted dims; Concat: every dim but the axis.

Shapes between nodes come from ONNX shape inference, rerun after each round of renames until
nothing changes. The renamed dims are the model's: its signature, the profile, the plan and the
runtime's input checks all see one dim.
"""

from __future__ import annotations

import onnx
from onnx import shape_inference

BROADCAST_OPS = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Greater", "GreaterOrEqual",
                 "Less", "LessOrEqual", "And", "Or", "Xor", "Where", "Max", "Min", "Sum", "Mean",
                 "PRelu", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"}
_ROUNDS = 4

Shape = list[int | str | None]


def unify_dims(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` (changed in place and returned) with graph input and output dims the graph
    requires equal given one name, the name of the first such input dim."""
    for _ in range(_ROUNDS):
        renames = _equal_dims(proto)
        if not renames:
            break
        for value in list(proto.graph.input) + list(proto.graph.output):
            if value.type.HasField("tensor_type"):
                for dim in value.type.tensor_type.shape.dim:
                    if dim.dim_param in renames:
                        dim.dim_param = renames[dim.dim_param]
    return proto


def _shapes(proto: onnx.ModelProto) -> dict[str, Shape]:
    """Every top-level value's shape ONNX inference finds, dims as int, name or None."""
    try:
        inferred = shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - a model inference cannot follow keeps its names
        inferred = proto
    shapes = {}
    values = (list(inferred.graph.input) + list(inferred.graph.value_info)
              + list(inferred.graph.output))
    for value in values:
        ttype = value.type.tensor_type if value.type.HasField("tensor_type") else None
        if ttype is None or not ttype.HasField("shape"):
            continue
        shapes[value.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                              for d in ttype.shape.dim]
    return shapes


def _equal_dims(proto: onnx.ModelProto) -> dict[str, str]:
    """Input dim name -> the name it is one with (only names that change)."""
    order = [d.dim_param for v in proto.graph.input if v.type.HasField("tensor_type")
             for d in v.type.tensor_type.shape.dim if d.dim_param]
    rank = {name: i for i, name in reversed(list(enumerate(order)))}
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent.get(name, name) != name:
            name = parent[name]
        return name

    def union(a, b) -> None:
        if not (isinstance(a, str) and isinstance(b, str) and a in rank and b in rank):
            return
        a, b = find(a), find(b)
        if a != b:
            first, second = sorted((a, b), key=rank.__getitem__)
            parent[second] = first

    shapes = _shapes(proto)
    for node in proto.graph.node:
        ins = [shapes.get(name) if name else None for name in node.input]
        if node.op_type in BROADCAST_OPS:
            known = [s for s in ins if s is not None]
            width = max((len(s) for s in known), default=0)
            for axis in range(1, width + 1):
                dims = [s[-axis] for s in known if len(s) >= axis]
                for other in dims[1:]:
                    union(dims[0], other)
        elif node.op_type in ("MatMul", "MatMulInteger") and len(ins) >= 2 and all(ins[:2]):
            a, b = ins[0], ins[1]
            if a and b and len(b) >= 2:
                union(a[-1], b[-2])
            elif a and b:
                union(a[-1], b[0])
        elif node.op_type == "Gemm" and len(ins) >= 2 and all(ins[:2]):
            attrs = {a.name: a.i for a in node.attribute}
            a, b = ins[0], ins[1]
            if len(a) == 2 and len(b) == 2:
                union(a[0 if attrs.get("transA") else 1], b[1 if attrs.get("transB") else 0])
        elif node.op_type == "Concat":
            known = [s for s in ins if s is not None]
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if known and all(len(s) == len(known[0]) for s in known):
                axis %= len(known[0]) if known[0] else 1
                for k in range(len(known[0])):
                    if k != axis:
                        for other in known[1:]:
                            union(known[0][k], other[k])
    return {name: find(name) for name in rank if find(name) != name}
