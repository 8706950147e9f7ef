"""ai.onnx.ml's numeric operators (converters/ml.py) against onnxruntime, batch left symbolic."""

import numpy as np
from onnx import TensorProto, helper

from compiler.importer.test_shape_values import _check


def _ml_model(node, inputs, outputs):
    graph = helper.make_graph([node], "ml", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    return model


def test_binarizer_keeps_the_dtype_and_compares_strictly():
    node = helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5)
    model = _ml_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    x = np.array([[0.5, 0.6, -1.0], [2.0, 0.4999, 0.5001]], np.float32)
    _check(model, [{"x": x}, {"x": x[:1]}])


def test_array_feature_extractor_takes_columns_of_the_last_axis():
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")
    model = _ml_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 5]),
                             helper.make_tensor_value_info("i", TensorProto.INT64, ["k"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2, "k"])])
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((n, 2, 5)).astype(np.float32),
                "i": np.array(cols, np.int64)} for n, cols in ((1, [4, 0]), (3, [1, 1, 3]))]
    _check(model, samples)


def test_array_feature_extractor_of_a_vector_is_one_row():
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain="ai.onnx.ml")
    model = _ml_model(node, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["c"]),
                             helper.make_tensor_value_info("i", TensorProto.INT64, ["k"])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "k"])])
    x = np.arange(6, dtype=np.float32)
    _check(model, [{"x": x, "i": np.array([5, 2], np.int64)}, {"x": x[:3], "i": np.array([0], np.int64)}])
