"""Converters for ONNX ops TVM 0.27's importer lacks and ONNX defines without a function body."""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax, topi
from tvm.relax.frontend.onnx import onnx_frontend


def _constant_int(expr, what: str, node: str) -> int:
    if not isinstance(expr, tvm.ir.GenericConst):
        raise ValueError(f"{node}: {what} must be known at compile time (a constant or a fixed input)")
    return int(np.asarray(expr.value.numpy()).reshape(-1)[0])


class CumProd:
    """ONNX CumProd (opset 26): cumulative product along a constant axis, optionally exclusive
    (starting at 1) and/or reversed."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            data = inputs[0]
            name = attrs.get("tvm_custom", {}).get("name", "CumProd")
            axis = _constant_int(inputs[1], "the axis", name)
            reverse = attrs.get("reverse", 0) != 0
            if reverse:
                data = bb.emit_te(topi.flip, data, axis=axis)
            data = bb.normalize(relax.op.cumprod(data, axis, exclusive=attrs.get("exclusive", 0) != 0))
            if reverse:
                data = bb.emit_te(topi.flip, data, axis=axis)
            return data
        return convert


class LpNormalization:
    """ONNX LpNormalization: x / ||x||_p along ``axis`` (p = 1 or 2), as onnxruntime computes it
    (a zero norm gives zero)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            axis, p = attrs.get("axis", -1), attrs.get("p", 2)
            if p == 1:
                norm = relax.op.sum(relax.op.abs(x), axis=[axis], keepdims=True)
            elif p == 2:
                norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[axis], keepdims=True))
            else:
                raise ValueError(f"LpNormalization: p must be 1 or 2, got {p}")
            norm = bb.normalize(norm)
            zero = relax.const(0, x.ty.dtype)
            safe = relax.op.where(relax.op.equal(norm, zero), relax.const(1, x.ty.dtype), norm)
            return relax.op.divide(x, safe)
        return convert
