"""ONNX subgraphs (Loop and Scan bodies) as private Relax functions, through TVM's importer.

TVM's importer only converts subgraphs inline, for ``If``, and evaluates both branches before
choosing. A loop body needs its own function, called once per iteration, so edgec drives a private
``ONNXGraphImporter`` per body: TVM's per-op converters (``_convert_operator``), attribute and
initializer parsing are reused; the node walk is edgec's, so that ``If`` inside a body is lazy
(each branch in its own binding block of a ``relax.If``) and nested ``Loop``/``Scan`` nodes come
back here. Every use of TVM importer internals is in this module.

Types are handled through *patterns*: a ``relax.TensorType`` whose dims are ints or pattern vars
(``tirx.Var``), each of which may stand for a dim known outside the loop. A function that takes a
value of a pattern type gets its own fresh copy of the pattern vars (a symbolic var belongs to one
function), so every tensor inside has a concrete, symbolic shape and legalizes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from typing import Any, Callable, Mapping

import onnx
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend

from edgec.compiler.importer.converters import shape_values
from edgec.core.model import subgraphs

INT64_SCALAR = relax.TensorType((), "int64")
BOOL_SCALAR = relax.TensorType((), "bool")

# Mirror ONNXGraphImporter._construct_nodes. Converters of these ops take shape values (TVM's
# Shape returns one); other ops get them as int64 tensors (TVM's own walk raises instead).
_SHAPE_OPS = {"Reshape", "Resize", "ConstantOfShape", "Gather", "Slice", "Shape", "Expand",
              "Concat", "Equal", "Where", "Cast", "CastLike", "Squeeze"}
# Converters of these ops return one tuple value.
_RETURN_TUPLE_OPS = {"Optional", "OptionalGetElement", "SequenceConstruct", "SequenceEmpty",
                     "SequenceErase", "SequenceInsert", "ConcatFromSequence", "SplitToSequence"}

Lowering = Callable[..., relax.Expr]


@dataclasses.dataclass
class Session:
    """What the converters of one control-flow node, nested ones included, share.

    ``lowerings`` maps op types converted by edgec inside bodies (Loop, Scan) to functions
    ``(bb, inputs, attrs, session, nodes) -> relax.Expr``. ``names`` are the function names taken
    so far; a new function's name must be free both there and in the builder's module.
    ``native_rows``: Loop and Scan outputs may be appended by edgec's CPU kernels (False for a
    module that runs on a GPU). ``converters``: the import's converter table, op type to
    converter (``edgec.compiler.importer.converters.converter_table``).
    """

    opset: int
    tvm_params: dict
    lowerings: dict[str, Lowering]
    names: set[str] = dataclasses.field(default_factory=set)
    native_rows: bool = False
    converters: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def unique_name(self, bb: relax.BlockBuilder, base: str) -> str:
        base = re.sub(r"\W", "_", base) or "f"
        if not (base[0].isalpha() or base[0] == "_"):
            base = "f_" + base
        taken = self.names | {gv.name_hint for gv in bb.get().get_global_vars()}
        name, index = base, 0
        while name in taken:
            index += 1
            name = f"{base}_{index}"
        self.names.add(name)
        return name


# ---------------------------------------------------------------------------------------------
# Types


def dtype_of(ty: relax.TensorType) -> str:
    return str(ty.dtype)


def is_static(dim: tirx.PrimExpr) -> bool:
    return isinstance(dim, tirx.IntImm)


def shaped(bb: relax.BlockBuilder, expr: relax.Expr, hint: str = "d") -> relax.Expr:
    """``expr`` with a known shape: a tensor of known rank but unknown dims is match-cast to fresh
    symbolic dims (what legalization needs); anything else is returned normalized."""
    expr = bb.normalize(expr)
    ty = expr.ty
    if isinstance(ty, relax.TensorType) and ty.shape is None and ty.ndim >= 0:
        if not isinstance(expr, (relax.Var, tvm.ir.GenericConst)):
            expr = bb.emit(expr)
        dims = [tirx.Var(f"{hint}{k}", "int64") for k in range(ty.ndim)]
        return bb.match_cast(expr, relax.TensorType(dims, dtype_of(ty)))
    return expr


def as_tensor(bb: relax.BlockBuilder, expr: relax.Expr) -> relax.Expr:
    """A tensor for a value TVM's converters may give as a shape or a prim value."""
    expr = bb.normalize(expr)
    ty = expr.ty
    if isinstance(ty, relax.TensorType):
        return expr
    if isinstance(ty, relax.ShapeType):
        return bb.normalize(relax.op.shape_to_tensor(expr))
    # A prim value is a PrimExpr used as a Relax expression (its type a PrimType).
    if isinstance(ty, tvm.ir.PrimType) and str(ty).startswith("int"):
        value = expr if str(ty) == "int64" else tirx.Cast("int64", expr)
        vector = relax.op.shape_to_tensor(relax.ShapeExpr([value]))
        result = bb.normalize(relax.op.reshape(vector, ()))
        return result if str(ty) == "int64" else bb.normalize(relax.op.astype(result, str(ty)))
    if isinstance(expr, tirx.FloatImm):
        return relax.const(expr.value, str(ty))
    raise NotImplementedError(
        f"a {type(ty).__name__} value (sequence or optional) crosses a Loop/Scan/If boundary; "
        "edgec lowers control flow over tensors only")


def scalar(bb: relax.BlockBuilder, expr: relax.Expr, dtype: str) -> relax.Expr:
    """``expr`` (a one-element tensor, shape or prim value) as a rank-0 tensor of ``dtype``."""
    expr = as_tensor(bb, expr)
    if expr.ty.ndim != 0:
        expr = bb.normalize(relax.op.reshape(expr, ()))
    if dtype_of(expr.ty) != dtype:
        expr = bb.normalize(relax.op.astype(expr, dtype))
    return expr


class Patterns:
    """Pattern types for values defined outside a loop, and what each pattern var stands for."""

    def __init__(self) -> None:
        self.outer: dict[tirx.Var, tirx.PrimExpr] = {}
        self._by_outer: dict[tirx.Var, tirx.Var] = {}

    def of(self, ty: relax.Type, hint: str = "d") -> relax.TensorType:
        """The pattern of a tensor type from outside; dims it shares with others stay tied."""
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise NotImplementedError(f"a loop value of type {ty} (unknown rank or not a tensor)")
        dims = []
        for k, dim in enumerate(ty.shape.values):
            if is_static(dim):
                dims.append(dim)
                continue
            if isinstance(dim, tirx.Var):
                if dim not in self._by_outer:
                    self._by_outer[dim] = tirx.Var(dim.name, "int64")
                var = self._by_outer[dim]
            else:
                var = tirx.Var(f"{hint}{k}", "int64")
            self.outer[var] = dim
            dims.append(var)
        return relax.TensorType(dims, dtype_of(ty))


def instantiate(ty: relax.TensorType, copies: dict[tirx.Var, tirx.Var]) -> relax.TensorType:
    """``ty`` with each pattern var replaced by its copy for one function (made on first use)."""
    if ty.shape is None:
        return ty
    dims = []
    for dim in ty.shape.values:
        if isinstance(dim, tirx.Var):
            if dim not in copies:
                copies[dim] = tirx.Var(dim.name, "int64")
            dim = copies[dim]
        dims.append(dim)
    return relax.TensorType(dims, dtype_of(ty))


def dims_of(ty: relax.TensorType) -> list[tirx.PrimExpr | None]:
    """A tensor type's dims, None for each when only its rank is known."""
    return list(ty.shape.values) if ty.shape is not None else [None] * ty.ndim


# ---------------------------------------------------------------------------------------------
# Free values


def free_names(graph: onnx.GraphProto) -> list[str]:
    """Names a graph (its subgraphs included) reads from enclosing scopes, in order of first use."""
    found: list[str] = []

    def visit(g: onnx.GraphProto, outer_bound: set[str]) -> None:
        bound = set(outer_bound) | {v.name for v in g.input} | {t.name for t in g.initializer}
        for node in g.node:
            for name in node.input:
                if name and name not in bound and name not in found:
                    found.append(name)
            for sub in subgraphs(node):
                visit(sub, bound)
            bound.update(node.output)
        for value in g.output:
            if value.name not in bound and value.name not in found:
                found.append(value.name)

    visit(graph, set())
    return found


def _is_constant(expr: relax.Expr) -> bool:
    if isinstance(expr, tvm.ir.GenericConst):
        return True
    if isinstance(expr, relax.ShapeExpr):
        return all(is_static(v) for v in expr.values)
    return isinstance(expr, (tirx.IntImm, tirx.FloatImm))


@dataclasses.dataclass
class FreeValues:
    """Outer values a body reads: constants used as they are, the rest passed as parameters."""

    constants: dict[str, relax.Expr]
    names: list[str]
    args: list[relax.Expr]
    types: list[relax.TensorType]

    @classmethod
    def collect(cls, bb: relax.BlockBuilder, graph: onnx.GraphProto, nodes: dict[str, relax.Expr],
                patterns: Patterns) -> "FreeValues":
        constants: dict[str, relax.Expr] = {}
        names, args, types = [], [], []
        for name in free_names(graph):
            if name not in nodes:
                continue  # a name no scope defines: the body's conversion reports it
            value = nodes[name]
            if _is_constant(value):
                constants[name] = value
                continue
            arg = shaped(bb, as_tensor(bb, value))
            if not isinstance(arg, (relax.Var, tvm.ir.GenericConst)):
                arg = bb.emit(arg)
            names.append(name)
            args.append(arg)
            types.append(patterns.of(arg.ty))
        return cls(constants, names, args, types)


# ---------------------------------------------------------------------------------------------
# Bodies


@dataclasses.dataclass
class Body:
    """A body graph converted to a private function, in a module of its own until committed.

    ``params`` are its parameter types; ``out_types`` its result types, in the same symbolic
    vars (dims that depend on data only inside the body are erased there); ``inner_types`` the
    results' types before that erasure; ``to_pattern`` maps the parameters' vars back to the
    pattern vars they copy.
    """

    gv: relax.GlobalVar
    module: tvm.IRModule
    params: list[relax.TensorType]
    out_types: list[relax.TensorType]
    inner_types: list[relax.TensorType]
    to_pattern: dict[tirx.Var, tirx.Var]
    graph: onnx.GraphProto

    def empty_rows(self, index: int) -> tuple[list[int], list[bool]]:
        """The row shape of scan output ``index`` when the loop runs no iteration, as
        onnxruntime gives it, and which of its dims are certainly those of every row.

        A dim static in the body's result type is kept; else the static size the ONNX graph
        declares for that output; else 0 (onnxruntime's choice for a dim its inference does not
        know).
        """
        declared = _declared_dims(self.graph.output[index]) or []
        dims, exact = [], []
        for k, dim in enumerate(dims_of(self.out_types[index])):
            if dim is not None and is_static(dim):
                dims.append(int(dim))
                exact.append(True)
            else:
                dims.append(declared[k] if k < len(declared) and declared[k] is not None else 0)
                exact.append(False)
        return dims, exact

    def commit(self, bb: relax.BlockBuilder) -> None:
        """Add the function and every function it calls to ``bb``'s module."""
        commit_module(bb, self.module)


def _declared_dims(value: onnx.ValueInfoProto) -> list[int | None] | None:
    ttype = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not ttype.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]


def commit_module(bb: relax.BlockBuilder, module: tvm.IRModule, skip: str | None = None) -> None:
    for gv, func in module.functions.items():
        if gv.name_hint != skip:
            bb.update_func(gv, func)


class NodeError(Exception):
    """A converter's failure, with the node it failed on: name, op, opset and input types."""

    def __init__(self, op_type: str, name: str, opset: int, inputs: list, cause: Exception):
        super().__init__(str(cause))
        self.op_type, self.name, self.opset, self.cause = op_type, name, opset, cause
        self.inputs = [describe_value(value) for value in inputs]

    def describe(self, reason: str) -> str:
        return (f"node '{self.name}' ({self.op_type}, opset {self.opset}, inputs "
                f"{', '.join(self.inputs) or 'none'}): {reason}")


def describe_value(value) -> str:
    """A converter input as a user reads it: ``float32[1, 3, h, w]``, a shape, a constant."""
    if value is None:
        return "-"
    ty = getattr(value, "ty", None)
    dim = lambda d: str(int(d)) if isinstance(d, tirx.IntImm) else str(d)  # noqa: E731
    if isinstance(ty, relax.TensorType):
        dims = "?" if ty.shape is None else ", ".join(dim(d) for d in ty.shape.values)
        kind = "constant " if isinstance(value, tvm.ir.GenericConst) else ""
        return f"{kind}{ty.dtype}[{dims}]"
    if isinstance(ty, relax.ShapeType):
        values = getattr(value, "values", None)
        return f"shape({', '.join(dim(d) for d in values)})" if values is not None else "shape"
    return type(value).__name__


class GraphImporter(onnx_frontend.ONNXGraphImporter):
    """TVM's ONNX importer with its converters taken from an explicit table (op type to a
    converter: a class or object with ``get_converter(opset)``) instead of TVM's module-level
    map, so that edgec's converters are used without changing TVM's module."""

    def __init__(self, converters: Mapping[str, Any]) -> None:
        super().__init__({}, "float32", keep_params_in_input=False)
        self.converters = converters

    def _convert_operator(self, op_name: str, inputs: list, attrs: dict, opset: int):
        if op_name not in self.converters:
            raise NotImplementedError(f"Operator {op_name} not implemented.")
        try:
            converter = self.converters[op_name].get_converter(opset)
            sym = converter(self.bb, inputs, attrs, [self._nodes, self._params])
            sym = self.bb.normalize(sym) if isinstance(sym, relax.Expr) else sym
            _note_extents(self.bb, sym)
            return sym
        except NodeError:
            raise
        except Exception as exc:  # the converters raise many types; each names this node now
            raise NodeError(op_name, attrs.get("tvm_custom", {}).get("name", ""), opset,
                            inputs, exc) from exc

    def _check_for_unsupported_ops(self, graph: onnx.GraphProto) -> None:
        unsupported = {node.op_type for node in graph.node
                       if node.op_type not in self.converters and node.op_type not in ("If", "Constant")}
        if unsupported:
            raise tvm.error.OpNotImplemented(
                f"The following operators are not supported for frontend ONNX: "
                f"{', '.join(sorted(unsupported))}")


def _note_extents(bb: relax.BlockBuilder, result) -> None:
    """The extents of a node's result tensors are never negative: shape arithmetic on them
    simplifies knowing it (``max(L, 0)`` is ``L`` for a conv's output length ``L``, which its
    vars alone cannot prove; see ``shape_values.note_dims``)."""
    ty = getattr(result, "ty", None)
    if isinstance(ty, relax.TupleType):
        types = list(ty.fields)
    else:
        types = [ty]
    for field in types:
        if isinstance(field, relax.TensorType) and isinstance(field.shape, relax.ShapeExpr):
            shape_values.note_dims(bb, field.shape.values)


def import_graph(proto: onnx.ModelProto, converters: Mapping[str, Any]) -> tvm.IRModule:
    """``proto`` as a Relax module whose ``main`` takes the graph inputs, weights as constants,
    as TVM's ``from_onnx`` imports it (the default domain's opset) but with ``converters``."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    return GraphImporter(converters).from_onnx(proto.graph, opset)


def subgraph_importer(session: Session) -> GraphImporter:
    # A fresh importer per body: its _nodes is the body's scope and its bb builds the body's
    # function; TVM's converters only see (bb, inputs, attrs, [nodes, params]) through it.
    importer = GraphImporter(session.converters)
    importer.opset = session.opset
    importer._params = session.tvm_params  # pylint: disable=protected-access
    return importer


def convert_body(session: Session, graph: onnx.GraphProto, name: str,
                 input_types: list[relax.TensorType], free: FreeValues) -> Body:
    """Convert ``graph`` to ``name(inputs..., free...) -> (outputs...)`` (all tensors).

    ``input_types`` are patterns for the graph's inputs, in order; ``free.types`` for the free
    values. Raises NotImplementedError for values that are not tensors.
    """
    importer = subgraph_importer(session)
    bb = importer.bb
    copies: dict[tirx.Var, tirx.Var] = {}
    params = []
    for index, (value, ty) in enumerate(zip(graph.input, input_types)):
        var = relax.Var(_var_name(value.name, f"in{index}"), instantiate(ty, copies))
        importer._nodes[value.name] = var
        params.append(var)
    for index, (value_name, ty) in enumerate(zip(free.names, free.types)):
        var = relax.Var(_var_name(value_name, f"free{index}"), instantiate(ty, copies))
        importer._nodes[value_name] = var
        params.append(var)
    for value_name, value in free.constants.items():
        importer._nodes.setdefault(value_name, value)

    # If is not allowed in a dataflow block; everything else a body emits is.
    use_dataflow = not any(node.op_type == "If" for node in graph.node)
    with bb.function(name, params, private=True):
        with bb.dataflow() if use_dataflow else contextlib.nullcontext():
            convert_nodes(importer, session, graph)
            outputs = relax.Tuple([shaped(bb, as_tensor(bb, importer._nodes[v.name]))
                                   for v in graph.output])
            inner_types = [field.ty for field in outputs.fields]
            if use_dataflow:
                outputs = bb.emit_output(outputs)
        bb.emit_func_output(outputs)
    module = bb.get()
    gv = module.get_global_var(name)
    out_types = list(module[gv].ret_ty.fields)
    for value, ty in zip(graph.output, out_types):
        if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
            raise NotImplementedError(f"body output '{value.name}' has unknown rank ({ty})")
    return Body(gv, module, [p.ty for p in params], out_types, inner_types,
                {v: k for k, v in copies.items()}, graph)


def _var_name(name: str, fallback: str) -> str:
    name = re.sub(r"\W", "_", name)
    return name if name and (name[0].isalpha() or name[0] == "_") else fallback


def convert_nodes(importer: GraphImporter, session: Session,
                  graph: onnx.GraphProto) -> None:
    """Convert ``graph``'s nodes into ``importer.bb``'s current block, names into its _nodes."""
    bb = importer.bb
    nodes = importer._nodes
    for init in graph.initializer:
        nodes[init.name] = relax.const(importer._parse_array(init))
    for node in graph.node:
        attrs = importer._parse_attr(node.attribute)
        inputs = onnx_frontend.onnx_input()
        for value_name in node.input:
            value = nodes[value_name] if value_name else None
            if (value is not None and node.op_type not in _SHAPE_OPS
                    and isinstance(value.ty, relax.ShapeType)):
                value = as_tensor(bb, value)
            inputs.append(value)
        attrs["tvm_custom"] = {"name": node.name, "num_outputs": len(node.output)}
        if node.op_type == "If":
            result = convert_if(importer, session, inputs[0], attrs)
        elif node.op_type in session.lowerings:
            result = session.lowerings[node.op_type](bb, inputs, attrs, session, nodes)
        else:
            result = importer._convert_operator(node.op_type, inputs, attrs, session.opset)
        _bind_outputs(bb, nodes, node, result)


def _bind_outputs(bb: relax.BlockBuilder, nodes: dict, node: onnx.NodeProto,
                  result: relax.Expr) -> None:
    if node.op_type in _RETURN_TUPLE_OPS:
        count = 1
    elif isinstance(result, relax.Tuple):
        count = len(result.fields)
    elif isinstance(result.ty, relax.TupleType):
        result = relax.Tuple([bb.emit(relax.TupleGetItem(result, i))
                              for i in range(len(result.ty.fields))])
        count = len(result.fields)
    else:
        count = 1
    # Bind calls now: an unbound call would be emitted again by each node that reads it.
    if count == 1:
        nodes[node.output[0]] = bb.emit(result) if isinstance(result, relax.Call) else result
    else:
        for index, value_name in enumerate(node.output):
            field = result.fields[index]
            if value_name:
                nodes[value_name] = bb.emit(field) if isinstance(field, relax.Call) else field


def convert_if(importer: GraphImporter, session: Session,
                cond: relax.Expr, attrs: dict) -> relax.Expr:
    """A lazy If: each branch's nodes go into its own binding block inside the ``relax.If``."""
    bb = importer.bb
    cond = scalar(bb, cond, "bool")
    branches = []
    for key in ("then_branch", "else_branch"):
        graph = attrs[key]
        nodes = importer._nodes
        saved = dict(nodes)
        bb._begin_binding_block()
        try:
            convert_nodes(importer, session, graph)
            outs = [as_tensor(bb, nodes[v.name]) for v in graph.output]
            result = bb.emit(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        finally:
            block = bb._end_block()
            nodes.clear()  # the same dict: callers hold it
            nodes.update(saved)
        branches.append(relax.SeqExpr([block], result))
    result = bb.emit(relax.If(cond, branches[0], branches[1]))
    if isinstance(result.ty, relax.TupleType):
        return relax.Tuple([shaped(bb, bb.emit(relax.TupleGetItem(result, i)))
                            for i in range(len(result.ty.fields))])
    return shaped(bb, result)
