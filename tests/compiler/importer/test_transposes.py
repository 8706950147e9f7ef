"""Transpose sinking (compiler/importer/transposes.py): the NHWC islands tf2onnx writes between
convolutions lose their transposes, and the rewritten graph computes what the original did."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.importer.transposes import sink_transposes
from edgec.tools import conformance

_RNG = np.random.default_rng(7)
_TO_NHWC, _TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def _init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def _model(nodes, inits, outputs, opset=13, inputs=None):
    inputs = inputs or [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8, 8, 3])]
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _out(name, rank=4):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank)


def _conv(name, source, channels_in, channels_out, output):
    weight = _RNG.standard_normal((channels_out, channels_in, 1, 1)).astype(np.float32)
    return (helper.make_node("Conv", [source, f"{name}_w"], [output], name=name),
            _init(f"{name}_w", weight))


def _keras_block(opset=13):
    """What tf2onnx writes for an NHWC model: NHWC input, each convolution in NCHW between two
    transposes, hard-swish, a padded squeeze-excite gate and a residual add done in NHWC."""
    conv1, w1 = _conv("conv1", "x_nchw", 3, 6, "c1")
    conv2, w2 = _conv("conv2", "se_nchw", 6, 6, "c2")
    conv3, w3 = _conv("conv3", "padded_nchw", 6, 4, "c3")
    if opset >= 18:
        mean = helper.make_node("ReduceMean", ["hs", "mean_axes"], ["se"], keepdims=1)
        extra = [_init("mean_axes", np.array([1, 2], np.int64))]
    else:
        mean = helper.make_node("ReduceMean", ["hs"], ["se"], axes=[1, 2], keepdims=1)
        extra = []
    nodes = [
        helper.make_node("Transpose", ["x"], ["x_nchw"], perm=_TO_NCHW),
        conv1,
        helper.make_node("Transpose", ["c1"], ["c1_nhwc"], perm=_TO_NHWC),
        helper.make_node("Add", ["c1_nhwc", "bias"], ["shifted"]),
        helper.make_node("Clip", ["shifted", "zero", "six"], ["relu6"]),
        helper.make_node("Mul", ["c1_nhwc", "relu6"], ["hs_6"]),
        helper.make_node("Mul", ["hs_6", "sixth"], ["hs"]),
        mean,
        helper.make_node("Transpose", ["se"], ["se_nchw"], perm=_TO_NCHW),
        conv2,
        helper.make_node("Transpose", ["c2"], ["gate_raw"], perm=_TO_NHWC),
        helper.make_node("Sigmoid", ["gate_raw"], ["gate"]),
        helper.make_node("Mul", ["hs", "gate"], ["scaled"]),
        helper.make_node("Pad", ["scaled", "pads"], ["padded"], mode="constant"),
        helper.make_node("Transpose", ["padded"], ["padded_nchw"], perm=_TO_NCHW),
        conv3,
        helper.make_node("Transpose", ["c3"], ["c3_nhwc"], perm=_TO_NHWC),
        helper.make_node("Softmax", ["c3_nhwc"], ["y"], axis=3),
    ]
    inits = [w1, w2, w3, _init("bias", np.linspace(2, 4, 6, dtype=np.float32)),
             _init("zero", np.float32(0)), _init("six", np.float32(6)),
             _init("sixth", np.float32(1 / 6)),
             _init("pads", np.array([0, 1, 0, 0, 0, 0, 2, 0], np.int64))] + extra
    return _model(nodes, inits, [_out("y")], opset=opset)


def _transposes(model):
    return sum(node.op_type == "Transpose" for node in model.graph.node)


def _run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


@pytest.mark.parametrize("opset", [13, 18])
def test_keras_block_keeps_only_the_input_transpose_and_computes_the_same(opset):
    model = _keras_block(opset)
    rewritten = sink_transposes(model)
    onnx.checker.check_model(rewritten, full_check=True)
    assert _transposes(model) == 6 and _transposes(rewritten) == 2  # the input's, the output's
    # The per-channel bias is now [1, C, 1, 1]; the NHWC copy is gone.
    names = {i.name for i in rewritten.graph.initializer}
    assert "bias" not in names and "pads" not in names
    x = _RNG.standard_normal((2, 8, 8, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(rewritten, x)[0], _run(model, x)[0], rtol=1e-6, atol=1e-7)


def test_keras_block_compiled_by_edgec_matches_onnxruntime():
    model = _keras_block()
    x = _RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    (got,) = conformance.run(model, [x])
    np.testing.assert_allclose(got, _run(model, x)[0], rtol=1e-5, atol=1e-6)


def test_a_transpose_whose_value_leaves_the_island_stays():
    """One transpose in, the value read by a Reshape and a graph output: nothing to gain."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=_TO_NCHW),
             helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    model = _model(nodes, [_init("shape", np.array([0, -1], np.int64))], [_out("y", 2)])
    assert sink_transposes(model) is model


def test_a_carried_value_read_outside_is_transposed_once_under_its_name():
    """The relu's output feeds both a cancelling transpose and a graph output: the rewrite keeps
    one transpose for the output, removes two, and both outputs stay what they were."""
    conv, weight = _conv("conv", "x_nchw", 3, 3, "c")
    nodes = [helper.make_node("Transpose", ["x"], ["x_nchw"], perm=_TO_NCHW), conv,
             helper.make_node("Transpose", ["c"], ["c_nhwc"], perm=_TO_NHWC),
             helper.make_node("Relu", ["c_nhwc"], ["r"]),
             helper.make_node("Transpose", ["r"], ["back"], perm=_TO_NCHW),
             helper.make_node("Neg", ["back"], ["y"])]
    inputs = None
    model = _model(nodes, [weight], [_out("y"), _out("r")], inputs=inputs)
    rewritten = sink_transposes(model)
    assert _transposes(rewritten) == 2
    x = _RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    for got, want in zip(_run(rewritten, x), _run(model, x)):
        np.testing.assert_array_equal(got, want)


def test_a_value_an_if_branch_reads_is_kept_as_written():
    conv, weight = _conv("conv", "x_nchw", 3, 3, "c")
    branch = helper.make_graph([helper.make_node("Identity", ["r"], ["out"])], "b", [],
                               [_out("out")])
    nodes = [helper.make_node("Transpose", ["x"], ["x_nchw"], perm=_TO_NCHW), conv,
             helper.make_node("Transpose", ["c"], ["c_nhwc"], perm=_TO_NHWC),
             helper.make_node("Relu", ["c_nhwc"], ["r"]),
             helper.make_node("Transpose", ["r"], ["back"], perm=_TO_NCHW),
             helper.make_node("ReduceSum", ["back"], ["total"], keepdims=0),
             helper.make_node("Greater", ["total", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=branch, else_branch=branch)]
    model = _model(nodes, [weight, _init("zero", np.float32(0))], [_out("y")])
    rewritten = sink_transposes(model)
    x = _RNG.standard_normal((1, 8, 8, 3)).astype(np.float32)
    np.testing.assert_array_equal(_run(rewritten, x)[0], _run(model, x)[0])
    assert "r" in {o for node in rewritten.graph.node for o in node.output}


def test_concat_of_two_transposed_branches_concatenates_on_the_moved_axis():
    conv1, w1 = _conv("conv1", "x_nchw", 3, 2, "a")
    conv2, w2 = _conv("conv2", "x_nchw", 3, 5, "b")
    conv3, w3 = _conv("conv3", "cat_nchw", 7, 2, "y")
    nodes = [helper.make_node("Transpose", ["x"], ["x_nchw"], perm=_TO_NCHW), conv1, conv2,
             helper.make_node("Transpose", ["a"], ["a_nhwc"], perm=_TO_NHWC),
             helper.make_node("Transpose", ["b"], ["b_nhwc"], perm=_TO_NHWC),
             helper.make_node("Concat", ["a_nhwc", "b_nhwc"], ["cat"], axis=-1),
             helper.make_node("Transpose", ["cat"], ["cat_nchw"], perm=_TO_NCHW), conv3]
    model = _model(nodes, [w1, w2, w3], [_out("y")])
    rewritten = sink_transposes(model)
    assert _transposes(rewritten) == 1
    x = _RNG.standard_normal((2, 8, 8, 3)).astype(np.float32)
    np.testing.assert_allclose(_run(rewritten, x)[0], _run(model, x)[0], rtol=1e-6)
