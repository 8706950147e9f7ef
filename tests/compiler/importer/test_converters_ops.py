"""edgec's converters for ops TVM lacks, ONNX function expansion and compile-time folding."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgec.tools import conformance
from edgec.compiler.importer.expand import expand_functions
from edgec.compiler.importer.fold import constant_input_name, fix_inputs, fold_constants
from edgec.errors import ModelError


def _model(nodes, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _reference(model, inputs):
    from onnx.reference import ReferenceEvaluator

    names = [i.name for i in model.graph.input]
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))


def test_shape_arithmetic_folds_to_constants():
    """Shape -> Div -> Concat -> Reshape: TVM's importer alone refuses Div on a shape."""
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Div", ["s", "two"], ["half"], name="div"),
             helper.make_node("Concat", ["half", "two"], ["new"], axis=0, name="cat"),
             helper.make_node("Reshape", ["x", "new"], ["y"], name="reshape")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
                   [numpy_helper.from_array(np.array([2], np.int64), "two")])
    folded = fold_constants(model)
    assert [n.op_type for n in folded.graph.node] == ["Constant", "Constant", "Constant", "Reshape"]
    x = np.arange(8, dtype=np.float32)
    (y,) = conformance.run(model, [x])
    np.testing.assert_array_equal(y, x.reshape(4, 2))


def test_constant_value_forms_become_value_tensors():
    nodes = [helper.make_node("Constant", [], ["c"], value_ints=[1, 2, 3], name="c"),
             helper.make_node("Add", ["x", "c"], ["y"], name="add")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.INT64, [3])],
                   [helper.make_tensor_value_info("y", TensorProto.INT64, [3])])
    folded = fold_constants(model)
    assert folded.graph.node[0].attribute[0].name == "value"
    (y,) = conformance.run(model, [np.array([10, 20, 30], np.int64)])
    np.testing.assert_array_equal(y, [11, 22, 33])


def test_reductions_over_an_empty_set_give_their_identity():
    """x [2, 0, 3]: every reduction over axis 1 is known at compile time (TVM's kernel would
    leave the output unwritten: its init runs inside the empty loop); the empty Abs stays a
    node (TVM cannot load a constant with no elements) and the sum over it folds too."""
    ops = {"ReduceSum": 0.0, "ReduceProd": 1.0, "ReduceMax": -np.inf, "ReduceMin": np.inf,
           "ReduceL2": 0.0, "ReduceLogSumExp": -np.inf}
    nodes = [helper.make_node(op, ["x", "axes"], [op], keepdims=1, name=op) for op in ops]
    nodes += [helper.make_node("Abs", ["x"], ["abs"], name="abs"),
              helper.make_node("ReduceSum", ["abs", "axes"], ["abs_sum"], keepdims=0, name="abs_sum")]
    outputs = [helper.make_tensor_value_info(op, TensorProto.FLOAT, [2, 1, 3]) for op in ops]
    outputs.append(helper.make_tensor_value_info("abs_sum", TensorProto.FLOAT, [2, 3]))
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0, 3])], outputs,
                   [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    folded = fold_constants(model)
    assert sorted(n.op_type for n in folded.graph.node) == ["Abs"] + ["Constant"] * 7
    got = conformance.run(model, [np.zeros((2, 0, 3), np.float32)])
    for value, want in zip(got, list(ops.values()) + [0.0]):
        np.testing.assert_array_equal(value, np.full(value.shape, want, np.float32))


def test_fixed_inputs_keep_the_graph_input_and_read_an_initializer():
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0, name="sum")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    fixed = fix_inputs(model, {"axes": np.array([1], np.int64)})
    assert [i.name for i in fixed.graph.input] == ["x", "axes"]
    assert fixed.graph.node[0].input[1] == constant_input_name("axes")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (y,) = conformance.run(model, [x, np.array([1], np.int64)])
    np.testing.assert_array_equal(y, x.sum(axis=1))


def test_ops_without_converter_expand_into_their_onnx_function():
    nodes = [helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["loss"],
                              reduction="mean", name="nll")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5]),
                           helper.make_tensor_value_info("t", TensorProto.INT64, [3])],
                   [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])])
    expanded = expand_functions(model, lambda op: op != "NegativeLogLikelihoodLoss")
    assert "NegativeLogLikelihoodLoss" not in {n.op_type for n in expanded.graph.node}
    assert expand_functions(model, lambda op: True) is model
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    t = np.array([0, 4, 2], np.int64)
    (loss,) = conformance.run(model, [x, t])
    np.testing.assert_allclose(loss, _reference(model, [x, t])[0], rtol=1e-6)


def test_onnx_attention_uses_its_function_body():
    nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=2,
                              kv_num_heads=2, name="attn")]
    value = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4, 8]) for n in "qkv"]
    model = _model(nodes, value, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])],
                   opset=23)
    rng = np.random.default_rng(1)
    qkv = [rng.standard_normal((1, 4, 8)).astype(np.float32) for _ in range(3)]
    (y,) = conformance.run(model, qkv)
    np.testing.assert_allclose(y, _reference(model, qkv)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod(exclusive, reverse):
    nodes = [helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive,
                              reverse=reverse, name="cp")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                   [numpy_helper.from_array(np.array(1, np.int64), "axis")], opset=26)
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    (y,) = conformance.run(model, [x])
    np.testing.assert_allclose(y, _reference(model, [x])[0])


def test_cumprod_with_a_runtime_axis_is_a_clear_error():
    nodes = [helper.make_node("CumProd", ["x", "axis"], ["y"], name="cp"),
             helper.make_node("Identity", ["axis"], ["axis_out"], name="id")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                           helper.make_tensor_value_info("axis", TensorProto.INT64, [])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], opset=26)
    from edgec.compiler.pipeline import import_model
    from edgec.core.model import from_proto

    with pytest.raises(ModelError, match="cp: the axis must be known at compile time"):
        import_model(from_proto(model))


@pytest.mark.parametrize("p", [1, 2])
def test_lp_normalization(p):
    nodes = [helper.make_node("LpNormalization", ["x"], ["y"], axis=1, p=p, name="lp")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    x = np.array([[1, -2, 2], [0, 0, 0]], np.float32)
    (y,) = conformance.run(model, [x])
    norm = np.linalg.norm(x, ord=p, axis=1, keepdims=True)
    np.testing.assert_allclose(y, np.divide(x, norm, out=np.zeros_like(x), where=norm != 0), rtol=1e-6)


@pytest.mark.parametrize("base,exponent", [(np.float32, np.int64), (np.int32, np.float32),
                                           (np.int64, np.int64)])
def test_pow_of_mixed_and_integer_types(base, exponent):
    dtype = helper.np_dtype_to_tensor_dtype
    nodes = [helper.make_node("Pow", ["x", "y"], ["z"], name="pow")]
    model = _model(nodes, [helper.make_tensor_value_info("x", dtype(np.dtype(base)), [3]),
                           helper.make_tensor_value_info("y", dtype(np.dtype(exponent)), [3])],
                   [helper.make_tensor_value_info("z", dtype(np.dtype(base)), [3])], opset=15)
    x, y = np.array([1, 2, 3], base), np.array([4, 5, 6], exponent)
    (z,) = conformance.run(model, [x, y])
    assert z.dtype == x.dtype
    np.testing.assert_array_equal(z, _reference(model, [x, y])[0])


def test_onehot_with_float_depth_and_indices():
    nodes = [helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=1, name="oh")]
    model = _model(nodes, [helper.make_tensor_value_info("i", TensorProto.FLOAT, [3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                   [numpy_helper.from_array(np.array([4.0], np.float32), "depth"),
                    numpy_helper.from_array(np.array([0, 1], np.float32), "values")], opset=11)
    i = np.array([0, 3, 1], np.float32)
    (y,) = conformance.run(model, [i])
    np.testing.assert_array_equal(y, np.eye(4, dtype=np.float32)[[0, 3, 1]])


def test_layer_normalization_mean_and_inv_std_keep_their_shapes():
    nodes = [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y", "mean", "inv"],
                              axis=1, name="ln")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5]),
                    helper.make_tensor_value_info("mean", TensorProto.FLOAT, [2, 1]),
                    helper.make_tensor_value_info("inv", TensorProto.FLOAT, [2, 1])],
                   [numpy_helper.from_array(np.ones(5, np.float32), "scale"),
                    numpy_helper.from_array(np.zeros(5, np.float32), "bias")], opset=17)
    x = np.random.default_rng(2).standard_normal((2, 5)).astype(np.float32)
    got = conformance.run(model, [x])
    for value, expected in zip(got, _reference(model, [x])):
        assert value.shape == expected.shape
        np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-5)


def test_resize_axes_become_full_rank_arguments():
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], axes=[3, 2], mode="nearest",
                              name="resize")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 6])],
                   [numpy_helper.from_array(np.array([3.0, 2.0], np.float32), "scales")], opset=19)
    folded = fold_constants(model)
    resize = next(n for n in folded.graph.node if n.op_type == "Resize")
    assert not any(a.name == "axes" for a in resize.attribute)
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    (y,) = conformance.run(model, [x])
    np.testing.assert_array_equal(y, _reference(model, [x])[0])
