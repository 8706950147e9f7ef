"""Quantization simulated in the ONNX graph, run by onnxruntime: how the accuracy guard ranks
layers by sensitivity without compiling once per layer.

Weight-only: the weight is replaced by its int8 round trip (the kernels dequantize the same int8
values, so this is exact). Static: a QuantizeLinear/DequantizeLinear pair with the calibrated
uint8 parameters on the layer's input. Dynamic: DynamicQuantizeLinear then DequantizeLinear,
whose range rule (min and max widened to hold 0) is the kernel's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..reference import reference_session
from . import schemes
from .layers import Layer, initializer_arrays
from .schemes import ActivationParams

Outputs = dict[str, np.ndarray]


def fake_weight(layer: Layer, array: np.ndarray, scheme: str) -> np.ndarray:
    """The weight after its int8 round trip, as the compiled kernels will use it."""
    if layer.kind == "embedding":
        return schemes.dequantize_rows(*schemes.quantize_rows(array, scheme))
    q, scale = schemes.quantize_weight(array, layer.weight_axis)
    return schemes.dequantize_weight(q, scale, layer.weight_axis)


def simulated_model(proto: onnx.ModelProto, layers: Sequence[Layer], precisions: dict[str, str],
                    activations: dict[str, ActivationParams], scheme: str) -> onnx.ModelProto:
    """A copy of ``proto`` with each layer's precision simulated."""
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
                fake_weight(layer, arrays[layer.weight], scheme), weight_name))
            slot = 0 if layer.kind == "embedding" else 1
            node.input[slot] = weight_name
            x = node.input[0]
            if precision == "int8-static":
                params = activations[node.name]
                scale = numpy_helper.from_array(np.array(params.scale, np.float32), f"{x}__s_{node.name}")
                zero = numpy_helper.from_array(np.array(params.zero, np.uint8), f"{x}__z_{node.name}")
                graph.initializer.extend([scale, zero])
                graph.node.append(helper.make_node(
                    "QuantizeLinear", [x, scale.name, zero.name], [f"{x}__q_{node.name}"]))
                graph.node.append(helper.make_node(
                    "DequantizeLinear", [f"{x}__q_{node.name}", scale.name, zero.name],
                    [f"{x}__dq_{node.name}"]))
                node.input[0] = f"{x}__dq_{node.name}"
            elif precision == "int8-dynamic":
                q, s, z = (f"{x}__{part}_{node.name}" for part in ("q", "s", "z"))
                graph.node.append(helper.make_node("DynamicQuantizeLinear", [x], [q, s, z]))
                graph.node.append(helper.make_node(
                    "DequantizeLinear", [q, s, z], [f"{x}__dq_{node.name}"]))
                node.input[0] = f"{x}__dq_{node.name}"
        graph.node.append(node)
    return proto


def run(proto: onnx.ModelProto, samples: Sequence[dict[str, np.ndarray]]) -> list[Outputs]:
    """The model's outputs on each sample, by onnxruntime (unoptimized: the QDQ pairs stay)."""
    session = reference_session(proto, optimize=False)
    return [session.run(sample) for sample in samples]
