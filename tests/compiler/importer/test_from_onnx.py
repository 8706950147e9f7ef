import pytest
from onnx import TensorProto, helper
from tvm import relax

from edgec.compiler.pipeline import import_model
from edgec.core.model import from_proto
from edgec.errors import ModelError
from edgec.zoo import get
from stages.test_profile import if_model


def _ifs(func: relax.Function) -> list[relax.If]:
    found = []
    relax.analysis.post_order_visit(func.body, lambda e: found.append(e) if isinstance(e, relax.If) else None)
    return found


def _calls_in(expr: relax.Expr) -> int:
    calls = []
    relax.analysis.post_order_visit(expr, lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
    return len(calls)


def test_top_level_if_branches_run_only_when_taken():
    for proto in (if_model(), get("early_exit").make_model(0)):
        mod = import_model(from_proto(proto))
        (branch,) = _ifs(mod["main"])
        # The branches' work lives inside the If, not before it.
        assert _calls_in(branch.true_branch) > 0 and _calls_in(branch.false_branch) > 0


def test_import_names_unsupported_ops():
    import pytest
    from onnx import TensorProto, helper

    from edgec.errors import ModelError

    graph = helper.make_graph([helper.make_node("STFT", ["x", "s"], ["y"], name="stft")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 1]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 9, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match="cannot import: STFT"):
        import_model(from_proto(model))


def test_an_import_failure_names_the_node_its_op_opset_and_input_types():
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["y"], name="pad_edges", mode="reflect")], "pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8]),
         helper.make_tensor_value_info("pads", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError) as error:
        import_model(from_proto(model, "pad"))
    message = str(error.value)
    assert "node 'pad_edges' (Pad, opset 17, inputs float32[n, 8], int64[4])" in message
    assert "\n" not in message
