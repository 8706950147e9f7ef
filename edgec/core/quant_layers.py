"""The layers of an ONNX model that quantization can change: ops with a constant weight.

``MatMul`` (weight [K, N]), ``Gemm`` (weight B, maybe transposed), ``Conv`` (OIHW weight) and
``Gather`` from a constant table (embeddings). Each layer knows its weight as the compiled program
sees it after library dispatch (``dense_weight``: [K, N]; convolutions: OIHW), which is how the
Relax rewrite finds it (by content).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

# The kinds of layers and the precisions each can take, most aggressive (fastest) first.
PRECISIONS = {
    "dense": ("int8-static", "int8-dynamic", "int8-weight", "fp32"),
    "conv": ("int8-static", "int8-weight", "fp32"),
    "embedding": ("int8-weight", "fp32"),
}


@dataclass(frozen=True)
class Layer:
    """One quantizable node: ``kind`` is ``dense``, ``conv`` or ``embedding``."""

    name: str
    op: str
    kind: str
    weight: str  # the initializer's name
    activation: str  # the input the weight multiplies (or the indices, for an embedding)
    weight_axis: int  # the output-channel axis of the initializer (rows, for an embedding)
    # Multiply-adds per output element (the reduction: K of a matmul, IC/groups x KH x KW of a
    # convolution) and per input element (N; OC/groups x KH x KW); 0 for an embedding.
    reduction: int = 0
    fan_out: int = 0

    def compiled_weight(self, array: np.ndarray) -> np.ndarray:
        """The initializer as the compiled program holds it after library dispatch."""
        if self.op == "Gemm" and self.weight_axis == 0:  # transB: [N, K] -> [K, N]
            return np.ascontiguousarray(array.T)
        return array


def find_layers(proto: onnx.ModelProto) -> list[Layer]:
    """The quantizable nodes of the top-level graph, in graph order."""
    inits = {i.name: i for i in proto.graph.initializer}
    layers = []
    for node in proto.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        op = node.op_type
        if op in ("MatMul", "Gemm", "Conv") and len(node.input) > 1 and node.input[1] in inits:
            weight = inits[node.input[1]]
            if weight.data_type != onnx.TensorProto.FLOAT:
                continue
            dims = list(weight.dims)
            if op == "MatMul" and len(dims) == 2:
                layers.append(Layer(node.name, op, "dense", weight.name, node.input[0], 1,
                                    dims[0], dims[1]))
            elif (op == "Gemm" and not attrs.get("transA", 0)
                  and float(attrs.get("alpha", 1.0)) == 1.0):
                axis = 0 if attrs.get("transB", 0) else 1
                layers.append(Layer(node.name, op, "dense", weight.name, node.input[0], axis,
                                    dims[1 - axis], dims[axis]))
            elif op == "Conv" and len(dims) == 4:
                kernel = dims[2] * dims[3]
                out_per_group = dims[0] // max(int(attrs.get("group", 1)), 1)
                layers.append(Layer(node.name, op, "conv", weight.name, node.input[0], 0,
                                    dims[1] * kernel, out_per_group * kernel))
        elif (op == "Gather" and node.input[0] in inits and int(attrs.get("axis", 0)) == 0
              and inits[node.input[0]].data_type == onnx.TensorProto.FLOAT
              and len(inits[node.input[0]].dims) == 2):
            layers.append(Layer(node.name, op, "embedding", node.input[0], node.input[1], 0))
    return layers


def initializer_arrays(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
