"""ONNX-level pad folding before import: a zero ``Pad`` of spatial dims only, read only by
convolutions (or by max pools of values that cannot be negative), becomes their own padding.

Keras writes ``ZeroPadding2D`` layers before its strided depthwise convolutions (MobileNetV2,
EfficientNet: TensorFlow's "same" padding, all at the end) and before ResNet's and DenseNet's
first max pool; tf2onnx exports each as a ``Pad``. Run as written, each is a pass over the
activation, and on the library route it also leaves the blocked layout and comes back (a reorder
of the padded copy: 0.3-0.5 ms of keras MobileNetV2's 12.6). onnxruntime folds them the same way.

The fold is exact: a convolution's own padding is zeros. A max pool pads with -inf instead, so
its pads fold only where the padded values are a ``Relu``'s or a ``Clip``'s with a lower bound
of at least 0 and every window keeps one real value (pads smaller than the window).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from edgec.core.model import attribute_text, graph_constants, graph_readers, subgraph_reads


@dataclass(frozen=True)
class _Fold:
    """One foldable ``Pad``: its spatial pads, the nodes that take them, the Identity nodes
    between (removed with it)."""

    pads: list[int]
    readers: list[int]
    identities: list[int]


def fold_pads(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose foldable top-level ``Pad`` nodes are gone into their readers'
    padding (``proto`` itself when there are none)."""
    graph = proto.graph
    if not any(node.op_type == "Pad" for node in graph.node):
        return proto
    folding = _Folding(graph)
    folds = {index: fold for index, node in enumerate(graph.node)
             if node.op_type == "Pad" and (fold := folding.fold(node)) is not None}
    if not folds:
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    nodes = proto.graph.node
    removed: list[int] = []
    for index, fold in folds.items():
        for reader in fold.readers:
            _widen(nodes[reader], fold.pads)
            nodes[reader].input[0] = nodes[index].input[0]
        removed += [index] + fold.identities
    for index in sorted(removed, reverse=True):
        del nodes[index]
    return proto


class _Folding:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        # The constants a fold reads: Pad's pads and value, Clip's lower bound.
        small = {name for node in graph.node if node.op_type in ("Pad", "Clip")
                 for name in node.input[1:3]}
        self.constants = graph_constants(graph, small)
        self.producer = {name: node for node in graph.node for name in node.output}
        self.readers = graph_readers(graph)
        # Values read inside an If branch or a loop body, or by the caller, stay as they are.
        self.kept = subgraph_reads(graph) | {value.name for value in graph.output}

    def fold(self, pad: onnx.NodeProto) -> _Fold | None:
        """How ``pad`` folds into its readers, or None when it cannot."""
        pads = self.spatial_pads(pad)
        if pads is None:
            return None
        readers, identities = self.reach(pad.output[0])
        if -1 in readers or not self.readers_accept(pad, pads, readers, identities):
            return None
        return _Fold(pads, readers, identities)

    def spatial_pads(self, pad: onnx.NodeProto) -> list[int] | None:
        """A zero, constant ``Pad``'s amounts as [begin per spatial dim..., end per spatial
        dim...] (its first two dims, batch and channels, unpadded), or None when it is not one."""
        attrs = {a.name: helper.get_attribute_value(a) for a in pad.attribute}
        if attribute_text(attrs.get("mode"), "constant") != "constant":
            return None
        if len(pad.input) > 3 and pad.input[3]:  # opset 18's axes: left as they are
            return None
        if len(pad.input) > 1:  # opset 11+: pads and value are inputs
            pads = self.constants.get(pad.input[1])
            value = self.constants.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] \
                else np.zeros(())
        else:
            pads = np.array(attrs.get("pads", []))
            value = np.array(attrs.get("value", 0.0))
        if pads is None or value is None or value.size > 1 or np.any(value != 0):
            return None
        pads = [int(p) for p in np.asarray(pads).ravel()]
        rank = len(pads) // 2
        if rank < 3 or any(p < 0 for p in pads) or pads[0] or pads[1] or pads[rank] \
                or pads[rank + 1]:
            return None
        return pads[2:rank] + pads[rank + 2:]

    def reach(self, name: str) -> tuple[list[int], list[int]]:
        """The nodes that read ``name``, through ``Identity`` nodes (the transpose pass leaves
        one where a transpose cancelled): (the readers, the identities between). A value that
        is kept (a graph output, read by a subgraph) is read by a reader that cannot fold: -1."""
        readers: list[int] = []
        identities: list[int] = []
        pending = [name]
        while pending:
            value = pending.pop()
            if value in self.kept or not self.readers.get(value):
                readers.append(-1)
                continue
            for index in self.readers[value]:
                node = self.graph.node[index]
                if node.op_type == "Identity":
                    identities.append(index)
                    pending.append(node.output[0])
                else:
                    readers.append(index)
        return readers, identities

    def readers_accept(self, pad: onnx.NodeProto, pads: list[int], readers: list[int],
                       identities: list[int]) -> bool:
        """Whether every reader of ``pad``'s output (``reach``'s) can take ``pads`` as its own."""
        read = {pad.output[0]} | {self.graph.node[i].output[0] for i in identities}
        for index in readers:
            node = self.graph.node[index]
            if sum(name in read for name in node.input) != 1 or node.input[0] not in read:
                return False
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if attribute_text(attrs.get("auto_pad"), "NOTSET") not in ("NOTSET", "VALID"):
                return False
            own = list(attrs.get("pads", [0] * len(pads)))
            if len(own) != len(pads):
                return False
            if node.op_type == "Conv":
                continue
            if node.op_type != "MaxPool" or len([o for o in node.output if o]) != 1 \
                    or attrs.get("ceil_mode", 0) or not self._nonnegative(pad.input[0]):
                return False
            kernel = list(attrs.get("kernel_shape", []))
            spatial = len(kernel)
            if spatial * 2 != len(pads) or any(
                    own[i] + pads[i] >= kernel[i % spatial] for i in range(len(pads))):
                return False
        return True

    def _nonnegative(self, name: str) -> bool:
        """Whether ``name`` is a ``Relu``'s output or a ``Clip``'s whose lower bound is >= 0."""
        node = self.producer.get(name)
        if node is None:
            return False
        if node.op_type == "Relu":
            return True
        if node.op_type != "Clip":
            return False
        if len(node.input) > 1:  # opset 11+: min is an input
            low = self.constants.get(node.input[1]) if node.input[1] else None
            return low is not None and low.size == 1 and float(low.ravel()[0]) >= 0
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        return float(attrs.get("min", -np.inf)) >= 0


def _widen(node: onnx.NodeProto, pads: list[int]) -> None:
    """Add ``pads`` to ``node``'s own (explicit from now on: VALID padded nothing)."""
    attrs = {a.name: a for a in node.attribute}
    own = list(attrs["pads"].ints) if "pads" in attrs else [0] * len(pads)
    widened = [a + b for a, b in zip(own, pads)]
    if "pads" in attrs:
        node.attribute.remove(attrs["pads"])
    if "auto_pad" in attrs:
        node.attribute.remove(attrs["auto_pad"])
    node.attribute.append(helper.make_attribute("pads", widened))
