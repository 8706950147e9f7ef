"""Converters for the numeric operators of the ``ai.onnx.ml`` domain (what skl2onnx and
onnxmltools emit around classical models) that TVM 0.27's importer has none of. Operators on
strings (LabelEncoder over string keys, StringNormalizer) stay refused: no TVM tensor holds
strings."""

from __future__ import annotations

from typing import Callable

from tvm import relax


class Binarizer:
    """ai.onnx.ml Binarizer: 1 where ``x > threshold``, else 0, in the input's dtype."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            dtype = str(x.ty.dtype)
            above = relax.op.greater(x, relax.const(float(attrs.get("threshold", 0.0)), dtype))
            return relax.op.astype(above, dtype)
        return convert


class ArrayFeatureExtractor:
    """ai.onnx.ml ArrayFeatureExtractor: the columns ``indices`` (flattened) of ``x``'s last axis;
    a 1-D ``x`` gives one row, as onnxruntime does ([1, len(indices)])."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x, indices = inputs
            flat = bb.normalize(relax.op.reshape(indices, [-1]))
            taken = bb.normalize(relax.op.take(x, flat, axis=x.ty.ndim - 1))
            return relax.op.expand_dims(taken, [0]) if x.ty.ndim == 1 else taken
        return convert


CONVERTERS: dict[str, type] = {"Binarizer": Binarizer, "ArrayFeatureExtractor": ArrayFeatureExtractor}
