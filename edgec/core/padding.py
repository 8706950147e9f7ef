"""When a region may run a shape padded up to a larger specialized one (a bucket), and how.

A region's dim ``D`` is *padding-safe* when running the region on inputs zero-padded along every
axis that carries ``D`` and slicing its outputs back gives exactly the unpadded outputs. That holds
when no op mixes values along such an axis: each position along it is then computed from the same
position of the inputs only, so the real positions never read a padded one.

The proof (:func:`prove`) is a dataflow analysis over the region's ONNX graph:

1. **Which axes carry D.** ONNX shape inference (with data propagation) types every value twice,
   with ``D`` at two different sizes and every other dim fixed; a value it leaves untyped is typed
   by running the region in onnxruntime on zero inputs of those shapes. An axis whose size differs
   between the two runs carries ``D``; any value without a full type at either size refuses the
   proof.
2. **Values computed from D's size** (``Shape``/``Size`` of a padded tensor, and anything computed
   from them) are tracked. They may steer shapes (``Reshape``/``Expand``/``Range``/``Slice``
   arguments, small-integer shape arithmetic), and shape changes are covered by rule 3; used as
   data (say, a mean computed as a sum divided by the length) they would see the bucket's size, so
   the proof refuses.
3. **Every op that touches a carrying axis** must keep positions apart: elementwise ops (with
   broadcasting); ``MatMul``/``Gemm`` unless the axis is contracted; ``Conv``/pooling/
   ``GlobalAveragePool`` only along the batch axis; normalizations, softmax, reductions,
   ``ArgMax``/``TopK``/``CumSum`` unless they work along the axis; ``Transpose``/``Squeeze``/
   ``Unsqueeze``; ``Reshape``/``Flatten`` only when the axis stays an axis of its own (same size and
   same product of the dims before it, at both sizes); ``Concat``/``Split``/``Gather``/``Slice``
   unless they work along the axis (``Slice`` from a constant 0 with step 1 is a prefix and keeps
   positions). Integer ``Div``/``Mod`` by a padded tensor would divide by the zero padding and is
   refused. Anything else that reads a carrying axis (control flow, data-dependent ops, an op the
   analysis does not know) refuses the proof, naming the node.
4. **Outputs**: every output axis that carries ``D`` must be ``D`` itself (the slice back is to the
   run's own ``D``).

The plan backs a proof with a check on samples (:func:`check_on_samples`): onnxruntime runs the
region on sample inputs as they are and padded to the largest profiled size, and the sliced
outputs must match. ``compiler.dispatch`` then compiles the padding and slicing into the region's
``main`` dispatch, so both runtimes get it.
"""

from __future__ import annotations
from edgec.core.reference import reference_session
from edgec.core.samples import sample_dims

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

# Ops that act on each position alone (with numpy broadcasting).
_ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Relu", "LeakyRelu", "PRelu", "Sigmoid", "Tanh", "Erf",
    "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Clip", "Min", "Max", "Sum", "Mean", "Where",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Cast",
    "CastLike", "Identity", "Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "HardSigmoid",
    "HardSwish", "Softplus", "Softsign", "Elu", "Selu", "Celu", "Gelu", "Mish", "IsNaN", "IsInf",
    "Mod", "Dropout", "BitShift",
}
# Ops that only rearrange axes of size 1 or permute axes: positions along an axis stay apart.
_AXIS_PERMUTING = {"Transpose", "Squeeze", "Unsqueeze"}
_SPATIAL = {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool",
            "GlobalMaxPool", "GlobalLpPool", "InstanceNormalization", "DepthToSpace",
            "SpaceToDepth", "Resize", "Upsample"}
_REDUCE = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
_ALONG_AXIS = {"Softmax", "LogSoftmax", "Hardmax", "ArgMax", "ArgMin", "TopK", "CumSum",
               "Concat", "Split", "Gather"}
# Inputs that are shape arguments (values that may be computed from D's size): (op, index).
_SHAPE_ARGS = {("Reshape", 1), ("Expand", 1), ("ConstantOfShape", 0), ("Range", 0), ("Range", 1),
               ("Range", 2), ("Slice", 1), ("Slice", 2), ("Slice", 3), ("Slice", 4),
               ("Unsqueeze", 1), ("Squeeze", 1), ("Split", 1), ("TopK", 1)}
_SHAPE_READERS = {"Shape", "Size"}
_FLOATS = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
           onnx.TensorProto.BFLOAT16)


@dataclass(frozen=True)
class PadProof:
    """The result of :func:`prove` for one dim of one region.

    ``inputs``/``outputs`` map each region input/output to the axes that carry the dim (the axes
    padded before and sliced after); ``reason`` says why the proof holds or the first thing that
    breaks it.
    """

    dim: str
    safe: bool
    reason: str
    inputs: dict[str, list[int]] = field(default_factory=dict)
    outputs: dict[str, list[int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"dim": self.dim, "safe": self.safe, "reason": self.reason,
                "inputs": self.inputs, "outputs": self.outputs}


def _typed(proto: onnx.ModelProto, dims: Mapping[str, int]) -> tuple[dict[str, list[int | None]],
                                                                        dict[str, int]]:
    """Every value's shape and element type with the graph inputs' dims set to ``dims``."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for value in proto.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in dims:
                dim.dim_value = int(dims[dim.dim_param])
    try:
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # a value left untyped refuses the proof below
        pass
    shapes: dict[str, list[int | None]] = {}
    elems: dict[str, int] = {}
    for value in list(proto.graph.value_info) + list(proto.graph.input) + list(proto.graph.output):
        ttype = value.type.tensor_type
        elems[value.name] = ttype.elem_type
        if ttype.HasField("shape"):
            shapes[value.name] = [d.dim_value if d.HasField("dim_value") else None
                                  for d in ttype.shape.dim]
    for init in proto.graph.initializer:
        shapes[init.name] = list(init.dims)
        elems[init.name] = init.data_type
    untyped = [out for node in proto.graph.node for out in node.output
               if out and (None in shapes.get(out, [None]) or not elems.get(out))]
    if untyped:
        _run_shapes(proto, untyped, shapes, elems)
    return shapes, elems


def _run_shapes(proto: onnx.ModelProto, names: list[str], shapes: dict, elems: dict) -> None:
    """Type ``names`` by running ``proto`` in onnxruntime on zero inputs at the probe shapes
    (ONNX inference leaves a value untyped where its shape comes from a computed tensor, such as a
    ``Slice`` of positions up to a length read from a shape). Values it cannot run stay untyped."""

    feed = {}
    for value in proto.graph.input:
        ttype = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
        if None in dims:
            return
        feed[value.name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(ttype.elem_type))
    extended = onnx.ModelProto.FromString(proto.SerializeToString())
    known = {o.name for o in extended.graph.output}
    extended.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    try:
        values = reference_session(extended, threads=1).run(feed)
    except Exception:  # any failure leaves the values untyped, which refuses the proof
        return
    for name in names:
        if name in values:
            array = np.asarray(values[name])
            shapes[name] = list(array.shape)
            elems[name] = helper.np_dtype_to_tensor_dtype(array.dtype)


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _prefix(shape: list[int], axis: int) -> int:
    return int(np.prod(shape[:axis], dtype=np.int64)) if axis else 1


class _Refused(Exception):
    pass


def prove(region: onnx.ModelProto, dim: str, dims: Mapping[str, int], small: int,
          large: int) -> PadProof:
    """Whether ``dim`` of the ``region`` model may be padded (see the module doc).

    ``dims`` fixes the region's other symbolic dims; ``small`` < ``large`` are the two sizes of
    ``dim`` the shapes are inferred at (sizes the profile saw, so the inference sees real shapes).
    """
    graph = region.graph
    a, elems = _typed(region, {**dims, dim: small})
    b, _ = _typed(region, {**dims, dim: large})
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = _attr(node, "value")
            if value is not None:
                constants[node.output[0]] = numpy_helper.to_array(value)

    def carrying(value: str) -> list[int]:
        sa, sb = a.get(value), b.get(value)
        if sa is None or sb is None or len(sa) != len(sb) or None in sa or None in sb:
            raise _Refused(f"shape inference cannot type '{value}' at {dim}={small} and {large}")
        return [axis for axis, (x, y) in enumerate(zip(sa, sb)) if x != y]

    try:
        inputs = {}
        for value in graph.input:
            axes = carrying(value.name)
            ttype = value.type.tensor_type
            if not axes and ttype.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) \
                    and len(ttype.shape.dim) <= 1:
                # A small integer input may hold a size computed from dim in an earlier region.
                raise _Refused(f"input '{value.name}' is a small integer tensor whose value may "
                               f"depend on {dim}")
            if axes:
                inputs[value.name] = axes
        if not inputs:
            raise _Refused(f"no input of the region has an axis that grows with {dim}")
        derived: set[str] = set()  # values computed from dim's size
        for node in graph.node:
            _check_node(node, dim, carrying, derived, constants, (a, b), elems)
        outputs = {}
        for value in graph.output:
            if value.name in derived:
                raise _Refused(f"output '{value.name}' is computed from {dim}'s size")
            axes = carrying(value.name)
            for axis in axes:
                if a[value.name][axis] != small or b[value.name][axis] != large:
                    raise _Refused(f"output '{value.name}' axis {axis} grows with {dim} but is not "
                                   f"{dim} itself, so it cannot be sliced back")
            if axes:
                outputs[value.name] = axes
    except _Refused as refused:
        return PadProof(dim, False, str(refused))
    return PadProof(dim, True,
                    f"every op keeps positions along the axes carrying {dim} apart (checked op by op "
                    f"over {len(graph.node)} nodes, shapes inferred at {dim}={small} and {large}); "
                    f"inputs padded: {', '.join(f'{k} axes {v}' for k, v in inputs.items())}; "
                    f"outputs sliced: {', '.join(f'{k} axes {v}' for k, v in outputs.items()) or 'none'}",
                    inputs, outputs)


def _check_node(node: onnx.NodeProto, dim: str, carrying, derived: set[str],
                constants: dict[str, np.ndarray], runs: tuple[dict, dict], elems: dict[str, int]) -> None:
    """Refuse (raise ``_Refused``) if ``node`` mixes positions along an axis carrying ``dim``;
    record in ``derived`` the values it computes from ``dim``'s size."""
    shapes = runs[0]
    op = node.op_type
    where = f"node '{node.name or node.output[0]}' ({op})"
    ins = [i for i in node.input]
    padded = {i: carrying(name) for i, name in enumerate(ins) if name}
    touched = {i: axes for i, axes in padded.items() if axes}
    outs = [o for o in node.output if o]
    from_size = [i for i, name in enumerate(ins) if name in derived]

    # Values computed from dim's size: shape arguments, or small integer arithmetic whose result is
    # again such a value. Used as data anywhere else, they would see the bucket's size.
    if from_size:
        small_int_out = all(len(shapes.get(o) or [0, 0]) <= 1 and not carrying(o) and
                            elems.get(o) in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)
                            for o in outs)
        for i in from_size:
            if (op, i) in _SHAPE_ARGS:
                continue
            if small_int_out and op not in ("If", "Loop", "Scan"):
                derived.update(outs)
                continue
            raise _Refused(f"{where} uses '{ins[i]}', a value computed from {dim}'s size, as data")
    if op in _SHAPE_READERS:
        if touched:
            derived.update(outs)
        return
    if not touched:
        return
    rank = {i: len(shapes[ins[i]]) for i in touched}

    def refuse(what: str) -> None:
        raise _Refused(f"{where} {what} along an axis carrying {dim}")

    if op in _ELEMENTWISE:
        if op in ("Div", "Mod") and 1 in touched and elems.get(ins[1]) not in _FLOATS:
            refuse("divides integers by the zero padding")
        return
    if op in ("MatMul", "MatMulInteger"):
        if 0 in touched and rank[0] - 1 in touched[0]:
            refuse("contracts (MatMul)")
        if 1 in touched and (max(rank[1] - 2, 0)) in touched[1]:
            refuse("contracts (MatMul)")
        return
    if op == "Gemm":
        contract_a = 0 if _attr(node, "transA", 0) else 1
        contract_b = 1 if _attr(node, "transB", 0) else 0
        if contract_a in touched.get(0, []) or contract_b in touched.get(1, []) or 2 in touched:
            refuse("contracts or biases (Gemm)")
        return
    if op in _SPATIAL:
        if any(axes != [0] for i, axes in touched.items()) or set(touched) - {0}:
            refuse("mixes channels or neighbouring positions")
        return
    if op == "BatchNormalization":
        if any(1 in axes for axes in touched.values()) or set(touched) - {0}:
            refuse("normalizes per channel")
        return
    if op == "LayerNormalization":
        axis = _attr(node, "axis", -1) % rank[0] if 0 in touched else 0
        if set(touched) - {0} or any(x >= axis for x in touched.get(0, [])):
            refuse("normalizes")
        return
    if op in _REDUCE:
        axes_value = _attr(node, "axes")
        if axes_value is None and len(ins) > 1 and ins[1]:
            arr = constants.get(ins[1])
            if arr is None:
                refuse("reduces over axes that are not constant")
            axes_value = arr.tolist()
        if not axes_value:
            if _attr(node, "noop_with_empty_axes", 0):
                return
            refuse("reduces (all axes)")
        reduced = {int(x) % rank[0] for x in axes_value}
        if reduced & set(touched.get(0, [])):
            refuse("reduces")
        return
    if op in _ALONG_AXIS:
        if op == "CumSum":
            arr = constants.get(ins[1]) if len(ins) > 1 else None
            if arr is None:
                refuse("sums over an axis that is not constant")
            axis = int(arr.reshape(-1)[0])
        else:
            axis = _attr(node, "axis", 0 if op in ("Concat", "Split", "Gather") else -1)
        data_inputs = list(range(len(ins))) if op == "Concat" else [0]
        for i in data_inputs:
            if i in touched and int(axis) % rank[i] in touched[i]:
                refuse("works")
        return  # Gather's indices (input 1) may carry dim: output positions follow them
    if op in _AXIS_PERMUTING:
        return
    if op in ("Reshape", "Flatten"):
        out = outs[0]
        axes_out = carrying(out)
        axes_in = touched.get(0, [])
        if len(axes_out) != len(axes_in):
            refuse("merges or splits (Reshape)")
        for axis_in, axis_out in zip(axes_in, axes_out):
            # Row-major: the axis stays one of its own iff it keeps its size and the product of
            # the dims before it, at both sizes of dim.
            if any(run[ins[0]][axis_in] != run[out][axis_out] or
                   _prefix(run[ins[0]], axis_in) != _prefix(run[out], axis_out) for run in runs):
                refuse("merges or splits (Reshape)")
        return
    if op == "Slice":
        starts = constants.get(ins[1]) if len(ins) > 1 else None
        axes_arr = constants.get(ins[3]) if len(ins) > 3 and ins[3] else None
        steps = constants.get(ins[4]) if len(ins) > 4 and ins[4] else None
        if starts is None:
            refuse("slices from a start that is not constant")
        axes_list = (axes_arr.tolist() if axes_arr is not None else list(range(len(starts))))
        for pos, axis in enumerate(axes_list):
            if int(axis) % rank[0] in touched.get(0, []):
                step = int(steps[pos]) if steps is not None else 1
                if int(starts[pos]) != 0 or step != 1:
                    refuse("slices other than a prefix")
        return
    if op in ("Expand", "ConstantOfShape", "Range"):
        return
    refuse("is not known to keep positions apart")


def _pad_to(array: np.ndarray, axes: list[tuple[int, str]], bucket: Mapping[str, int]) -> np.ndarray:
    if not axes:
        return array
    widths = [(0, 0)] * array.ndim
    for axis, dim in axes:
        widths[axis] = (0, int(bucket[dim]) - array.shape[axis])
    return np.pad(array, widths)


def _slice_to(array: np.ndarray, axes: list[tuple[int, str]], dims: Mapping[str, int]) -> np.ndarray:
    index = [slice(None)] * array.ndim
    for axis, dim in axes:
        index[axis] = slice(0, int(dims[dim]))
    return array[tuple(index)]


def check_on_samples(model, cut, region: onnx.ModelProto, padding: Mapping[str, Any],
                     samples: list, largest: Mapping[str, int], limit: int = 4) -> str | None:
    """Back a proof with onnxruntime: run the region on up to ``limit`` samples smaller than
    ``largest`` along the padded dims, as they are and zero-padded to ``largest``; the padded
    outputs sliced back must equal the others (rtol 1e-4, atol 1e-5). Returns None when they do,
    else what differs. ``samples`` are the model's; a later region's inputs are the values the
    whole model computes for them."""

    pad_dims = list(padding["dims"])
    inputs = {k: [(int(a), d) for a, d in v] for k, v in padding["inputs"].items()}
    outputs = {k: [(int(a), d) for a, d in v] for k, v in padding["outputs"].items()}
    chosen = []
    for sample in samples:
        dims = sample_dims(model, sample)
        if any(dims[d] < largest[d] for d in pad_dims) and \
                all(dims[d] <= largest[d] for d in pad_dims):
            chosen.append((sample, dims))
        if len(chosen) == limit:
            break
    if not chosen:
        return "no sample is smaller than the largest profiled shape to check padding on"
    graph_inputs = {i.name for i in model.proto.graph.input}
    needed = [name for name in cut.inputs if name not in graph_inputs]
    whole = None
    if needed:
        extended = onnx.ModelProto.FromString(model.proto.SerializeToString())
        known = {o.name for o in extended.graph.output}
        extended.graph.output.extend(
            [onnx.ValueInfoProto(name=name) for name in needed if name not in known])
        whole = reference_session(extended, threads=1)
    session = reference_session(region, threads=1)
    for sample, dims in chosen:
        values = dict(sample.arrays)
        if whole is not None:
            values.update(whole.run({i.name: sample.arrays[i.name] for i in model.proto.graph.input}))
        feed = {name: values[name] for name in cut.inputs}
        bucket = {**dims, **{d: largest[d] for d in pad_dims}}
        plain = session.run(feed)
        padded = session.run({name: _pad_to(np.asarray(array), inputs.get(name, []), bucket)
                              for name, array in feed.items()})
        for name, expected in plain.items():
            got = _slice_to(padded[name], outputs.get(name, []), dims)
            if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-4, atol=1e-5):
                return (f"output '{name}' of sample '{sample.name}' padded to "
                        f"{', '.join(f'{d}={largest[d]}' for d in pad_dims)} differs from the unpadded run")
    return None


def region_padding(model, cut, region: onnx.ModelProto, dims: list[str],
                   distribution: list[tuple[dict[str, int], float]], samples: list | None) -> dict[str, Any]:
    """Which of ``dims`` a region may pad, proved (:func:`prove`) and checked on ``samples``
    (:func:`check_on_samples`): the plan Region's ``padding`` (``used`` is left for the plan)."""
    result: dict[str, Any] = {"used": False, "dims": [], "inputs": {}, "outputs": {},
                              "proofs": {}, "refused": {}, "check": ""}
    if not distribution or not dims:
        return result
    hottest = max(distribution, key=lambda entry: entry[1])[0]
    largest = {}
    for dim in dims:
        seen = sorted({int(g[dim]) for g, _ in distribution if dim in g})
        if len(seen) < 2:
            result["refused"][dim] = f"the profile saw one size of {dim}: nothing to pad"
            continue
        others = {d: int(hottest[d]) for d in dims if d != dim and d in hottest}
        proof = prove(region, dim, others, seen[0], seen[-1])
        if not proof.safe:
            result["refused"][dim] = proof.reason
            continue
        result["proofs"][dim] = proof.reason
        result["dims"].append(dim)
        largest[dim] = seen[-1]
        for kind, axes_of in (("inputs", proof.inputs), ("outputs", proof.outputs)):
            for name, axes in axes_of.items():
                result[kind].setdefault(name, []).extend([axis, dim] for axis in axes)
    if not result["dims"]:
        return result
    if not samples:
        result["check"] = "not checked: no samples given (pass --samples), so padding is not used"
        result["refused"].update({d: "proved, but not checked on samples" for d in result["dims"]})
        result["dims"] = []
        return result
    failed = check_on_samples(model, cut, region, result, samples, largest)
    if failed:
        result["check"] = f"refused by the sample check: {failed}"
        result["refused"].update({d: result["check"] for d in result["dims"]})
        result["dims"] = []
        return result
    result["check"] = ("onnxruntime on samples padded to the largest profiled size gives the "
                       "unpadded outputs (rtol 1e-4, atol 1e-5)")
    return result
