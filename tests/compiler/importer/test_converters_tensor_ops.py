"""edgec's converters for tensor ops TVM has none for (converters/tensor_ops.py): each compiled
once with symbolic dims (the symbolic plan), run at the sample shapes and at one it did not see,
and compared with onnxruntime."""

import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import edgec
from edgec import runtime
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.errors import ModelError
from edgec.stages.plan import PlanSettings


def _model(node, inputs, outputs, opset=26):
    graph = h.make_graph([node], "g", inputs, outputs)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 13
    return model


def _check(model, samples, unseen=(), rtol=1e-5, atol=1e-5, reference=None):
    """Compile ``model`` on ``samples`` as one symbolic program and compare every output with
    onnxruntime's (or ``reference(feed)``'s, a list) on each sample and on the ``unseen`` feeds."""
    compiled = edgec.compile(from_proto(model, "case"), [Sample(f"s{k}", s) for k, s in enumerate(samples)],
                             settings=edgec.CompileSettings(plan=PlanSettings("symbolic")))
    if reference is None:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        reference = lambda feed: session.run(None, feed)  # noqa: E731
    names = [o.name for o in model.graph.output]
    with tempfile.TemporaryDirectory() as tmp:
        loaded = runtime.load(compiled.artifact.save(Path(tmp) / "case.edgec"))
        for feed in [*samples, *unseen]:
            got = loaded.run(feed)
            for name, want in zip(names, reference(feed)):
                value = np.asarray(got[name])
                assert value.dtype == want.dtype and value.shape == want.shape, name
                if want.dtype.kind == "f":
                    np.testing.assert_allclose(value, want, rtol=rtol, atol=atol, err_msg=name)
                else:
                    np.testing.assert_array_equal(value, want, err_msg=name)


def _rng(seed=0):
    return np.random.default_rng(seed)


# BitCast ------------------------------------------------------------------------------------

@pytest.mark.parametrize("source, target", [(T.FLOAT, T.INT32), (T.INT32, T.FLOAT), (T.DOUBLE, T.INT64),
                                            (T.UINT16, T.INT16), (T.INT8, T.UINT8), (T.FLOAT16, T.UINT16)])
def test_bitcast_reads_the_bytes_as_the_other_type(source, target):
    from onnx.helper import tensor_dtype_to_np_dtype

    node = h.make_node("BitCast", ["x"], ["y"], to=target)
    model = _model(node, [h.make_tensor_value_info("x", source, ["batch", 3])],
                   [h.make_tensor_value_info("y", target, ["batch", 3])])
    dtype = tensor_dtype_to_np_dtype(source)
    values = lambda n: (_rng(n).standard_normal((n, 3)) * 100).astype(dtype)  # noqa: E731
    _check(model, [{"x": values(2)}, {"x": values(4)}], unseen=[{"x": values(5)}])


def test_bitcast_between_widths_is_a_one_line_error():
    node = h.make_node("BitCast", ["x"], ["y"], to=T.INT64, name="cast")
    model = _model(node, [h.make_tensor_value_info("x", T.FLOAT, [2])],
                   [h.make_tensor_value_info("y", T.INT64, [2])])
    with pytest.raises(ModelError, match="BitCast needs types of one bit width"):
        edgec.compile(from_proto(model, "case"), [Sample("s", {"x": np.zeros(2, np.float32)})])


# Col2Im -------------------------------------------------------------------------------------

def _constant(name, value):
    from onnx import numpy_helper

    return h.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.int64)))


@pytest.mark.parametrize("image, block, attrs", [
    ([6, 7], [2, 3], {"strides": [2, 1], "pads": [1, 0, 0, 2], "dilations": [2, 1]}),
    ([5, 5], [3, 3], {"strides": [2, 2]}),
    ([3, 4, 5], [1, 2, 3], {"pads": [0, 1, 0, 0, 0, 1]}),
])
def test_col2im_sums_the_blocks_back_into_the_image(image, block, attrs):
    spatial = len(image)
    pads = attrs.get("pads", [0] * 2 * spatial)
    strides, dilations = attrs.get("strides", [1] * spatial), attrs.get("dilations", [1] * spatial)
    length = int(np.prod([(image[d] + pads[d] + pads[d + spatial] - dilations[d] * (block[d] - 1) - 1)
                          // strides[d] + 1 for d in range(spatial)]))
    kernel = int(np.prod(block))
    graph = h.make_graph([_constant("image", image), _constant("block", block),
                          h.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, ["batch", 2 * kernel, length])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["batch", 2, *image])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 8
    x = lambda n: _rng(n).standard_normal((n, 2 * kernel, length)).astype(np.float32)  # noqa: E731
    _check(model, [{"x": x(1)}, {"x": x(3)}], unseen=[{"x": x(2)}])


def test_col2im_of_an_image_shape_read_from_another_inputs_dims():
    """nn.Fold with the output size of a tensor: image_shape is Shape(ref)[2:], symbolic."""
    graph = h.make_graph([h.make_node("Shape", ["ref"], ["image"], start=2), _constant("block", [2, 2]),
                          h.make_node("Col2Im", ["x", "image", "block"], ["y"], strides=[2, 2])], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, ["n", 8, "blocks"]),
                          h.make_tensor_value_info("ref", T.FLOAT, ["n", 1, "height", "width"])],
                         [h.make_tensor_value_info("y", T.FLOAT, ["n", 2, "height", "width"])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 8

    def feed(n, height, width):
        x = _rng(n).standard_normal((n, 8, (height // 2) * (width // 2))).astype(np.float32)
        return {"x": x, "ref": np.zeros((n, 1, height, width), np.float32)}

    _check(model, [feed(1, 4, 6), feed(2, 6, 4)], unseen=[feed(3, 8, 8)])


def test_col2im_with_an_image_shape_known_only_at_run_time_is_a_one_line_error():
    graph = h.make_graph([h.make_node("Col2Im", ["x", "image", "block"], ["y"], name="c2i")], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 9]),
                          h.make_tensor_value_info("image", T.INT64, [2]),
                          h.make_tensor_value_info("block", T.INT64, [2])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 1, 4, 4])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 8
    samples = [Sample(f"s{k}", {"x": np.zeros((1, 4, 9), np.float32), "image": np.array([4, 4 + k]),
                                "block": np.array([2, 2])}) for k in range(2)]
    with pytest.raises(ModelError, match="image_shape must be known at compile time"):
        edgec.compile(from_proto(model, "case"), samples)


# DeformConv ---------------------------------------------------------------------------------

@pytest.mark.parametrize("with_mask, attrs", [
    (True, {"group": 2, "offset_group": 2, "strides": [2, 1], "pads": [1, 0, 2, 1], "dilations": [1, 2]}),
    (False, {"pads": [1, 1, 1, 1]}),
])
def test_deform_conv_samples_at_the_offsets(with_mask, attrs):
    """Symbolic batch and image dims; offsets large enough to sample outside the image."""
    from onnx import numpy_helper

    channels, out_channels, kernel = 4, 6, (3, 2)
    group, offset_group = attrs.get("group", 1), attrs.get("offset_group", 1)
    rng = _rng(7)
    weight = rng.standard_normal((out_channels, channels // group, *kernel)).astype(np.float32)
    bias = rng.standard_normal(out_channels).astype(np.float32)
    taps = offset_group * kernel[0] * kernel[1]
    names = ["x", "w", "offset", "b"] + (["mask"] if with_mask else [])
    inputs = [h.make_tensor_value_info("x", T.FLOAT, ["batch", channels, "height", "width"]),
              h.make_tensor_value_info("offset", T.FLOAT, ["batch", 2 * taps, "oh", "ow"])]
    if with_mask:
        inputs.append(h.make_tensor_value_info("mask", T.FLOAT, ["batch", taps, "oh", "ow"]))
    output = h.make_tensor_value_info("y", T.FLOAT, ["batch", out_channels, "oh", "ow"])
    graph = h.make_graph([h.make_node("DeformConv", names, ["y"], kernel_shape=list(kernel), **attrs)], "g",
                         inputs, [output], [numpy_helper.from_array(weight, "w"),
                                            numpy_helper.from_array(bias, "b")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 22)])
    model.ir_version = 8
    strides, dilations = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    pads = attrs["pads"]

    def feed(n, height, width):
        r = _rng(n * 100 + height)
        oh = (height + pads[0] + pads[2] - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
        ow = (width + pads[1] + pads[3] - dilations[1] * (kernel[1] - 1) - 1) // strides[1] + 1
        arrays = {"x": r.standard_normal((n, channels, height, width)).astype(np.float32),
                  "offset": (r.standard_normal((n, 2 * taps, oh, ow)) * 2).astype(np.float32)}
        if with_mask:
            arrays["mask"] = r.random((n, taps, oh, ow)).astype(np.float32)
        return arrays

    _check(model, [feed(1, 5, 6), feed(2, 7, 5)], unseen=[feed(3, 6, 8)], atol=1e-4)


# TensorScatter ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, axis, with_indices", [("linear", -2, True), ("circular", 1, True),
                                                      ("linear", 2, False)])
def test_tensorscatter_writes_the_update_rows_into_the_cache(mode, axis, with_indices):
    """[batch, heads, max_seq, dim] cache, [batch, heads, seq, dim] update (axis -2 or 2), or the
    sequence on axis 1; batch and both lengths symbolic."""
    dims = ["batch", 2, "max_seq", 3] if axis != 1 else ["batch", "max_seq", 2, 3]
    update_dims = [("seq" if d == "max_seq" else d) for d in dims]
    names = ["cache", "update"] + (["write"] if with_indices else [])
    inputs = [h.make_tensor_value_info("cache", T.FLOAT, dims),
              h.make_tensor_value_info("update", T.FLOAT, update_dims)]
    if with_indices:
        inputs.append(h.make_tensor_value_info("write", T.INT64, ["batch"]))
    node = h.make_node("TensorScatter", names, ["present"], mode=mode, axis=axis)
    model = _model(node, inputs, [h.make_tensor_value_info("present", T.FLOAT, dims)], opset=24)
    seq_axis = dims.index("max_seq")

    def feed(batch, total, length):
        r = _rng(batch * 10 + total)
        shape = [{"batch": batch, "max_seq": total}.get(d, d) for d in dims]
        update_shape = list(shape)
        update_shape[seq_axis] = length
        arrays = {"cache": r.standard_normal(shape).astype(np.float32),
                  "update": r.standard_normal(update_shape).astype(np.float32)}
        if with_indices:
            top = total if mode == "circular" else total - length + 1
            arrays["write"] = r.integers(0, top, batch).astype(np.int64)
        return arrays

    _check(model, [feed(2, 6, 2), feed(3, 5, 5)], unseen=[feed(4, 7, 3)])


# Det ----------------------------------------------------------------------------------------

def _det_model(dims, elem=T.FLOAT):
    node = h.make_node("Det", ["x"], ["y"])
    return _model(node, [h.make_tensor_value_info("x", elem, dims)],
                  [h.make_tensor_value_info("y", elem, dims[:-2])], opset=22)


def test_det_of_a_symbolic_batch_of_symbolic_size():
    """Random matrices, and ones whose leading entries are zero or tiny (no LU without
    pivoting gets them right): permutations, a singular matrix, [[1e-9, 1], [1, 1]]-like."""
    model = _det_model(["batch", 2, "m", "m"])

    def feed(batch, m):
        x = _rng(batch * 10 + m).standard_normal((batch, 2, m, m)).astype(np.float32)
        x[0, 0] = np.eye(m, dtype=np.float32)[::-1]  # zeros on the diagonal: a row swap each step
        x[0, 1, :, 0] = 0  # a zero column: singular
        if m >= 2:
            x[-1, 1, 0, 0] = 1e-9
        return {"x": x}

    _check(model, [feed(1, 3), feed(2, 4)], unseen=[feed(3, 5), feed(2, 1)], rtol=1e-4, atol=1e-5)


def test_det_of_one_matrix_in_float64_needs_pivoting():
    """onnxruntime has no float64 Det: numpy's (LAPACK's LU) is the reference."""
    model = _det_model([3, 3], T.DOUBLE)
    x = np.array([[1e-12, 1.0, 2.0], [1.0, 1.0, 1.0], [3.0, 0.5, -1.0]])
    _check(model, [{"x": x}], unseen=[{"x": _rng(3).standard_normal((3, 3))}], rtol=1e-12, atol=1e-12,
           reference=lambda feed: [np.asarray(np.linalg.det(feed["x"]))])


# ReverseSequence ----------------------------------------------------------------------------

@pytest.mark.parametrize("time_axis, batch_axis", [(0, 1), (1, 0)])
def test_reversesequence_reverses_each_batch_entry_up_to_its_length(time_axis, batch_axis):
    dims = ["time", "batch", 3] if time_axis == 0 else ["batch", "time", 3]
    node = h.make_node("ReverseSequence", ["x", "lens"], ["y"], time_axis=time_axis, batch_axis=batch_axis)
    model = _model(node, [h.make_tensor_value_info("x", T.FLOAT, dims),
                          h.make_tensor_value_info("lens", T.INT64, ["batch"])],
                   [h.make_tensor_value_info("y", T.FLOAT, dims)], opset=10)

    def feed(batch, time):
        r = _rng(batch * 10 + time)
        shape = [{"time": time, "batch": batch}.get(d, d) for d in dims]
        lens = r.integers(1, time + 1, batch).astype(np.int64)
        lens[0] = time
        return {"x": r.standard_normal(shape).astype(np.float32), "lens": lens}

    _check(model, [feed(2, 4), feed(3, 6)], unseen=[feed(4, 5)])
