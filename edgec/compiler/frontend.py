"""ONNX to Relax, through TVM's importer, with one-line errors for what it cannot import."""

from __future__ import annotations

import warnings

import onnx
import tvm
import tvm.relax.frontend.onnx as onnx_frontend

from ..errors import ModelError, describe
from ..model import Model


def import_onnx(model: Model) -> tvm.IRModule:
    """Import ``model`` into a Relax module whose ``main`` takes the graph inputs in order.

    Weights become constants. Symbolic input dims stay symbolic (``tvm.tirx.Var`` named after the
    ONNX dim). Raises ModelError naming the unsupported operators.
    """
    unsupported = unsupported_ops(model.proto)
    if unsupported:
        raise ModelError(
            f"model '{model.name}' uses operator(s) the compiler cannot import: "
            f"{', '.join(sorted(unsupported))}"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = onnx_frontend.from_onnx(model.proto, keep_params_in_input=False)
    except Exception as exc:  # the importer raises many types; each is a model it cannot handle
        raise ModelError(f"model '{model.name}' failed to import: {describe(exc)}") from None
    return mod


def unsupported_ops(proto: onnx.ModelProto) -> set[str]:
    """Operators anywhere in the graph, subgraphs included, that the importer has no converter for."""
    known = set(onnx_frontend.onnx_frontend._get_convert_map()) | {"If", "Constant"}
    found: set[str] = set()

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            if node.op_type not in known:
                found.add(node.op_type)
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    visit(attr.g)
                for sub in attr.graphs:
                    visit(sub)

    visit(proto.graph)
    return found
