"""ONNX-level transpose sinking before import: the layout changes an exporter writes around
each convolution cancel out instead of running.

tf2onnx keeps a TensorFlow model's elementwise ops in NHWC: every convolution (NCHW in ONNX) is
followed by a ``Transpose`` to NHWC, its activation, residual add or squeeze-excite in NHWC, and
a ``Transpose`` back before the next convolution (Keras' MobileNetV3-Small: 106 of them for 54
convolutions). Run as written, each pair is two passes over the activation, and the library
route cannot keep its blocked layout between convolutions. onnxruntime and OpenVINO push such
transposes through layout-free ops until they meet their inverse; so does this pass.

A value ``v = Transpose(s, perm)`` is carried as ``s`` plus ``perm`` through the ops that do not
care about layout (elementwise ops whose other operands are constants, scalars or carried with
the same ``perm``; reductions that keep their dims; constant pads; concatenations; softmax),
each rewritten to work on the untransposed values (axes, pads and constants permuted). A
``Transpose`` of a carried value becomes nothing (it undoes ``perm``) or one transpose; a
carried value that anything else reads is transposed once, under its own name. Connected
values are rewritten together only when that leaves fewer transposes than it removes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgec.core.model import all_nodes, graph_constants, graph_readers, subgraph_reads

_UNARY = {
    "Relu", "LeakyRelu", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
    "Softplus", "Softsign", "Gelu", "Mish", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Neg",
    "Abs", "Sign", "Floor", "Ceil", "Round", "Not", "Cast", "Identity", "Sin", "Cos",
    "IsNaN", "IsInf", "ThresholdedRelu", "Shrink",
}
# Every tensor input broadcasts against the others (Clip's min and max are scalars).
_ELEMENTWISE = _UNARY | {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mean", "Sum", "Equal", "Less",
    "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Where", "PRelu", "Clip",
    "BitShift", "Mod",
}
_REDUCE = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
# Opset 18 moved these reductions' axes from an attribute to an input; ReduceSum moved at 13.
_AXES_INPUT_SINCE = {op: 18 for op in _REDUCE} | {"ReduceSum": 13}


@dataclass
class _Carried:
    """A value of the original graph held as ``source`` (a value of the rewritten graph) with
    ``perm`` still to apply: value == Transpose(source, perm)."""

    source: str
    perm: tuple[int, ...]
    group: int


@dataclass
class _Plan:
    """What the rewrite of one node would emit, and which group it belongs to."""

    group: int
    nodes: list = field(default_factory=list)
    initializers: list = field(default_factory=list)
    kind: str = "absorbed"  # "source", "absorbed", "cancelled", "composed"


def sink_transposes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose top-level transposes are pushed through layout-free ops and
    cancelled where they meet their inverse (``proto`` itself when nothing changes)."""
    graph = proto.graph
    if not any(node.op_type == "Transpose" for node in graph.node):
        return proto
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    sinking = _Sinking(graph, opset)
    plans = sinking.plan()
    kept = sinking.profitable_groups(plans)
    if not kept:
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    sinking.rewrite(proto.graph, plans, kept)
    return proto


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inverse = [0] * len(perm)
    for axis, source in enumerate(perm):
        inverse[source] = axis
    return tuple(inverse)


class _Sinking:
    def __init__(self, graph: onnx.GraphProto, opset: int) -> None:
        self.graph = graph
        self.opset = opset
        self.constants: dict[str, np.ndarray] = graph_constants(graph)
        self.carried: dict[str, _Carried] = {}
        self.replaced: set[str] = set()  # constants some rewrite reads a permuted copy of
        self.parent: list[int] = []
        self.names: set[str] = {name for node in all_nodes(graph) for name in node.output}
        self.names |= {v.name for v in graph.input} | set(self.constants)
        # Values read inside an If branch or loop body are read as written.
        self.outer_reads = subgraph_reads(graph)

    # --- planning ---------------------------------------------------------------------------

    def _group(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def _find(self, group: int) -> int:
        while self.parent[group] != group:
            self.parent[group] = self.parent[self.parent[group]]
            group = self.parent[group]
        return group

    def _union(self, groups: list[int]) -> int:
        roots = [self._find(g) for g in groups]
        for root in roots[1:]:
            self.parent[root] = roots[0]
        return roots[0]

    def _fresh(self, base: str) -> str:
        name, index = f"{base}__edgec_untransposed", 0
        while name in self.names:
            index += 1
            name = f"{base}__edgec_untransposed{index}"
        self.names.add(name)
        return name

    def plan(self) -> dict[int, _Plan]:
        """Per node index, the rewrite that carries its transposed inputs through it."""
        plans: dict[int, _Plan] = {}
        for index, node in enumerate(self.graph.node):
            plan = self._plan_node(node)
            if plan is not None:
                plans[index] = plan
        return plans

    def _plan_node(self, node: onnx.NodeProto) -> _Plan | None:
        if node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Transpose":
            return self._plan_transpose(node)
        inputs = [self.carried.get(name) for name in node.input]
        carried = [c for c in inputs if c is not None]
        if not carried or len(node.output) != 1:
            return None
        perm = carried[0].perm
        if any(c.perm != perm for c in carried):
            return None
        rewritten = self._rewrite_op(node, perm)
        if rewritten is None:
            return None
        new_node, initializers = rewritten
        group = self._union([c.group for c in carried])
        output = self._fresh(node.output[0])
        new_node.output[:] = [output]
        for position, name in enumerate(node.input):
            if inputs[position] is not None:
                new_node.input[position] = inputs[position].source
        self.carried[node.output[0]] = _Carried(output, perm, group)
        return _Plan(group, [new_node], initializers)

    def _plan_transpose(self, node: onnx.NodeProto) -> _Plan | None:
        attr = next((a for a in node.attribute if a.name == "perm"), None)
        if attr is None or not node.input or node.input[0] not in self.names:
            return None
        perm = tuple(int(a) for a in attr.ints)
        if sorted(perm) != list(range(len(perm))):
            return None
        before = self.carried.get(node.input[0])
        if before is None:  # a source: its output is carried as its input
            group = self._group()
            self.carried[node.output[0]] = _Carried(node.input[0], perm, group)
            return _Plan(group, kind="source")
        if len(before.perm) != len(perm):
            return None
        combined = tuple(before.perm[axis] for axis in perm)
        group = self._find(before.group)
        if combined == tuple(range(len(perm))):
            identity = helper.make_node("Identity", [before.source], [node.output[0]],
                                        name=node.name)
            return _Plan(group, [identity], kind="cancelled")
        composed = helper.make_node("Transpose", [before.source], [node.output[0]],
                                    name=node.name, perm=list(combined))
        return _Plan(group, [composed], kind="composed")

    def _rewrite_op(self, node: onnx.NodeProto, perm: tuple[int, ...]
                    ) -> tuple[onnx.NodeProto, list] | None:
        """``node`` working on the untransposed values (inputs and outputs still to rename),
        with any new constants it reads; None when its meaning depends on the layout in a way
        this cannot follow."""
        rank = len(perm)
        new = onnx.NodeProto()
        new.CopyFrom(node)
        initializers: list = []
        op = node.op_type

        def permute_axis(axis: int) -> int:
            return perm[axis % rank]

        if op in _ELEMENTWISE:
            tensor_inputs = (range(1) if op == "Clip" else range(len(node.input)))
            for position in tensor_inputs:
                name = node.input[position]
                if not name or name in self.carried:
                    continue
                value = self.constants.get(name)
                if value is None or value.ndim > rank:
                    return None
                if value.size == 1:
                    continue
                full = value.reshape((1,) * (rank - value.ndim) + value.shape)
                moved = np.ascontiguousarray(np.transpose(full, _inverse(perm)))
                new_name = self._fresh(name)
                initializers.append(numpy_helper.from_array(moved, new_name))
                new.input[position] = new_name
                self.replaced.add(name)
            if op == "Clip" and any(n in self.carried for n in node.input[1:] if n):
                return None
            return new, initializers
        attrs = {a.name: a for a in node.attribute}
        if op in _REDUCE:
            if len(node.input) != 1 and op in _AXES_INPUT_SINCE \
                    and self.opset >= _AXES_INPUT_SINCE[op]:
                if any(name in self.carried for name in node.input[1:]):
                    return None
                axes = self.constants.get(node.input[1]) if node.input[1] else None
                if node.input[1] and axes is None:
                    return None
                if axes is not None:
                    new_name = self._fresh(node.input[1])
                    moved = np.array([permute_axis(int(a)) for a in axes.reshape(-1)], np.int64)
                    initializers.append(numpy_helper.from_array(moved, new_name))
                    new.input[1] = new_name
                    self.replaced.add(node.input[1])
            elif "axes" in attrs:
                _set_ints(new, "axes", [permute_axis(int(a)) for a in attrs["axes"].ints])
            keepdims = attrs["keepdims"].i if "keepdims" in attrs else 1
            return (new, initializers) if keepdims else None
        if op == "Pad":
            if len(node.input) > 3 and node.input[3]:
                return None  # pads for named axes: rare, left as written
            mode = attrs["mode"].s.decode() if "mode" in attrs else "constant"
            if mode not in ("constant", "reflect", "edge", "wrap"):
                return None
            if self.opset < 11:
                pads = list(attrs["pads"].ints) if "pads" in attrs else None
            else:
                value = self.constants.get(node.input[1]) if len(node.input) > 1 else None
                pads = None if value is None else [int(p) for p in value.reshape(-1)]
            if pads is None or len(pads) != 2 * rank:
                return None
            moved = [0] * (2 * rank)
            for axis in range(rank):
                moved[perm[axis]] = pads[axis]
                moved[rank + perm[axis]] = pads[rank + axis]
            if self.opset < 11:
                _set_ints(new, "pads", moved)
            else:
                new_name = self._fresh(node.input[1])
                initializers.append(numpy_helper.from_array(np.array(moved, np.int64), new_name))
                new.input[1] = new_name
                self.replaced.add(node.input[1])
            return new, initializers
        if op == "Concat":
            if not all(name in self.carried for name in node.input):
                return None
            _set_int(new, "axis", permute_axis(attrs["axis"].i))
            return new, initializers
        if op in ("Softmax", "LogSoftmax") and self.opset >= 13:
            _set_int(new, "axis", permute_axis(attrs["axis"].i if "axis" in attrs else -1))
            return new, initializers
        return None

    # --- choosing and rewriting ----------------------------------------------------------------

    def _materialized(self, plans: dict[int, _Plan]) -> dict[str, _Carried]:
        """The carried values something outside their group's rewrite reads: each must be
        transposed back under its own name."""
        readers = graph_readers(self.graph)
        outputs = {v.name for v in self.graph.output}
        needed: dict[str, _Carried] = {}
        for name, carried in self.carried.items():
            group = self._find(carried.group)
            outside = name in outputs or name in self.outer_reads or any(
                index not in plans or self._find(plans[index].group) != group
                or plans[index].kind == "source"
                for index in readers.get(name, []))
            if outside:
                needed[name] = carried
        return needed

    def profitable_groups(self, plans: dict[int, _Plan]) -> set[int]:
        """Groups whose rewrite leaves fewer transposes than the graph has now."""
        before: dict[int, int] = {}
        after: dict[int, int] = {}
        for plan in plans.values():
            group = self._find(plan.group)
            if plan.kind in ("source", "cancelled", "composed"):
                before[group] = before.get(group, 0) + 1
            if plan.kind == "composed":
                after[group] = after.get(group, 0) + 1
        for carried in self._materialized(plans).values():
            group = self._find(carried.group)
            after[group] = after.get(group, 0) + 1
        return {g for g, count in before.items() if after.get(g, 0) < count}

    def rewrite(self, graph: onnx.GraphProto, plans: dict[int, _Plan], kept: set[int]) -> None:
        """Replace ``graph``'s nodes (a copy of the planned graph) by the kept groups' rewrite."""
        materialized = self._materialized(plans)
        by_output = {name: c for name, c in materialized.items()
                     if self._find(c.group) in kept}
        nodes = []
        for index, node in enumerate(graph.node):
            plan = plans.get(index)
            if plan is None or self._find(plan.group) not in kept:
                nodes.append(node)
                continue
            if plan.kind == "source":
                if node.output[0] in by_output:
                    nodes.append(node)  # the transpose as written is its own materialization
                continue
            nodes.extend(plan.nodes)
            graph.initializer.extend(plan.initializers)
            if plan.kind == "absorbed" and node.output[0] in by_output:
                carried = by_output[node.output[0]]
                nodes.append(helper.make_node("Transpose", [carried.source], [node.output[0]],
                                              name=f"{node.name}__edgec_transpose",
                                              perm=list(carried.perm)))
        produced = {name for node in nodes for name in node.output}
        for value in [v for v in graph.value_info if v.name not in produced]:
            graph.value_info.remove(value)
        del graph.node[:]
        graph.node.extend(nodes)
        # The constants rewritten ops read permuted copies of, unless something still reads them.
        read = {name for node in all_nodes(graph) for name in node.input}
        read |= {v.name for v in graph.output}
        unread = [i for i in graph.initializer if i.name in self.replaced and i.name not in read]
        for init in unread:
            graph.initializer.remove(init)


def _set_int(node: onnx.NodeProto, name: str, value: int) -> None:
    for attr in node.attribute:
        if attr.name == name:
            attr.i = value
            return
    node.attribute.append(helper.make_attribute(name, value))


def _set_ints(node: onnx.NodeProto, name: str, values: list[int]) -> None:
    for attr in node.attribute:
        if attr.name == name:
            del attr.ints[:]
            attr.ints.extend(values)
            return
    node.attribute.append(helper.make_attribute(name, values))
