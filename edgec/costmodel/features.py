"""Features of a region under an option at a shape on a target.

All features come from the ONNX graph with the graph inputs' symbolic dims set to the shape's
values (shape inference with data propagation), so the planner can compute them from a profile
alone. A dim that depends on values (after ``NonZero``) counts as 1 and is counted in
``unknown_dims``; trip counts of loops come from the profile.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import helper

from edgec.compiler.backends import backend_for
from edgec.compiler.importer.recurrent import native_loop_fits
from edgec.core.model import Model, all_nodes, subgraphs
from edgec.core.regions import RegionCut
from edgec.core.targets import Target

# How a region runs at a shape: its one symbolic function; its dispatch into a static copy; its
# dispatch that finds none and runs the symbolic fallback; its dispatch that pads the inputs to a
# larger static copy (a bucket), runs it and slices the outputs back.
OPTIONS = ("symbolic", "specialized", "fallback", "padded")

_MATMUL = ("MatMul", "Gemm", "MatMulInteger", "Einsum")
_CONV = ("Conv", "ConvTranspose", "ConvInteger")
_REDUCE = ("Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization", "ReduceSum",
           "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "TopK", "ArgMax", "ArgMin",
           "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "InstanceNormalization",
           "LRN", "CumSum")
_MOVEMENT = ("Reshape", "Transpose", "Gather", "GatherElements", "GatherND", "Concat", "Slice",
             "Split", "Squeeze", "Unsqueeze", "Expand", "Tile", "ScatterND", "ScatterElements",
             "Flatten", "Pad", "Identity", "Where", "Resize")
_SHAPE = ("Shape", "Size", "Constant", "ConstantOfShape", "Range", "Cast", "NonZero")
_CONTROL = ("If", "Loop", "Scan")
# Recurrent layers, with about how many nodes one step of their Scan runs.
_RECURRENT = {"LSTM": 20, "GRU": 18, "RNN": 4}

# The order the learners see features in; saved with a fitted model.
FEATURE_NAMES = (
    "log_flops", "log_bytes", "log_intensity", "log_nodes", "frac_matmul", "frac_conv",
    "frac_reduce", "frac_movement", "frac_shape", "frac_elementwise", "control_flow",
    "log_trips", "log_sub_nodes", "unknown_dims", "log_input_elements", "log_max_dim",
    "symbolic_dims", "static", "dispatch", "dispatch_x_inv_bytes", "static_x_log_nodes", "static_x_frac_movement",
    "static_x_log_flops", "target_cores", "target_vector_bits", "padded", "pad_fraction",
    "log_pad_bytes", "log_library_flops", "log_tvm_flops", "log_kernels", "frac_library",
    "log_tvm_matmul_flops", "static_x_log_tvm_matmul_flops", "static_x_log_tvm_flops",
    "log_recurrent_flops",
)


def _fixed(model: Model, dims: Mapping[str, int]) -> bytes:
    proto = onnx.ModelProto.FromString(model.serialized())
    for value in proto.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in dims:
                dim.dim_value = int(dims[dim.dim_param])
    return proto.SerializeToString()


@functools.lru_cache(maxsize=64)
def _shapes_at(serialized: bytes) -> dict[str, tuple[int, list[int | None]]]:
    proto = onnx.ModelProto.FromString(serialized)
    try:
        proto = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # best effort: values without a type count as unknown
        pass
    found = {}
    for value in list(proto.graph.value_info) + list(proto.graph.input) + list(proto.graph.output):
        ttype = value.type.tensor_type
        if not ttype.HasField("shape"):
            continue
        found[value.name] = (ttype.elem_type, [d.dim_value if d.HasField("dim_value") else None
                                               for d in ttype.shape.dim])
    for init in proto.graph.initializer:
        found[init.name] = (init.data_type, list(init.dims))
    return found


def _elements(dims: list[int | None]) -> int:
    return int(np.prod([d if d else 1 for d in dims], dtype=np.int64)) if dims else 1


def _itemsize(elem_type: int) -> int:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 4


def _count_sub_nodes(node: onnx.NodeProto) -> int:
    return sum(1 for graph in subgraphs(node) for _ in all_nodes(graph))


def _scan_trips(node: onnx.NodeProto, shapes: dict) -> int | None:
    """A Scan's trip count at these shapes: its first scan input's length along the scan axis."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body = attrs["body"]
    num_scan = int(attrs.get("num_scan_inputs", 1))
    first = node.input[len(body.input) - num_scan] if len(node.input) >= len(body.input) else None
    axes = list(attrs.get("scan_input_axes", [0]))
    known = shapes.get(first) if first else None
    if not known or not known[1]:
        return None
    return known[1][(axes[0] if axes else 0) % len(known[1])]


def _batch_major(node: onnx.NodeProto) -> bool:
    return any(a.name == "layout" and a.i == 1 for a in node.attribute)


def target_features(target: Target) -> dict[str, float]:
    mattr = " ".join(target.tvm.get("mattr", []))
    vector_bits = 512 if "avx512" in mattr else 256 if "avx" in mattr else 128
    return {"target_cores": float(target.tvm.get("num-cores", 1) or 1),
            "target_vector_bits": float(vector_bits)}


def region_features(model: Model, cut: RegionCut, dims: Mapping[str, int], option: str,
                    target: Target, trips: Mapping[str, float] | None = None,
                    static: bool = False, bucket: Mapping[str, int] | None = None) -> dict[str, float]:
    """The features of region ``cut`` of ``model`` run as ``option`` with the graph inputs'
    symbolic dims at ``dims``; ``trips`` gives a loop's mean trip count by node name. ``static``:
    the region has no symbolic dim, so even its one function is static. ``bucket``: for option
    ``padded``, the dims of the static copy it runs (its work is that copy's, on padded inputs)."""
    if option not in OPTIONS:
        raise ValueError(f"unknown option {option!r}")
    if option == "padded" and not bucket:
        raise ValueError("option 'padded' needs the bucket it runs")
    real_dims = dict(dims)
    if option == "padded":
        dims = {**dims, **bucket}
    shapes = _shapes_at(_fixed(model, dims))
    by_name = {n.name: n for n in model.proto.graph.node}
    flops = moved = 0.0
    library_flops = tvm_matmul_flops = recurrent_flops = 0.0
    library_calls = kernels = 0
    weights = {init.name for init in model.proto.graph.initializer}
    counts = dict.fromkeys(("matmul", "conv", "reduce", "movement", "shape", "elementwise"), 0)
    control = sub_nodes = 0
    trip_total = 0.0
    unknown: set[tuple[str, int]] = set()
    for name in cut.nodes:
        node = by_name[name]
        op = node.op_type
        outs = [shapes.get(o) for o in node.output if o]
        ins = [shapes.get(i) for i in node.input if i]
        for value, known in zip(list(node.output) + list(node.input), outs + ins):
            if known is not None:
                unknown |= {(value, a) for a, d in enumerate(known[1]) if d is None}
        out_elems = sum(_elements(o[1]) for o in outs if o is not None)
        moved += sum(_elements(v[1]) * _itemsize(v[0]) for v in outs + ins if v is not None)
        # Kernels: ops other than shape arithmetic (which folds or runs on the host). A matmul or
        # conv with a constant weight is a oneDNN call (compiler.library_dispatch); the rest are
        # TVM kernels.
        kernels += op not in _SHAPE
        if op in _MATMUL:
            k = ins[0][1][-1] if ins and ins[0] is not None and ins[0][1] and ins[0][1][-1] else 1
            if op == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute) and ins[0]:
                k = ins[0][1][0] or 1
            flops += 2.0 * out_elems * k
            counts["matmul"] += 1
            if len(node.input) > 1 and node.input[1] in weights:
                library_flops += 2.0 * out_elems * k
                library_calls += 1
            else:  # two computed operands (attention): a TVM kernel whose loops are the dims
                tvm_matmul_flops += 2.0 * out_elems * k
        elif op in _CONV:
            weight = ins[1] if len(ins) > 1 and ins[1] is not None else None
            per_out = _elements(weight[1][1:]) if weight else 1
            flops += 2.0 * out_elems * per_out
            counts["conv"] += 1
            if len(node.input) > 1 and node.input[1] in weights:
                library_flops += 2.0 * out_elems * per_out
                library_calls += 1
        elif op in _REDUCE:
            flops += 4.0 * sum(_elements(v[1]) for v in ins[:1] if v is not None)
            counts["reduce"] += 1
        elif op in _MOVEMENT:
            counts["movement"] += 1
        elif op in _SHAPE:
            counts["shape"] += 1
        elif op in _RECURRENT:
            # importer/recurrent.py: the input projection is one library matmul before the loop;
            # each step a matmul with R and the gates, in edgec's native loop on CPU targets
            # (one call, no per-step overhead) or as a Scan.
            x, w, r = (ins[k][1] if len(ins) > k and ins[k] is not None else [] for k in range(3))
            elem_type = ins[0][0] if ins and ins[0] else 0
            native = backend_for(target).native_kernels and native_loop_fits(node, elem_type)
            if len(x) == 3 and len(w) == 3 and len(r) == 3:
                steps, rows = (x[1], x[0]) if _batch_major(node) else (x[0], x[1])
                per_input = 2.0 * (steps or 1) * (rows or 1) * (w[0] or 1) * (w[1] or 1)
                library_flops += per_input * (x[2] or 1)
                flops += per_input * ((x[2] or 1) + (r[2] or 1))
                # A matrix-vector product per step: priced apart from the library's matmuls.
                recurrent_flops += per_input * (r[2] or 1) if native else 0.0
                library_calls += 1
                trip_total += 0 if native else steps or 1
            counts["matmul"] += 1
            if not native:
                control += 1
                sub_nodes += _RECURRENT[op]
        elif op in _CONTROL:
            control += 1
            inner = _count_sub_nodes(node)
            sub_nodes += inner
            trip = (trips or {}).get(name, 1.0) if op != "If" else 1.0
            if op == "Scan":
                trip = _scan_trips(node, shapes) or trip
            trip_total += trip
            # A loop body's work: its nodes times the state it carries, each trip.
            flops += trip * inner * max(out_elems, 1)
            moved += trip * inner * max(out_elems, 1) * 4
        else:
            flops += float(out_elems)
            counts["elementwise"] += 1
    nodes = max(len(cut.nodes), 1)
    input_dims = [d for i in cut.inputs if shapes.get(i) for d in shapes[i][1]]
    feats = {
        "log_flops": math.log10(flops + 1.0),
        "log_bytes": math.log10(moved + 1.0),
        "log_intensity": math.log10((flops + 1.0) / (moved + 1.0)),
        "log_nodes": math.log10(nodes),
        **{f"frac_{k}": v / nodes for k, v in counts.items()},
        "control_flow": float(control),
        "log_trips": math.log10(trip_total + 1.0),
        "log_sub_nodes": math.log10(sub_nodes + 1.0),
        "unknown_dims": float(len(unknown)),
        "log_input_elements": math.log10(sum(_elements(shapes[i][1]) for i in cut.inputs
                                             if shapes.get(i)) + 1.0),
        "log_max_dim": math.log10(max([d for d in input_dims if d] or [1])),
        "symbolic_dims": float(len(dims)),
        "static": 1.0 if option in ("specialized", "padded") or static else 0.0,
        "dispatch": 1.0 if option in ("specialized", "fallback", "padded") else 0.0,
    }
    # Padding: the share of the bucket's input elements that are padding, and the bytes the pad
    # and slice copies move (inputs and outputs at the bucket).
    padded = option == "padded"
    fraction = 0.0
    if padded:
        real = sum(_elements(shapes[i][1]) for i in cut.inputs if shapes.get(i))
        real_shapes = _shapes_at(_fixed(model, real_dims))
        small = sum(_elements(real_shapes[i][1]) for i in cut.inputs if real_shapes.get(i))
        fraction = 1.0 - small / real if real else 0.0
    copied = sum(_elements(shapes[v][1]) * _itemsize(shapes[v][0])
                 for v in list(cut.inputs) + list(cut.outputs) if shapes.get(v)) if padded else 0.0
    feats["log_library_flops"] = math.log10(library_flops + 1.0)
    feats["log_tvm_flops"] = math.log10(max(flops - library_flops - recurrent_flops, 0.0) + 1.0)
    feats["log_kernels"] = math.log10(kernels + 1.0)
    feats["log_recurrent_flops"] = math.log10(recurrent_flops + 1.0)
    feats["frac_library"] = library_calls / max(kernels, 1)
    # Static shapes pay most in TVM's own kernels, the matmuls of two computed tensors above all
    # (measured: attention's about 2x); oneDNN calls run alike either way.
    feats["log_tvm_matmul_flops"] = math.log10(tvm_matmul_flops + 1.0)
    feats["static_x_log_tvm_matmul_flops"] = feats["static"] * feats["log_tvm_matmul_flops"]
    feats["static_x_log_tvm_flops"] = feats["static"] * feats["log_tvm_flops"]
    feats["padded"] = 1.0 if padded else 0.0
    feats["pad_fraction"] = fraction
    feats["log_pad_bytes"] = math.log10(copied + 1.0)
    # A dispatch adds about a constant time: in log time that is worth more the less the region
    # moves (per 10 kB moved).
    feats["dispatch_x_inv_bytes"] = feats["dispatch"] * 1e4 / (moved + 1.0)
    feats["static_x_log_nodes"] = feats["static"] * feats["log_nodes"]
    feats["static_x_frac_movement"] = feats["static"] * feats["frac_movement"]
    feats["static_x_log_flops"] = feats["static"] * feats["log_flops"]
    feats.update(target_features(target))
    return {name: round(float(feats[name]), 6) for name in FEATURE_NAMES}


def vector(features: Mapping[str, float], names: tuple[str, ...] | list[str] = FEATURE_NAMES) -> list[float]:
    return [float(features.get(name, 0.0)) for name in names]


def loop_trips(profile_control_flow: Mapping[str, Any]) -> dict[str, float]:
    """Mean trip count per Loop/Scan node, from a profile's ``control_flow`` section."""
    return {name: float(info["trip_mean"]) for name, info in profile_control_flow.items()
            if "trip_mean" in info}
