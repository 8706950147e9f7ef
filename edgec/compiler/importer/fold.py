"""ONNX-level constant folding before import: fixed inputs, ``Shape`` of static tensors, and
every node computed only from constants (or from tensors of static shape with no elements)
become ``Constant`` nodes; an ``If`` whose condition is known becomes its branch's nodes, and
every ``Constant`` (subgraphs included) holds a ``value`` tensor.

TVM's importer accepts many shape-like arguments (axes, shape, sizes, k, pads, repeats,
starts/ends) only as constants, and handles ``Shape`` results only in a dozen ops. Folding here,
with ONNX's reference implementation of each op, hands it constants wherever the values are
known at compile time: graph inputs the plan fixed (``constants``), initializers, ``Constant``
nodes, the shapes ONNX shape inference proves static, and anything computed from those.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgec.core.model import all_nodes, subgraphs

# Results larger than this stay computed at run time: folding them would bloat the artifact.
MAX_FOLDED_ELEMENTS = 1 << 16
_CONSTANT_SUFFIX = "__edgec_constant"
# Ops whose result is not a function of their inputs, or that edgec must keep (control flow).
_KEEP = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
         "Bernoulli", "If", "Loop", "Scan", "Constant", "SequenceConstruct", "SequenceEmpty",
         "SequenceInsert", "SequenceErase", "SequenceAt", "SequenceLength", "SplitToSequence",
         "ConcatFromSequence", "Optional", "OptionalGetElement", "OptionalHasElement",
         "ImageDecoder", "StringNormalizer", "StringSplit", "StringConcat", "RegexFullMatch",
         "TfIdfVectorizer", "LabelEncoder"}


def constant_input_name(name: str) -> str:
    """The initializer that stands for graph input ``name`` once its value is fixed."""
    return name + _CONSTANT_SUFFIX


def fix_inputs(proto: onnx.ModelProto, constants: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``proto`` whose nodes read each input in ``constants`` from an initializer.

    The graph inputs themselves stay, so the compiled ``main`` keeps the model's signature; the
    runtime checks that a call passes the fixed value.
    """
    if not constants:
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    renames = {name: constant_input_name(name) for name in constants}

    for node in all_nodes(proto.graph):
        for index, name in enumerate(node.input):
            if name in renames:
                node.input[index] = renames[name]
    for name, value in constants.items():
        proto.graph.initializer.append(numpy_helper.from_array(np.asarray(value), renames[name]))
    return proto


def fold_constants(proto: onnx.ModelProto, max_rounds: int = 4) -> onnx.ModelProto:
    """A copy of ``proto`` with every top-level node whose outputs are known at compile time
    replaced by ``Constant`` nodes (``proto`` itself when nothing folds)."""
    if not _foldable(proto):
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    _value_constants(proto, opset)
    for _ in range(max_rounds):
        if not _fold_round(proto, opset):
            break
    _full_rank_resizes(proto)
    return proto


def _full_rank_resizes(proto: onnx.ModelProto) -> None:
    """Resize-18's ``axes``, which TVM's converter ignores, folded into full-rank constant
    roi/scales/sizes (in place). Exact where it applies: every argument known, and no
    ``keep_aspect_ratio_policy`` with sizes (that one scales the listed axes jointly)."""
    graph = proto.graph
    resizes = [n for n in graph.node if n.op_type == "Resize"
               and any(a.name == "axes" for a in n.attribute)]
    if not resizes:
        return
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer
              if int(np.prod(init.dims)) <= MAX_FOLDED_ELEMENTS}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    shapes = _static_shapes(proto)
    added: list[onnx.NodeProto] = []
    for node in resizes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        dims = shapes.get(node.input[0])
        args = [node.input[i] if i < len(node.input) else "" for i in range(4)]
        if dims is None or any(name and name not in values for name in args[1:]):
            continue
        policy = attrs.get("keep_aspect_ratio_policy", b"stretch")
        if args[3] and values[args[3]].size and policy not in (b"stretch", "stretch"):
            continue
        rank = len(dims)
        axes = [a % rank for a in attrs["axes"]]
        full: list[np.ndarray | None] = [None, None, None]
        roi = values.get(args[1])
        if roi is not None and roi.size:
            wide = np.concatenate([np.zeros(rank, roi.dtype), np.ones(rank, roi.dtype)])
            wide[axes] = roi[: len(axes)]
            wide[[rank + a for a in axes]] = roi[len(axes):]
            full[0] = wide
        scales = values.get(args[2])
        if scales is not None and scales.size:
            full[1] = np.ones(rank, scales.dtype)
            full[1][axes] = scales
        sizes = values.get(args[3])
        if sizes is not None and sizes.size:
            full[2] = np.array(dims, sizes.dtype)
            full[2][axes] = sizes
        while len(node.input) < 4:
            node.input.append("")
        for position, value in zip((1, 2, 3), full):
            if value is not None:
                name = f"{node.name}__full_rank_{position}"
                added.append(helper.make_node("Constant", [], [name], name=name,
                                              value=numpy_helper.from_array(value, name)))
                node.input[position] = name
        kept = [a for a in node.attribute if a.name != "axes"]
        del node.attribute[:]
        node.attribute.extend(kept)
    if added:
        nodes = added + list(graph.node)
        del graph.node[:]
        graph.node.extend(nodes)


def _foldable(proto: onnx.ModelProto) -> bool:
    if _has_empty_input(proto.graph):
        return True
    if any(_other_constant_form(node) for node in all_nodes(proto.graph)):
        return True
    known = {init.name for init in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type in ("Shape", "Size") or (
                node.op_type == "Resize" and any(a.name == "axes" for a in node.attribute)):
            return True
        if node.op_type == "Constant":
            known.update(node.output)
        elif node.op_type == "If" and node.input[0] in known:
            return True
        elif node.op_type not in _KEEP and all(not i or i in known for i in node.input):
            return True
    return False


def _static_shapes(proto: onnx.ModelProto) -> dict[str, list[int]]:
    """Names whose shapes ONNX shape inference proves fully static."""
    return {name: dims for name, (_, dims) in _static_types(proto).items()}


def _static_types(proto: onnx.ModelProto) -> dict[str, tuple[int, list[int]]]:
    """Names whose shapes ONNX shape inference proves fully static: (element type, dims)."""
    graph = proto.graph
    light = onnx.ModelProto()
    light.CopyFrom(proto)
    del light.graph.initializer[:]
    small = []
    for init in graph.initializer:
        if int(np.prod(init.dims)) <= MAX_FOLDED_ELEMENTS:
            small.append(init)
        else:  # its dims are all inference needs; keep the weights out of the copy
            light.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    light.graph.initializer.extend(small)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception:  # inference is best effort: without it only Shape of inputs folds
        inferred = light
    types: dict[str, tuple[int, list[int]]] = {}
    for value in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            continue
        dims = value.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            types[value.name] = (value.type.tensor_type.elem_type, [d.dim_value for d in dims])
    for init in graph.initializer:
        types[init.name] = (init.data_type, list(init.dims))
    return types


def _has_empty_input(graph: onnx.GraphProto) -> bool:
    return any(d.HasField("dim_value") and d.dim_value == 0
               for value in graph.input for d in value.type.tensor_type.shape.dim)


def _empty_values(types: dict[str, tuple[int, list[int]]]) -> dict[str, np.ndarray]:
    """The tensors of static shape with no elements: their value is their shape, so nodes
    computed from them fold like constants (a reduction over an empty set is its identity; TVM's
    kernel would leave its output unwritten, as its init runs inside the empty loop)."""
    empty = {}
    for name, (elem_type, dims) in types.items():
        if 0 in dims and elem_type not in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING):
            try:
                empty[name] = np.zeros(dims, helper.tensor_dtype_to_np_dtype(elem_type))
            except (KeyError, TypeError, ValueError):  # an element type numpy cannot hold
                continue
    return empty


def _evaluate(node: onnx.NodeProto, values: list[np.ndarray | None], opset: int,
              ir_version: int) -> list[np.ndarray] | None:
    """The node's outputs computed by ONNX's reference implementation, or None if it cannot."""
    from onnx.reference import ReferenceEvaluator

    inputs = [helper.make_tensor_value_info(f"in{i}", helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for i, v in enumerate(values) if v is not None]
    names, position = [], 0
    for value in values:
        if value is None:
            names.append("")
        else:
            names.append(f"in{position}")
            position += 1
    outs = [f"out{i}" for i in range(len(node.output))]
    single = helper.make_node(node.op_type, names, [o if n else "" for o, n in zip(outs, node.output)],
                              domain=node.domain)
    single.attribute.extend(node.attribute)
    graph = helper.make_graph([single], "fold", inputs,
                              [helper.make_empty_tensor_value_info(o) for o, n in zip(outs, node.output) if n])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            results = ReferenceEvaluator(model).run(
                None, {f"in{i}": v for i, v in enumerate(v for v in values if v is not None)})
    except Exception:  # an op or case the reference cannot run: leave the node to the compiler
        return None
    results = [np.asarray(r) for r in results]
    if any(r.dtype == object or r.size > MAX_FOLDED_ELEMENTS for r in results):
        return None
    return results


def _fold_round(proto: onnx.ModelProto, opset: int) -> bool:
    """Fold what is foldable now; True when anything changed."""
    graph = proto.graph
    known: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        if int(np.prod(init.dims)) <= MAX_FOLDED_ELEMENTS:
            known[init.name] = numpy_helper.to_array(init)
    needs_shapes = _has_empty_input(graph) or any(n.op_type in ("Shape", "Size") for n in graph.node)
    types = _static_types(proto) if needs_shapes else {}
    shapes = {name: dims for name, (_, dims) in types.items()}
    known = {**_empty_values(types), **known}
    changed = False
    taken_names = _graph_names(graph)
    new_nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        results = None
        if node.domain not in ("", "ai.onnx"):
            pass
        elif node.op_type == "Constant":
            if not _other_constant_form(node):
                known[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
            new_nodes.append(node)
            continue
        elif node.op_type == "If" and node.input[0] in known:
            new_nodes.extend(_taken_branch(node, bool(np.asarray(known[node.input[0]]).reshape(-1)[0]),
                                           taken_names))
            changed = True
            continue
        elif node.op_type in ("Shape", "Size") and node.input[0] in shapes:
            results = _shape_of(node, shapes[node.input[0]], opset)
        elif (node.op_type not in _KEEP and node.input
              and all(not name or name in known for name in node.input)
              and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                          for a in node.attribute)):
            results = _evaluate(node, [known[n] if n else None for n in node.input], opset,
                                proto.ir_version)
        if results is not None and any(r.size == 0 for r in results):
            # TVM's VM cannot load a constant with no elements: the node stays (it is cheap), and
            # what reads its result still folds.
            known.update((name, value) for name, value in zip(node.output, results) if name)
            results = None
        if results is None:
            new_nodes.append(node)
            continue
        changed = True
        for name, value in zip(node.output, results):
            if not name:
                continue
            known[name] = value
            new_nodes.append(helper.make_node(
                "Constant", [], [name], name=f"{node.name}__folded_{len(new_nodes)}",
                value=numpy_helper.from_array(value, name)))
    if changed:
        del graph.node[:]
        graph.node.extend(new_nodes)
    return changed


def _shape_of(node: onnx.NodeProto, dims: list[int], opset: int) -> list[np.ndarray]:
    """Shape (with opset-15 start/end) or Size of a tensor with static ``dims``."""
    if node.op_type == "Size":
        return [np.array(int(np.prod(dims)), np.int64)]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    start, end = (attrs.get("start", 0), attrs.get("end")) if opset >= 15 else (0, None)
    return [np.array(dims[start:end], np.int64)]


def _other_constant_form(node: onnx.NodeProto) -> bool:
    """A Constant given as value_float(s), value_int(s), value_string(s) or sparse_value."""
    return node.op_type == "Constant" and node.attribute[0].name != "value"


def _value_constants(proto: onnx.ModelProto, opset: int) -> None:
    """Every Constant anywhere, subgraphs included, as a ``value`` tensor (in place): TVM's
    converter reads only ``value``. Strings stay as they are (no tensor TVM can hold)."""
    for node in all_nodes(proto.graph):
        if not _other_constant_form(node):
            continue
        attribute = node.attribute[0]
        if attribute.name == "sparse_value":
            value = _dense(attribute.sparse_tensor)
        else:
            results = _evaluate(node, [], opset, proto.ir_version)
            value = None if results is None else results[0]
        if value is None:
            continue
        del node.attribute[:]
        node.attribute.append(helper.make_attribute(
            "value", numpy_helper.from_array(value, node.output[0])))


def _dense(sparse: onnx.SparseTensorProto) -> np.ndarray:
    """A sparse tensor's dense value; its indices are linear ([NNZ]) or per dim ([NNZ, rank])."""
    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dense = np.zeros(tuple(sparse.dims), values.dtype)
    if indices.ndim == 2:
        dense[tuple(indices.T)] = values
    else:
        dense.reshape(-1)[indices] = values
    return dense


def _graph_names(graph: onnx.GraphProto) -> set[str]:
    """Every value name ``graph`` itself uses (its subgraphs' own names aside)."""
    names = {v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
    names.update(init.name for init in graph.initializer)
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
    return names


def _taken_branch(node: onnx.NodeProto, condition: bool, taken: set[str]) -> list[onnx.NodeProto]:
    """The nodes that replace ``If`` ``node`` whose condition is ``condition``: its branch's
    initializers as Constants, its nodes, and an Identity per output. Names the branch defines
    that are already taken in the enclosing graph get fresh ones (``taken`` is updated)."""
    branch = next(helper.get_attribute_value(a) for a in node.attribute
                  if a.name == ("then_branch" if condition else "else_branch"))
    defined = [init.name for init in branch.initializer] + [
        name for n in branch.node for name in n.output if name]
    renames = {}
    for name in defined:
        if name in taken:
            fresh, index = f"{name}__{node.name}", 0
            while fresh in taken:
                index += 1
                fresh = f"{name}__{node.name}_{index}"
            renames[name] = fresh
        taken.add(renames.get(name, name))
    rename = lambda name: renames.get(name, name)  # noqa: E731
    nodes = [helper.make_node("Constant", [], [rename(init.name)], name=f"{node.name}/{init.name}",
                              value=init) for init in branch.initializer]
    for inner in branch.node:
        inner = onnx.NodeProto.FromString(inner.SerializeToString())
        for sub_node in [inner, *(n for sub in subgraphs(inner) for n in all_nodes(sub))]:
            sub_node.input[:] = [rename(name) for name in sub_node.input]
        inner.output[:] = [rename(name) for name in inner.output]
        inner.name = inner.name or f"{node.name}/{inner.op_type}_{len(nodes)}"
        nodes.append(inner)
    for out, value in zip(node.output, branch.output):
        if out:
            nodes.append(helper.make_node("Identity", [rename(value.name)], [out],
                                          name=f"{node.name}/{out}"))
    return nodes

