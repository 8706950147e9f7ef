"""Shape values kept symbolic: the arithmetic exporters do on shapes, computed on the dims.

Exported models compute shapes at run time: ``Shape -> Gather/Slice -> Squeeze/Unsqueeze ->
Cast -> Add/Mul/Div -> Concat -> Reshape/Expand/Range/Pad``. TVM's importer keeps a shape as a
``ShapeExpr`` through a dozen ops only; any other op makes it a run-time tensor, and a shape built
back from a tensor gets fresh symbolic dims unrelated to the input's (``range_len_0``), so later
broadcasts and reshapes cannot be proven.

Here every such value is a *shape value*: a small tensor (rank 0 or 1) whose elements are known
as TIR expressions on the input dims (``tirx.PrimExpr``: ints, ``seq``, ``floordiv(c, 2)``,
float casts of them). The converters below compute their result's elements when their inputs are
shape values (ShapeExpr, PrimValue, small constants, ``shape_of``/``shape_to_tensor`` chains or
results of these converters) and otherwise fall back to TVM's converter. A shape value is still a
tensor to every other converter: integer ones are emitted as ``shape_to_tensor`` of a
``ShapeExpr`` of their elements (cheap, and what ``ops.shape_with_dims`` follows); float ones
that are not integral keep TVM's tensor computation. The elements are remembered per builder.

The consumers (Range, Reshape, Expand, ConstantOfShape, Tile, Pad, Slice, Resize) read shape
values as dims: an ``arange`` over ``seq`` has extent ``seq``. A shape computed from tensor data
keeps TVM's path (``tensor_to_shape`` and a ``match_cast`` to fresh dims).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import numpy as np
import onnx
import tvm
import tvm_ffi
from tvm import relax, tirx, topi
from tvm.relax.frontend.onnx import onnx_frontend

from edgec.compiler.importer.converters import ops as edgec_ops
from edgec.compiler.ir import constant

# Longest shape value followed (a shape has one element per dim).
_MAX_LENGTH = 64


@dataclasses.dataclass(frozen=True)
class Value:
    """The elements of a rank-0 or rank-1 tensor as TIR expressions of ``dtype``."""

    elements: tuple
    rank: int
    dtype: str
    # The dims where rank is 2 (a shape value reshaped to pairs: pads as exporters build them).
    dims2: tuple | None = None

    def __post_init__(self):
        assert self.rank in (0, 1, 2) and (self.rank == 1 or self.rank == 2 and self.dims2 is not None
                                           or len(self.elements) == 1)

    @property
    def shape(self) -> tuple:
        return {0: (), 1: (len(self.elements),)}.get(self.rank, self.dims2)


def _known(bb: relax.BlockBuilder) -> dict:
    """{relax.Var: Value} for the shape values ``bb`` emitted (kept on the builder)."""
    table = getattr(bb, "_edgec_shape_values", None)
    if table is None:
        table = {}
        bb._edgec_shape_values = table
    return table


# ---------------------------------------------------------------------------------------------
# TIR helpers


def _dt(expr: tirx.PrimExpr) -> str:
    return str(expr.ty)


def _is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _is_float(dtype: str) -> bool:
    return "float" in dtype


def _imm(value, dtype: str) -> tirx.PrimExpr:
    if dtype == "bool":
        return tirx.IntImm("bool", int(bool(value)))
    return tirx.FloatImm(dtype, float(value)) if _is_float(dtype) else tirx.IntImm(dtype, int(value))


def _constant(expr: tirx.PrimExpr):
    """The Python number ``expr`` is, or None."""
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.FloatImm):
        return float(expr.value)
    return None


# Most dims noted per builder (the latest are kept: the ones nearby converters read).
_MAX_DIMS = 256
# Most noted dims one simplification assumes (those on the expression's vars, latest first).
_MAX_FACTS = 16


def note_dims(bb: relax.BlockBuilder | None, dims) -> None:
    """Remember that ``dims`` are extents of tensors, so never negative. A var is known to be
    one everywhere (``simplify``); an expression such as ``(samples - 400) // 320 + 1`` (a conv's
    output length) is not provably >= 0 from its vars alone (it is -1 at ``samples == 0``), yet
    is wherever the tensor exists: ``max(L, 0)`` (Range's length, a Slice's clamp) is ``L``."""
    if bb is None:
        return
    table = getattr(bb, "_edgec_dims", None)
    if table is None:
        table = {}
        bb._edgec_dims = table
    for dim in dims:
        if not tvm.ir.is_prim_expr(dim) or isinstance(dim, (tirx.IntImm, tirx.Var)):
            continue
        if not _is_int(_dt(dim)):
            continue
        key = tvm_ffi.structural_hash(dim)
        if key in table:
            continue
        table[key] = dim
        if len(table) > _MAX_DIMS:
            del table[next(iter(table))]


def _analyzer(expr: tirx.PrimExpr, bb: relax.BlockBuilder | None, stack) -> tvm.sym.Analyzer:
    """An analyzer knowing that ``expr``'s int vars and the dims noted on ``bb`` over those vars
    are never negative (the constraints stay entered until ``stack`` closes)."""
    analyzer = tvm.sym.Analyzer()
    names = set()
    for var in tirx.analysis.undefined_vars(expr):
        if _is_int(_dt(var)):
            analyzer.update(var, tvm.sym.ConstIntBound(0, tvm.sym.ConstIntBound.POS_INF))
            names.add(var)
    table = getattr(bb, "_edgec_dims", None) if bb is not None else None
    if table and names:
        facts = 0
        for dim in reversed(list(table.values())):
            if all(v in names for v in tirx.analysis.undefined_vars(dim)):
                stack.enter_context(analyzer.constraint_scope(dim >= _imm(0, _dt(dim))))
                facts += 1
                if facts >= _MAX_FACTS:
                    break
    return analyzer


def simplify(expr: tirx.PrimExpr, bb: relax.BlockBuilder | None = None) -> tirx.PrimExpr:
    """``expr`` simplified knowing that its vars are dims (never negative), and so are the
    dims noted on ``bb`` (``note_dims``)."""
    with contextlib.ExitStack() as stack:
        return _analyzer(expr, bb, stack).simplify(expr)


def _cast(expr: tirx.PrimExpr, dtype: str) -> tirx.PrimExpr:
    source = _dt(expr)
    if source == dtype:
        return expr
    number = _constant(expr)
    if number is not None:
        if dtype == "bool":
            return _imm(number != 0, dtype)
        if _is_int(dtype):
            return _imm(int(number), dtype)  # ONNX Cast truncates toward zero
        return _imm(number, dtype)
    if dtype == "bool":
        return expr != _imm(0, source)
    if _is_int(dtype) and _is_float(source):
        exact = _integral(expr)
        if exact is not None:
            return _cast(exact, dtype)
    if _is_int(dtype) and isinstance(expr, tirx.Cast) and _is_int(_dt(expr.value)):
        return _cast(expr.value, dtype)  # an int widened and narrowed back
    return tirx.Cast(dtype, expr)


def _integral(expr: tirx.PrimExpr) -> tirx.PrimExpr | None:
    """An int64 expression equal to float ``expr`` where it is a cast of one (a shape computed
    in floats), else None."""
    if _is_int(_dt(expr)):
        return _cast(expr, "int64")
    if isinstance(expr, tirx.Cast) and _is_int(_dt(expr.value)):
        return _cast(expr.value, "int64")
    number = _constant(expr)
    if number is not None:
        return _imm(int(number), "int64") if float(number).is_integer() else None
    for kind, combine in ((tirx.Add, lambda a, b: a + b), (tirx.Sub, lambda a, b: a - b),
                          (tirx.Mul, lambda a, b: a * b)):
        if isinstance(expr, kind):  # integral floats stay integral (exact below 2**24)
            a, b = _integral(expr.a), _integral(expr.b)
            return None if a is None or b is None else combine(a, b)
    return None


def _binary(op: str, a: tirx.PrimExpr, b: tirx.PrimExpr, dtype: str, fmod: int = 0) -> tirx.PrimExpr:
    x, y = _constant(a), _constant(b)
    if x is not None and y is not None:  # numbers: ONNX's (numpy's C) semantics exactly
        if op == "Div":
            if _is_int(dtype):
                return _imm(int(x / y) if y else 0, dtype) if abs(x) < 2**53 else _imm(x // y, dtype)
            return _imm(np.divide(np.array(x, dtype), np.array(y, dtype)), dtype)
        if op == "Mod":
            value = np.fmod(x, y) if fmod or _is_float(dtype) else np.mod(x, y)
            return _imm(value, dtype)
        table = {"Add": x + y, "Sub": x - y, "Mul": x * y, "Min": min(x, y), "Max": max(x, y)}
        if op in table:
            return _imm(np.array(table[op]).astype(dtype), dtype)
    if op == "Add":
        return a + b
    if op == "Sub":
        return a - b
    if op == "Mul":
        return a * b
    if op == "Div":
        # Dims are never negative: floor division is ONNX's (truncating) integer division.
        return tirx.floordiv(a, b) if _is_int(dtype) else tirx.Div(a, b)
    if op == "Mod":
        if _is_float(dtype):
            raise _NotSymbolic
        return tirx.truncmod(a, b) if fmod else tirx.floormod(a, b)
    if op == "Min":
        return tirx.min(a, b)
    if op == "Max":
        return tirx.max(a, b)
    if op == "Pow":
        if y is not None and float(y).is_integer() and 0 <= y <= 8:
            result = _imm(1, dtype)
            for _ in range(int(y)):
                result = result * a
            return result
        raise _NotSymbolic
    comparisons = {"Equal": tirx.EQ, "Less": tirx.LT, "Greater": tirx.GT, "LessOrEqual": tirx.LE,
                   "GreaterOrEqual": tirx.GE}
    if op in comparisons:
        return comparisons[op](a, b)
    if op == "And":
        return tirx.And(a, b)
    if op == "Or":
        return tirx.Or(a, b)
    raise _NotSymbolic


class _NotSymbolic(Exception):
    """The result cannot be computed on the dims: TVM's converter runs."""


# ---------------------------------------------------------------------------------------------
# Reading and writing shape values


def value_of(bb: relax.BlockBuilder, expr, derived_only: bool = False) -> Value | None:
    """``expr`` as a shape value, or None. ``derived_only``: constants do not count (a result is
    only worth computing on the dims when some input comes from a shape)."""
    if expr is None:
        return None
    if isinstance(expr, relax.Var):
        known = _known(bb).get(expr)
        if known is not None:
            return known
    if isinstance(expr, tvm.ir.GenericConst):
        if derived_only:
            return None
        array = np.asarray(expr.value.numpy())
        if array.ndim > 1 or array.size > _MAX_LENGTH or array.size == 0 and array.ndim == 0:
            return None
        dtype = str(array.dtype)
        if not (_is_int(dtype) or _is_float(dtype) or dtype == "bool"):
            return None
        return Value(tuple(_imm(v, dtype) for v in array.reshape(-1)), array.ndim, dtype)
    if isinstance(expr, relax.ShapeExpr):
        return Value(tuple(expr.values), 1, "int64")
    if tvm.ir.is_prim_expr(expr):  # a scalar (TVM 0.27 has no PrimValue: a PrimExpr is one)
        bound = bb.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        if bound is not None:
            return value_of(bb, bound, derived_only)
        if derived_only and _constant(expr) is not None:
            return None
        return Value((expr,), 0, _dt(expr))
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.ShapeType) and isinstance(expr, relax.Var):
        bound = bb.lookup_binding(expr)
        if bound is not None:
            return value_of(bb, bound, derived_only)
        values = getattr(ty, "values", None)
        return None if values is None else Value(tuple(values), 1, "int64")
    if isinstance(ty, relax.TensorType) and ty.ndim in (0, 1) and ty.shape is not None and all(
            isinstance(d, tirx.IntImm) for d in ty.shape.values):
        length = 1 if ty.ndim == 0 else int(ty.shape.values[0])
        if length > _MAX_LENGTH or not _is_int(str(ty.dtype)):
            return None
        # A chain TVM built (shape_of, shape_to_tensor, take, concat...): follow it.
        elements = edgec_ops._symbolic_values(bb, expr)
        if elements is None or len(elements) != length:
            return None
        if derived_only and all(isinstance(e, int) for e in elements):
            return None
        dtype = str(ty.dtype)
        return Value(tuple(_cast(_imm(e, "int64") if isinstance(e, int) else e, dtype)
                           for e in elements), ty.ndim, dtype)
    return None


def emit(bb: relax.BlockBuilder, value: Value, fallback: Callable[[], relax.Expr] | None = None):
    """A tensor holding ``value``, remembered as a shape value: a constant where every element is
    a number, else ``shape_to_tensor`` of the elements (``fallback()`` computes floats that are
    not integral)."""
    elements = tuple(simplify(e, bb) if _constant(e) is None else e for e in value.elements)
    value = dataclasses.replace(value, elements=elements)
    numbers = [_constant(e) for e in elements]
    if all(n is not None for n in numbers):
        array = np.array(numbers, dtype=value.dtype).reshape(value.shape)
        return relax.const(array, value.dtype)
    if _is_float(value.dtype):
        ints = [_integral(e) for e in elements]
        if any(i is None for i in ints):
            if fallback is None:
                raise _NotSymbolic
            result = bb.normalize(fallback())
            if not isinstance(result, relax.Var):
                result = bb.emit(result)
            _known(bb)[result] = value
            return result
    else:
        ints = [_cast(e, "int64") for e in elements]
    tensor = bb.normalize(relax.op.shape_to_tensor(relax.ShapeExpr(list(ints))))
    if value.rank != 1:
        tensor = bb.normalize(relax.op.reshape(tensor, value.shape))
    if value.dtype != "int64":
        tensor = bb.normalize(relax.op.astype(tensor, value.dtype))
    result = bb.emit(tensor) if not isinstance(tensor, relax.Var) else tensor
    _known(bb)[result] = value
    return result


def _flat(value: Value | None) -> Value | None:
    """``value`` where it is rank 0 or 1 (what most ops here compute on)."""
    return value if value is not None and value.rank < 2 else None


def dims_of(bb: relax.BlockBuilder, expr) -> list[tirx.PrimExpr] | None:
    """A 1-D shape value as int64 dims (for Reshape, Expand...), or None."""
    value = value_of(bb, expr)
    if value is None or value.rank != 1 or value.dtype == "bool":
        return None
    if _is_float(value.dtype):
        ints = [_integral(e) for e in value.elements]
        return None if any(i is None for i in ints) else ints
    return [_cast(e, "int64") for e in value.elements]


def _scalar_of(bb, expr) -> tirx.PrimExpr | None:
    value = value_of(bb, expr)
    return value.elements[0] if value is not None and len(value.elements) == 1 else None


def _axes(bb, attrs, inputs, index: int) -> list[int] | None:
    """Axes from input ``index`` (opset 13+) or the ``axes`` attribute; None when not constant."""
    if len(inputs) > index and inputs[index] is not None:
        value = value_of(bb, inputs[index])
        numbers = None if value is None else [_constant(e) for e in value.elements]
        return None if numbers is None or None in numbers else [int(n) for n in numbers]
    axes = attrs.get("axes")
    return None if axes is None else [int(a) for a in axes]


def _converter(op_type: str, compute: Callable, base=None) -> type:
    """A converter class: ``compute(bb, inputs, attrs, opset)`` returns the result's Value (or
    raises _NotSymbolic / returns None), else ``base`` (default TVM's converter) runs."""

    class Converter:
        @classmethod
        def get_converter(cls, opset: int) -> Callable:
            under = base or onnx_frontend._get_convert_map()[op_type]
            fallback = under.get_converter(opset)

            def convert(bb, inputs, attrs, params):
                try:
                    value = compute(bb, inputs, attrs, opset)
                except _NotSymbolic:
                    value = None
                if value is None:
                    return fallback(bb, inputs, attrs, params)
                try:
                    return emit(bb, value, lambda: fallback(bb, inputs, attrs, params))
                except _NotSymbolic:
                    return fallback(bb, inputs, attrs, params)
            return convert

    Converter.__name__ = Converter.__qualname__ = op_type
    Converter.__doc__ = f"ONNX {op_type} on shape values, computed on the dims; else TVM's."
    return Converter


# ---------------------------------------------------------------------------------------------
# Ops on shape values


def _gather(bb, inputs, attrs, opset):
    data = _flat(value_of(bb, inputs[0]))
    index = _flat(value_of(bb, inputs[1]))
    if data is None or index is None or data.rank != 1 or int(attrs.get("axis", 0)) not in (0, -1):
        return None
    if value_of(bb, inputs[0], derived_only=True) is None:
        return None  # constants: TVM's converter folds them
    n = len(data.elements)
    picks = [_constant(e) for e in index.elements]
    if any(p is None or not -n <= p < n for p in picks):
        return None
    return Value(tuple(data.elements[int(p) % n] for p in picks), index.rank, data.dtype)


def _array(value: Value) -> np.ndarray:
    array = np.empty(len(value.elements), dtype=object)
    array[:] = list(value.elements)
    return array.reshape(value.shape)


def _from_array(array: np.ndarray, dtype: str) -> Value | None:
    if array.ndim > 2:
        return None
    return Value(tuple(array.reshape(-1)), array.ndim, dtype, tuple(array.shape) if array.ndim == 2 else None)


def _transpose(bb, inputs, attrs, opset):
    data = value_of(bb, inputs[0], derived_only=True)
    if data is None or data.rank < 2:
        return data if data is not None and data.rank < 2 else None
    perm = attrs.get("perm")
    return _from_array(_array(data).transpose(None if perm is None else [int(p) for p in perm]), data.dtype)


def _reshape_value(bb, inputs, attrs):
    """Reshape of a shape value to a constant shape (exporters pair pads up: [-1, 2])."""
    data = value_of(bb, inputs[0], derived_only=True)
    target = value_of(bb, inputs[1]) if len(inputs) > 1 else None
    if data is None or target is None:
        return None
    dims = [_constant(e) for e in target.elements]
    if any(d is None for d in dims):
        return None
    array = _array(data)
    dims = [array.shape[k] if d == 0 and not attrs.get("allowzero", 0) else int(d) for k, d in enumerate(dims)]
    try:
        return _from_array(array.reshape(dims), data.dtype)
    except ValueError:
        return None


def _slice(bb, inputs, attrs, opset):
    data = value_of(bb, inputs[0], derived_only=True)
    if data is None:
        return None
    if opset < 10:
        starts, ends = attrs.get("starts"), attrs.get("ends")
        axes, steps = attrs.get("axes", [0]), [1]
    else:
        numbers = []
        for k in (1, 2, 3, 4):
            if len(inputs) > k and inputs[k] is not None:
                value = value_of(bb, inputs[k])
                found = None if value is None else [_constant(e) for e in value.elements]
                if found is None or None in found:
                    return None
                numbers.append([int(v) for v in found])
            else:
                numbers.append(None)
        starts, ends, axes, steps = numbers
        axes, steps = axes or [0], steps or [1]
    array = _array(data)
    index = [slice(None)] * array.ndim
    for axis, start, end, step in zip(axes, starts, ends, steps * len(axes) if len(steps) == 1 else steps):
        index[int(axis) % array.ndim] = slice(int(start), int(end), int(step))
    return _from_array(array[tuple(index)], data.dtype)


def _squeeze(bb, inputs, attrs, opset):
    data = _flat(value_of(bb, inputs[0], derived_only=True))
    if data is None:
        return None
    axes = _axes(bb, attrs, inputs, 1) if opset >= 13 else attrs.get("axes")
    if data.rank == 1 and len(data.elements) == 1 and (axes is None or list(axes) in ([0], [-1])):
        return Value(data.elements, 0, data.dtype)
    if data.rank == 1 and axes is None:
        return data
    return None


def _unsqueeze(bb, inputs, attrs, opset):
    data = _flat(value_of(bb, inputs[0], derived_only=True))
    axes = _axes(bb, attrs, inputs, 1) if opset >= 13 else attrs.get("axes")
    if data is None or data.rank != 0 or axes is None or list(axes) not in ([0], [-1]):
        return None
    return Value(data.elements, 1, data.dtype)


def _concat(bb, inputs, attrs, opset):
    present = [i for i in inputs if i is not None]
    if not any(value_of(bb, i, derived_only=True) is not None for i in present):
        return None
    values = [value_of(bb, i) for i in present]
    if any(v is None or v.rank != 1 for v in values):
        return None
    dtype = values[0].dtype
    return Value(tuple(_cast(e, dtype) for v in values for e in v.elements), 1, dtype)


def _dtype_of_onnx(to: int) -> str:
    return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(to))))


def _cast_to(dtype_for: Callable):
    def compute(bb, inputs, attrs, opset):
        data = value_of(bb, inputs[0], derived_only=True)
        if data is None:
            return None
        dtype = dtype_for(bb, inputs, attrs)
        if dtype is None or not (_is_int(dtype) or _is_float(dtype) or dtype == "bool"):
            return None
        return dataclasses.replace(data, elements=tuple(_cast(e, dtype) for e in data.elements), dtype=dtype)
    return compute


def _cast_like_dtype(bb, inputs, attrs):
    ty = getattr(inputs[1], "ty", None)
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


def _broadcast(values: list[Value]) -> tuple[int, list[list]] | None:
    lengths = {len(v.elements) for v in values if not (len(v.elements) == 1)}
    if len(lengths) > 1:
        return None
    n = lengths.pop() if lengths else 1
    return n, [list(v.elements) * n if len(v.elements) == 1 else list(v.elements) for v in values]


def _elementwise(op: str):
    def compute(bb, inputs, attrs, opset):
        present = inputs[:2] if op not in ("Min", "Max") else [i for i in inputs if i is not None]
        if not any(value_of(bb, i, derived_only=True) is not None for i in present):
            return None
        values = [_flat(value_of(bb, i)) for i in present]
        if any(v is None for v in values):
            return None
        dtype = values[0].dtype
        if op in ("Pow",):
            values[1] = Value(tuple(_cast(e, dtype) for e in values[1].elements), values[1].rank, dtype)
        if any(v.dtype != dtype for v in values):
            return None
        shaped = _broadcast(values)
        if shaped is None:
            return None
        n, columns = shaped
        rank = max(v.rank for v in values)
        out_dtype = "bool" if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual") else dtype
        fmod = int(attrs.get("fmod", 0))
        elements = []
        for k in range(n):
            result = columns[0][k]
            for column in columns[1:]:
                result = _binary(op, result, column[k], dtype, fmod)
            elements.append(result)
        return Value(tuple(elements), rank, out_dtype)
    return compute


def _unary(op: str):
    def compute(bb, inputs, attrs, opset):
        data = value_of(bb, inputs[0], derived_only=True)
        if data is None:
            return None
        if op == "Identity":
            return data
        functions = {"Neg": lambda e: _imm(0, data.dtype) - e,
                     "Abs": lambda e: tirx.abs(e) if _constant(e) is None else _imm(abs(_constant(e)), data.dtype),
                     "Not": lambda e: tirx.Not(e) if _constant(e) is None else _imm(not _constant(e), "bool"),
                     "Floor": _rounded(tirx.floor, np.floor, tirx.floordiv),
                     "Ceil": _rounded(tirx.ceil, np.ceil, tirx.ceildiv)}
        return Value(tuple(functions[op](e) for e in data.elements), data.rank, data.dtype)
    return compute


def _rounded(tir_fn, np_fn, int_fn):
    """Floor/Ceil of a float expression; of an int ratio computed in floats (``a / b`` with a
    and b casts of ints), the int division (exact below 2**24 in float32)."""

    def apply(expr):
        number = _constant(expr)
        if number is not None:
            return _imm(np_fn(number), _dt(expr))
        if isinstance(expr, tirx.Div):
            a, b = _integral(expr.a), _integral(expr.b)
            if a is not None and b is not None:
                return tirx.Cast(_dt(expr), int_fn(a, b))
        if _integral(expr) is not None:
            return expr
        raise _NotSymbolic  # a float function of the dims: TVM's tensor computation
    return apply


def _reduce(op: str):
    def compute(bb, inputs, attrs, opset):
        data = _flat(value_of(bb, inputs[0], derived_only=True))
        if data is None:
            return None
        axes = _axes(bb, attrs, inputs, 1) if (opset >= 18 or op == "ReduceSum" and opset >= 13) else attrs.get("axes")
        if axes is not None and list(axes) not in ([], [0], [-1]):
            return None
        if not axes and attrs.get("noop_with_empty_axes", 0):
            return data
        if data.rank == 0:
            result = data.elements[0]
        else:
            elements = list(data.elements)
            if not elements:
                return None
            result = elements[0]
            name = {"ReduceProd": "Mul", "ReduceSum": "Add", "ReduceMin": "Min", "ReduceMax": "Max"}[op]
            for e in elements[1:]:
                result = _binary(name, result, e, data.dtype)
        keep = int(attrs.get("keepdims", 1))
        return Value((result,), 1 if keep and data.rank == 1 else 0, data.dtype)
    return compute


def _where(bb, inputs, attrs, opset):
    if not any(value_of(bb, i, derived_only=True) is not None for i in inputs):
        return None
    values = [_flat(value_of(bb, i)) for i in inputs]
    if any(v is None for v in values) or values[1].dtype != values[2].dtype:
        return None
    shaped = _broadcast(values)
    if shaped is None:
        return None
    n, (cond, yes, no) = shaped
    elements = []
    for c, a, b in zip(cond, yes, no):
        number = _constant(c)
        elements.append((a if number else b) if number is not None else tirx.Select(c, a, b))
    return Value(tuple(elements), max(v.rank for v in values), values[1].dtype)


# ---------------------------------------------------------------------------------------------
# Consumers: ops that take a shape value as dims


class Range:
    """ONNX Range with start/limit/delta computed from shapes: ``arange`` whose length is an
    expression in the input dims (max(ceil((limit - start) / delta), 0)), not a fresh var."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Range.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            bounds = [_scalar_of(bb, i) for i in inputs[:3]]
            derived = any(value_of(bb, i, derived_only=True) is not None for i in inputs[:3])
            if not derived or any(b is None for b in bounds):
                return fallback(bb, inputs, attrs, params)
            dtype = _dt(bounds[0])
            ints = [_integral(b) for b in bounds]
            if any(i is None for i in ints):
                return fallback(bb, inputs, attrs, params)
            start, limit, delta = (simplify(i, bb) for i in ints)
            step = _constant(delta)
            if step is None or step == 0:
                return fallback(bb, inputs, attrs, params)
            result = bb.normalize(relax.op.arange(start, limit, delta, "int64"))
            length = simplify(tirx.max(tirx.ceildiv(limit - start, delta) if step > 0 else
                                       tirx.ceildiv(start - limit, _imm(-step, "int64")), 0), bb)
            ty = result.ty
            if not (isinstance(ty, relax.TensorType) and ty.shape is not None):
                return fallback(bb, inputs, attrs, params)
            if not tvm.sym.Analyzer().can_prove_equal(ty.shape.values[0], length):
                # The op's own length expression differs in form: state ours.
                result = _stated(bb, result, [length])
            if dtype != "int64":
                result = bb.normalize(relax.op.astype(result, dtype))
            return result
        return convert


def _pad_indices(bb, length, before, dim) -> tuple[relax.Expr, relax.Expr]:
    """For output positions ``i < length`` of a padded axis: whether ``i - before`` lies in the
    input (``[0, dim)``), and ``i - before`` clipped into it, from two aranges whose bounds are
    the dims (``j = i - before``, ``k = j - dim``: inside is ``j >= 0 and k < 0``, clipped is
    ``max(j - max(k + 1, 0), 0)``), with no tensor of a dim. Relax ops on ``shape_to_tensor``
    scalars of the dims broke FuseTIR: TVM 0.27 legalizes ``shape_to_tensor([total])`` to a
    ``call_tir`` taking the var ``total`` itself as an argument, and FuseOps, fusing it with
    the comparisons on ``past + seq`` positions, made ``total`` both a parameter of the fused
    function and a var of its ``R.Shape`` parameter (``VarRemapGet(source) == nullptr``:
    GPT-2's attention mask padded to the KV length). A TE kernel instead is not re-legalized
    where a specialization makes the dims static, and FuseTIR rejects its symbolic buffers."""
    step = _imm(1, "int64")
    shifted = simplify(-before, bb)
    j = relax.op.arange(shifted, simplify(length - before, bb), step, "int64")
    k = relax.op.arange(simplify(shifted - dim, bb), simplify(length - before - dim, bb), step, "int64")
    zero, one = relax.const(0, "int64"), relax.const(1, "int64")
    inside = bb.normalize(relax.op.logical_and(relax.op.greater_equal(j, zero), relax.op.less(k, zero)))
    clipped = bb.normalize(relax.op.maximum(
        relax.op.subtract(j, relax.op.maximum(relax.op.add(k, one), zero)), zero))
    return inside, clipped


def _simplified(bb, tensor: relax.Expr) -> relax.Expr:
    """``tensor`` reshaped (a view) to its dims simplified (``seq + (total - seq)``: ``total``)."""
    dims = _input_dims(tensor)
    if dims is None:
        return tensor
    simple = [simplify(d, bb) for d in dims]
    if all(a.same_as(b) for a, b in zip(dims, simple)):
        return tensor
    return relax.op.reshape(tensor, relax.ShapeExpr(simple))


def _stated(bb, tensor: relax.Expr, dims: list) -> relax.Expr:
    """``tensor`` match-cast to ``dims`` (checked at run time). Through a cast to unknown dims
    first: TVM 0.27's ConvertToDataflow crashes on a match_cast from a computed extent
    (``min(seq, 128)``) straight to a dim."""
    ty = tensor.ty
    tensor = bb.match_cast(bb.emit(tensor) if not isinstance(tensor, relax.Var) else tensor,
                           relax.TensorType(None, str(ty.dtype), ndim=len(dims)))
    return bb.match_cast(tensor, relax.TensorType(dims, str(ty.dtype)))


def _target_or_fallback(bb, shape) -> relax.Expr:
    """``shape`` (a 1-D tensor) as a ShapeExpr of its dims where known, else of fresh dims
    (``tensor_to_shape`` and ``match_cast``: a shape computed from data)."""
    dims = dims_of(bb, shape)
    if dims is not None:
        return relax.ShapeExpr([simplify(d, bb) for d in dims])
    return edgec_ops.shape_with_dims(bb, shape)


def _input_dims(data, bb: relax.BlockBuilder | None = None) -> list | None:
    """``data``'s dims, or None; noted on ``bb`` as never negative (``note_dims``)."""
    ty = getattr(data, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values)
    note_dims(bb, dims)
    return dims


class Reshape:
    """ONNX Reshape to a shape computed from shapes: the target's dims (0 copies an input dim
    unless ``allowzero``, -1 is the rest of the input's size)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Reshape.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            data, shape = inputs[0], inputs[1]
            value = _reshape_value(bb, inputs, attrs)
            if value is not None:
                return emit(bb, value)
            dims = dims_of(bb, shape) if value_of(bb, shape, derived_only=True) is not None else None
            in_dims = _input_dims(data, bb)
            if dims is not None and in_dims is None and not any(_constant(d) == 0 for d in dims):
                return relax.op.reshape(data, relax.ShapeExpr([simplify(d, bb) for d in dims]))
            if dims is None or in_dims is None:
                if shape is not None and value_of(bb, shape) is None and in_dims is not None and not isinstance(
                        shape, tvm.ir.GenericConst) and isinstance(getattr(shape, "ty", None), relax.TensorType):
                    target = edgec_ops.shape_with_dims(bb, shape)
                    if isinstance(target, relax.ShapeExpr):
                        return fallback(bb, [data, target], attrs, params)
                return fallback(bb, inputs, attrs, params)
            allowzero = int(attrs.get("allowzero", 0))
            out = []
            for k, d in enumerate(dims):
                number = _constant(d)
                if number == 0 and not allowzero:
                    out.append(in_dims[k])
                else:
                    out.append(d)
            holes = [k for k, d in enumerate(out) if _constant(d) == -1]
            if len(holes) > 1:
                return fallback(bb, inputs, attrs, params)
            if holes:
                total = _imm(1, "int64")
                for d in in_dims:
                    total = total * d
                rest = _imm(1, "int64")
                for k, d in enumerate(out):
                    if k != holes[0]:
                        rest = rest * d
                out[holes[0]] = tirx.floordiv(total, rest)
            return relax.op.reshape(data, relax.ShapeExpr([simplify(d, bb) for d in out]))
        return convert


class Expand:
    """ONNX Expand to a shape computed from shapes (bidirectional broadcast of the dims)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Expand.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            data, shape = inputs[0], inputs[1]
            dims, in_dims = dims_of(bb, shape), _input_dims(data, bb)
            if value_of(bb, shape, derived_only=True) is None and (
                    in_dims is None or all(isinstance(d, tirx.IntImm) for d in in_dims)):
                return fallback(bb, inputs, attrs, params)
            if dims is None or in_dims is None:
                return fallback(bb, inputs, attrs, params)
            rank = max(len(dims), len(in_dims))
            dims = [_imm(1, "int64")] * (rank - len(dims)) + list(dims)
            in_dims = [_imm(1, "int64")] * (rank - len(in_dims)) + list(in_dims)
            analyzer = tvm.sym.Analyzer()
            out = []
            for t, d in zip(dims, in_dims):
                t_number, d_number = _constant(t), _constant(d)
                if t_number in (1, -1) or analyzer.can_prove_equal(t, d):
                    out.append(d)
                elif d_number == 1 or t_number is not None:
                    out.append(t)
                else:
                    out.append(simplify(tirx.max(t, d), bb))
            if len(out) == len(_input_dims(data)) and all(
                    analyzer.can_prove_equal(a, b) for a, b in zip(out, _input_dims(data))):
                return data
            return relax.op.broadcast_to(data, relax.ShapeExpr(out))
        return convert


def _with_shape_input(base, index: int, keep_constant: bool = True) -> type:
    """``base`` (a converter class) with input ``index``, a shape value computed from shapes,
    given as a ShapeExpr (or a constant where every dim is a number)."""

    class Converter:
        @classmethod
        def get_converter(cls, opset: int) -> Callable:
            inner = base.get_converter(opset)

            def convert(bb, inputs, attrs, params):
                if len(inputs) > index and value_of(bb, inputs[index], derived_only=True) is not None:
                    dims = dims_of(bb, inputs[index])
                    if dims is not None:
                        dims = [simplify(d, bb) for d in dims]
                        inputs = list(inputs)
                        if all(_constant(d) is not None for d in dims):
                            inputs[index] = constant(np.array([_constant(d) for d in dims], np.int64))
                        else:
                            inputs[index] = relax.ShapeExpr(dims)
                        inputs = _as_onnx_input(inputs)
                return inner(bb, inputs, attrs, params)
            return convert

    Converter.__name__ = Converter.__qualname__ = base.__name__
    Converter.__doc__ = f"{base.__name__} with its shape input computed from shapes given as dims."
    return Converter


def _resize(base) -> type:
    """Resize whose ``sizes`` are computed from shapes (``interpolate(size=x.shape[-2:])``): a
    constant where every size is a number (then ``base``), else ``image.resize2d`` to the
    symbolic sizes (TVM's converter takes numbers only)."""
    numbered = _with_shape_input(base, 3)

    class Resize:
        @classmethod
        def get_converter(cls, opset: int) -> Callable:
            inner = numbered.get_converter(opset)

            def convert(bb, inputs, attrs, params):
                sizes = dims_of(bb, inputs[3]) if len(inputs) > 3 and inputs[3] is not None else None
                x = inputs[0]
                ty = getattr(x, "ty", None)
                if (sizes is None or all(_constant(simplify(d, bb)) is not None for d in sizes)
                        or not isinstance(ty, relax.TensorType) or ty.ndim != 4 or len(sizes) != 4
                        or opset < 13):
                    return inner(bb, inputs, attrs, params)
                roi = inputs[1] if len(inputs) > 1 else None
                if roi is not None and not (isinstance(roi, tvm.ir.GenericConst) and roi.value.numpy().size == 0):
                    return inner(bb, inputs, attrs, params)
                text = lambda key, default: (attrs.get(key, default).decode("ascii")  # noqa: E731
                                             if isinstance(attrs.get(key, default), bytes) else str(attrs.get(key, default)))
                mode = text("mode", "nearest")
                if attrs.get("antialias", 0) or text("keep_aspect_ratio_policy", "stretch") != "stretch" or "axes" in attrs:
                    return inner(bb, inputs, attrs, params)
                dims = _input_dims(x)
                if dims is None or not all(tvm.sym.Analyzer().can_prove_equal(a, simplify(b, bb))
                                           for a, b in zip(dims[:2], sizes[:2])):
                    return inner(bb, inputs, attrs, params)
                return relax.op.image.resize2d(
                    x, size=relax.ShapeExpr([simplify(d, bb) for d in sizes[2:]]), roi=[0.0] * 4, layout="NCHW",
                    method="nearest_neighbor" if mode == "nearest" else mode,
                    coordinate_transformation_mode=text("coordinate_transformation_mode", "half_pixel"),
                    rounding_method=text("nearest_mode", "round_prefer_floor"),
                    cubic_alpha=attrs.get("cubic_coeff_a", -0.75),
                    cubic_exclude=attrs.get("exclude_outside", 0),
                    extrapolation_value=attrs.get("extrapolation_value", 0.0))
            return convert

    return Resize


def _as_onnx_input(values: list):
    out = onnx_frontend.onnx_input()
    for v in values:
        out.append(v)
    return out


class Tile:
    """ONNX Tile whose repeats are computed from shapes: output dims are input dims times them."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Tile.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            data, repeats = inputs[0], inputs[1]
            reps = dims_of(bb, repeats) if value_of(bb, repeats, derived_only=True) is not None else None
            in_dims = _input_dims(data, bb)
            if reps is None or in_dims is None or len(reps) != len(in_dims):
                return fallback(bb, inputs, attrs, params)
            out = [simplify(d * r, bb) for d, r in zip(in_dims, reps)]
            return bb.emit_te(topi.dyn_tile, data, out, len(reps))
        return convert


class Pad:
    """ONNX Pad (opset 11+) whose pads are computed from shapes (constant mode; TVM refuses
    "dynamic pads"): the input concatenated with blocks of the pad value of symbolic width."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Pad.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            if opset < 11 or value_of(bb, inputs[1], derived_only=True) is None:
                return fallback(bb, inputs, attrs, params)
            pads, in_dims = dims_of(bb, inputs[1]), _input_dims(inputs[0], bb)
            mode = attrs.get("mode", b"constant")
            mode = mode.decode() if isinstance(mode, bytes) else str(mode)
            if pads is None or in_dims is None or mode != "constant":
                return fallback(bb, inputs, attrs, params)
            rank = len(in_dims)
            axes = _axes(bb, {}, inputs, 3) if len(inputs) > 3 and inputs[3] is not None else list(range(rank))
            if axes is None or len(pads) != 2 * len(axes):
                return fallback(bb, inputs, attrs, params)
            before, after = [_imm(0, "int64")] * rank, [_imm(0, "int64")] * rank
            for k, axis in enumerate(axes):
                before[axis % rank] = simplify(pads[k], bb)
                after[axis % rank] = simplify(pads[k + len(axes)], bb)
            value = 0.0
            if len(inputs) > 2 and inputs[2] is not None:
                constant = value_of(bb, inputs[2])
                number = None if constant is None else _constant(constant.elements[0])
                if number is None:
                    return fallback(bb, inputs, attrs, params)
                value = number
            data = inputs[0]
            if any((_constant(p) or 0) < 0 for p in before + after):
                # Negative widths crop: slice first, then pad by the positive parts.
                begin = [_imm(max(0, -(_constant(p) or 0)), "int64") for p in before]
                end = [d - max(0, -(_constant(p) or 0)) for d, p in zip(in_dims, after)]
                data = bb.normalize(relax.op.strided_slice(data, list(range(rank)), begin, end,
                                                           assume_inbound=True))
                before = [p if (_constant(p) or 0) >= 0 else _imm(0, "int64") for p in before]
                after = [p if (_constant(p) or 0) >= 0 else _imm(0, "int64") for p in after]
            # Per padded axis: take(data, clip(i - before)) where i - before lies in the input,
            # else the value. (topi.nn.pad with symbolic widths breaks FuseTIR; blocks of the
            # value fold to empty constants where a specialization makes a width 0.)
            dtype = str(data.ty.dtype)
            fill = relax.const(np.array(value, dtype=dtype), dtype)
            for axis in range(rank):
                if _constant(before[axis]) == 0 and _constant(after[axis]) == 0:
                    continue
                dim = _input_dims(bb.normalize(data))[axis]
                length = simplify(before[axis] + dim + after[axis], bb)
                inside, clipped = _pad_indices(bb, length, before[axis], dim)
                taken = bb.normalize(relax.op.take(data, clipped, axis=axis))
                mask = bb.normalize(relax.op.reshape(inside, [length if k == axis else 1 for k in range(rank)]))
                data = bb.normalize(relax.op.where(mask, taken, fill))
            return _simplified(bb, data)
        return convert


class Slice:
    """ONNX Slice of a tensor whose starts/ends are computed from shapes: a ``strided_slice``
    with the bounds clamped as ONNX does, on the dims; of a shape value, the elements. Other
    slices go to ``base`` (the table's Slice underneath: ``converters.slicing``), else TVM's."""

    base = None

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = (cls.base or onnx_frontend.Slice).get_converter(opset)

        def convert(bb, inputs, attrs, params):
            if opset >= 10:
                value = _slice(bb, inputs, attrs, opset)
                if value is not None:
                    return emit(bb, value)
            else:
                value = _slice(bb, inputs, attrs, opset)
                if value is not None:
                    return emit(bb, value)
                return fallback(bb, inputs, attrs, params)
            bounds = inputs[1:3]
            if not any(value_of(bb, b, derived_only=True) is not None for b in bounds):
                return fallback(bb, inputs, attrs, params)
            in_dims = _input_dims(inputs[0], bb)
            starts, ends = dims_of(bb, inputs[1]), dims_of(bb, inputs[2])
            axes = _axes(bb, {}, inputs, 3) if len(inputs) > 3 and inputs[3] is not None else None
            steps = None
            if len(inputs) > 4 and inputs[4] is not None:
                steps = _axes(bb, {}, inputs, 4)
                if steps is None:
                    return fallback(bb, inputs, attrs, params)
            if in_dims is None or starts is None or ends is None or len(starts) != len(ends):
                return fallback(bb, inputs, attrs, params)
            rank = len(in_dims)
            axes = list(range(len(starts))) if axes is None else [a % rank for a in axes]
            steps = steps or [1] * len(axes)
            if any(s <= 0 for s in steps):
                return fallback(bb, inputs, attrs, params)
            begin, end, stated = [], [], False
            out_dims = list(in_dims)
            for axis, s, e, step in zip(axes, starts, ends, steps):
                dim = in_dims[axis]
                begin.append(simplify(_clamp(s, dim), bb))
                end.append(simplify(_clamp(e, dim), bb))
                # Bounds computed from shapes lie inside the dim in every model that runs (a
                # position table sliced to seq): state the unclamped extent, which match_cast
                # checks at run time (an error, never a wrong result, where it does not hold).
                if _constant(s) is not None and _constant(e) is not None:
                    continue
                lower, upper = simplify(s, bb), simplify(e, bb)
                if _nonnegative(lower, bb) and _nonnegative(upper, bb):
                    out_dims[axis] = simplify(tirx.max(tirx.ceildiv(upper - lower, step), 0), bb)
                    stated = True
            result = bb.normalize(relax.op.strided_slice(
                inputs[0], axes, begin, end, [_imm(s, "int64") for s in steps], assume_inbound=True))
            ty = result.ty
            if stated and isinstance(ty, relax.TensorType) and ty.shape is not None and not all(
                    tvm.sym.Analyzer().can_prove_equal(a, b) for a, b in zip(ty.shape.values, out_dims)):
                result = _stated(bb, result, out_dims)
            return result
        return convert


class TopK:
    """ONNX TopK (opset 10+) whose k is computed at run time: from shapes (``min(300, n)`` in a
    detector's NMS) or from data (a graph input that differs per call). A full sort along the
    axis, then both outputs sliced to ``min(k, dim)``: one program whose output dim is that
    expression, or a fresh dim read from k's value. A constant k keeps TVM's converter."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.TopK.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            data, k = inputs[0], inputs[1] if len(inputs) > 1 else None
            if opset < 10 or k is None or isinstance(k, tvm.ir.GenericConst):
                return fallback(bb, inputs, attrs, params)
            ty = data.ty
            if not isinstance(ty, relax.TensorType) or ty.shape is None:
                return fallback(bb, inputs, attrs, params)
            rank = len(ty.shape.values)
            axis = int(attrs.get("axis", -1)) % rank
            count = _scalar_of(bb, k)
            if count is None:  # from data: one fresh dim, the value of k
                count = edgec_ops.shape_with_dims(
                    bb, bb.normalize(relax.op.reshape(relax.op.astype(k, "int64"), [1]))).values[0]
            else:
                count = _cast(count, "int64")
            end = simplify(tirx.min(count, ty.shape.values[axis]), bb)
            largest = bool(int(attrs.get("largest", 1)))
            ordered = bb.emit(relax.op.topk(data, -1, axis, ret_type="both", largest=largest,
                                            dtype="int64"))
            values, indices = (bb.emit(relax.op.strided_slice(
                relax.TupleGetItem(ordered, i), [axis], [_imm(0, "int64")], [end],
                assume_inbound=True)) for i in (0, 1))
            return relax.Tuple([values, indices])
        return convert


def _nonnegative(expr: tirx.PrimExpr, bb: relax.BlockBuilder | None = None) -> bool:
    with contextlib.ExitStack() as stack:
        return _analyzer(expr, bb, stack).can_prove(expr >= 0)


def _clamp(index: tirx.PrimExpr, dim: tirx.PrimExpr) -> tirx.PrimExpr:
    """ONNX's slice bound for a positive step: negative counts from the end, then [0, dim]."""
    number = _constant(index)
    if number is not None:
        if number < 0:
            return tirx.max(dim + number, 0)
        return tirx.min(_imm(min(number, 2**62), "int64"), dim)
    return tirx.min(tirx.max(tirx.Select(index < 0, index + dim, index), 0), dim)


# ---------------------------------------------------------------------------------------------
# The table

_ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Mod", "Min", "Max", "Pow", "Equal", "Less", "Greater",
                "LessOrEqual", "GreaterOrEqual", "And", "Or")
_UNARY = ("Identity", "Neg", "Abs", "Not", "Floor", "Ceil")
_REDUCE = ("ReduceProd", "ReduceSum", "ReduceMin", "ReduceMax")


def converters(base: dict) -> dict[str, type]:
    """edgec's shape-value converters; ``base`` is the table they go over (edgec's Resize,
    ConstantOfShape, Pow, Mod stay underneath where their inputs are not shape values)."""
    computed = {
        "Gather": _gather, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Concat": _concat,
        "Cast": _cast_to(lambda bb, inputs, attrs: _dtype_of_onnx(attrs["to"])),
        "CastLike": _cast_to(_cast_like_dtype), "Where": _where, "Transpose": _transpose,
        **{op: _elementwise(op) for op in _ELEMENTWISE},
        **{op: _unary(op) for op in _UNARY},
        **{op: _reduce(op) for op in _REDUCE},
    }
    table: dict[str, type] = {op: _converter(op, compute, base.get(op))
                              for op, compute in computed.items()}
    table.update({
        "Range": Range,
        "Reshape": Reshape,
        "Expand": Expand,
        "Tile": Tile,
        "Pad": Pad,
        "TopK": TopK,
        "Slice": type("Slice", (Slice,), {"base": base.get("Slice")}),
    })
    table["ConstantOfShape"] = _with_shape_input(base["ConstantOfShape"], 0)
    table["Resize"] = _resize(base["Resize"])
    return table
