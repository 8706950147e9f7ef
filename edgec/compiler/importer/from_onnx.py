"""ONNX to Relax: TVM's importer driven with edgec's converter table, with one-line errors for
what it cannot import.

The ONNX-level passes that run before (fixed inputs, recurrent layers, function expansion,
constant folding) are listed in ``edgec.compiler.pipeline.onnx_passes``; ``import_model`` there
runs them and then ``convert``.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any, Mapping

import onnx
import tvm
from tvm import relax

from edgec.compiler.importer.converter_table import BUILT_IN
from edgec.compiler.importer.converters.control_flow import LAZY_IF
from edgec.compiler.importer.converters.subgraph import NodeError, import_graph
from edgec.core.model import all_nodes
from edgec.errors import ModelError, describe


def unsupported_ops(proto: onnx.ModelProto, converters: Mapping[str, Any]) -> set[str]:
    """Operators anywhere in the graph, subgraphs included, that ``converters`` has no entry for."""
    return {node.op_type for node in all_nodes(proto.graph)
            if node.op_type not in converters and node.op_type not in BUILT_IN}


def convert(name: str, proto: onnx.ModelProto, converters: Mapping[str, Any]) -> tvm.IRModule:
    """``proto`` (model ``name``) as a Relax module whose ``main`` takes the graph inputs in order.

    Weights become constants; symbolic input dims stay symbolic (``tvm.tirx.Var`` named after the
    ONNX dim). Raises ModelError naming the unsupported operators, or why the import failed.
    """
    unsupported = unsupported_ops(proto, converters)
    if unsupported:
        raise ModelError(f"model '{name}' uses operator(s) the compiler cannot import: "
                         f"{', '.join(sorted(unsupported))}")
    try:
        # TVM's importer prints each failing node's inputs as IR: the error below names it.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            mod = import_graph(_with_lazy_ifs(proto), converters)
    except NodeError as exc:
        raise ModelError(f"model '{name}' failed to import at "
                         f"{exc.describe(describe(exc.cause))}") from None
    except Exception as exc:  # the importer raises many types; each is a model it cannot handle
        raise ModelError(f"model '{name}' failed to import: {describe(exc)}") from None
    if any(node.op_type == "If" for node in proto.graph.node):
        # TVM's importer opens one dataflow block over the whole graph unless it sees an If;
        # renamed to LAZY_IF they land inside it, which FuseOps cannot take ("it_creator !=
        # group2func_" on a detector's NMS branch): ungroup before regrouping around them.
        mod = relax.transform.ToNonDataflow()(mod)
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
