"""Small helpers over ``onnx.helper`` for writing the zoo's generated models.

A :class:`GraphBuilder` collects the nodes and initializers of one graph and hands out names from a
namespace shared with its subgraphs, so every node and tensor name in a model is unique and
non-empty (ONNX forbids a subgraph from shadowing an outer name, and the compiler keys on node
names).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# IR 8 is the version that introduced opset 17; onnxruntime 1.32 reads IR versions up to 11.
IR_VERSION = 8
PRODUCER = "edgec.zoo"
FLOAT = TensorProto.FLOAT
INT64 = TensorProto.INT64
BOOL = TensorProto.BOOL

Dim = int | str


class _Namespace:
    """Hands out names that are unique across a model and all of its subgraphs."""

    def __init__(self) -> None:
        self._used: set[str] = set()

    def claim(self, base: str) -> str:
        """Reserve and return ``base``, or ``base_<n>`` with the smallest n still free."""
        name, n = base, 1
        while name in self._used:
            name, n = f"{base}_{n}", n + 1
        self._used.add(name)
        return name


class GraphBuilder:
    """Collects the nodes and initializers of one graph (or subgraph).

    Use :meth:`op` to add a node and get its output name(s), :meth:`weight` to add an initializer,
    :meth:`subgraph` for the body of an ``If``/``Loop``/``Scan``, and :meth:`graph` to finish.
    """

    def __init__(self, namespace: _Namespace | None = None) -> None:
        self._ns = namespace or _Namespace()
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def subgraph(self) -> GraphBuilder:
        """A builder for a nested graph that shares this model's namespace."""
        return GraphBuilder(self._ns)

    def name(self, base: str) -> str:
        """Reserve a unique name, for graph inputs and other tensors not made by :meth:`op`."""
        return self._ns.claim(base)

    def weight(self, base: str, array: np.ndarray) -> str:
        """Add ``array`` as an initializer and return its (unique) name."""
        name = self._ns.claim(base)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def const(self, base: str, values, dtype=np.int64) -> str:
        """Add a small constant (shapes, axes, thresholds) as an initializer of ``dtype``."""
        name = self._ns.claim(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], name: str | None = None, outputs: int = 1,
           **attrs) -> str | list[str]:
        """Add one node; return its output name, or a list of names when ``outputs`` > 1.

        ``name`` is the base of the node name and of its output names (``name``, ``name_o1``...);
        it defaults to the lower-cased op type.
        """
        node_name = self._ns.claim(name or op_type.lower())
        out_names = [node_name if i == 0 else self._ns.claim(f"{node_name}_o{i}")
                     for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), out_names, name=node_name,
                                           **attrs))
        return out_names[0] if outputs == 1 else out_names

    def rename(self, old: str, new: str) -> str:
        """Give the tensor ``old`` (made by a node of this builder) the exact name ``new``.

        Graph outputs need fixed names, while helpers pick fresh ones; renaming avoids an extra
        ``Identity`` node per output.
        """
        if self._ns.claim(new) != new:
            raise ValueError(f"tensor name {new!r} is already taken")
        for node in self.nodes:
            for field in (node.input, node.output):
                for i, tensor in enumerate(field):
                    if tensor == old:
                        field[i] = new
        return new

    def graph(self, name: str, inputs: Sequence[onnx.ValueInfoProto],
              outputs: Sequence[onnx.ValueInfoProto]) -> onnx.GraphProto:
        """The finished graph with the given input and output declarations."""
        return helper.make_graph(self.nodes, name, list(inputs), list(outputs),
                                 initializer=self.initializers)


def value_info(name: str, dtype: int, dims: Sequence[Dim] | None) -> onnx.ValueInfoProto:
    """Declare a tensor: ``dims`` holds ints for fixed dims and strings for named dynamic dims."""
    return helper.make_tensor_value_info(name, dtype, None if dims is None else list(dims))


def make_model(graph: onnx.GraphProto, opset: int = OPSET) -> onnx.ModelProto:
    """Wrap ``graph`` in a model with the zoo's opset, IR version and producer name."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name=PRODUCER)
    model.ir_version = IR_VERSION
    return model


def he_normal(rng: np.random.Generator, shape: Sequence[int], fan_in: int,
              gain: float = 2.0) -> np.ndarray:
    """Normal weights with variance ``gain / fan_in`` (He for ReLU layers, LeCun with gain 1)."""
    return (rng.standard_normal(shape) * np.sqrt(gain / fan_in)).astype(np.float32)


def small_normal(rng: np.random.Generator, shape: Sequence[int], std: float = 0.02) -> np.ndarray:
    """Normal float32 values with a small standard deviation, for biases and embeddings."""
    return (rng.standard_normal(shape) * std).astype(np.float32)


def conv_relu(b: GraphBuilder, rng: np.random.Generator, x: str, cin: int, cout: int, name: str,
              kernel: int = 3) -> str:
    """A same-padded ``Conv`` with He-initialized weights and a bias, followed by ``Relu``."""
    w = b.weight(f"{name}.w", he_normal(rng, (cout, cin, kernel, kernel), cin * kernel * kernel))
    bias = b.weight(f"{name}.b", small_normal(rng, (cout,)))
    pad = kernel // 2
    y = b.op("Conv", [x, w, bias], name=f"{name}.conv", kernel_shape=[kernel, kernel],
             pads=[pad] * 4)
    return b.op("Relu", [y], name=f"{name}.relu")


def linear(b: GraphBuilder, rng: np.random.Generator, x: str, fan_in: int, fan_out: int, name: str,
           gain: float = 2.0) -> str:
    """``MatMul`` by a [fan_in, fan_out] weight plus a bias ``Add``; works on any leading dims."""
    w = b.weight(f"{name}.w", he_normal(rng, (fan_in, fan_out), fan_in, gain))
    bias = b.weight(f"{name}.b", small_normal(rng, (fan_out,)))
    y = b.op("MatMul", [x, w], name=f"{name}.matmul")
    return b.op("Add", [y, bias], name=f"{name}.add")


def classifier_head(b: GraphBuilder, rng: np.random.Generator, x: str, channels: int,
                    classes: int, name: str) -> str:
    """``GlobalAveragePool``, ``Flatten`` and ``Gemm``: [N, C, H, W] features to [N, classes]."""
    pooled = b.op("GlobalAveragePool", [x], name=f"{name}.gap")
    flat = b.op("Flatten", [pooled], name=f"{name}.flatten", axis=1)
    w = b.weight(f"{name}.w", he_normal(rng, (classes, channels), channels, gain=1.0))
    bias = b.weight(f"{name}.b", small_normal(rng, (classes,)))
    return b.op("Gemm", [flat, w, bias], name=f"{name}.gemm", transB=1)
