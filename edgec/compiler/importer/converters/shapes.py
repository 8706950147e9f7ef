"""Shape logic: ``Shape`` of a tensor whose shape is known at compile time is a constant tensor.

TVM's importer turns ``Shape`` into a Relax ``ShapeExpr``, which only a dozen converters accept
(``Div``/``Sub``/``Size`` on it fail: "cannot handle ShapeExpr inputs"). When every dim is a
number, an int64 constant serves every consumer: arithmetic on it folds, and ``Reshape``/
``Expand``/``ConstantOfShape`` accept constant shape tensors. Symbolic shapes keep TVM's path.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from edgec.compiler.ir import static_shape


class Shape:
    """ONNX Shape (opset 1-24): a constant when the input's dims are all known."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Shape.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            dims = static_shape(inputs[0]) if isinstance(inputs[0], relax.Expr) else None
            if dims is None:
                return fallback(bb, inputs, attrs, params)
            start, end = attrs.get("start", 0), attrs.get("end")
            return relax.const(np.array(dims[start:end] if opset >= 15 else dims, np.int64))
        return convert


class Size:
    """ONNX Size: a constant when the input's dims are all known."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Size.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            dims = static_shape(inputs[0]) if isinstance(inputs[0], relax.Expr) else None
            if dims is None:
                return fallback(bb, inputs, attrs, params)
            return relax.const(np.array(int(np.prod(dims)), np.int64))
        return convert
