"""Sequence and optional values, resolved to tensors for the lengths the samples show.

edgec compiles tensor programs. A model whose inputs or outputs are ONNX sequences or optionals
is rewritten, before profiling, into a tensor-only model specialized to what the samples show:
a sequence input of length n becomes n tensor inputs, an absent optional disappears, and every
sequence op in the top-level graph (SequenceConstruct/Insert/At/Erase/Length, ConcatFromSequence,
SplitToSequence, SequenceMap, Optional*, and an If or Loop that carries sequences) is evaluated
on those static lists of tensors. A structural value the rewrite must know (a split size, a trip
count, an If condition) that is a graph input is taken from the samples, which must agree, and
recorded as fixed. The boundary record says how the runtime maps a user's lists and Nones to the
flat tensors and back (``edgec.runtime.signature.flatten_inputs``, ``group_outputs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgec.core.model import element_type, tensor_dtype
from edgec.core.reference import reference_session
from edgec.errors import ModelError, SamplesError

# What a non-tensor value is during the rewrite: ("seq", [tensor names]) or ("opt", None | value),
# where an optional's value is a tensor name or a ("seq", [...]).
Value = Any

_FOLD_LIMIT = 4096  # constant-fold node outputs up to this many elements


def structured(value: onnx.ValueInfoProto) -> bool:
    """Whether a graph input or output is a sequence or an optional rather than a tensor."""
    return value.type.HasField("sequence_type") or value.type.HasField("optional_type")


def _boundary_record(value: onnx.ValueInfoProto) -> tuple[str, onnx.TypeProto, dict]:
    """A sequence or optional graph input/output: its kind, its element type and the start of
    its manifest record."""
    kind = _kind(value.type)
    element = _element_type(value.type)
    return kind, element, {"name": value.name, "kind": kind,
                           "dtype": tensor_dtype(element.tensor_type.elem_type)}


def _element_type(type_proto: onnx.TypeProto) -> onnx.TypeProto:
    """The tensor type inside a sequence/optional type (any depth)."""
    element = element_type(type_proto)
    if element is None:
        raise ModelError("a map or sparse tensor at the model's boundary is not supported; "
                         "edgec supports tensors, sequences and optionals")
    return element


def _kind(type_proto: onnx.TypeProto) -> str:
    if type_proto.HasField("sequence_type"):
        return "sequence"
    if type_proto.HasField("optional_type"):
        return "optional"
    return "tensor"


class _Rewriter:
    """Walks a graph's nodes, keeping sequences and optionals as Python lists of tensor names."""

    def __init__(self, samples: Sequence[dict[str, Any]], graph_inputs: set[str],
                 shapes: dict[str, tuple]) -> None:
        self.samples = samples
        self.shapes = shapes  # tensor shapes from shape inference (SplitToSequence needs them)
        self.graph_inputs = graph_inputs
        self.constants: dict[str, np.ndarray] = {}
        self.fixed: dict[str, np.ndarray] = {}  # graph inputs whose sample value was relied on
        self.values: dict[str, Value] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}__s{self.count}"

    # --- constants -------------------------------------------------------------------------
    def constant(self, name: str, what: str) -> np.ndarray:
        """The value of tensor ``name``, which the rewrite needs to know (``what`` says why)."""
        if name in self.constants:
            return self.constants[name]
        if name in self.graph_inputs and self.samples and all(
                isinstance(s.get(name), np.ndarray) for s in self.samples):
            first = self.samples[0][name]
            if all(s[name].shape == first.shape and np.array_equal(s[name], first) for s in self.samples):
                self.fixed[name] = first
                return first
            raise SamplesError(f"input '{name}' decides {what} and differs between samples; an "
                               f"artifact is compiled for one value: compile one per value")
        raise ModelError(f"{what} depends on tensor '{name}', which is not a constant or a graph "
                         f"input; edgec resolves sequences at compile time")

    def emit_constant(self, name: str, value: np.ndarray) -> None:
        self.constants[name] = value
        self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value)))

    def _fold(self, node: onnx.NodeProto) -> bool:
        """Evaluate a tensor node whose inputs are all constants (small results only)."""
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return False
        if node.op_type == "Constant":
            value = helper.get_attribute_value(node.attribute[0]) if node.attribute else None
            if isinstance(value, onnx.TensorProto) and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(value)
            return False
        if not node.input or not all(i == "" or i in self.constants for i in node.input):
            return False
        if node.domain not in ("", "ai.onnx"):
            return False
        from onnx.reference import ReferenceEvaluator

        names = [f"in{k}" if i else "" for k, i in enumerate(node.input)]
        inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(self.constants[i].dtype),
                                                self.constants[i].shape)
                  for n, i in zip(names, node.input) if n]
        outputs = [helper.make_empty_tensor_value_info(f"out{k}") for k in range(len(node.output))]
        single = helper.make_node(node.op_type, names, [o.name for o in outputs], domain=node.domain)
        single.attribute.extend(node.attribute)
        try:
            results = ReferenceEvaluator(helper.make_model(helper.make_graph([single], "fold", inputs, outputs))).run(
                None, {n: self.constants[i] for n, i in zip(names, node.input) if n})
        except Exception:  # the reference cannot evaluate it: leave the node to the compiler
            return False
        if any(np.asarray(r).size > _FOLD_LIMIT for r in results):
            return False
        for out, result in zip(node.output, results):
            if out:
                self.emit_constant(out, np.asarray(result))
        return True

    # --- the walk --------------------------------------------------------------------------
    def run(self, nodes: Sequence[onnx.NodeProto]) -> None:
        for node in nodes:
            takes = any(i in self.values for i in node.input)
            if node.op_type in _WHEN_STRUCTURED and (takes or _returns_structured(node)):
                _WHEN_STRUCTURED[node.op_type](self, node)
            elif takes or node.op_type in _HANDLERS:
                handler = _HANDLERS.get(node.op_type)
                if handler is None:
                    raise ModelError(f"node '{node.name}' ({node.op_type}) takes a sequence or optional "
                                     f"value, which edgec cannot compile")
                handler(self, node)
            elif not self._fold(node):
                self.nodes.append(node)

    def tensor(self, name: str, what: str) -> str:
        value = self.values.get(name)
        if value is None:
            return name
        if value[0] == "opt" and isinstance(value[1], str):
            return value[1]
        raise ModelError(f"{what} expects a tensor, but '{name}' is a sequence or optional")

    def sequence(self, name: str, what: str) -> list[str]:
        value = self.values.get(name)
        if value is not None and value[0] == "opt":
            value = value[1]
        if value is None or value[0] != "seq":
            raise ModelError(f"{what} expects a sequence, but '{name}' is not one (or is an empty optional)")
        return list(value[1])

    def alias(self, source: str, target: str) -> None:
        """``target`` names the same tensor as ``source``."""
        self.nodes.append(helper.make_node("Identity", [source], [target]))
        if source in self.constants:
            self.constants[target] = self.constants[source]

    def inline(self, graph: onnx.GraphProto, bindings: dict[str, Value | str], prefix: str) -> list[Value | str]:
        """Run ``graph``'s nodes with its inputs bound; returns its outputs' values."""
        renames: dict[str, str] = {}
        for value_info, bound in zip(graph.input, bindings.values()):
            if isinstance(bound, str):
                renames[value_info.name] = bound
            else:
                renames[value_info.name] = self.fresh(f"{prefix}{value_info.name}")
                self.values[renames[value_info.name]] = bound
        for node in graph.node:
            for out in node.output:
                if out:
                    renames[out] = self.fresh(f"{prefix}{out}")
        for init in graph.initializer:
            renames[init.name] = self.fresh(f"{prefix}{init.name}")
            self.emit_constant(renames[init.name], numpy_helper.to_array(init))
        self.run([_renamed(node, renames) for node in graph.node])
        results = []
        for out in graph.output:
            name = renames.get(out.name, out.name)
            results.append(self.values.get(name, name))
        return results

    def bind(self, name: str, value: Value | str) -> None:
        """Output ``name`` takes ``value`` (a tensor name, or a sequence/optional)."""
        if isinstance(value, str):
            self.alias(value, name)
        else:
            self.values[name] = value


def _renamed(node: onnx.NodeProto, renames: dict[str, str]) -> onnx.NodeProto:
    """A copy of ``node`` with its inputs, outputs and the outer names its subgraphs read renamed."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    copy.name = ""
    for k, name in enumerate(copy.input):
        copy.input[k] = renames.get(name, name)
    for k, name in enumerate(copy.output):
        copy.output[k] = renames.get(name, name)
    for attr in copy.attribute:
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            _rename_outer(sub, renames)
    return copy


def _rename_outer(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    local = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    local |= {o for n in graph.node for o in n.output}
    outer = {k: v for k, v in renames.items() if k not in local}
    for node in graph.node:
        for k, name in enumerate(node.input):
            node.input[k] = outer.get(name, name)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                _rename_outer(sub, outer)
    for out in graph.output:
        if out.name in outer:
            out.name = outer[out.name]


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _position(r: _Rewriter, node: onnx.NodeProto, index: int, length: int, default: int) -> int:
    if len(node.input) <= index or not node.input[index]:
        return default
    position = int(r.constant(node.input[index], f"the position of {node.op_type} '{node.name}'").reshape(-1)[0])
    return position + length if position < 0 else position


def _identity(r: _Rewriter, node: onnx.NodeProto) -> None:
    value = r.values.get(node.input[0])
    if value is None:
        r.nodes.append(node)
    else:
        r.values[node.output[0]] = value


def _construct(r: _Rewriter, node: onnx.NodeProto) -> None:
    r.values[node.output[0]] = ("seq", [r.tensor(i, node.op_type) for i in node.input])


def _empty(r: _Rewriter, node: onnx.NodeProto) -> None:
    r.values[node.output[0]] = ("seq", [])


def _insert(r: _Rewriter, node: onnx.NodeProto) -> None:
    items = r.sequence(node.input[0], node.op_type)
    position = _position(r, node, 2, len(items), len(items))
    items.insert(position, r.tensor(node.input[1], node.op_type))
    r.values[node.output[0]] = ("seq", items)


def _erase(r: _Rewriter, node: onnx.NodeProto) -> None:
    items = r.sequence(node.input[0], node.op_type)
    del items[_position(r, node, 1, len(items), len(items) - 1)]
    r.values[node.output[0]] = ("seq", items)


def _at(r: _Rewriter, node: onnx.NodeProto) -> None:
    items = r.sequence(node.input[0], node.op_type)
    r.alias(items[_position(r, node, 1, len(items), 0)], node.output[0])


def _length(r: _Rewriter, node: onnx.NodeProto) -> None:
    r.emit_constant(node.output[0], np.array(len(r.sequence(node.input[0], node.op_type)), np.int64))


def _concat(r: _Rewriter, node: onnx.NodeProto) -> None:
    items = r.sequence(node.input[0], node.op_type)
    axis = _attr(node, "axis")
    if _attr(node, "new_axis", 0):
        axes = r.fresh("axes")
        r.emit_constant(axes, np.array([axis], np.int64))
        stacked = []
        for item in items:
            stacked.append(r.fresh(item))
            r.nodes.append(helper.make_node("Unsqueeze", [item, axes], [stacked[-1]]))
        items = stacked
    r.nodes.append(helper.make_node("Concat", items, [node.output[0]], axis=axis))


def _split(r: _Rewriter, node: onnx.NodeProto) -> None:
    data = node.input[0]
    axis = _attr(node, "axis", 0)
    shape = r.shapes.get(data)
    if shape is None or not isinstance(shape[axis], int):
        raise ModelError(f"SplitToSequence '{node.name}' splits an axis of unknown size; edgec "
                         f"needs it static")
    size = shape[axis]
    if len(node.input) > 1 and node.input[1]:
        split = r.constant(node.input[1], f"the split of SplitToSequence '{node.name}'")
        if split.ndim == 0:
            chunk = int(split)
            sizes = [chunk] * (size // chunk) + ([size % chunk] if size % chunk else [])
        else:
            sizes = [int(s) for s in split]
        keep = True
    else:
        sizes, keep = [1] * size, bool(_attr(node, "keepdims", 1))
    sizes_name = r.fresh("split")
    r.emit_constant(sizes_name, np.array(sizes, np.int64))
    parts = [r.fresh(node.output[0]) for _ in sizes]
    r.nodes.append(helper.make_node("Split", [data, sizes_name], parts, axis=axis))
    if not keep:
        axes = r.fresh("axes")
        r.emit_constant(axes, np.array([axis], np.int64))
        squeezed = [r.fresh(p) for p in parts]
        for part, out in zip(parts, squeezed):
            r.nodes.append(helper.make_node("Squeeze", [part, axes], [out]))
        parts = squeezed
    r.values[node.output[0]] = ("seq", parts)


def _sequence_map(r: _Rewriter, node: onnx.NodeProto) -> None:
    body = _attr(node, "body")
    lengths = {len(r.sequence(i, node.op_type)) for i in node.input if i in r.values}
    if len(lengths) != 1:
        raise ModelError(f"SequenceMap '{node.name}' maps sequences of different lengths {sorted(lengths)}")
    results: list[list[str]] = [[] for _ in node.output]
    for index in range(lengths.pop()):
        bindings = {v.name: (r.sequence(i, node.op_type)[index] if i in r.values else i)
                    for v, i in zip(body.input, node.input)}
        for k, value in enumerate(r.inline(body, bindings, f"{node.name}_{index}_")):
            results[k].append(r.tensor(value, "SequenceMap's body") if not isinstance(value, str) else value)
    for out, items in zip(node.output, results):
        r.values[out] = ("seq", items)


def _optional(r: _Rewriter, node: onnx.NodeProto) -> None:
    if node.input and node.input[0]:
        inner = r.values.get(node.input[0], node.input[0])
        r.values[node.output[0]] = ("opt", inner)
    else:
        r.values[node.output[0]] = ("opt", None)


def _has_element(r: _Rewriter, node: onnx.NodeProto) -> None:
    value = r.values.get(node.input[0], node.input[0]) if node.input and node.input[0] else ("opt", None)
    present = not (isinstance(value, tuple) and value[0] == "opt" and value[1] is None)
    r.emit_constant(node.output[0], np.array(present))


def _get_element(r: _Rewriter, node: onnx.NodeProto) -> None:
    value = r.values.get(node.input[0], node.input[0])
    if isinstance(value, tuple) and value[0] == "opt":
        if value[1] is None:
            raise ModelError(f"OptionalGetElement '{node.name}' reads an empty optional")
        value = value[1]
    r.bind(node.output[0], value)


def _if(r: _Rewriter, node: onnx.NodeProto) -> None:
    cond = bool(r.constant(node.input[0], f"which branch If '{node.name}' takes (it returns sequences)"))
    branch = _attr(node, "then_branch" if cond else "else_branch")
    for out, value in zip(node.output, r.inline(branch, {}, f"{node.name}_")):
        r.bind(out, value)


def _loop(r: _Rewriter, node: onnx.NodeProto) -> None:
    """Unrolled: a loop over sequences is resolved iteration by iteration."""
    body = _attr(node, "body")
    what = f"the iterations of Loop '{node.name}' (it carries sequences)"
    trips = int(r.constant(node.input[0], what)) if node.input[0] else None
    cond = bool(r.constant(node.input[1], what)) if len(node.input) > 1 and node.input[1] else True
    carried: list[Value | str] = [r.values.get(i, i) for i in node.input[2:]]
    scans: list[list[str]] = [[] for _ in body.output[1 + len(carried):]]
    iteration = 0
    while cond and (trips is None or iteration < trips):
        counter = r.fresh(f"{node.name}_iter")
        r.emit_constant(counter, np.array(iteration, np.int64))
        flag = r.fresh(f"{node.name}_cond")
        r.emit_constant(flag, np.array(cond))
        values = r.inline(body, dict(zip([v.name for v in body.input], [counter, flag, *carried])),
                          f"{node.name}_{iteration}_")
        cond = bool(r.constant(values[0], what))
        carried = values[1:1 + len(carried)]
        for k, value in enumerate(values[1 + len(carried):]):
            scans[k].append(r.tensor(value, "a Loop scan output") if not isinstance(value, str) else value)
        iteration += 1
        if iteration > 10000:
            raise ModelError(f"Loop '{node.name}' runs over 10000 iterations; edgec unrolls loops over sequences")
    for out, value in zip(node.output, carried):
        r.bind(out, value)
    axes = r.fresh("axes")
    r.emit_constant(axes, np.array([0], np.int64))
    for out, items in zip(node.output[len(carried):], scans):
        stacked = []
        for item in items:
            stacked.append(r.fresh(item))
            r.nodes.append(helper.make_node("Unsqueeze", [item, axes], [stacked[-1]]))
        r.nodes.append(helper.make_node("Concat", stacked, [out], axis=0))


_HANDLERS = {
    "SequenceConstruct": _construct, "SequenceEmpty": _empty, "SequenceInsert": _insert,
    "SequenceErase": _erase, "SequenceAt": _at, "SequenceLength": _length,
    "ConcatFromSequence": _concat, "SplitToSequence": _split, "SequenceMap": _sequence_map,
    "Optional": _optional, "OptionalHasElement": _has_element, "OptionalGetElement": _get_element,
}
_WHEN_STRUCTURED = {"Identity": _identity, "If": _if, "Loop": _loop}


@dataclasses.dataclass(frozen=True)
class Flattened:
    """The tensor-only model and the record of how its tensors map to the original values."""

    proto: onnx.ModelProto
    boundary: dict
    samples: list[dict[str, np.ndarray]]


def _structure(name: str, kind: str, values: list[Any]) -> Any:
    """What all samples show for input ``name``: a sequence's length, an optional's presence."""
    def shape_of(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, list):
            return ("seq", len(value))
        return "tensor"

    seen = {repr(shape_of(v)) for v in values}
    if len(seen) != 1:
        raise SamplesError(
            f"input '{name}' is a {kind} of {' and '.join(sorted(seen))} across samples; an artifact "
            f"is compiled for one length: compile one per length")
    return shape_of(values[0])


def flatten(proto: onnx.ModelProto, samples: Sequence[dict[str, Any]]) -> Flattened:
    """Rewrite ``proto`` (with sequence/optional inputs or outputs) into a tensor-only model."""
    graph = proto.graph
    initializers = {i.name for i in graph.initializer}
    rewriter = _Rewriter(samples, {v.name for v in graph.input}, _static_shapes(proto))
    for init in graph.initializer:
        rewriter.constants[init.name] = numpy_helper.to_array(init)
    flat_inputs: list[onnx.ValueInfoProto] = []
    records_in = []
    for value in graph.input:
        if value.name in initializers:
            continue
        if not structured(value):
            flat_inputs.append(value)
            records_in.append({"name": value.name, "kind": "tensor"})
            continue
        kind, element, record = _boundary_record(value)
        shape = _structure(value.name, kind, [s.get(value.name) for s in samples])
        arrays = [s[value.name] for s in samples]
        if shape is None:
            rewriter.values[value.name] = ("opt", None)
            record["tensors"] = None
        else:
            count = shape[1] if shape != "tensor" else 1
            names = [f"{value.name}__{k}" for k in range(count)]
            for k, name in enumerate(names):
                items = [a[k] if isinstance(a, list) else a for a in arrays]
                flat_inputs.append(_element_input(name, element, items))
            inner: Value = ("seq", names) if shape != "tensor" else names[0]
            rewriter.values[value.name] = ("opt", inner) if kind == "optional" else inner
            record["tensors"] = names
            record["sequence"] = shape != "tensor"
        records_in.append(record)
    rewriter.run(graph.node)

    outputs: list[onnx.ValueInfoProto] = []
    records_out = []
    for value in graph.output:
        if not structured(value):
            outputs.append(value)
            records_out.append({"name": value.name, "kind": "tensor"})
            continue
        kind, element, record = _boundary_record(value)
        current = rewriter.values.get(value.name)
        if current is not None and current[0] == "opt":
            current = current[1]
        if current is None:
            record["tensors"] = None
        else:
            items = current[1] if isinstance(current, tuple) else [current]
            names = [f"{value.name}__{k}" for k in range(len(items))]
            for item, name in zip(items, names):
                rewriter.alias(item, name)
                outputs.append(helper.make_value_info(name, _plain(element)))
            record["tensors"] = names
            record["sequence"] = isinstance(current, tuple)
        records_out.append(record)
    if not flat_inputs:
        raise ModelError("the model takes only empty optionals or sequences for these samples; "
                         "edgec compiles models that take tensor inputs")
    flat_graph = helper.make_graph(rewriter.nodes, graph.name, flat_inputs, outputs,
                                   [i for i in graph.initializer])
    flat = helper.make_model(flat_graph, opset_imports=list(proto.opset_import), ir_version=proto.ir_version)
    _type_outputs(flat, samples_flat := [_flat_sample(s, records_in) for s in samples])
    fixed = {name: {"shape": list(v.shape), "value": v.ravel().tolist(), "dtype": v.dtype.name}
             for name, v in rewriter.fixed.items()}
    boundary = {"inputs": records_in, "outputs": records_out, "fixed": fixed}
    return Flattened(flat, boundary, samples_flat)


def _returns_structured(node: onnx.NodeProto) -> bool:
    """Whether an If/Loop's subgraph outputs are sequences or optionals."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH and any(structured(o) for o in attr.g.output):
            return True
    return False


def _plain(element: onnx.TypeProto) -> onnx.TypeProto:
    """A tensor type of the element's dtype, its shape to be inferred."""
    return helper.make_tensor_type_proto(element.tensor_type.elem_type, None)


def _element_input(name: str, element: onnx.TypeProto, arrays: list[np.ndarray]) -> onnx.ValueInfoProto:
    """A graph input for one sequence element: the declared shape, else the samples' rank."""
    if element.tensor_type.HasField("shape"):
        info = helper.make_value_info(name, element)
        for dim in info.type.tensor_type.shape.dim:
            if not dim.HasField("dim_value"):
                dim.Clear()  # a symbol names a size per element, not one shared by all elements
        return info
    rank = {np.asarray(a).ndim for a in arrays}
    if len(rank) != 1:
        raise SamplesError(f"input '{name}' has ranks {sorted(rank)} across samples")
    return helper.make_tensor_value_info(name, element.tensor_type.elem_type, [None] * rank.pop())


def _flat_sample(sample: dict[str, Any], records: list[dict]) -> dict[str, np.ndarray]:
    flat = {}
    for record in records:
        value = sample[record["name"]]
        if record["kind"] == "tensor":
            flat[record["name"]] = value
        elif record["tensors"]:
            items = value if isinstance(value, list) else [value]
            flat.update(zip(record["tensors"], (np.asarray(i) for i in items)))
    return flat


def _static_shapes(proto: onnx.ModelProto) -> dict[str, tuple]:
    """Tensor shapes from ONNX shape inference (dims as ints or names)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # best effort
        inferred = proto
    shapes = {}
    for value in list(inferred.graph.input) + list(inferred.graph.value_info):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            shapes[value.name] = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                       for d in value.type.tensor_type.shape.dim)
    return shapes


def _type_outputs(flat: onnx.ModelProto, samples: list[dict[str, np.ndarray]]) -> None:
    """Give untyped outputs their rank: from shape inference, else from onnxruntime on a sample."""
    try:
        inferred = onnx.shape_inference.infer_shapes(flat)
    except Exception:  # best effort
        inferred = flat
    known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)
             if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
    source = {n.output[0]: n.input[0] for n in flat.graph.node if n.op_type == "Identity"}
    untyped = []
    for out in flat.graph.output:
        if out.type.tensor_type.HasField("shape"):
            continue
        found = known.get(out.name) or known.get(source.get(out.name, ""))
        if found is not None:
            out.type.tensor_type.shape.CopyFrom(found.type.tensor_type.shape)
        else:
            untyped.append(out)
    if untyped and samples:

        results = reference_session(flat).run(samples[0])
        for out in untyped:
            for _ in range(np.asarray(results[out.name]).ndim):
                out.type.tensor_type.shape.dim.add()
