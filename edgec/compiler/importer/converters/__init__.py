"""edgec's own ONNX operator converters, added to TVM's importer for the ops it lacks or mishandles.

``CONVERTERS`` maps an ONNX op type to a converter class in the style of TVM's
``OnnxOpConverter`` (a ``get_converter(opset)`` classmethod returning
``impl(bb, inputs, attrs, params)``). ``edgec.compiler.importer.from_onnx`` installs them for the duration
of an import.
"""

from __future__ import annotations

from edgec.compiler.importer.converters import ops
from edgec.compiler.importer.converters import shapes
from edgec.compiler.importer.recurrent import RECURRENT_KERNEL, RecurrentLoop
from edgec.compiler.importer.converters.control_flow import LAZY_IF, LazyIf, Loop, Scan

CONVERTERS: dict[str, type] = {}
CONVERTERS["Loop"] = Loop
CONVERTERS["Scan"] = Scan
CONVERTERS[LAZY_IF] = LazyIf
CONVERTERS["Shape"] = shapes.Shape
CONVERTERS["Size"] = shapes.Size
CONVERTERS["CumProd"] = ops.CumProd
CONVERTERS["LpNormalization"] = ops.LpNormalization
CONVERTERS["Pow"] = ops.Pow
CONVERTERS["ConstantOfShape"] = ops.ConstantOfShape
CONVERTERS["OneHot"] = ops.OneHot
CONVERTERS["IsInf"] = ops.IsInf
CONVERTERS["SpaceToDepth"] = ops.SpaceToDepth
CONVERTERS["Mod"] = ops.Mod
CONVERTERS["BitShift"] = ops.BitShift
CONVERTERS["ConvTranspose"] = ops.ConvTranspose
CONVERTERS["Resize"] = ops.Resize
CONVERTERS["NonMaxSuppression"] = ops.NonMaxSuppression
CONVERTERS["QLinearMatMul"] = ops.QLinearMatMul
CONVERTERS["QLinearConv"] = ops.QLinearConv
CONVERTERS["ConvInteger"] = ops.ConvInteger
CONVERTERS[RECURRENT_KERNEL] = RecurrentLoop
