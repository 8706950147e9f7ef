"""The importer's converter table: TVM's ONNX converters with edgec's on top, for the ops TVM lacks
or mishandles.

A converter is a class or object with ``get_converter(opset)`` returning
``impl(bb, inputs, attrs, params)``, in the style of TVM's ``OnnxOpConverter``. The importer
(``edgec.compiler.importer.from_onnx``) looks every node up in the table it is given; TVM's own
module is never changed.
"""

from __future__ import annotations

from typing import Any

from tvm.relax.frontend.onnx import onnx_frontend

from edgec.compiler.importer.converters import ml, ops, shape_values, shapes, spec_ops, tensor_ops
from edgec.compiler.importer.converters.control_flow import LAZY_IF, LazyIf, Loop, Scan
from edgec.compiler.importer.converters.slicing import Slice, checked_squeeze
from edgec.compiler.importer.recurrent import RECURRENT_KERNEL, RecurrentLoop

# edgec's converters that depend on nothing but the opset.
CONVERTERS: dict[str, type] = {
    "Shape": shapes.Shape,
    "Size": shapes.Size,
    "CumProd": ops.CumProd,
    "LpNormalization": ops.LpNormalization,
    "Pow": ops.Pow,
    "ConstantOfShape": ops.ConstantOfShape,
    "OneHot": ops.OneHot,
    "IsInf": ops.IsInf,
    "SpaceToDepth": ops.SpaceToDepth,
    "Mod": ops.Mod,
    "BitShift": ops.BitShift,
    "ConvTranspose": ops.ConvTranspose,
    "Resize": ops.Resize,
    "NonMaxSuppression": ops.NonMaxSuppression,
    "QLinearMatMul": ops.QLinearMatMul,
    "QLinearConv": ops.QLinearConv,
    "ConvInteger": ops.ConvInteger,
    RECURRENT_KERNEL: RecurrentLoop,
    "Slice": Slice,
    "Squeeze": checked_squeeze(onnx_frontend.Squeeze),
    **spec_ops.CONVERTERS,
    **ml.CONVERTERS,
    "ReduceMax": ops.infinite_extremum(onnx_frontend.ReduceMax),
    "ReduceMin": ops.infinite_extremum(onnx_frontend.ReduceMin),
    "MatMul": ops.wide_matmul(onnx_frontend.MatMul),
    "Softmax": ops.NarrowSoftmax,
    "Conv": ops.wide_conv(onnx_frontend.Conv),
    "Clip": ops.constant_bound_clip(onnx_frontend.Clip),
    "Concat": ops.without_empty_operands(onnx_frontend.Concat),
    "BitCast": tensor_ops.BitCast,
    "Col2Im": tensor_ops.Col2Im,
    "DeformConv": tensor_ops.DeformConv,
    "TensorScatter": tensor_ops.TensorScatter,
    "Det": tensor_ops.Det,
    "ReverseSequence": tensor_ops.ReverseSequence,
}
# Shape values computed on the dims, over edgec's and TVM's converters (which run otherwise).
CONVERTERS.update(shape_values.converters(CONVERTERS))
# Op types the importer handles itself, without a converter.
BUILT_IN = ("If", "Constant")


def converter_table(native_rows: bool) -> dict[str, Any]:
    """TVM's converters with edgec's on top (edgec's win where both exist). ``native_rows``:
    Loop and Scan outputs are appended by edgec's CPU kernels (modules that run on the CPU)."""
    table: dict[str, Any] = {**onnx_frontend._get_convert_map(), **CONVERTERS}
    for op_type, converter in (("Loop", Loop), ("Scan", Scan), (LAZY_IF, LazyIf)):
        table[op_type] = converter(table, native_rows)
    return table
