"""Quantization simulated in the ONNX graph, run by onnxruntime: how the accuracy guard ranks
layers by sensitivity without compiling once per layer.

Weight-only: the weight is replaced by its int8 round trip (the kernels dequantize the same int8
values, so this is exact). Static: the layer's input goes through uint8 and back with the
calibrated parameters; dynamic: with parameters from its own min and max (widened to hold 0).
Both are written with elementary ops (Mul, Add, Max, Min, Floor, ReduceMin...) in the kernel's
arithmetic (round half up, saturate to 0..255), which every opset has: QuantizeLinear needs
opset 10 and DynamicQuantizeLinear 11, and the zoo's CNNs are opset 9 graphs.
fp16: the weight and the layer's input through fp16 and back (a partial model of the GPU
program, whose other ops run in fp16 too). bf16: the weight and the layer's input rounded to bf16
(to nearest, as oneDNN's conversion), products summed in f32: what the kernel does. The input is
rounded by Veltkamp's split (two Mul/Sub), which every opset has (a Cast to bfloat16 needs 13).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgec.core import quant_schemes as schemes
from edgec.core.quant_layers import Layer, initializer_arrays
from edgec.core.quant_schemes import ActivationParams
from edgec.core.reference import reference_session

Outputs = dict[str, np.ndarray]


def fake_weight(layer: Layer, array: np.ndarray, scheme: str, precision: str = "int8",
                weight_levels: int = schemes.WEIGHT_LEVELS) -> np.ndarray:
    """The weight after its int8 (or fp16, bf16) round trip, as the compiled kernels will use it
    (``weight_levels``: the integer layers' int8 range, ``schemes.integer_weight_levels``)."""
    if precision == "fp16":
        return array.astype(np.float16).astype(np.float32)
    if precision == "bf16":
        return bf16_round(array)
    if layer.kind == "embedding":
        return schemes.dequantize_rows(*schemes.quantize_rows(array, scheme))
    levels = schemes.layer_weight_levels(precision, weight_levels)
    q, scale = schemes.quantize_weight(array, layer.weight_axis, levels)
    return schemes.dequantize_weight(q, scale, layer.weight_axis)


def bf16_round(array: np.ndarray) -> np.ndarray:
    """float32 ``array`` rounded to bf16 (nearest, ties to even), as float32. NaN stays NaN."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return np.where(np.isnan(array), array, rounded.view(np.float32)).astype(np.float32)


def simulated_model(proto: onnx.ModelProto, layers: Sequence[Layer], precisions: dict[str, str],
                    activations: dict[str, ActivationParams], scheme: str,
                    weight_levels: int = schemes.WEIGHT_LEVELS) -> onnx.ModelProto:
    """A copy of ``proto`` with each layer's precision simulated (``weight_levels``: as the
    target's integer kernels take their weights, ``schemes.integer_weight_levels``)."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    arrays = initializer_arrays(proto)
    by_name = {layer.name: layer for layer in layers}
    graph = proto.graph
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        layer = by_name.get(node.name)
        precision = precisions.get(node.name, "fp32") if layer else "fp32"
        if precision != "fp32":
            weight_name = f"{layer.weight}__edgec_q8_{node.name}"
            graph.initializer.append(numpy_helper.from_array(
                fake_weight(layer, arrays[layer.weight], scheme, precision, weight_levels),
                weight_name))
            slot = 0 if layer.kind == "embedding" else 1
            node.input[slot] = weight_name
            x = node.input[0]
            if precision == "bf16" and layer.kind != "embedding":
                node.input[0] = _bf16_input(graph, x, node.name)
            if precision == "fp16" and layer.kind != "embedding":
                half = f"{x}__edgec_fp16_{node.name}"
                graph.node.append(helper.make_node("Cast", [x], [half], to=onnx.TensorProto.FLOAT16))
                graph.node.append(helper.make_node("Cast", [half], [half + "_f32"],
                                                   to=onnx.TensorProto.FLOAT))
                node.input[0] = half + "_f32"
            if precision in schemes.INTEGER_PRECISIONS:
                node.input[0] = _fake_quantize(graph, x, node.name, activations.get(node.name)
                                               if precision == "int8-static" else None)
        graph.node.append(node)
    return proto


def _bf16_input(graph: onnx.GraphProto, x: str, layer: str) -> str:
    """Append nodes rounding float32 ``x`` to bf16's 8 significant bits; return the result's
    name. Veltkamp's split, t = x * (2^16 + 1) and t - (t - x), rounds the low 16 bits of the
    significand away to nearest (equal to bf16_round on a million random values)."""
    prefix = f"{x}__edgec_bf16_{layer}"
    factor = prefix + "_factor"
    graph.initializer.append(numpy_helper.from_array(np.array(65537.0, np.float32), factor))
    graph.node.append(helper.make_node("Mul", [x, factor], [prefix + "_t"]))
    graph.node.append(helper.make_node("Sub", [prefix + "_t", x], [prefix + "_d"]))
    graph.node.append(helper.make_node("Sub", [prefix + "_t", prefix + "_d"], [prefix]))
    return prefix


def _fake_quantize(graph: onnx.GraphProto, x: str, layer: str,
                   params: ActivationParams | None) -> str:
    """Append nodes taking ``x`` through uint8 and back as the int8 kernels do; return the name
    of the result. ``params`` None: dynamic, from the tensor's own range."""
    prefix = f"{x}__edgec_fq_{layer}"
    names = iter(f"{prefix}_{i}" for i in range(100))

    def const(value: float) -> str:
        name = next(names)
        graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), name))
        return name

    def op(op_type: str, *inputs: str, **attrs) -> str:
        out = next(names)
        graph.node.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    if params is not None:
        scale, zero = const(params.scale), const(float(params.zero))
    else:  # the kernel's Params(): [min, max] widened to hold 0, over 0..255
        lo = op("Min", op("ReduceMin", x, keepdims=0), const(0.0))
        hi = op("Max", op("ReduceMax", x, keepdims=0), const(0.0))
        # A constant-zero input: any positive scale quantizes it exactly (the kernel uses 1).
        scale = op("Max", op("Div", op("Sub", hi, lo), const(255.0)), const(1e-30))
        zero = op("Floor", op("Add", op("Div", op("Neg", lo), scale), const(0.5)))
    shifted = op("Add", op("Add", op("Mul", x, op("Reciprocal", scale)), zero), const(0.5))
    q = op("Floor", op("Min", op("Max", shifted, const(0.0)), const(255.0)))
    return op("Mul", op("Sub", q, zero), scale)


def run(proto: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]]) -> list[Outputs]:
    """The model's outputs on each sample, by onnxruntime (unoptimized: the QDQ pairs stay)."""
    session = reference_session(proto, optimize=False)
    return [session.run(sample) for sample in samples]
