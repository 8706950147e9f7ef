"""ONNX's Attention (opset 23/24, imported as its function body) and the ops its body relies on,
compiled by edgec and checked against onnxruntime: fully masked rows (ReduceMax of -inf),
float16 (MatMul, Softmax and Conv accumulating in float32); LinearAttention, whose body has a Scan;
CausalConvWithState's Concat of no zeros."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from compiler.importer.test_converters_ops import _model
from edgec.tools import conformance

_RNG = np.random.default_rng(4321)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                         list(shape))


def _onnxruntime(model, inputs):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs)))


def _check(model, inputs, rtol=1e-5, atol=1e-6):
    got = conformance.run(model, inputs)
    expected = _onnxruntime(model, inputs)
    assert len(got) == len(expected)
    for value, want in zip(got, expected):
        assert value.shape == want.shape and value.dtype == want.dtype
        np.testing.assert_allclose(value.astype(np.float64), want.astype(np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("op,dtype,axes,keepdims", [
    ("ReduceMax", np.float32, [-1], 1), ("ReduceMax", np.float32, [0, 2], 0),
    ("ReduceMin", np.float32, [1], 1), ("ReduceMax", np.float16, [-1], 0),
    ("ReduceMin", np.float32, None, 0)])
def test_reduce_extremum_of_infinities_is_infinite(op, dtype, axes, keepdims):
    """TOPI's max starts from -FLT_MAX, so a row of -inf gave -3.4e38 (Attention's all-masked
    rows are found by ReduceMax(bias) == -inf)."""
    inf = np.inf if op == "ReduceMin" else -np.inf
    x = _RNG.standard_normal((3, 4, 5)).astype(dtype)
    x[1] = inf
    x[:, 2, :] = inf
    x[2, 3] = np.finfo(dtype).min if op == "ReduceMax" else np.finfo(dtype).max
    inputs = ["x"] if axes is None else ["x", "axes"]
    init = [] if axes is None else [helper.make_tensor("axes", 7, [len(axes)], axes)]
    out = np.max(x, axis=None if axes is None else tuple(axes), keepdims=bool(keepdims))
    node = helper.make_node(op, inputs, ["y"], keepdims=keepdims, name="reduce")
    model = _model([node], [_vi("x", dtype, x.shape)], [_vi("y", dtype, out.shape)], init, opset=18)
    _check(model, [x])



@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_extremum_of_bools_is_any_or_all(op):
    """ONNX ReduceMax/ReduceMin over bool (opset 20): TOPI has no lowest bool (compile error)."""
    x = _RNG.random((3, 4, 5)) < 0.3
    x[0] = True
    x[1] = False
    axes = helper.make_tensor("axes", 7, [1], [-1])
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0, name="reduce")
    model = _model([node], [_vi("x", np.bool_, x.shape)], [_vi("y", np.bool_, (3, 4))], [axes],
                   opset=20)
    (got,) = conformance.run(model, [x])
    np.testing.assert_array_equal(got, _onnxruntime(model, [x])[0])

def test_float16_matmul_accumulates_in_float32():
    """onnxruntime sums float16 products in float32 and rounds once; TVM's float16 accumulator
    rounded every addition (hundreds of the 256 results differed over K=64)."""
    a = _RNG.random((16, 64)).astype(np.float16)
    b = _RNG.random((2, 64, 16)).astype(np.float16)
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="matmul")
    model = _model([node], [_vi("a", a.dtype, a.shape), _vi("b", b.dtype, b.shape)],
                   [_vi("y", np.float16, (2, 16, 16))])
    (got,) = conformance.run(model, [a, b])
    np.testing.assert_array_equal(got, _onnxruntime(model, [a, b])[0])


def _ulps(a, b):
    """Units in the last place between float16 arrays of one sign."""
    return np.abs(a.view(np.int16).astype(np.int32) - b.view(np.int16).astype(np.int32))


@pytest.mark.parametrize("axis", [-1, 1])
def test_float16_softmax_sums_in_float32(axis):
    """Softmax over float16 with its sum in float32: within 2 ulps of onnxruntime (float32
    throughout), where TVM's float16 sum drifted by 8 (4 terms) to 20 ulps (200 terms)."""
    x = (_RNG.standard_normal((3, 200, 4)) * 3).astype(np.float16)
    node = helper.make_node("Softmax", ["x"], ["y"], axis=axis, name="softmax")
    model = _model([node], [_vi("x", x.dtype, x.shape)], [_vi("y", np.float16, x.shape)])
    (got,) = conformance.run(model, [x])
    assert _ulps(got, _onnxruntime(model, [x])[0]).max() <= 2


@pytest.mark.parametrize("rule,q_heads", [("linear", 2), ("gated_delta", 4)])
def test_linear_attention_body_with_a_scan_expands(rule, q_heads):
    """LinearAttention (opset 27) has no converter; its function body steps a Scan, whose
    subgraph's names expansion now prefixes as the body's (it refused bodies with subgraphs)."""
    b, t, kv_heads, dk, dv = 2, 5, 2, 4, 3
    shapes = {"query": (b, t, q_heads * dk), "key": (b, t, kv_heads * dk),
              "value": (b, t, kv_heads * dv), "past_state": (b, kv_heads, dk, dv)}
    if rule == "gated_delta":
        shapes.update(decay=(b, t, kv_heads * dk), beta=(b, t, kv_heads))
    inputs = {name: (_RNG.standard_normal(shape) * 0.5).astype(np.float32)
              for name, shape in shapes.items()}
    if rule == "gated_delta":
        inputs["decay"] = -np.abs(inputs["decay"])
        inputs["beta"] = 1 / (1 + np.exp(-inputs["beta"]))
    node = helper.make_node("LinearAttention", list(inputs), ["output", "present_state"],
                            q_num_heads=q_heads, kv_num_heads=kv_heads, update_rule=rule,
                            name="linear_attention")
    model = _model([node], [_vi(name, np.float32, a.shape) for name, a in inputs.items()],
                   [_vi("output", np.float32, (b, t, q_heads * dv)),
                    _vi("present_state", np.float32, (b, kv_heads, dk, dv))], opset=27)
    _check(model, list(inputs.values()))


def test_concat_of_an_operand_with_no_elements():
    """CausalConvWithState pads with kernel_size - 1 zeros: none for a size-one kernel. TVM
    folded the empty zeros into a constant with no elements, and the artifact failed to load."""
    x = _RNG.standard_normal((2, 4, 8)).astype(np.float32)
    shape = helper.make_tensor("shape", 7, [3], [2, 4, 0])
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["zeros"], name="zeros"),
             helper.make_node("Concat", ["zeros", "x", "zeros"], ["y"], axis=2, name="concat"),
             helper.make_node("Concat", ["x", "zeros"], ["z"], axis=-1, name="concat_last")]
    model = _model(nodes, [_vi("x", x.dtype, x.shape)],
                   [_vi("y", np.float32, x.shape), _vi("z", np.float32, x.shape)], [shape])
    _check(model, [x])


@pytest.mark.parametrize("spatial,with_bias", [(1, False), (2, True)])
def test_float16_conv_accumulates_in_float32(spatial, with_bias):
    """CausalConvWithState's float16 cases: onnxruntime sums the products and the bias in
    float32 and rounds once; TVM's float16 accumulator drifted by several ulps."""
    x = _RNG.random((2, 8) + (9,) * spatial).astype(np.float16)
    w = (_RNG.random((6, 8) + (3,) * spatial) - 0.3).astype(np.float16)
    b = _RNG.random(6).astype(np.float16)
    inputs, names = ([x, w, b], ["x", "w", "b"]) if with_bias else ([x, w], ["x", "w"])
    node = helper.make_node("Conv", names, ["y"], pads=[1] * (2 * spatial), name="conv")
    model = _model([node], [_vi(n, a.dtype, a.shape) for n, a in zip(names, inputs)],
                   [_vi("y", np.float16, (2, 6) + (9,) * spatial)])
    (got,) = conformance.run(model, inputs)
    want = _onnxruntime(model, inputs)[0]
    error = np.abs(got.astype(np.float32) - want.astype(np.float32)).max()
    assert error <= 2 ** -10 * np.abs(want).max()
