"""edgec's converters for ops whose TVM conversion compiled but computed something else than ONNX
(Sum of one input, IsInf's detect_* flags, SpaceToDepth CRD, Mod fmod=0 on floats, BitShift out of
range, ConvTranspose output_shape, Resize with scales/antialias/policies, NonMaxSuppression's IoU
boundary): each against ONNX's reference evaluator over several attribute combinations."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from compiler.importer.test_converters_ops import _model, _reference

from edgec.tools import conformance
from edgec.compiler.pipeline import import_model
from edgec.errors import ModelError
from edgec.core.model import from_proto

_RNG = np.random.default_rng(1234)


def _vi(name, array_or_dtype, shape=None):
    if shape is None:
        array_or_dtype, shape = array_or_dtype.dtype, array_or_dtype.shape
    return helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(np.dtype(array_or_dtype)), list(shape))


def _check(model, inputs, rtol=1e-5, atol=1e-6, signed_zeros=False):
    got = conformance.run(model, inputs)
    expected = _reference(model, inputs)
    assert len(got) == len(expected)
    for value, want in zip(got, expected):
        want = np.asarray(want)
        assert value.shape == want.shape
        if want.dtype.kind == "f":
            np.testing.assert_allclose(value, want, rtol=rtol, atol=atol, equal_nan=True)
            if signed_zeros:
                np.testing.assert_array_equal(np.signbit(value), np.signbit(want))
        else:
            np.testing.assert_array_equal(value, want)


def test_sum_of_one_input_is_that_input():
    x = _RNG.standard_normal((2, 3)).astype(np.float32)
    model = _model([helper.make_node("Sum", ["x"], ["y"], name="sum")], [_vi("x", x)],
                   [_vi("y", x)])
    _check(model, [x])


def test_sum_of_three_broadcast_inputs():
    a, b, c = (_RNG.standard_normal(s).astype(np.float32) for s in [(2, 3), (3,), (2, 1)])
    model = _model([helper.make_node("Sum", ["a", "b", "c"], ["y"], name="sum")],
                   [_vi("a", a), _vi("b", b), _vi("c", c)], [_vi("y", np.float32, (2, 3))])
    _check(model, [a, b, c])


@pytest.mark.parametrize("positive,negative", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_isinf_detect_flags(positive, negative):
    x = np.array([-np.inf, -1.5, 0.0, np.nan, 2.0, np.inf, -np.inf], np.float32)
    node = helper.make_node("IsInf", ["x"], ["y"], detect_positive=positive,
                            detect_negative=negative, name="isinf")
    model = _model([node], [_vi("x", x)], [_vi("y", np.bool_, x.shape)], opset=20)
    _check(model, [x])


@pytest.mark.parametrize("mode,block", [("DCR", 2), ("CRD", 2), ("CRD", 3)])
def test_space_to_depth_modes(mode, block):
    x = _RNG.standard_normal((2, 3, 2 * block, 3 * block)).astype(np.float32)
    node = helper.make_node("SpaceToDepth", ["x"], ["y"], blocksize=block, mode=mode, name="s2d")
    model = _model([node], [_vi("x", x)], [_vi("y", np.float32, (2, 3 * block * block, 2, 3))],
                   opset=28)
    _check(model, [x])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mod_fmod0_float_edge_cases_and_broadcast(dtype):
    inf, nan = np.inf, np.nan
    x = np.array([0, -0.0, 0, -0.0, -3, 3, -1, 1, inf, -inf, 1, 1, nan, 1, 5.5, -5.5, 5.5, -5.5],
                 dtype)
    y = np.array([-2, 2, 2, -2, inf, inf, -inf, -inf, 2, 2, 0, -0.0, 2, nan, 2, 2, -2, -2], dtype)
    model = _model([helper.make_node("Mod", ["x", "y"], ["z"], fmod=0, name="mod")],
                   [_vi("x", x), _vi("y", y)], [_vi("z", x)], opset=13)
    _check(model, [x, y], signed_zeros=True)
    a = (_RNG.standard_normal((3, 4)) * 10).astype(dtype)
    b = np.array([1.5, -2.25, 3.0, -0.5], dtype)
    model = _model([helper.make_node("Mod", ["a", "b"], ["z"], fmod=0, name="mod")],
                   [_vi("a", a), _vi("b", b)], [_vi("z", a)], opset=13)
    _check(model, [a, b])


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8])
def test_bitshift_out_of_range_shifts(direction, dtype):
    bits = np.iinfo(dtype).bits
    lo = -3 if np.iinfo(dtype).min < 0 else 0
    y = np.arange(lo, bits + 4).astype(dtype)
    x = np.resize(np.array([-8, 5, -1, 1, 100], np.int64), y.shape).astype(dtype)
    node = helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction, name="shift")
    model = _model([node], [_vi("x", x), _vi("y", y)], [_vi("z", x)], opset=28)
    _check(model, [x, y])


def _conv_transpose(spatial, with_bias, out, **attrs):
    w = _RNG.standard_normal((2, 3) + (3,) * spatial).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    names = ["x", "w"]
    if with_bias:
        inits.append(numpy_helper.from_array(_RNG.standard_normal(3).astype(np.float32), "b"))
        names.append("b")
    node = helper.make_node("ConvTranspose", names, ["y"], name="convt", **attrs)
    x_info = _vi("x", np.float32, (1, 2) + (3,) * spatial)
    return _model([node], [x_info], [_vi("y", np.float32, [1, 3] + out)], inits, opset=17)


@pytest.mark.parametrize("spatial,strides,output_shape,extra", [
    (2, [3, 2], [10, 8], {}),                                    # past what the kernels cover
    (2, [3, 2], [11, 9], {"auto_pad": "SAME_UPPER"}),            # SAME_* split negative pads
    (2, [3, 3], [10, 11], {"auto_pad": "SAME_LOWER", "bias": True}),
    (2, [2, 2], [5, 6], {"auto_pad": "SAME_UPPER"}),             # positive pads
    (2, [2, 1], [6, 4], {"auto_pad": "SAME_LOWER", "dilations": [2, 1], "bias": True}),
    (1, [3], [11], {"output_padding": [1], "bias": True}),       # bias reaches the zero rows
])
def test_conv_transpose_output_shape(spatial, strides, output_shape, extra):
    extra = dict(extra)
    with_bias = extra.pop("bias", False)
    model = _conv_transpose(spatial, with_bias, output_shape, strides=strides,
                            output_shape=output_shape, **extra)
    x = _RNG.standard_normal((1, 2) + (3,) * spatial).astype(np.float32)
    _check(model, [x], rtol=1e-4, atol=1e-5)


def test_conv_transpose_output_shape_inside_the_kernels_pads_as_the_spec_says():
    """NOTSET with a smaller output: the spec's pads, more at the start (the reference refuses)."""
    x = _RNG.standard_normal((1, 2, 3, 3)).astype(np.float32)
    shaped = _conv_transpose(2, True, [5, 6], strides=[2, 2], output_shape=[5, 6])
    padded = _conv_transpose(2, True, [5, 6], strides=[2, 2], pads=[1, 1, 1, 0])
    for init_a, init_b in zip(shaped.graph.initializer, padded.graph.initializer):
        init_b.CopyFrom(init_a)
    (y,) = conformance.run(shaped, [x])
    np.testing.assert_allclose(y, _reference(padded, [x])[0], rtol=1e-4, atol=1e-5)


_RESIZES = [
    # (input shape, scales or None, sizes or None, attributes)
    ((1, 2, 4, 6), [1, 1, 0.6, 0.7], None, {"mode": "linear"}),
    ((1, 1, 5, 7), [1, 1, 0.6, 0.8], None, {"mode": "cubic"}),
    ((1, 1, 4, 4), [1, 1, 0.8, 0.8], None, {"mode": "cubic", "cubic_coeff_a": -0.5,
                                             "exclude_outside": 1}),
    ((1, 1, 2, 4), [1, 1, 0.6, 0.6], None, {"mode": "linear",
                                             "coordinate_transformation_mode": "align_corners"}),
    ((1, 1, 4, 5), [1, 1, 0.6, 1.7], None, {"mode": "linear",
                                             "coordinate_transformation_mode": "asymmetric"}),
    ((1, 1, 5, 5), [1, 1, 0.7, 1.3], None, {"mode": "linear", "coordinate_transformation_mode":
                                             "half_pixel_symmetric"}),
    ((1, 1, 6, 7), [1, 1, 0.45, 0.6], None, {"mode": "nearest", "nearest_mode": "ceil"}),
    ((1, 1, 8, 8), [1, 1, 0.6, 0.35], None, {"mode": "linear", "antialias": 1}),
    ((1, 1, 8, 9), [1, 1, 0.5, 0.7], None, {"mode": "cubic", "antialias": 1}),
    ((1, 1, 8, 9), None, [1, 1, 3, 5], {"mode": "cubic", "antialias": 1,
                                         "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ((1, 1, 4, 6), None, [3, 3], {"mode": "nearest", "axes": [2, 3],
                                  "keep_aspect_ratio_policy": "not_larger"}),
    ((1, 1, 4, 6), None, [3, 3], {"mode": "linear", "axes": [3, 2],
                                  "keep_aspect_ratio_policy": "not_smaller"}),
    ((2, 1, 5), [1, 1, 0.5], None, {"mode": "linear"}),
    ((2, 3, 4, 4), [1, 1, 1.5, 2.0], None, {"mode": "linear"}),  # TVM's own path
]


@pytest.mark.parametrize("shape,scales,sizes,attrs", _RESIZES)
def test_resize_against_the_reference(shape, scales, sizes, attrs):
    x = _RNG.standard_normal(shape).astype(np.float32)
    inits, names = [], ["x", ""]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array(scales, np.float32), "scales"))
        names.append("scales")
    else:
        inits.append(numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        names += ["", "sizes"]
    node = helper.make_node("Resize", names, ["y"], name="resize", **attrs)
    model = _model([node], [_vi("x", x)], [_vi("y", np.float32, [None] * len(shape))], inits,
                   opset=19)
    _check(model, [x], rtol=1e-4, atol=1e-5)


def test_resize_tf_crop_and_resize_with_extrapolation():
    x = _RNG.standard_normal((1, 1, 5, 6)).astype(np.float32)
    roi = np.array([0, 0, -0.2, 0.3, 1, 1, 0.7, 1.4], np.float32)
    inits = [numpy_helper.from_array(roi, "roi"),
             numpy_helper.from_array(np.array([1, 1, 0.8, 1.5], np.float32), "scales")]
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="linear",
                            coordinate_transformation_mode="tf_crop_and_resize",
                            extrapolation_value=7.0, name="resize")
    model = _model([node], [_vi("x", x)], [_vi("y", np.float32, [1, 1, 4, 9])], inits, opset=19)
    _check(model, [x], rtol=1e-4, atol=1e-5)


def _nms_model(iou_threshold):
    inits = [numpy_helper.from_array(np.array([3], np.int64), "max"),
             numpy_helper.from_array(np.array([iou_threshold], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.0], np.float32), "score")]
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max", "iou", "score"],
                            ["sel"], name="nms")
    inputs = [_vi("boxes", np.float32, [1, 6, 4]), _vi("scores", np.float32, [1, 2, 6])]
    return _model([node], inputs,
                  [_vi("sel", np.int64, [None, 3])], inits, opset=11)


@pytest.mark.parametrize("iou_threshold", [np.float32(1 / 7), 0.3, 0.0])
def test_nms_keeps_a_box_whose_iou_equals_the_threshold(iou_threshold):
    boxes = np.array([[[0, 0, 1, 1], [0.5, 0.5, 1.5, 1.5], [0, 0, 1, 1.2], [3, 3, 4, 4],
                       [3.2, 3.1, 4.1, 4.2], [10, 10, 11, 11]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7, 0.6, 0.5, 0.4], [0.1, 0.9, 0.3, 0.8, 0.2, 0.05]]],
                      np.float32)
    _check(_nms_model(iou_threshold), [boxes, scores])


def test_nms_with_a_runtime_iou_threshold_is_a_clear_error():
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max", "iou"], ["sel"],
                            name="nms")
    model = _model([node], [_vi("boxes", np.float32, [1, 2, 4]),
                            _vi("scores", np.float32, [1, 1, 2]),
                            _vi("max", np.int64, [1]), _vi("iou", np.float32, [1])],
                   [_vi("sel", np.int64, [None, 3])], opset=11)
    with pytest.raises(ModelError, match="iou_threshold must be known at compile time"):
        import_model(from_proto(model))


def _detector_nms_model(center_point_box, score_threshold):
    """A detector's batched NMS: boxes of a run-time count, "no limit" written as INT64_MAX (what
    torchvision exports), a score threshold or none."""
    inits = [numpy_helper.from_array(np.array([2**63 - 1], np.int64), "max"),
             numpy_helper.from_array(np.array([0.45], np.float32), "iou")]
    names = ["boxes", "scores", "max", "iou"]
    if score_threshold is not None:
        inits.append(numpy_helper.from_array(np.array([score_threshold], np.float32), "score"))
        names.append("score")
    node = helper.make_node("NonMaxSuppression", names, ["sel"], name="nms",
                            center_point_box=center_point_box)
    inputs = [_vi("boxes", np.float32, [1, "n", 4]), _vi("scores", np.float32, [1, 3, "n"])]
    return _model([node], inputs, [_vi("sel", np.int64, [None, 3])], inits, opset=11)


def _boxes(n, seed):
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 8, (1, n, 2)).astype(np.float32)
    size = rng.uniform(0.5, 3, (1, n, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + size], axis=2)
    boxes[0, ::4] = boxes[0, ::4][:, [2, 3, 0, 1]]  # corners in either order
    scores = rng.permutation(3 * n).reshape(1, 3, n).astype(np.float32) / (3 * n)
    return boxes, scores


def _detector_boxes(n, seed):
    """``n`` boxes as a detector's batched NMS hands them over: each class's boxes shifted apart
    (so only boxes of one class can overlap, and most are kept), a few with NaN corners."""
    boxes, scores = _boxes(n, seed)
    boxes += (np.arange(n) % 7 * 20.0).astype(np.float32)[None, :, None]
    boxes[0, 5] = np.nan
    boxes[0, 9, 3] = np.nan
    return boxes, scores


def _compiled_for(model, samples, path):
    """``model`` compiled by the driver for ``samples`` (one program), loaded from ``path``."""
    from edgec import runtime
    from edgec.core.samples import Sample
    from edgec.driver import compile as compile_model

    artifact = compile_model(from_proto(model, path.stem),
                             [Sample(f"s{k}", s) for k, s in enumerate(samples)]).artifact
    return runtime.load(artifact.save(path))


@pytest.mark.parametrize("center_point_box,score_threshold", [(0, 0.2), (1, 0.2), (0, None)])
def test_nms_over_a_run_time_box_count_matches_onnx(center_point_box, score_threshold, tmp_path):
    """One program for every box count (edgec's CPU kernel): counts seen when profiling and one
    never seen, against ONNX's reference."""
    model = _detector_nms_model(center_point_box, score_threshold)
    samples = [dict(zip(("boxes", "scores"), _boxes(n, n))) for n in (12, 30)]
    compiled = _compiled_for(model, samples, tmp_path / "nms.edgec")
    unseen = [_boxes(1, 100), _boxes(45, 144), _detector_boxes(700, 7)]
    for arrays in samples + [dict(zip(("boxes", "scores"), pair)) for pair in unseen]:
        want = _reference(model, [arrays["boxes"], arrays["scores"]])[0]
        np.testing.assert_array_equal(compiled.run(arrays)["sel"], want)
    assert "edgec_nms" in import_model(from_proto(model)).script()


def test_nms_in_a_top_level_if_then_cut_and_gathered_after_it(tmp_path):
    """torchvision's batched NMS: ``If(boxes empty) then [] else NMS(...)[:, 2]``, its result cut
    to at most 5 and used to gather boxes after the If. The top-level If must not land inside
    a dataflow block (FuseOps failed: "it_creator != group2func_")."""
    consts = {"max": np.array([2**63 - 1], np.int64), "iou": np.array([0.45], np.float32),
              "score": np.array([0.2], np.float32), "two": np.array([2], np.int64),
              "one": np.array([1], np.int64), "zero": np.array([0], np.int64),
              "cap": np.array([5], np.int64), "none": np.zeros([0], np.int64)}
    nms = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["boxes", "scores", "max", "iou", "score"], ["sel"]),
         helper.make_node("Gather", ["sel", "two"], ["col"], axis=1),
         helper.make_node("Squeeze", ["col", "one"], ["keep"])],
        "nms", [], [_vi("keep", np.int64, ["k"])])
    empty = helper.make_graph([helper.make_node("Identity", ["none"], ["nothing"])], "empty", [],
                              [_vi("nothing", np.int64, ["k"])])
    nodes = [helper.make_node("Shape", ["boxes"], ["shape"]),
             helper.make_node("ReduceProd", ["shape"], ["numel"], keepdims=0),
             helper.make_node("Equal", ["numel", "zero"], ["is_empty"]),
             helper.make_node("If", ["is_empty"], ["kept"], then_branch=empty, else_branch=nms),
             helper.make_node("Slice", ["kept", "zero", "cap"], ["top"]),
             helper.make_node("Squeeze", ["boxes", "zero"], ["flat"]),
             helper.make_node("Gather", ["flat", "top"], ["picked"], axis=0)]
    model = _model(nodes, [_vi("boxes", np.float32, [1, "n", 4]), _vi("scores", np.float32, [1, 3, "n"])],
                   [_vi("picked", np.float32, ["m", 4])],
                   [numpy_helper.from_array(v, k) for k, v in consts.items()], opset=13)
    samples = [dict(zip(("boxes", "scores"), _boxes(n, n))) for n in (12, 30)]
    compiled = _compiled_for(model, samples, tmp_path / "nms_if.edgec")
    for arrays in samples + [dict(zip(("boxes", "scores"), _boxes(n, 7 + n))) for n in (2, 41)]:
        want = _reference(model, [arrays["boxes"], arrays["scores"]])[0]
        np.testing.assert_array_equal(compiled.run(arrays)["picked"], want)


def test_resize_that_tvm_computes_right_stays_one_resize2d():
    x_info = _vi("x", np.float32, (1, 2, 4, 4))
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", name="resize")
    model = _model([node], [x_info], [_vi("y", np.float32, (1, 2, 8, 8))],
                   [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
                   opset=19)
    assert "image.resize2d" in import_model(from_proto(model)).script()


def test_constant_of_shape_with_a_shape_computed_at_run_time():
    """Zeros [batch, 5] built from the input's shape, as exported models build initial states."""
    x = _RNG.standard_normal((2, 4, 3)).astype(np.float32)
    one, hidden = (numpy_helper.from_array(np.array([v], np.int64), n) for v, n in ((1, "one"), (5, "h")))
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["b"]),
             helper.make_node("Concat", ["b", "h"], ["shape"], axis=0),
             helper.make_node("ConstantOfShape", ["shape"], ["z"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5])),
             helper.make_node("ReduceSum", ["x", "axes"], ["r"], keepdims=0),
             helper.make_node("MatMul", ["r", "w"], ["p"]),
             helper.make_node("Add", ["z", "p"], ["y"])]
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    w = numpy_helper.from_array(_RNG.standard_normal((3, 5)).astype(np.float32), "w")
    model = _model(nodes, [_vi("x", np.float32, ["a", "b", 3])], [_vi("y", np.float32, ["b", 5])],
                   initializers=[one, hidden, axes, w])
    _check(model, [x])


@pytest.mark.parametrize("op", ["Conv", "MatMul"])
def test_reduction_of_extent_one_keeps_its_epilogue_once(op):
    """A 1x1 conv or a matmul over K=1 (TVM kernels: the weight is an input, not a constant)
    fused with an elementwise epilogue: the schedule must not apply the epilogue twice."""
    rng = np.random.default_rng(7)
    if op == "Conv":
        x, w = rng.standard_normal((1, 1, 5, 5)), rng.standard_normal((3, 1, 1, 1))
        out = (1, 3, 5, 5)
    else:
        x, w = rng.standard_normal((6, 1)), rng.standard_normal((1, 4))
        out = (6, 4)
    x, w = x.astype(np.float32), w.astype(np.float32)
    one = numpy_helper.from_array(np.array(1.5, np.float32), "one")
    nodes = [helper.make_node(op, ["x", "w"], ["p"]), helper.make_node("Add", ["p", "one"], ["y"])]
    model = _model(nodes, [_vi("x", x), _vi("w", w)], [_vi("y", np.float32, out)], initializers=[one])
    _check(model, [x, w])


def test_matmul_of_activations_with_an_epilogue_is_vectorized():
    """Attention's ``softmax(..) @ v + x`` (both matmul operands computed, a residual epilogue):
    the schedule rule vectorizes the reduction block and the epilogue apart instead of leaving
    the whole kernel as TVM's scalar loops; the result still matches onnxruntime."""
    import tvm
    from tvm import te, topi

    from edgec.compiler.transform.schedules import SimpleKernel

    m = tvm.tirx.Var("m", "int64")
    a, b, c = (te.placeholder(shape, "float32", name)
               for shape, name in [((m, m), "a"), ((m, 32), "b"), ((m, 32), "c")])
    out = topi.add(topi.matmul(a, b), c)
    func = te.create_prim_func([a, b, c, out])
    scheduled = SimpleKernel(parallel=False).apply(func, tvm.target.Target("llvm"), False)
    assert scheduled is not None
    assert scheduled.mod.script().count("T.vectorized(") == 2  # the matmul's and the add's

    rng = np.random.default_rng(8)
    x, y, z = (rng.standard_normal(shape).astype(np.float32) for shape in [(5, 5), (5, 32), (5, 32)])
    nodes = [helper.make_node("MatMul", ["x", "y"], ["p"]), helper.make_node("Add", ["p", "z"], ["o"])]
    model = _model(nodes, [_vi("x", np.float32, ["n", "n"]), _vi("y", np.float32, ["n", 32]),
                           _vi("z", np.float32, ["n", 32])], [_vi("o", np.float32, ["n", 32])])
    _check(model, [x, y, z])


def _q(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinearconv_per_channel_weights_with_bias_and_padding(dtype):
    rng = np.random.default_rng(11)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, (1, 3, 6, 6), endpoint=True).astype(dtype)
    w = rng.integers(info.min, info.max, (4, 3, 3, 3), endpoint=True).astype(dtype)
    inits = [_q("xs", np.float32(0.02)), _q("xz", dtype(7)), _q("w", w),
             _q("ws", rng.uniform(0.001, 0.01, 4).astype(np.float32)),
             _q("wz", np.zeros(4, dtype)), _q("ys", np.float32(0.05)), _q("yz", dtype(3)),
             _q("b", rng.integers(-500, 500, 4).astype(np.int32))]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                            ["y"], pads=[1, 1, 1, 1], strides=[2, 2])
    model = _model([node], [_vi("x", x)], [_vi("y", dtype, (1, 4, 3, 3))], initializers=inits)
    _check(model, [x])


def test_qlinearmatmul_per_row_and_per_column_scales():
    rng = np.random.default_rng(12)
    a = rng.integers(0, 255, (2, 5, 8), endpoint=True).astype(np.uint8)
    b = rng.integers(-128, 127, (8, 6), endpoint=True).astype(np.int8)
    inits = [_q("as", np.float32(0.03)), _q("az", np.uint8(120)), _q("b", b),
             _q("bs", rng.uniform(0.01, 0.05, 6).astype(np.float32)), _q("bz", np.zeros(6, np.int8)),
             _q("ys", np.float32(0.2)), _q("yz", np.uint8(128))]
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    model = _model([node], [_vi("a", a)], [_vi("y", np.uint8, (2, 5, 6))], initializers=inits)
    _check(model, [a])


def test_convinteger_per_channel_weight_zero_points():
    rng = np.random.default_rng(13)
    x = rng.integers(0, 255, (1, 2, 5, 5), endpoint=True).astype(np.uint8)
    w = rng.integers(0, 255, (3, 2, 2, 2), endpoint=True).astype(np.uint8)
    inits = [_q("w", w), _q("xz", np.uint8(100)), _q("wz", np.array([3, 128, 250], np.uint8))]
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[0, 1, 0, 1])
    model = _model([node], [_vi("x", x)], [_vi("y", np.int32, (1, 3, 4, 6))], initializers=inits)
    _check(model, [x])


def test_min_of_a_scalar_and_a_scalar_constant():
    """Min(ReduceMin(x), 0): the importer broadcasts the 0-d constant to shape (); folding it
    must keep it 0-d (np.ascontiguousarray made it 1-d and the stack failed to type)."""
    x = _RNG.standard_normal((3, 4)).astype(np.float32) + 2
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [helper.make_node("ReduceMin", ["x"], ["r"], keepdims=0),
             helper.make_node("Min", ["r", "zero"], ["y"])]
    model = _model(nodes, [_vi("x", x)], [_vi("y", np.float32, ())], initializers=[zero])
    _check(model, [x])
