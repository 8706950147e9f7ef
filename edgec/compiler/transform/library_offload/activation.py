"""Which activation follows a convolution or matmul, so that its library call applies it last
(oneDNN's eltwise post-ops): relu, clip(0, hi) (relu6, hard sigmoid), sigmoid, tanh, and the
gated forms ``t * g(t)``: swish (SiLU), hard swish and GELU.

Exporters spell these as chains of scalar ops (``x * clip(x + 3, 0, 6) / 6``, ``x * 0.5 * (1 +
erf(x / 1.4142))``, ``min(max(x, 0), 6)``), in whichever order and association the framework
wrote. Rather than one pattern per spelling, a chain of elementwise ops with scalar constants is
evaluated on a grid of inputs and compared with each activation's definition: any spelling of the
same function fuses, and a chain that computes something else does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax

from edgec.compiler.transform.library_offload.analysis import _Analysis, _Binding, scalar_constant

Function = Callable[[np.ndarray], np.ndarray]

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # overflow-free 1 / (1 + exp(-x))


def _gelu_tanh_gate(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


# Unary ops: their function. Binary ops with one scalar constant: the function of (x, c), for the
# constant on the right; a constant on the left swaps the two.
_UNARY: dict[str, Function] = {
    "relax.nn.relu": lambda x: np.maximum(x, 0.0),
    "relax.sigmoid": _sigmoid,
    "relax.tanh": np.tanh,
    "relax.erf": _erf,
    "relax.nn.silu": lambda x: x * _sigmoid(x),
    "relax.nn.gelu": lambda x: x * 0.5 * (1.0 + _erf(x / math.sqrt(2.0))),
    "relax.nn.gelu_tanh": lambda x: x * _gelu_tanh_gate(x),
}
_BINARY: dict[str, Callable[[np.ndarray, float], np.ndarray]] = {
    "relax.add": lambda x, c: x + c,
    "relax.subtract": lambda x, c: x - c,
    "relax.multiply": lambda x, c: x * c,
    "relax.divide": lambda x, c: x / c,
    "relax.maximum": np.maximum,
    "relax.minimum": np.minimum,
}
_COMMUTES = {"relax.add", "relax.multiply", "relax.maximum", "relax.minimum"}
_CLIP = tvm.ir.Op.get("relax.clip")
_MULTIPLY = tvm.ir.Op.get("relax.multiply")

_PLAIN: dict[str, Function] = {
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "swish": _UNARY["relax.nn.silu"],
    "hardswish": lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "gelu_erf": _UNARY["relax.nn.gelu"],
    "gelu_tanh": _UNARY["relax.nn.gelu_tanh"],
}

# Inputs the chains are compared on: dense around the breakpoints of relu6 and hard sigmoid, and
# out to float32's largest, so that a clip is told from a function that only saturates later.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_GRID = np.unique(np.concatenate([np.linspace(-12.0, 12.0, 4801),
                                  [-_FLOAT32_MAX, -1e30, -1e6, -100.0, 100.0, 1e6, 1e30,
                                   _FLOAT32_MAX]]))


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    with np.errstate(all="ignore"):
        return bool(np.all(np.abs(a - b) <= 1e-5 * np.maximum(1.0, np.abs(b))))


def _number(expr) -> float | None:
    """A literal bound (clip's are IntImm or FloatImm, or a PrimValue of one)."""
    for _ in range(2):
        value = getattr(expr, "value", None)
        if isinstance(value, (int, float)):
            return float(value)
        expr = value
    return None


def _step(value: relax.Expr, var: relax.Var) -> Function | None:
    """``value`` as a function of ``var`` alone (an elementwise op of it and scalar constants)."""
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    name = value.op.name
    args = list(value.args)
    if name in _UNARY and len(args) == 1 and args[0].same_as(var):
        return _UNARY[name]
    if value.op.same_as(_CLIP) and args[0].same_as(var):
        lo, hi = (_number(a) for a in args[1:])
        if lo is None or hi is None:
            return None
        return lambda x: np.clip(x, lo, hi)
    if name in _BINARY and len(args) == 2:
        right = args[0].same_as(var)
        if not right and not args[1].same_as(var):
            return None
        c = scalar_constant(args[1] if right else args[0], float_only=True)
        if c is None:
            return None
        op = _BINARY[name]
        if right or name in _COMMUTES:
            return lambda x: op(x, c)
        return lambda x: op(np.full_like(x, c), x)
    return None


@dataclass
class Activation:
    """An activation found after ``tail``: its name (``relu`` or rules.ACTIVATIONS), clip's
    upper bound, the input scale it needs (``c * clip(y, 0, hi)`` runs as ``clip(c * y, 0,
    c * hi)``: the caller scales the affine epilogue by ``prescale``), and the bindings it
    replaces, the last of which the library call now binds."""

    name: str
    tail: relax.Var
    drop: set[relax.Var]
    upper: float = 0.0
    prescale: float = 1.0


def _chain(analysis: _Analysis, start: _Binding, source: relax.Var, taken: set[relax.Var],
           ) -> list[tuple[_Binding, Function]]:
    """The bindings from ``start`` on, each the sole consumer of the one before, that compute an
    elementwise function of ``source``, with each prefix's function."""
    chain: list[tuple[_Binding, Function]] = []
    binding, var, composed = start, source, None
    while binding is not None and binding.var not in taken:
        step = _step(binding.value, var)
        if step is None:
            break
        composed = step if composed is None else (lambda f, g: lambda x: g(f(x)))(composed, step)
        chain.append((binding, composed))
        var = binding.var
        binding = analysis.sole_consumer(var)
    return chain


def find_activation(analysis: _Analysis, tail: relax.Var, taken: set[relax.Var],
                    allowed: frozenset[str], may_prescale: bool) -> Activation | None:
    """The longest activation in ``allowed`` that ``tail``'s consumers compute from it alone.

    ``may_prescale``: whether the caller can scale ``tail`` (no residual was added into it), which
    a clip followed by a positive scale needs.
    """
    consumers = analysis.consumers.get(tail, [])
    home = analysis.bindings.get(tail)
    if home is None or not consumers or len(consumers) != analysis.uses.get(tail, 0):
        return None
    bindings = [analysis.bindings[c] for c in consumers]
    if any(b.block != home.block or b.var in taken for b in bindings):
        return None
    if len(bindings) == 1:
        return _plain(analysis, bindings[0], tail, taken, allowed, may_prescale)
    if len(bindings) == 2:
        return _gated(analysis, bindings, tail, taken, allowed)
    return None


def _plain(analysis: _Analysis, first: _Binding, tail: relax.Var, taken: set[relax.Var],
           allowed: frozenset[str], may_prescale: bool) -> Activation | None:
    chain = _chain(analysis, first, tail, taken)
    for length in range(len(chain), 0, -1):
        last, function = chain[length - 1]
        with np.errstate(all="ignore"):
            values = function(_GRID)
        drop = {b.var for b, _ in chain[:length]}
        for name, reference in _PLAIN.items():
            if name in allowed and _close(values, reference(_GRID)):
                return Activation(name, last.var, drop)
        if "clip" in allowed:
            found = _as_clip(values, may_prescale)
            if found is not None:
                return Activation("clip", last.var, drop, upper=found[0], prescale=found[1])
    return None


def _as_clip(values: np.ndarray, may_prescale: bool) -> tuple[float, float] | None:
    """(hi, c) when ``values`` are ``clip(c * x, 0, hi)`` on the grid, c > 0."""
    hi = float(values[-1])
    positive = (_GRID > 0) & (values < hi * 0.5)
    if not hi > 0 or values[-2] != hi or not np.any(positive):
        return None
    c = float(np.median(values[positive] / _GRID[positive]))
    if not c > 0 or (abs(c - 1.0) > 1e-6 and not may_prescale):
        return None
    if not _close(values, np.clip(c * _GRID, 0.0, hi)):
        return None
    return (hi, c) if may_prescale else (hi, 1.0)


def _gated(analysis: _Analysis, bindings: list[_Binding], tail: relax.Var,
           taken: set[relax.Var], allowed: frozenset[str]) -> Activation | None:
    """``h(tail * g(tail))``: one consumer starts the chain of g, the other multiplies, and
    scalar ops h may follow (GELU as ``(x * (1 + erf(x / sqrt 2))) * 0.5``)."""
    for gate_start, product in (bindings, bindings[::-1]):
        chain = _chain(analysis, gate_start, tail, taken)
        if not chain:
            continue
        last, gate = chain[-1]
        value = product.value
        consumer = analysis.sole_consumer(last.var)
        if (not isinstance(value, relax.Call) or not value.op.same_as(_MULTIPLY)
                or consumer is None or consumer.var != product.var
                or not _operands_are(value, tail, last.var)):
            continue
        after = analysis.sole_consumer(product.var)
        tails = [(product, lambda y: y)] + (
            _chain(analysis, after, product.var, taken) if after is not None else [])
        for end, h in reversed(tails):
            with np.errstate(all="ignore"):
                values = h(_GRID * gate(_GRID))
            for name, reference in _PLAIN.items():
                if name in allowed and name != "relu" and _close(values, reference(_GRID)):
                    drop = {b.var for b, _ in chain} | {b.var for b, _ in tails}
                    drop = {v for v in drop if _position(tails, v) <= _position(tails, end.var)}
                    return Activation(name, end.var, drop)
    return None


def _position(tails: list[tuple[_Binding, Function]], var: relax.Var) -> int:
    """Where ``var`` is among the product and the ops after it (-1: not there: the gate's)."""
    return next((i for i, (b, _) in enumerate(tails) if b.var.same_as(var)), -1)


def _operands_are(call: relax.Call, a: relax.Var, b: relax.Var) -> bool:
    x, y = call.args
    return (x.same_as(a) and y.same_as(b)) or (x.same_as(b) and y.same_as(a))
