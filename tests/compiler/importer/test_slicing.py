"""ONNX Slice with constant bounds on symbolic axes (edgec's converter, converters/slicing.py)
and Squeeze of an axis the importer cannot prove to be 1: the extents are plain expressions of
the dim, checked at IR level, and small models match onnxruntime on the symbolic module."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from edgec.compiler.pipeline import import_model
from edgec.core.model import from_proto
from tests.compiler.importer.test_converters_control_flow import check, model, vi

F = TensorProto.FLOAT
INT32_MAX, INT64_MAX = 2**31 - 1, 2**63 - 1


def slice_model(starts, ends, axes=None, steps=None, shape=("seq", "batch", 8), squeeze=None):
    """y[shape] -> Slice(starts, ends, axes, steps) [-> Squeeze(squeeze)] -> out."""
    inits = [numpy_helper.from_array(np.array(starts, np.int64), "starts"),
             numpy_helper.from_array(np.array(ends, np.int64), "ends")]
    names = ["y", "starts", "ends"]
    if axes is not None or steps is not None:
        inits.append(numpy_helper.from_array(np.array(axes if axes is not None
                                                      else range(len(starts)), np.int64), "axes"))
        names.append("axes")
    if steps is not None:
        inits.append(numpy_helper.from_array(np.array(steps, np.int64), "steps"))
        names.append("steps")
    nodes = [helper.make_node("Slice", names, ["sliced" if squeeze is not None else "out"])]
    if squeeze is not None:
        inits.append(numpy_helper.from_array(np.array(squeeze, np.int64), "sq"))
        nodes.append(helper.make_node("Squeeze", ["sliced", "sq"], ["out"]))
    rank = len(shape) - len(squeeze or [])
    return model(nodes, [vi("y", F, list(shape))], [vi("out", F, [None] * rank)], inits)


def out_shape(proto) -> list[str]:
    """The output dims of the imported ``main`` as text."""
    mod = import_model(from_proto(proto, "slicing"))
    return [re.sub(r"T\.int64\((-?\d+)\)", r"\1", str(d)) for d in mod["main"].ret_ty.shape.values]


def feed(*shape: int, seed: int = 0):
    return {"y": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("starts, ends, extent", [
    ([-1], [INT32_MAX], "1"),          # tf2onnx's last step
    ([-1], [INT64_MAX], "1"),          # PyTorch's x[-1:]
    ([0], [-1], "seq - 1"),            # x[:-1]
    ([1], [INT64_MAX], "seq - 1"),     # x[1:]
    ([-3], [-1], "2"),                 # x[-3:-1]
])
def test_symbolic_axis_has_a_plain_extent(starts, ends, extent):
    assert out_shape(slice_model(starts, ends, axes=[0])) == [extent, "batch", "8"]


def test_last_step_squeezes():
    """Slice(-1:INT32_MAX) then Squeeze(0), as tf2onnx writes a Keras LSTM's last step."""
    proto = slice_model([-1], [INT32_MAX], axes=[0], squeeze=[0])
    assert out_shape(proto) == ["batch", "8"]
    check(proto, feed(4, 1, 8), feed(9, 2, 8, seed=1), forms=(True,))


def test_positive_end_keeps_onnx_clamp_and_squeeze_checks_it():
    """x[0:1] on a symbolic axis: the end stays clamped (x[:5] on a shorter input is ONNX's
    shorter slice), and Squeeze casts the extent to 1, which the VM checks."""
    assert out_shape(slice_model([0], [5], axes=[0])) == ["T.min(5, seq)", "batch", "8"]
    proto = slice_model([0], [1], axes=[0], squeeze=[0])
    assert out_shape(proto) == ["batch", "8"]
    check(proto, feed(3, 2, 8), forms=(True,))
    check(slice_model([0], [5], axes=[0]), feed(3, 2, 8), feed(7, 2, 8), forms=(True,))


def test_static_axes_keep_onnx_semantics():
    """Static axes clamp as ONNX does, next to a symbolic one; all-static slices stay TVM's."""
    proto = slice_model([-1, -100, 1], [INT64_MAX, 100, -1], axes=[0, 1, 2], shape=("seq", 3, 8))
    assert out_shape(proto) == ["1", "3", "6"]
    check(proto, feed(5, 3, 8), forms=(True,))
    static = slice_model([-1, 7], [INT64_MAX, 1], axes=[0, 2], steps=[1, -2], shape=(4, 3, 8))
    check(static, feed(4, 3, 8), forms=(True,))


def test_steps_other_than_one():
    """A step other than 1 on a symbolic axis is TVM's clamping slice; a static axis with a
    positive step is exact."""
    proto = slice_model([0, 1], [INT64_MAX, 8], axes=[0, 2], steps=[2, 3])
    check(proto, feed(5, 1, 8), feed(6, 2, 8), forms=(True,))
    reverse = slice_model([-1, -1], [-INT64_MAX, 0], axes=[0, 2], steps=[-1, -2])
    check(reverse, feed(5, 1, 8), forms=(True,))


@pytest.mark.parametrize("starts, ends", [([-1], [INT32_MAX]), ([0], [-1]), ([1], [INT64_MAX]),
                                          ([-3], [-1])])
def test_symbolic_slices_match_onnxruntime(starts, ends):
    proto = slice_model(starts, ends, axes=[0])
    check(proto, feed(4, 1, 8), feed(9, 2, 8, seed=1), forms=(True,))


def test_sliced_extents_unify():
    """wav2vec2's x[:, :, :-1] meets a tensor of the same extent: y[..., :-1] + y[..., 1:] has
    the extent n - 1, not two min/max expressions an Add cannot match."""
    nodes = [helper.make_node("Slice", ["y", "zero", "minus1", "a"], ["head"]),
             helper.make_node("Slice", ["y", "one", "end", "a"], ["tail"]),
             helper.make_node("Add", ["head", "tail"], ["out"])]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("zero", [0]), ("minus1", [-1]), ("one", [1]), ("end", [INT64_MAX]), ("a", [2]))]
    proto = model(nodes, [vi("y", F, [1, 4, "n"])], [vi("out", F, [1, 4, None])], inits)
    assert out_shape(proto) == ["1", "4", "n - 1"]
    check(proto, {"y": feed(1, 4, 7)["y"]}, {"y": feed(1, 4, 3)["y"]}, forms=(True,))


def test_squeeze_of_a_provable_unit_axis_needs_no_cast():
    proto = slice_model([-1], [INT32_MAX], axes=[0], squeeze=[0])
    mod = import_model(from_proto(proto, "slicing"))
    assert "match_cast" not in mod.script()
