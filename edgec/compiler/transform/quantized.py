"""Quantized layers in the compiled program: int8 and bf16 library calls, int8 embedding tables.

:func:`Int8Lowering` runs right after library offload, for a quantization decision that the
quantize stage made (``QuantizedLowering``, read as data). It rewrites

- ``edgec_dnnl_dense`` / ``edgec_dnnl_conv2d`` calls whose (folded) weight belongs to a quantized
  layer into the ``edgec_q8_*`` functions of ``edgec/native/dnnl_int8.cc``, with the weight as an
  int8 constant and its per-channel scales (the argument lists are in that file); on Arm, the
  ``edgec_xnn_*`` calls of weight-only layers into ``edgec_xnn_q8_*_w8`` (``xnnpack_shim.cc``);
- ``edgec_dnnl_dense`` / ``edgec_dnnl_conv2d*`` calls of bf16 layers into the same calls with
  ``FLAG_BF16`` set: oneDNN packs the fp32 weight as bf16 once and converts the input per call;
- ``take`` from a quantized embedding table into ``take`` from the int8 table, cast and scaled
  per row, so only the gathered rows are dequantized.

Weights therefore stay int8 in the library. Constant folding cannot turn them back into fp32:
nothing in the program computes on the int8 constant alone (the dense/conv kernels receive it
as an argument of an opaque call; the table is only read through run-time indices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import onnx
import tvm
from tvm import relax

from edgec.compiler.ir import rewrite_functions
from edgec.compiler.transform.library_offload import FLAG_BF16, constant_value, weight_id
from edgec.core import quant_schemes as schemes
from edgec.core.quant_layers import Layer, find_layers, initializer_arrays
from edgec.errors import CompileError

_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")
_TAKE = tvm.ir.Op.get("relax.take")
# The library calls a quantized layer's call replaces, by the fp32 function library dispatch
# wrote, with the int8 function's name less its _w8/_i8 suffix: oneDNN's (dnnl_int8.cc, x86:
# weight-only and integer), XNNPACK's (in its shim, Arm: weight-only).
_QUANTIZED_CALLS = {"edgec_dnnl_dense": "edgec_q8_dense", "edgec_dnnl_conv2d": "edgec_q8_conv2d",
                    "edgec_dnnl_conv2d_add": "edgec_q8_conv2d_add",
                    "edgec_xnn_dense": "edgec_xnn_q8_dense", "edgec_xnn_conv2d": "edgec_xnn_q8_conv2d",
                    "edgec_xnn_conv2d_add": "edgec_xnn_q8_conv2d_add"}


class _Quantized:
    """The int8 form of one layer's weight, made once per layer however many functions use it
    (shape specializations copy the program): one constant object, so one copy in the library.

    Library dispatch may have folded a per-output-channel scale into the weight (a batch norm,
    or a multiply by a constant, after the layer): the call then holds that scaled weight, whose
    int8 form (per channel) is the layer's up to rounding, and is made from it.
    """

    def __init__(self, layer: Layer, precision: str, array: np.ndarray, scheme: str,
                 activation: dict[str, Any] | None, weight_levels: int) -> None:
        self.layer, self.precision, self.activation = layer, precision, activation
        self.array = array
        self.levels = schemes.layer_weight_levels(precision, weight_levels)
        self.axis = 1 if layer.kind == "dense" else 0  # of the compiled weight: [K, N] or OIHW
        # By the id of the fp32 weight a call holds: (int8 weight, scales, int8 weight id).
        self.forms: dict[int, tuple[relax.Expr, relax.Expr, int]] = {}
        if layer.kind == "embedding":
            q, scale, zero = schemes.quantize_rows(array, scheme)
            self.table = relax.const(q)
            self.scale = relax.const(scale.reshape(-1, 1))
            self.zero = relax.const(zero.astype(np.float32).reshape(-1, 1)) if zero.any() else None
        else:
            self.form(array)
        self.uses = 0

    def form(self, array: np.ndarray) -> tuple[relax.Expr, relax.Expr, int] | None:
        """The int8 form of ``array``: this layer's weight, or it scaled per output channel;
        None for any other weight."""
        key = weight_id(array)
        if key not in self.forms:
            if self.forms and not _scaled_per_channel(self.array, array, self.axis):
                return None
            if self.precision == "bf16":  # the call keeps its fp32 weight; oneDNN packs it
                self.forms[key] = (relax.const(array), None, key)
                return self.forms[key]
            q, scale = schemes.quantize_weight(array, self.axis, self.levels)
            self.forms[key] = (relax.const(q), relax.const(scale), weight_id(q, scale))
        return self.forms[key]


def _scaled_per_channel(weight: np.ndarray, other: np.ndarray, axis: int) -> bool:
    """Whether ``other`` is ``weight`` times one factor per index of ``axis``."""
    if other.shape != weight.shape:
        return False
    a = np.moveaxis(weight, axis, 0).reshape(weight.shape[axis], -1).astype(np.float64)
    b = np.moveaxis(other, axis, 0).reshape(other.shape[axis], -1).astype(np.float64)
    rows = np.arange(len(a))
    pivot = np.abs(a).argmax(axis=1)
    factor = np.divide(b[rows, pivot], a[rows, pivot], out=np.zeros(len(a)), where=a[rows, pivot] != 0)
    return bool(np.allclose(b, a * factor[:, None], rtol=1e-5, atol=1e-6 * (np.abs(b).max() or 1.0)))


@relax.expr_functor.mutator
class _Rewrite(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, by_id: dict[int, _Quantized]) -> None:
        super().__init__(mod)
        self.by_id = by_id
        self.by_shape: dict[tuple[int, ...], list[_Quantized]] = {}
        for quantized in by_id.values():
            if quantized.layer.kind != "embedding":
                self.by_shape.setdefault(quantized.array.shape, []).append(quantized)

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if call.op.same_as(_CALL_DPS_PACKED) and isinstance(call.args[0], relax.ExternFunc):
            name = call.args[0].global_symbol
            if name in _QUANTIZED_CALLS:
                return self._library_call(call, name)
        elif (call.op.same_as(_TAKE) and call.attrs.axis is not None
              and int(call.attrs.axis) == 0):  # axis None would index the flattened table
            return self._embedding(call)
        return call

    def _find(self, expr: relax.Expr) -> _Quantized | None:
        array = constant_value(expr)
        if array is None or array.dtype != np.float32:
            return None
        return self.by_id.get(weight_id(array))

    def _find_weight(self, expr: relax.Expr) -> tuple[_Quantized, tuple] | None:
        """The quantized layer whose weight a library call holds (as is, or scaled per output
        channel by library dispatch), and that weight's int8 form."""
        array = constant_value(expr)
        if array is None or array.dtype != np.float32:
            return None
        found = self.by_id.get(weight_id(array))
        candidates = [found] if found is not None else self.by_shape.get(array.shape, [])
        for quantized in candidates:
            form = quantized.form(array)
            if form is not None:
                return quantized, form
        return None

    def _library_call(self, call: relax.Call, name: str) -> relax.Expr:
        args = list(call.args[1].fields)
        match = self._find_weight(args[1])
        if match is None or match[0].precision == "fp32":
            return call
        found, (weight, scale, identity) = match
        if found.precision == "bf16":
            if not name.startswith("edgec_dnnl_"):
                return call  # XNNPACK has no bf16 kernels here: fp32 (as_compiled says so)
            found.uses += 1
            flags = int(args[-2].value)  # every fp32 call's arguments end (..., flags, weight id)
            args[-2] = relax.prim_value(flags | FLAG_BF16)
            return relax.call_dps_packed(name, args, call.ty_args[0])
        found.uses += 1
        # The fp32 call's (data, weight, bias, [residual,] attributes..., weight id): the int8
        # weight and its scales replace the weight; integer layers add the input's quantization.
        x, bias, rest = args[0], args[2], args[3:-1]
        wid = relax.prim_value(identity)
        quant: list[relax.Expr] = []
        suffix = "w8"
        if found.precision in schemes.INTEGER_PRECISIONS:
            if name.startswith("edgec_xnn_"):
                raise CompileError(f"layer '{found.layer.name}': {found.precision} needs oneDNN's "
                                   f"integer kernels (x86); on XNNPACK targets use int8-weight")
            suffix = "i8"
            act = found.activation or {"scale": 0.0, "zero": 0}  # scale 0: per call (dynamic)
            quant = [relax.prim_value(float(act["scale"]), "float64"),
                     relax.prim_value(int(act["zero"]))]
        new_args = [x, weight, scale, bias, *quant, *rest, wid]
        function = f"{_QUANTIZED_CALLS[name]}_{suffix}"
        return relax.call_dps_packed(function, new_args, call.ty_args[0])

    def _embedding(self, call: relax.Call) -> relax.Expr:
        found = self._find(call.args[0])
        if found is None or found.layer.kind != "embedding" or found.precision == "fp32":
            return call
        found.uses += 1
        indices = call.args[1]
        emit = self.builder_.emit
        rows = emit(relax.op.astype(emit(relax.op.take(found.table, indices, axis=0)), "float32"))
        if found.zero is not None:
            rows = emit(relax.op.subtract(rows, emit(relax.op.take(found.zero, indices, axis=0))))
        return relax.op.multiply(rows, emit(relax.op.take(found.scale, indices, axis=0)))


@dataclass(frozen=True)
class QuantizedLowering:
    """What the compiler needs of a quantization decision (``edgec.stages.quantize``): the mode,
    the scheme, per layer name its ``precision`` and, for static layers, ``activation``, and the
    ONNX model whose weights the layers quantize."""

    mode: str
    scheme: str
    decisions: Mapping[str, Mapping[str, Any]]
    proto: onnx.ModelProto | None = field(default=None, compare=False, repr=False)

    def layers(self, precision: str | None = None) -> list[str]:
        """The layers quantized (not fp32), or only those at ``precision``."""
        return [name for name, d in self.decisions.items()
                if d["precision"] != "fp32" and precision in (None, d["precision"])]


def Int8Lowering(proto: onnx.ModelProto, lowering: QuantizedLowering,  # noqa: N802
                 found: dict[str, int], weight_levels: int) -> tvm.transform.Pass:
    """The pass that turns the library calls of ``lowering``'s quantized layers into int8 (or
    bf16) ones (module docstring). ``found`` receives per layer how many calls of the program it
    rewrote (0: the layer was not found there and stays fp32). ``weight_levels``: the int8 range
    of integer layers' weights on this target (``quant_schemes.integer_weight_levels``)."""
    arrays = initializer_arrays(proto)

    @tvm.transform.module_pass(opt_level=0, name="edgec.Int8Lowering")
    def lower(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        by_id: dict[int, _Quantized] = {}
        for layer in find_layers(proto):
            decision = lowering.decisions.get(layer.name)
            if decision is None or decision["precision"] == "fp32":
                continue
            compiled = layer.compiled_weight(arrays[layer.weight])
            by_id[weight_id(compiled)] = _Quantized(
                layer, decision["precision"], compiled, lowering.scheme, decision.get("activation"),
                weight_levels)
        mod = rewrite_functions(_Rewrite(mod, by_id), mod)
        for quantized in by_id.values():
            found[quantized.layer.name] = found.get(quantized.layer.name, 0) + quantized.uses
        return mod

    return lower
