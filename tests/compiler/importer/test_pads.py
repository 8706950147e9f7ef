"""Pad folding (compiler/importer/pads.py): Keras' zero padding before strided convolutions and
max pools becomes their own padding, and the rewritten graph computes what the original did;
pads that would change the result stay."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.importer.pads import fold_pads
from edgec.tools import conformance

_RNG = np.random.default_rng(11)
_END_ONLY = [0, 0, 0, 0, 0, 0, 1, 1]  # TensorFlow's "same" padding of a stride-2 3x3 window
_BOTH = [0, 0, 1, 1, 0, 0, 1, 1]


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _pad(source, output, pads, opset, value=None, mode="constant"):
    """A Pad node, with its pads (and value) as inputs from opset 11 and attributes before."""
    if opset >= 11:
        inputs = [source, f"{output}_pads"] + ([f"{output}_value"] if value is not None else [])
        inits = [_init(f"{output}_pads", np.array(pads, np.int64))]
        if value is not None:
            inits.append(_init(f"{output}_value", np.float32(value)))
        return helper.make_node("Pad", inputs, [output], mode=mode), inits
    return helper.make_node("Pad", [source], [output], mode=mode, pads=pads,
                            value=float(value or 0.0)), []


def _model(nodes, inits, opset, channels=4):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, channels, 9, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def _keras_stem(opset, pool_source="relu"):
    """ZeroPadding2D before a stride-2 depthwise convolution, a ReLU, ZeroPadding2D before a
    3x3 stride-2 max pool (ResNet's stem), a 1x1 convolution."""
    pad1, inits1 = _pad("x", "padded", _END_ONLY, opset)
    pad2, inits2 = _pad(pool_source, "pool_in", _BOTH, opset)
    nodes = [
        pad1,
        helper.make_node("Conv", ["padded", "dw", "dw_bias"], ["dw_out"], kernel_shape=[3, 3],
                         strides=[2, 2], group=4, auto_pad="VALID"),
        helper.make_node("Relu", ["dw_out"], ["relu"]),
        helper.make_node("Tanh", ["dw_out"], ["tanh"]),
        pad2,
        helper.make_node("MaxPool", ["pool_in"], ["pooled"], kernel_shape=[3, 3], strides=[2, 2]),
        helper.make_node("Conv", ["pooled", "pw"], ["y"]),
    ]
    inits = inits1 + inits2 + [
        _init("dw", _RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)),
        _init("dw_bias", _RNG.standard_normal(4).astype(np.float32)),
        _init("pw", _RNG.standard_normal((6, 4, 1, 1)).astype(np.float32))]
    return _model(nodes, inits, opset)


def _run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _pads(model):
    return sum(node.op_type == "Pad" for node in model.graph.node)


@pytest.mark.parametrize("opset", [9, 13])
def test_keras_stem_loses_its_pads_and_computes_the_same(opset):
    model = _keras_stem(opset)
    folded = fold_pads(model)
    onnx.checker.check_model(folded, full_check=True)
    assert _pads(model) == 2 and _pads(folded) == 0
    conv = next(node for node in folded.graph.node if node.op_type == "Conv")
    attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
    assert attrs["pads"] == [0, 0, 1, 1] and "auto_pad" not in attrs
    x = _RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, x), _run(model, x), rtol=1e-6, atol=1e-6)


def test_keras_stem_compiled_by_edgec_matches_onnxruntime():
    model = _keras_stem(13)
    x = _RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    (got,) = conformance.run(model, [x])
    np.testing.assert_allclose(got, _run(model, x), rtol=1e-5, atol=1e-5)


def test_a_max_pool_of_values_that_may_be_negative_keeps_its_pad():
    """Zeros are not -inf: a pad before a max pool of tanh's values changes the result."""
    folded = fold_pads(_keras_stem(13, pool_source="tanh"))
    assert [node.op_type for node in folded.graph.node].count("Pad") == 1
    assert next(n for n in folded.graph.node if n.op_type == "Pad").output[0] == "pool_in"


@pytest.mark.parametrize("case", ["value", "reflect", "channels", "also_read", "read_as_weight",
                                  "output", "same", "wider_than_window"])
def test_pads_that_would_change_the_result_stay(case):
    opset = 13
    pads = {"channels": [0, 1, 0, 0, 0, 0, 1, 1]}.get(case, _END_ONLY)
    pad, inits = _pad("x", "padded", pads, opset, value=0.5 if case == "value" else None,
                      mode="reflect" if case == "reflect" else "constant")
    channels_in = 5 if case == "channels" else 4
    conv_attrs = {"auto_pad": "SAME_UPPER"} if case == "same" else {}
    nodes = [pad, helper.make_node("Conv", ["padded", "w"], ["c"], kernel_shape=[3, 3],
                                   **conv_attrs)]
    inits.append(_init("w", _RNG.standard_normal((4, channels_in, 3, 3)).astype(np.float32)))
    if case == "also_read":
        nodes.append(helper.make_node("ReduceMean", ["padded"], ["m"], keepdims=0))
        nodes.append(helper.make_node("Add", ["c", "m"], ["y"]))
    elif case == "read_as_weight":
        nodes.append(helper.make_node("Conv", ["x", "padded"], ["y"]))
    elif case == "output":
        nodes.append(helper.make_node("Identity", ["c"], ["y"]))
        model = _model(nodes, inits, opset)
        model.graph.output.append(helper.make_tensor_value_info("padded", TensorProto.FLOAT, None))
        assert fold_pads(model) is model
        return
    elif case == "wider_than_window":
        nodes = [helper.make_node("Relu", ["x"], ["r"]),
                 _pad("r", "padded", [0, 0, 2, 2, 0, 0, 2, 2], opset)[0],
                 helper.make_node("MaxPool", ["padded"], ["y"], kernel_shape=[2, 2])]
        inits = _pad("r", "padded", [0, 0, 2, 2, 0, 0, 2, 2], opset)[1]
    else:
        nodes.append(helper.make_node("Identity", ["c"], ["y"]))
    model = _model(nodes, inits, opset)
    assert fold_pads(model) is model


def test_a_pad_read_through_an_identity_folds_and_the_identity_goes():
    """The transpose pass leaves an Identity where a Pad's transpose cancelled (tf2onnx's
    MobileNetV3): the Pad still folds into the convolution behind it."""
    pad, inits = _pad("x", "padded", _END_ONLY, 13)
    nodes = [pad, helper.make_node("Identity", ["padded"], ["same"]),
             helper.make_node("Conv", ["same", "w"], ["y"], kernel_shape=[3, 3], strides=[2, 2])]
    inits.append(_init("w", _RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)))
    model = _model(nodes, inits, 13)
    folded = fold_pads(model)
    onnx.checker.check_model(folded, full_check=True)
    assert [node.op_type for node in folded.graph.node] == ["Conv"]
    x = _RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)
    np.testing.assert_allclose(_run(folded, x), _run(model, x), rtol=1e-6, atol=1e-6)
