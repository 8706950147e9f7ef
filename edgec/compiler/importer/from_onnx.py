"""ONNX to Relax, through TVM's importer, with one-line errors for what it cannot import."""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator, Mapping

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from edgec.errors import ModelError, describe
from edgec.core.model import Model, all_nodes
from edgec.compiler.importer.converters import CONVERTERS
from edgec.compiler.importer.converters.control_flow import LAZY_IF, NATIVE_ROWS
from edgec.compiler.importer.expand import expand_functions, value_types
from edgec.compiler.importer.fold import fix_inputs, fold_constants
from edgec.compiler.importer.recurrent import rewrite_recurrent

_tvm_convert_map = onnx_frontend._get_convert_map


def convert_map() -> dict[str, type]:
    """TVM's converters with edgec's on top (edgec's win where both exist)."""
    return {**_tvm_convert_map(), **CONVERTERS}


@contextlib.contextmanager
def _edgec_converters(native_loops: bool) -> Iterator[None]:
    # The importer looks its converters up through this module-level function on every node.
    onnx_frontend._get_convert_map = convert_map
    native = NATIVE_ROWS.set(native_loops)
    try:
        yield
    finally:
        NATIVE_ROWS.reset(native)
        onnx_frontend._get_convert_map = _tvm_convert_map


def import_onnx(model: Model, constants: Mapping[str, np.ndarray] | None = None,
                native_loops: bool = True) -> tvm.IRModule:
    """Import ``model`` into a Relax module whose ``main`` takes the graph inputs in order.

    Weights become constants. Symbolic input dims stay symbolic (``tvm.tirx.Var`` named after the
    ONNX dim). Inputs named in ``constants`` are compiled as those values (``main`` still takes
    them; the runtime checks they match). What is known at compile time is folded first
    (``fold.py``). ``native_loops``: recurrent layers may run as edgec's native CPU loop
    (``recurrent.py``) and Loop/Scan outputs be appended in place (``control_flow.py``); False for
    modules that will run on a GPU. Raises ModelError naming the unsupported operators.
    """
    known = set(convert_map()) | {"If", "Constant"}
    proto = fix_inputs(model.proto, dict(constants or {}))
    proto = rewrite_recurrent(proto, model.name, value_types(proto).get, native=native_loops)
    proto = fold_constants(expand_functions(proto, known.__contains__))
    unsupported = unsupported_ops(proto)
    if unsupported:
        raise ModelError(
            f"model '{model.name}' uses operator(s) the compiler cannot import: "
            f"{', '.join(sorted(unsupported))}"
        )
    try:
        with warnings.catch_warnings(), _edgec_converters(native_loops):
            warnings.simplefilter("ignore")
            mod = onnx_frontend.from_onnx(_with_lazy_ifs(proto), keep_params_in_input=False)
    except Exception as exc:  # the importer raises many types; each is a model it cannot handle
        raise ModelError(f"model '{model.name}' failed to import: {describe(exc)}") from None
    # The importer emits no dataflow block when shape logic or an If sits at the top level, and
    # operator fusion only works inside dataflow blocks: regroup the pure bindings.
    return relax.transform.ConvertToDataflow()(mod)


def _with_lazy_ifs(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose top-level ``If`` nodes go to edgec's lazy converter, not TVM's eager one."""
    if not any(node.op_type == "If" for node in proto.graph.node):
        return proto
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for node in proto.graph.node:
        if node.op_type == "If":
            node.op_type = LAZY_IF
    return proto


def unsupported_ops(proto: onnx.ModelProto) -> set[str]:
    """Operators anywhere in the graph, subgraphs included, that the importer has no converter for."""
    known = set(convert_map()) | {"If", "Constant"}
    return {node.op_type for node in all_nodes(proto.graph) if node.op_type not in known}
