"""edgec's converters for corners of the ONNX spec TVM's converters miss (spec_ops): each
compiled through the whole pipeline and compared with onnxruntime."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from compiler.importer.test_converters_ops import _model

from edgec.tools import conformance

_RNG = np.random.default_rng(7)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None if shape is None else list(shape))


def _onnxruntime(model, inputs):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: v for i, v in zip(session.get_inputs(), inputs)})


def _check(model, inputs, rtol=1e-5, atol=1e-6):
    got = conformance.run(model, inputs)
    expected = _onnxruntime(model, inputs)
    assert len(got) == len(expected)
    for value, want in zip(got, expected):
        assert value.shape == want.shape
        assert value.dtype == want.dtype
        if want.dtype.kind == "f":
            np.testing.assert_allclose(value, want, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(value, want)


@pytest.mark.parametrize("dtype,k", [(np.float32, 0), (np.int64, 1), (np.float64, -1)])
def test_eyelike_with_a_dtype_other_than_the_input(dtype, k):
    x = np.zeros((3, 4), np.int32)
    node = helper.make_node("EyeLike", ["x"], ["y"], k=k, name="eye",
                            dtype=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    model = _model([node], [_vi("x", np.int32, x.shape)], [_vi("y", dtype, x.shape)])
    _check(model, [x])


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_bool_max_and_min_reductions(op, keepdims):
    x = np.array([[True, False], [True, True], [False, False]])
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims, name="r")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    shape = (3, 1) if keepdims else (3,)
    model = _model([node], [_vi("x", np.bool_, x.shape)], [_vi("y", np.bool_, shape)], [axes],
                   opset=20)
    _check(model, [x])


@pytest.mark.parametrize("sizes", [[0, 0, 0], [2, 0, 3], [0, 5], [5, 0]])
def test_split_with_empty_parts(sizes):
    x = _RNG.standard_normal((2, 5)).astype(np.float32)
    outs = [f"y{k}" for k in range(len(sizes))]
    node = helper.make_node("Split", ["x", "split"], outs, axis=1, name="split")
    split = numpy_helper.from_array(np.array(sizes, np.int64), "split")
    model = _model([node], [_vi("x", np.float32, x.shape)],
                   [_vi(o, np.float32, (2, s)) for o, s in zip(outs, sizes)], [split])
    x = x if sum(sizes) == 5 else x[:, :sum(sizes)].copy()
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = x.shape[1]
    _check(model, [x])


@pytest.mark.parametrize("op,attrs", [("Elu", {"alpha": 0.5}), ("Selu", {}),
                                      ("ThresholdedRelu", {"alpha": 0.3})])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_activations_keep_the_input_dtype(op, attrs, dtype):
    x = _RNG.standard_normal((3, 4)).astype(dtype)
    model = _model([helper.make_node(op, ["x"], ["y"], name="act", **attrs)],
                   [_vi("x", dtype, x.shape)], [_vi("y", dtype, x.shape)])
    _check(model, [x], rtol=1e-3 if dtype == np.float16 else 1e-7, atol=1e-3 if dtype == np.float16 else 1e-9)


@pytest.mark.parametrize("opset,mode,scales", [(9, "nearest", [1, 1, 2, 3]), (9, "linear", [1, 1, 2, 2]),
                                               (7, "nearest", [1.0, 2.0, 3.0, 1.0]), (7, "linear", [1, 1, 1.5, 2])])
def test_upsample(opset, mode, scales):
    x = _RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    out = [int(d * s) for d, s in zip(x.shape, scales)]
    if opset >= 9:
        node = helper.make_node("Upsample", ["x", "scales"], ["y"], mode=mode, name="up")
        inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    else:
        node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales, name="up")
        inits = []
    model = _model([node], [_vi("x", np.float32, x.shape)], [_vi("y", np.float32, out)], inits,
                   opset=opset)
    _check(model, [x])


def test_unsqueeze_with_rank_0_axes():
    x = _RNG.standard_normal((2, 3)).astype(np.float32)
    node = helper.make_node("Unsqueeze", ["x", "axis"], ["y"], name="unsqueeze")
    axis = numpy_helper.from_array(np.array(-1, np.int64), "axis")
    model = _model([node], [_vi("x", np.float32, x.shape)], [_vi("y", np.float32, (2, 3, 1))],
                   [axis])
    _check(model, [x])


@pytest.mark.parametrize("dtype,shape", [(np.float32, (2, 3, 4, 5)), (np.float32, (4, 3)),
                                         (np.float64, (2, 3, 6))])
def test_batchnorm_training_mode_outputs_running_statistics(dtype, shape):
    x = _RNG.standard_normal(shape).astype(dtype)
    c = shape[1]
    params = [numpy_helper.from_array(_RNG.standard_normal(c).astype(dtype), "scale"),
              numpy_helper.from_array(_RNG.standard_normal(c).astype(dtype), "bias"),
              numpy_helper.from_array(_RNG.standard_normal(c).astype(dtype), "mean"),
              numpy_helper.from_array(_RNG.random(c).astype(dtype) + 0.5, "var")]
    node = helper.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"],
                            ["y", "running_mean", "running_var"], training_mode=1,
                            momentum=0.8, epsilon=1e-3, name="bn")
    model = _model([node], [_vi("x", dtype, shape)],
                   [_vi("y", dtype, shape), _vi("running_mean", dtype, (c,)),
                    _vi("running_var", dtype, (c,))], params, opset=15)
    _check(model, [x], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("axis", [-3, -2, 0, 1])
def test_onehot_axis_counted_from_the_end_and_negative_indices(axis):
    i = np.array([[1, -2, 0], [4, -5, 2]], np.int64)
    node = helper.make_node("OneHot", ["i", "depth", "values"], ["y"], axis=axis, name="oh")
    shape = [2, 3]
    shape.insert(axis % 3, 5)
    model = _model([node], [_vi("i", np.int64, i.shape)], [_vi("y", np.float32, shape)],
                   [numpy_helper.from_array(np.array(5.0, np.float32), "depth"),
                    numpy_helper.from_array(np.array([-1, 3], np.float32), "values")], opset=11)
    _check(model, [i])


@pytest.mark.parametrize("shape,attrs", [
    ((1, 2, 9), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    ((2, 3, 6, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 7, 7), {"kernel_shape": [3, 2], "dilations": [2, 1], "ceil_mode": 1, "strides": [2, 2]}),
    ((1, 1, 5, 6), {"kernel_shape": [2, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 1, 5, 6), {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER"}),
    ((1, 2, 5, 6), {"kernel_shape": [2, 2], "storage_order": 1, "pads": [1, 1, 0, 0]}),
    ((1, 1, 4, 5, 6), {"kernel_shape": [2, 2, 3], "strides": [1, 2, 2]}),
])
def test_maxpool_indices(shape, attrs):
    x = _RNG.permutation(int(np.prod(shape))).reshape(shape).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], name="pool", **attrs)
    model = _model([node], [_vi("x", np.float32, shape)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("i", TensorProto.INT64, None)], opset=12)
    # The output shapes ONNX infers (declared: edgec checks declared outputs).
    from onnx import shape_inference
    inferred = shape_inference.infer_shapes(model)
    del model.graph.output[:]
    model.graph.output.extend(inferred.graph.output)
    _check(model, [x])


def test_maxpool_indices_of_uint8():
    shape = (1, 2, 4, 4)
    x = _RNG.permutation(32).reshape(shape).astype(np.uint8)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2],
                            name="pool")
    model = _model([node], [_vi("x", np.uint8, shape)],
                   [_vi("y", np.uint8, (1, 2, 2, 2)), _vi("i", np.int64, (1, 2, 2, 2))], opset=12)
    _check(model, [x])


@pytest.mark.parametrize("axis,sorted_", [(0, 1), (1, 1), (-1, 0), (0, 0)])
def test_unique_with_an_axis(axis, sorted_):
    x = np.array([[[1, 0], [1, 0], [2, 3]], [[1, 0], [1, 0], [0, 3]], [[4, 0], [4, 0], [0, 3]],
                  [[1, 0], [1, 0], [2, 3]]], np.float32)  # [4, 3, 2]
    node = helper.make_node("Unique", ["x"], ["y", "indices", "inverse", "counts"], axis=axis,
                            sorted=sorted_, name="unique")
    model = _model([node], [_vi("x", np.float32, x.shape)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                    *(helper.make_tensor_value_info(n, TensorProto.INT64, ["n"])
                      for n in ("indices", "inverse", "counts"))], opset=11)
    model.graph.output[0].type.tensor_type.shape.Clear()
    for k in range(3):
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_param = f"d{k}"
    model.graph.output[2].type.tensor_type.shape.dim[0].dim_param = "m"
    _check(model, [x])


def test_optional_has_element_without_an_input_is_false():
    nodes = [helper.make_node("OptionalHasElement", [], ["has"], name="has"),
             helper.make_node("Not", ["has"], ["y"], name="not")]
    model = _model(nodes, [], [_vi("y", np.bool_, ())], opset=18)
    _check(model, [])


def test_maxpool_indices_of_a_window_of_lowest_values_next_to_padding():
    x = np.full((1, 1, 3, 3), -np.inf, np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], pads=[1, 1, 0, 0],
                            name="pool")
    model = _model([node], [_vi("x", np.float32, x.shape)],
                   [_vi("y", np.float32, (1, 1, 3, 3)), _vi("i", np.int64, (1, 1, 3, 3))], opset=12)
    _check(model, [x])


def test_a_string_constant_is_a_one_line_error():
    from edgec.errors import ModelError

    branch = helper.make_graph(
        [helper.make_node("Constant", [], ["s"], value_strings=["a", "b"], name="s"),
         helper.make_node("Identity", ["x"], ["y_b"], name="id")], "b", [],
        [helper.make_tensor_value_info("y_b", TensorProto.FLOAT, [2])])
    node = helper.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=branch, name="if")
    model = _model([node], [_vi("x", np.float32, (2,)), _vi("flag", np.bool_, ())],
                   [_vi("y", np.float32, (2,))])
    with pytest.raises(ModelError, match="string constants are not supported") as error:
        conformance.run(model, [np.zeros(2, np.float32), np.array(True)])
    assert "\n" not in str(error.value)
