"""Shape logic: ``Shape`` of a tensor whose shape is known at compile time is a constant tensor.

TVM's importer turns ``Shape`` into a Relax ``ShapeExpr``, which only a dozen converters accept
(``Div``/``Sub``/``Size`` on it fail: "cannot handle ShapeExpr inputs"). When every dim is a
number, an int64 constant serves every consumer: arithmetic on it folds, and ``Reshape``/
``Expand``/``ConstantOfShape`` accept constant shape tensors. A symbolic shape is a shape value
(``shape_values``): an int64 tensor whose elements, the input's dims, the converters there follow;
a tensor, so that every converter takes it.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from edgec.compiler.importer.converters import shape_values
from edgec.compiler.ir import static_shape


class Shape:
    """ONNX Shape (opset 1-24): a constant when the input's dims are all known."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Shape.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            dims = static_shape(inputs[0]) if isinstance(inputs[0], relax.Expr) else None
            start, end = (attrs.get("start", 0), attrs.get("end")) if opset >= 15 else (0, None)
            if dims is not None:
                return relax.const(np.array(dims[start:end], np.int64))
            ty = getattr(inputs[0], "ty", None)
            if isinstance(ty, relax.TensorType) and ty.shape is not None:
                values = list(ty.shape.values)[start:end]
                shape_values.note_dims(bb, ty.shape.values)
                return shape_values.emit(bb, shape_values.Value(tuple(values), 1, "int64"))
            result = fallback(bb, inputs, attrs, params)
            if isinstance(getattr(result, "ty", None), relax.ShapeType):
                result = relax.op.shape_to_tensor(bb.normalize(result))
            return result
        return convert


class Size:
    """ONNX Size: a constant when the input's dims are all known."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Size.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            dims = static_shape(inputs[0]) if isinstance(inputs[0], relax.Expr) else None
            if dims is not None:
                return relax.const(np.array(int(np.prod(dims)), np.int64))
            ty = getattr(inputs[0], "ty", None)
            if isinstance(ty, relax.TensorType) and ty.shape is not None:
                shape_values.note_dims(bb, ty.shape.values)
                size = tvm.tirx.IntImm("int64", 1)
                for dim in ty.shape.values:
                    size = size * dim
                return shape_values.emit(bb, shape_values.Value((size,), 0, "int64"))
            return fallback(bb, inputs, attrs, params)
        return convert
