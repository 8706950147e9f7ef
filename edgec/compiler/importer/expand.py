"""ONNX ops that TVM's importer lacks, replaced by the function body ONNX defines for them.

Many ONNX operators (``NegativeLogLikelihoodLoss``, ``SoftmaxCrossEntropyLoss``, ``Attention``,
``RMSNormalization``, ``Swish``, ``Celu``...) are specified as functions of simpler operators;
some bodies depend on the node's attributes and input types ("context-dependent"). A node of such
an op that no converter handles (or whose TVM converter implements another op of the same name,
see ``ALWAYS_EXPAND``) is replaced by its body, with names prefixed by the node's name, the same
expansion ONNX uses for its ``*_expanded`` test models; a body's subgraphs (LinearAttention's Scan
step) have the values they define prefixed too. Expansion repeats for ops inside bodies.
"""

from __future__ import annotations

import warnings
from typing import Callable

import onnx
from onnx import AttributeProto, FunctionProto, GraphProto, NodeProto, TypeProto

from edgec.core.model import all_graphs, all_nodes

# TVM's "Attention" converter implements com.microsoft's Attention (num_heads, packed QKV), not
# ONNX's opset-23 Attention, and its RMSNormalization fails to compile when normalizing over
# every axis; the ONNX ops' function bodies are used instead.
ALWAYS_EXPAND = {"Attention", "RMSNormalization"}


def _prefer_body(node: NodeProto) -> bool:
    """Ops TVM converts, but not as ONNX specifies: their function body is used instead."""
    if node.op_type in ALWAYS_EXPAND:
        return True
    # TVM's LayerNormalization returns Mean and InvStdDev as scalars, not reduced tensors.
    return node.op_type == "LayerNormalization" and any(node.output[1:])


def expand_functions(proto: onnx.ModelProto, has_converter: Callable[[str], bool],
                     max_rounds: int = 4) -> onnx.ModelProto:
    """A copy of ``proto`` where every node, in the graph and in its subgraphs at any depth, of
    an op without converter (or in ``ALWAYS_EXPAND``) whose ONNX schema has a function body is
    replaced by that body. ``proto`` itself is returned when nothing expands."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)

    def wanted(node: NodeProto) -> bool:
        if node.domain not in ("", "ai.onnx"):
            return False
        if has_converter(node.op_type) and not _prefer_body(node):
            return False
        schema = _schema(node.op_type, opset)
        return schema is not None and (schema.has_function or schema.has_context_dependent_function)

    if not any(wanted(node) for node in all_nodes(proto.graph)):
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for _ in range(max_rounds):
        if not any(wanted(node) for node in all_nodes(proto.graph)):
            break
        types = value_types(proto)
        changed = False
        for graph in all_graphs(proto.graph):
            nodes: list[NodeProto] = []
            for node in graph.node:
                body = _expand(node, opset, types) if wanted(node) else None
                nodes.extend(body if body is not None else [node])
                changed |= body is not None
            del graph.node[:]
            graph.node.extend(nodes)
        if not changed:
            break
    return proto


def _schema(op_type: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, "")
    except Exception:  # SchemaError: not an ONNX op at this opset
        return None


def value_types(proto: onnx.ModelProto) -> dict[str, TypeProto]:
    """Each value's type as ONNX shape inference sees it (context-dependent bodies need it)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # best effort: ops whose body needs a missing type stay as they are
        inferred = proto
    types: dict[str, TypeProto] = {}
    for graph in all_graphs(inferred.graph):  # subgraphs' values too: their names are unique
        types.update({v.name: v.type
                      for v in list(graph.input) + list(graph.value_info) + list(graph.output)})
        for init in graph.initializer:
            types[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
    return types


def _function(node: NodeProto, schema, opset: int, types: dict[str, TypeProto]) -> FunctionProto | None:
    """The body for this node at the model's opset (the newest version at or below it)."""
    plain = [v for v in schema.function_opset_versions if v <= opset]
    dependent = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    function = FunctionProto()
    if dependent and (not plain or max(dependent) >= max(plain)):
        input_types = []
        for name in node.input:
            if name and name not in types:
                return None
            input_types.append(types[name].SerializeToString() if name else TypeProto().SerializeToString())
        try:
            text = schema.get_context_dependent_function_with_opset_version(
                max(dependent), node.SerializeToString(), input_types)
        except Exception:  # the schema cannot build a body for these types
            return None
        function.ParseFromString(text)
    elif plain:
        function.ParseFromString(schema.get_function_with_opset_version(max(plain)))
    else:
        return None
    return function if function.node else None


def _expand(node: NodeProto, opset: int, types: dict[str, TypeProto]) -> list[NodeProto] | None:
    schema = _schema(node.op_type, opset)
    node = _with_defaults(node, schema)
    function = _function(node, schema, opset, types)
    if function is None:
        return None
    prefix = f"{node.name}__{node.op_type}__"
    names: dict[str, str] = {}
    for index, name in enumerate(function.input):
        names[name] = node.input[index] if index < len(node.input) else ""
    for index, name in enumerate(function.output):
        if index < len(node.output) and node.output[index]:
            names[name] = node.output[index]
    attributes = {a.name: a for a in node.attribute}

    def rename(name: str) -> str:
        if name in names:
            return names[name]
        return prefix + name if name else ""

    body = []
    for index, inner in enumerate(function.node):
        new = _renamed(inner, rename, attributes, lambda name: prefix + name)
        new.name = f"{prefix}{inner.name or inner.op_type}_{index}"
        body.append(new)
    return body


def _with_defaults(node: NodeProto, schema) -> NodeProto:
    """The node with every attribute the schema defaults made explicit (bodies refer to them)."""
    node_copy = NodeProto()
    node_copy.CopyFrom(node)
    present = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in present and attr.default_value and attr.default_value.name:
            node_copy.attribute.append(attr.default_value)
    return node_copy


def _renamed(inner: NodeProto, rename: Callable[[str], str],
             attributes: dict[str, AttributeProto], fresh: Callable[[str], str]) -> NodeProto:
    """A body node with edges renamed and attribute references resolved, in its subgraphs
    (a Scan's or Loop's body) too; ``fresh`` names the values a subgraph defines."""
    new = NodeProto()
    new.CopyFrom(inner)
    new.ClearField("input")
    new.ClearField("output")
    new.ClearField("attribute")
    new.input.extend(rename(n) for n in inner.input)
    new.output.extend(rename(n) for n in inner.output)
    for attr in inner.attribute:
        if attr.HasField("ref_attr_name"):
            if attr.ref_attr_name in attributes:
                resolved = AttributeProto()
                resolved.CopyFrom(attributes[attr.ref_attr_name])
                resolved.name = attr.name
                new.attribute.append(resolved)
            continue
        copy = AttributeProto()
        copy.CopyFrom(attr)
        if attr.type == AttributeProto.GRAPH:
            copy.g.CopyFrom(_renamed_graph(attr.g, rename, attributes, fresh))
        elif attr.type == AttributeProto.GRAPHS:
            del copy.graphs[:]
            copy.graphs.extend(_renamed_graph(g, rename, attributes, fresh) for g in attr.graphs)
        new.attribute.append(copy)
    return new


def _renamed_graph(graph: GraphProto, rename: Callable[[str], str],
                   attributes: dict[str, AttributeProto],
                   fresh: Callable[[str], str]) -> GraphProto:
    """A body's subgraph with the values it defines given fresh names and the values it reads
    from the body renamed as the body's are (``rename``)."""
    local = ({v.name for v in graph.input} | {t.name for t in graph.initializer}
             | {t.values.name for t in graph.sparse_initializer}
             | {name for node in graph.node for name in node.output})

    def inner(name: str) -> str:
        if not name:
            return ""
        return fresh(name) if name in local else rename(name)

    new = GraphProto()
    new.CopyFrom(graph)
    new.ClearField("node")
    for index, node in enumerate(graph.node):
        renamed = _renamed(node, inner, attributes, fresh)
        renamed.name = fresh(f"{graph.name}_{node.name or node.op_type}_{index}")
        new.node.append(renamed)
    for value in list(new.input) + list(new.output) + list(new.value_info):
        value.name = inner(value.name)
    for tensor in new.initializer:
        tensor.name = inner(tensor.name)
    for sparse in new.sparse_initializer:
        sparse.values.name = inner(sparse.values.name)
    return new
