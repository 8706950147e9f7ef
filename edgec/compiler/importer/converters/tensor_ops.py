"""Converters for ONNX tensor ops TVM 0.27's importer has no converter for: BitCast, Col2Im,
DeformConv, TensorScatter, Det and ReverseSequence. Each is Relax ops or a TOPI / ``te.compute``
kernel, so it lowers through the normal pipeline, with symbolic batch dims where the op allows."""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.relax.frontend.onnx import onnx_frontend

from edgec.compiler.ir import constant


def _name(attrs: dict, op: str) -> str:
    return attrs.get("tvm_custom", {}).get("name", op) or op


class BitCast:
    """ONNX BitCast (opset 26): the input's bytes read as the type ``to`` of the same bit width;
    the shape is the input's. ``bool`` is one byte holding 0 or 1 (TVM's bool is a 1-bit type, so
    it goes through uint8)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            name = _name(attrs, "BitCast")
            target = onnx_frontend.get_type(attrs["to"])
            source = str(x.ty.dtype)
            width = {d: 8 if d == "bool" else tvm.DataType(d).bits for d in (source, target)}
            if width[source] != width[target]:
                raise ValueError(f"{name}: BitCast needs types of one bit width, got {source} "
                                 f"({width[source]} bits) and {target} ({width[target]} bits)")
            if isinstance(x, tvm.ir.GenericConst):
                array = np.asarray(x.value.numpy())
                if target == "bool":
                    return constant(array.view(np.uint8) != 0)
                return constant(array.view(np.dtype(target)))
            if source == target:
                return x
            if source == "bool":
                x = bb.normalize(relax.op.astype(x, "uint8"))
                source = "uint8"
            if target == "bool":
                as_bytes = x if source == "uint8" else bb.emit_te(topi.reinterpret, x, "uint8")
                return relax.op.not_equal(as_bytes, relax.const(0, "uint8"))
            if source == target:
                return x
            return bb.emit_te(topi.reinterpret, x, target)
        return convert
