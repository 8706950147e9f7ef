"""Loading ONNX models and the facts about them every stage needs.

A :class:`Model` wraps a checked, normalized ``onnx.ModelProto``: every node has a unique name, every
dim of a graph input or output is either a number or a named symbol, and initializers are not
listed as inputs. Stages never change it; they derive new protos from copies. A PyTorch program
(``torch.export``) is a Model too, with ``program`` set and no proto (see edgec.core.torch_program).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edgec.core.dims import unify_dims
from edgec.errors import InputFileError, ModelError
from edgec.runtime.signature import Dim, TensorSpec, ValueSpec

CONTROL_FLOW_OPS = ("If", "Loop", "Scan")


@dataclass(frozen=True)
class Model:
    """A loaded ONNX model with its inputs, outputs and identity."""

    proto: onnx.ModelProto | None
    name: str
    sha256: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    opset: int
    control_flow: tuple[tuple[str, str], ...] = field(default=())
    path: str = ""
    # The torch.export.ExportedProgram of a PyTorch program (then ``proto`` is None).
    program: Any = None

    @property
    def structured(self) -> bool:
        """Whether an input or output is a sequence or an optional (see edgec.core.sequences)."""
        return any(isinstance(spec, ValueSpec) for spec in self.inputs + self.outputs)

    @property
    def kind(self) -> str:
        """``onnx`` or ``torch``: which frontend and which reference the model goes through."""
        return "onnx" if self.program is None else "torch"

    @property
    def node_names(self) -> list[str]:
        """The names of the top-level nodes (graph nodes; for a torch program, its op calls)."""
        if self.program is not None:
            return [n.name for n in self.program.graph.nodes if n.op == "call_function"]
        return [n.name for n in self.proto.graph.node]

    @property
    def dynamic_dims(self) -> list[str]:
        """The symbol names used by the inputs' dims, in order of first appearance."""
        seen: list[str] = []
        for spec in self.inputs:
            for dim in spec.dims:
                if isinstance(dim, str) and dim not in seen:
                    seen.append(dim)
        return seen

    def input(self, name: str) -> TensorSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def serialized(self) -> bytes:
        return self.proto.SerializeToString()


def tensor_dtype(elem_type: int) -> str:
    """The numpy dtype name of an ONNX tensor element type."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


def element_type(type_proto: onnx.TypeProto) -> onnx.TypeProto | None:
    """The tensor type inside a sequence/optional type (any depth); None where there is none (a
    map, a sparse tensor)."""
    while not type_proto.HasField("tensor_type"):
        if type_proto.HasField("sequence_type"):
            type_proto = type_proto.sequence_type.elem_type
        elif type_proto.HasField("optional_type"):
            type_proto = type_proto.optional_type.elem_type
        else:
            return None
    return type_proto


def _spec_of(value: onnx.ValueInfoProto, where: str) -> TensorSpec | ValueSpec:
    for kind in ("sequence", "optional"):
        if value.type.HasField(f"{kind}_type"):
            element = element_type(value.type)
            if element is None:
                raise ModelError(f"{where} '{value.name}' is a {kind} of unsupported elements")
            try:
                return ValueSpec(value.name, kind, tensor_dtype(element.tensor_type.elem_type))
            except (KeyError, TypeError, ValueError):
                raise ModelError(f"{where} '{value.name}' is a {kind} of unsupported element type") from None
    if not value.type.HasField("tensor_type"):
        raise ModelError(f"{where} '{value.name}' is not a tensor; edgec supports tensor inputs and outputs")
    ttype = value.type.tensor_type
    try:
        dtype = tensor_dtype(ttype.elem_type)
    except (KeyError, TypeError, ValueError):
        raise ModelError(f"{where} '{value.name}' has unsupported element type {ttype.elem_type}") from None
    dims: list[Dim] = []
    if ttype.HasField("shape"):
        for dim in ttype.shape.dim:
            dims.append(dim.dim_value if dim.HasField("dim_value") else dim.dim_param)
    return TensorSpec(value.name, dtype, tuple(dims))


def _normalize(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Name every node and every unnamed graph input/output dim; drop initializers from inputs."""
    graph = proto.graph
    initializers = {init.name for init in graph.initializer}
    real_inputs = [value for value in graph.input if value.name not in initializers]
    if len(real_inputs) != len(graph.input):
        del graph.input[:]
        graph.input.extend(real_inputs)
    taken = {dim.dim_param for value in list(graph.input) + list(graph.output)
             if value.type.HasField("tensor_type")
             for dim in value.type.tensor_type.shape.dim if dim.dim_param}
    for value in list(graph.input) + list(graph.output):
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if _unknown_dim(dim):
                # Its own symbolic dim: "?" or a negative size (paddle2onnx's -1) says "any
                # size", not "the same size as every other unknown dim".
                name = f"{_identifier(value.name)}_dim{axis}"
                while name in taken:
                    name += "_"
                taken.add(name)
                dim.Clear()
                dim.dim_param = name
            elif dim.dim_param and not dim.dim_param.isidentifier():
                dim.dim_param = _identifier(dim.dim_param)
    unify_dims(proto)
    used: set[str] = set()

    def name_nodes(g: onnx.GraphProto, prefix: str) -> None:
        for index, node in enumerate(g.node):
            if not node.name or node.name in used:
                node.name = f"{prefix}{node.op_type}_{index}"
            while node.name in used:
                node.name += "_"
            used.add(node.name)
            for sub in subgraphs(node):
                name_nodes(sub, f"{node.name}/")

    name_nodes(graph, "")
    return proto


# dim_param values exporters write for "unknown" rather than as a name shared between dims.
_UNKNOWN_DIM_NAMES = {"", "?", "-1", "None", "none", "unk", "unknown"}


def _unknown_dim(dim: onnx.TensorShapeProto.Dimension) -> bool:
    """A dim with no size and no real name: unset, a negative size, or a placeholder name."""
    if dim.HasField("dim_value"):
        return dim.dim_value < 0
    return dim.dim_param.strip() in _UNKNOWN_DIM_NAMES


def _identifier(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name) or "input"


def _check_dataflow(graph: onnx.GraphProto, name: str) -> None:
    """Name a missing tensor or a cycle in the top-level graph more plainly than onnx's checker.

    A node input must be a graph input, an initializer or an output of an earlier node. One that
    nothing produces is usually a missing initializer; one produced only by a later node means the
    nodes are out of order or form a cycle, told apart by a topological sort.
    """
    available = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    available |= {t.values.name for t in graph.sparse_initializer}
    produced_by = {out: node for node in graph.node for out in node.output if out}
    late = []
    for node in graph.node:
        for tensor in node.input:
            if tensor in available:
                continue
            if tensor not in produced_by:
                raise ModelError(
                    f"model '{name}': node '{node.name or node.op_type}' ({node.op_type}) reads "
                    f"'{tensor}', which no graph input, initializer or node provides (a missing "
                    f"initializer?); re-export the model with it"
                )
            late.append(node)
        available.update(out for out in node.output if out)
    if not late:
        return
    # Kahn's algorithm: the nodes left over all lie on or behind a cycle.
    waiting = {id(node): {t for t in node.input if t in produced_by} for node in graph.node}
    ready = [node for node in graph.node if not waiting[id(node)]]
    done: set[int] = set()
    while ready:
        node = ready.pop()
        done.add(id(node))
        outputs = set(node.output)
        for other in graph.node:
            if id(other) not in done and waiting[id(other)] & outputs:
                waiting[id(other)] -= outputs
                if not waiting[id(other)]:
                    ready.append(other)
    stuck = [node.name or node.op_type for node in graph.node if id(node) not in done]
    if stuck:
        raise ModelError(
            f"model '{name}' has a cycle: nodes {', '.join(stuck[:6])}{' …' if len(stuck) > 6 else ''} "
            f"wait on each other's outputs; an ONNX graph must be acyclic, fix the exporter"
        )
    node = late[0]
    raise ModelError(
        f"model '{name}': node '{node.name or node.op_type}' comes before the node producing its "
        f"input; ONNX needs nodes in topological order (onnx.utils or re-export can sort them)"
    )


def attribute_text(value: Any, default: str = "") -> str:
    """A string attribute's value as text: ONNX holds it as bytes (TVM's importer passes them
    on); ``default`` when absent."""
    if value is None:
        return default
    return value.decode("ascii") if isinstance(value, bytes) else str(value)


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs a node holds as attributes (If branches, Loop/Scan bodies...)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        yield from attr.graphs


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph inside it (If branches, Loop/Scan bodies) at any depth, each
    after the graphs it holds, so that a rewrite of a graph sees its subgraphs rewritten."""
    for node in graph.node:
        for sub in subgraphs(node):
            yield from all_graphs(sub)
    yield graph


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and of its subgraphs, depth first, each before its subgraphs."""
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from all_nodes(sub)


def graph_constants(graph: onnx.GraphProto,
                    names: set[str] | None = None) -> dict[str, np.ndarray]:
    """The values of ``graph``'s initializers and of its ``Constant`` nodes that hold a ``value``
    tensor, by name (its subgraphs' not included); only those in ``names`` when given (a pass
    that reads a few small constants need not copy every weight)."""
    wanted = (lambda name: True) if names is None else names.__contains__
    constants = {init.name: numpy_helper.to_array(init) for init in graph.initializer
                 if wanted(init.name)}
    for node in graph.node:
        if node.op_type == "Constant" and len(node.output) == 1 and wanted(node.output[0]):
            value = next((a for a in node.attribute if a.name == "value"), None)
            if value is not None and value.type == onnx.AttributeProto.TENSOR:
                constants[node.output[0]] = numpy_helper.to_array(value.t)
    return constants


def graph_readers(graph: onnx.GraphProto) -> dict[str, list[int]]:
    """The indices of the nodes of ``graph`` (not of its subgraphs) that read each value, each
    node once per value."""
    readers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.node):
        for name in dict.fromkeys(node.input):
            readers.setdefault(name, []).append(index)
    return readers


def subgraph_reads(graph: onnx.GraphProto) -> set[str]:
    """The values that nodes inside ``graph``'s If branches and loop bodies read (at any depth):
    a pass that rewrites ``graph`` must leave them as written."""
    return {name for node in graph.node for sub in subgraphs(node)
            for inner in all_nodes(sub) for name in inner.input}


def from_proto(proto: onnx.ModelProto, name: str = "model", path: str = "") -> Model:
    """Check and normalize an in-memory ONNX model; the caller's proto is not changed."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    sha256 = hashlib.sha256(proto.SerializeToString()).hexdigest()
    if not proto.graph.node:
        raise ModelError(f"model '{name}' has no nodes; export a model with at least one operator")
    _check_dataflow(proto.graph, name)
    try:
        onnx.checker.check_model(proto)
    except Exception as exc:  # ValidationError, and e.g. UnicodeDecodeError for a name that is not UTF-8
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"model '{name}' is not a valid ONNX model: {first}") from None
    proto = _normalize(proto)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    bounds = index_bounds(proto)
    inputs = tuple(
        TensorSpec(spec.name, spec.dtype, spec.dims, bounds.get(spec.name))
        if isinstance(spec, TensorSpec) else spec
        for spec in (_spec_of(v, "input") for v in proto.graph.input)
    )
    outputs = tuple(_spec_of(v, "output") for v in proto.graph.output)
    control_flow = tuple((n.name, n.op_type) for n in proto.graph.node if n.op_type in CONTROL_FLOW_OPS)
    return Model(proto, name, sha256, inputs, outputs, opset, control_flow, path)


# Graph names exporters write whatever the model is: naming a model after them would give every
# model of a report the same name.
_EXPORTER_GRAPH_NAMES = frozenset({"", "main_graph", "torch_jit", "torch-jit-export", "tf2onnx",
                                   "graph", "model", "Graph", "Model", "onnx_graph"})


def model_name(proto: onnx.ModelProto, path: Path) -> str:
    """What to call a model loaded from ``path``: its graph's name, which travels with the file,
    unless that is an exporter's default (``main_graph``, ``torch_jit``, ...); then the file's
    stem, or the folder's name for the zoo's ``DIR/model.onnx`` layout."""
    if proto.graph.name.strip() not in _EXPORTER_GRAPH_NAMES:
        return proto.graph.name.strip()
    return path.parent.name if path.name == "model.onnx" and path.parent.name else path.stem


def load_model(path: str | Path, name: str | None = None) -> Model:
    """Load an ONNX model file, with one-line errors for a missing, unreadable or invalid model.

    External data next to the model is loaded too. The model is called ``name`` if given, else as
    :func:`model_name` says (reports and ``report --compare`` match results by this name). A
    ``.pt2`` file (``torch.export.save``) loads as a PyTorch program.
    """
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"model file '{path}' does not exist; pass the path of an .onnx or .pt2 file")
    if path.suffix == ".pt2" and path.is_file():
        from edgec.core.torch_program import load_program  # torch is an optional extra

        program = load_program(path)
        return dataclasses.replace(program, name=name) if name else program
    if path.is_dir():
        if (path / "model.onnx").is_file():
            path = path / "model.onnx"
        else:
            raise InputFileError(f"'{path}' is a folder without model.onnx; pass an .onnx file")
    try:
        proto = onnx.load(str(path))
    except Exception as exc:  # protobuf raises several unrelated types on garbage input
        raise ModelError(f"'{path}' is not an ONNX model ({type(exc).__name__}); pass an .onnx file") from None
    if not proto.HasField("graph"):
        raise ModelError(f"'{path}' is not an ONNX model (no graph); pass an .onnx file")
    return from_proto(proto, name or model_name(proto, path), str(path.resolve()))


def expose_activations(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` whose graph outputs also list every top-level node output.

    Types and shapes come from ONNX shape inference; an activation whose type or rank it cannot
    infer is not exposed. The original outputs keep their positions at the front.
    """
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # inference is best effort; untyped activations are just not exposed
        inferred = proto
    known = {v.name: v for v in inferred.graph.value_info
             if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type
             and v.type.tensor_type.HasField("shape")}
    present = {o.name for o in proto.graph.output}
    for node in proto.graph.node:
        for out in node.output:
            if out and out not in present and out in known:
                proto.graph.output.append(known[out])
                present.add(out)
    return _normalize(proto)


_GATHER_OPS = ("Gather", "GatherElements")


def index_bounds(proto: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """Integer graph inputs used directly as the indices of a gather over a constant table.

    Returns, per such input, the valid range [-n, n) where n is the size of the gathered axis
    (the tightest over all its uses).
    """
    graph = proto.graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    shapes[node.output[0]] = tuple(attr.t.dims)
    inputs = {v.name for v in graph.input
              if v.type.tensor_type.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)}
    bounds: dict[str, tuple[int, int]] = {}
    for node in graph.node:
        if node.op_type not in _GATHER_OPS or len(node.input) < 2:
            continue
        data, indices = node.input[0], node.input[1]
        if indices not in inputs or data not in shapes:
            continue
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), 0)
        table = shapes[data]
        if not table:
            continue
        size = table[axis % len(table)]
        low, high = bounds.get(indices, (-size, size))
        bounds[indices] = (max(low, -size), min(high, size))
    return bounds
