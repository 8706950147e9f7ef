"""The library offload's three module passes, each on a small Relax module written in TVMScript
and compared with the module it should become (IR only: nothing is compiled)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm.script import ir as I, relax as R, tirx as T

from edgec.compiler.transform.library_offload import (
    FLAG_RELU, Canonicalize, DispatchRules, DispatchStats, Offload, PropagateLayout,
    dispatch_with_stats, weight_id)

_RNG = np.random.default_rng(0)
W = _RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)  # OIHW, 4 -> 8 channels
BIAS = _RNG.standard_normal(8).astype(np.float32)
GAMMA, BETA, MEAN = (_RNG.uniform(-1, 1, 8).astype(np.float32) for _ in range(3))
VAR = _RNG.uniform(0.5, 1.5, 8).astype(np.float32)
W16 = _RNG.standard_normal((16, 16, 3, 3)).astype(np.float32)
B16 = _RNG.standard_normal(16).astype(np.float32)
DENSE = _RNG.standard_normal((16, 32)).astype(np.float32)
W32 = _RNG.standard_normal((32, 16, 1, 1)).astype(np.float32)


def _bn_scale_shift() -> tuple[np.ndarray, np.ndarray]:
    """Inference batch norm as x * scale + shift, computed as the pass does (float64)."""
    factor = GAMMA.astype(np.float64) / np.sqrt(VAR.astype(np.float64) + 1e-5)
    shift = BETA.astype(np.float64) - MEAN.astype(np.float64) * factor
    return (factor.reshape(1, 8, 1, 1).astype(np.float32),
            shift.reshape(1, 8, 1, 1).astype(np.float32))


def test_canonicalize_turns_a_batch_norm_after_a_conv_into_multiply_add():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32")) -> R.Tensor((1, 8, 8, 8), "float32"):
            with R.dataflow():
                c = R.nn.conv2d(x, R.const(W), padding=[1, 1, 1, 1])
                bn = R.nn.batch_norm(c, R.const(GAMMA), R.const(BETA), R.const(MEAN),
                                     R.const(VAR), axis=1, epsilon=1e-5, training=False)
                y = bn[0]
                R.output(y)
            return y

    scale, shift = _bn_scale_shift()

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32")) -> R.Tensor((1, 8, 8, 8), "float32"):
            with R.dataflow():
                c = R.nn.conv2d(x, R.const(W), padding=[1, 1, 1, 1])
                lv = R.multiply(c, R.const(scale))
                y = R.add(lv, R.const(shift))
                R.output(y)
            return y

    tvm.ir.assert_structural_equal(Canonicalize()(Before), Expected)


def test_canonicalize_drops_a_slice_of_everything_and_keeps_real_slices():
    """GhostNet slices each module's concat to the channels it already has: that slice is the
    identity; one that drops a channel, starts later or steps by 2 is not."""
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 8, 4, 4), "float32")):
            with R.dataflow():
                whole = R.strided_slice(x, (1,), (0,), (8,), (1,))
                again = R.strided_slice(whole, (1,), (0,), (8,))
                fewer = R.strided_slice(again, (1,), (0,), (7,), (1,))
                later = R.strided_slice(whole, (1,), (1,), (8,), (1,))
                every_other = R.strided_slice(whole, (2,), (0,), (4,), (2,))
                y = (fewer, later, every_other)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 8, 4, 4), "float32")):
            with R.dataflow():
                fewer = R.strided_slice(x, (1,), (0,), (7,), (1,))
                later = R.strided_slice(x, (1,), (1,), (8,), (1,))
                every_other = R.strided_slice(x, (2,), (0,), (4,), (2,))
                y = (fewer, later, every_other)
                R.output(y)
            return y

    tvm.ir.assert_structural_equal(Canonicalize()(Before), Expected)


def test_canonicalize_drops_the_kernel_taps_that_read_only_padding():
    """DeepLab's ASPP convolutions (dilation 24 and 36 on a 14x14 input) multiply padding with
    every tap but the centre: the same convolution as 1x1 with the centre weights, exactly. A
    dilation whose outer taps reach some input (2 on 4x4) keeps them all."""
    w = np.random.default_rng(1).standard_normal((8, 8, 3, 3)).astype(np.float32)

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 8, 4, 4), "float32")):
            with R.dataflow():
                far = R.nn.conv2d(x, R.const(w), padding=[6, 6, 6, 6], dilation=[6, 6])
                near = R.nn.conv2d(far, R.const(w), padding=[2, 2, 2, 2], dilation=[2, 2])
                R.output(near)
            return near

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 8, 4, 4), "float32")):
            with R.dataflow():
                far = R.nn.conv2d(x, R.const(w[:, :, 1:2, 1:2].copy()), padding=[0, 0, 0, 0],
                                  dilation=[6, 6])
                near = R.nn.conv2d(far, R.const(w), padding=[2, 2, 2, 2], dilation=[2, 2])
                R.output(near)
            return near

    tvm.ir.assert_structural_equal(Canonicalize()(Before), Expected)


def test_offload_makes_conv_bias_relu_one_library_call():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32")) -> R.Tensor((1, 8, 8, 8), "float32"):
            with R.dataflow():
                c = R.nn.conv2d(x, R.const(W), padding=[1, 1, 1, 1])
                b = R.add(c, R.const(BIAS.reshape(1, 8, 1, 1)))
                y = R.nn.relu(b)
                R.output(y)
            return y

    wid = weight_id(W)  # the bias folds in as is: the weight is unscaled

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32")) -> R.Tensor((1, 8, 8, 8), "float32"):
            with R.dataflow():
                # x, w, b, strides, padding (t, l, b, r), dilation, groups, flags, weight id
                y = R.call_dps_packed(
                    "edgec_dnnl_conv2d",
                    (x, R.const(W), R.const(BIAS), 1, 1, 1, 1, 1, 1, 1, 1, 1, FLAG_RELU, wid),
                    out_ty=R.Tensor((1, 8, 8, 8), "float32"))
                R.output(y)
            return y

    stats = DispatchStats()
    after = Offload(DispatchRules(), stats)(Before)
    tvm.ir.assert_structural_equal(after, Expected)
    assert stats.calls == {"edgec_dnnl_conv2d": 1}


@I.ir_module
class _TinyDense:
    @R.function
    def main(x: R.Tensor((1, 16), "float32")) -> R.Tensor((1, 32), "float32"):
        with R.dataflow():
            y = R.matmul(x, R.const(DENSE))
            R.output(y)
        return y


def test_offload_leaves_a_matmul_below_the_tiny_threshold_a_matmul():
    # 1 x 16 x 32 = 512 multiply-adds: fewer than a library call costs (dense_min_macs 4096).
    stats = DispatchStats()
    tvm.ir.assert_structural_equal(Offload(DispatchRules(), stats)(_TinyDense), _TinyDense)
    assert stats.calls == {}

    # Without the threshold (quantized builds) the same matmul is a library call.
    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 16), "float32")) -> R.Tensor((1, 32), "float32"):
            with R.dataflow():
                y = R.call_dps_packed(
                    "edgec_dnnl_dense",
                    (x, R.const(DENSE), R.const(np.zeros(32, np.float32)), 0, weight_id(DENSE)),
                    out_ty=R.Tensor((1, 32), "float32"))
                R.output(y)
            return y

    every = Offload(DispatchRules(dense_min_macs=0))(_TinyDense)
    tvm.ir.assert_structural_equal(every, Expected)


def test_propagate_layout_keeps_activations_blocked_between_two_convs():
    """conv -> relu -> conv with a residual of the NCHW input: the convs write NCHW16c, the relu
    runs on it, the residual is transformed to it, and the output back to NCHW."""
    wid = weight_id(W16)

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 16, 8, 8), "float32")) -> R.Tensor((1, 16, 8, 8), "float32"):
            with R.dataflow():
                c = R.call_dps_packed(
                    "edgec_dnnl_conv2d",
                    (x, R.const(W16), R.const(B16), 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, wid),
                    out_ty=R.Tensor((1, 16, 8, 8), "float32"))
                r = R.nn.relu(c)
                y = R.call_dps_packed(
                    "edgec_dnnl_conv2d_add",
                    (r, R.const(W16), R.const(B16), x, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, wid),
                    out_ty=R.Tensor((1, 16, 8, 8), "float32"))
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((1, 16, 8, 8), "float32")) -> R.Tensor((1, 16, 8, 8), "float32"):
            with R.dataflow():
                # The shim reorders the NCHW image itself: no transform before the first conv.
                c_nc16c = R.call_dps_packed(
                    "edgec_dnnl_conv2d",
                    (x, R.const(W16), R.const(B16), 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, wid),
                    out_ty=R.Tensor((1, 1, 8, 8, 16), "float32"))
                r_nc16c = R.nn.relu(c_nc16c)
                x_nc16c = R.layout_transform(
                    x, index_map=T.index_map(lambda n, c, h, w: (n, c // 16, h, w, c % 16)))
                y_nc16c = R.call_dps_packed(
                    "edgec_dnnl_conv2d_add",
                    (r_nc16c, R.const(W16), R.const(B16), x_nc16c,
                     1, 1, 1, 1, 1, 1, 1, 1, 1, 0, wid),
                    out_ty=R.Tensor((1, 1, 8, 8, 16), "float32"))
                y = R.layout_transform(
                    y_nc16c, index_map=T.index_map(lambda n, cb, h, w, c: (n, cb * 16 + c, h, w)))
                R.output(y)
            return y

    tvm.ir.assert_structural_equal(PropagateLayout(DispatchRules(block=16))(Before), Expected)
    # block 0: every tensor stays NCHW.
    tvm.ir.assert_structural_equal(PropagateLayout(DispatchRules(block=0))(Before), Before)


def _split_of_a_conv(indices) -> tvm.IRModule:
    """A conv to 32 channels split along channels at ``indices``, its two parts used."""
    wid = weight_id(W32)

    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((1, 16, 8, 8), "float32")):
            with R.dataflow():
                c = R.call_dps_packed(
                    "edgec_dnnl_conv2d",
                    (x, R.const(W32), R.const(np.zeros(32, np.float32)), 1, 1, 0, 0, 0, 0,
                     1, 1, 1, 0, wid),
                    out_ty=R.Tensor((1, 32, 8, 8), "float32"))
                s = R.split(c, indices, axis=1)
                a = s[0]
                b = s[1]
                y = R.concat((b, a), axis=1)
                R.output(y)
            return y

    return Module


def test_propagate_layout_splits_blocked_tensors_along_blocks_or_in_nhwc():
    """A channel split of a blocked tensor stays blocked: along the block axis when every part
    has whole blocks, else in NHWC with each part NHWC (ShuffleNet's halves of 24 or 58)."""
    halves = PropagateLayout(DispatchRules(block=16))(_split_of_a_conv(2))["main"]
    text = halves.script(show_meta=False)
    assert "R.split(c_nc16c, indices_or_sections=2, axis=1)" in text
    assert "R.concat((b_nc16c, a_nc16c), axis=1)" in text
    assert text.count("R.layout_transform") == 1  # the output, back to NCHW

    uneven = PropagateLayout(DispatchRules(block=16))(_split_of_a_conv([24]))["main"]
    text = uneven.script(show_meta=False)
    assert "indices_or_sections=[24], axis=4)" in text
    assert "R.concat((b_nc8c, a_nc24c), axis=4)" in text
    assert text.count("R.layout_transform") == 2  # to NHWC for the split, the output to NCHW


def test_dispatch_with_stats_is_the_three_passes_in_order_and_leaves_its_input_alone():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((1, 4, 8, 8), "float32")) -> R.Tensor((1, 8, 8, 8), "float32"):
            with R.dataflow():
                c = R.nn.conv2d(x, R.const(W), padding=[1, 1, 1, 1])
                bn = R.nn.batch_norm(c, R.const(GAMMA), R.const(BETA), R.const(MEAN),
                                     R.const(VAR), axis=1, epsilon=1e-5, training=False)
                y = R.nn.relu(bn[0])
                R.output(y)
            return y

    text = Before.script()
    rules = DispatchRules(block=8)
    out, stats = dispatch_with_stats(Before, rules)
    assert Before.script() == text
    assert stats.calls == {"edgec_dnnl_conv2d": 1}
    pipeline = tvm.transform.Sequential([Canonicalize(), Offload(rules), PropagateLayout(rules)])
    tvm.ir.assert_structural_equal(pipeline(Before), out)
    # The batch norm went into the conv; the output comes back from NCHW8c once.
    ops = [b.value.op.name for b in out["main"].body.blocks[0].bindings]
    assert ops == ["relax.call_dps_packed", "relax.layout_transform"]


@I.ir_module
class _Attention:
    @R.function
    def main(q: R.Tensor(("batch", 4, "seq", 64), "float32"),
             kt: R.Tensor(("batch", 4, 64, "seq"), "float32"),
             bias: R.Tensor((1, 4, 64, 64), "float32"),
             other: R.Tensor((2, 4, 64, 64), "float32")):
        batch, seq = T.int64(), T.int64()
        with R.dataflow():
            scores = R.matmul(q, kt)  # same batch dims: the library
            broadcast = R.matmul(bias, other)  # batch 1 against 2: stays TVM's
            R.output(scores, broadcast)
        return scores, broadcast


def test_offload_sends_an_activation_matmul_with_equal_batch_dims_to_the_library():
    @I.ir_module
    class Expected:
        @R.function
        def main(q: R.Tensor(("batch", 4, "seq", 64), "float32"),
                 kt: R.Tensor(("batch", 4, 64, "seq"), "float32"),
                 bias: R.Tensor((1, 4, 64, 64), "float32"),
                 other: R.Tensor((2, 4, 64, 64), "float32")):
            batch, seq = T.int64(), T.int64()
            with R.dataflow():
                scores = R.call_dps_packed("edgec_dnnl_batch_matmul", (q, kt),
                                           out_ty=R.Tensor((batch, 4, seq, seq), "float32"))
                broadcast = R.matmul(bias, other)
                R.output(scores, broadcast)
            return scores, broadcast

    stats = DispatchStats()
    tvm.ir.assert_structural_equal(Offload(DispatchRules(batch_matmul=True), stats)(_Attention),
                                   Expected)
    assert stats.calls == {"edgec_dnnl_batch_matmul": 1}
    # Off by default (XNNPACK has no such function), and refused there.
    tvm.ir.assert_structural_equal(Offload(DispatchRules())(_Attention), _Attention)
    with pytest.raises(ValueError, match="only the oneDNN shim"):
        DispatchRules(library="xnn", batch_matmul=True)


@I.ir_module
class _Softmaxes:
    @R.function
    def main(scores: R.Tensor(("batch", 4, "seq", "seq"), "float32"),
             rows: R.Tensor((8, 400, 3), "float32"), tiny: R.Tensor((2, 16), "float32")):
        batch, seq = T.int64(), T.int64()
        with R.dataflow():
            last = R.nn.softmax(scores, axis=-1)  # symbolic: the library
            middle = R.nn.softmax(rows, axis=1)  # 9600, along a middle axis: the library
            small = R.nn.softmax(tiny, axis=-1)  # 32 static elements: TVM's
            R.output(last, middle, small)
        return last, middle, small


def test_offload_sends_softmax_to_the_library_unless_static_and_tiny():
    @I.ir_module
    class Expected:
        @R.function
        def main(scores: R.Tensor(("batch", 4, "seq", "seq"), "float32"),
                 rows: R.Tensor((8, 400, 3), "float32"), tiny: R.Tensor((2, 16), "float32")):
            batch, seq = T.int64(), T.int64()
            with R.dataflow():
                last = R.call_dps_packed("edgec_dnnl_softmax", (scores, R.prim_value(3)),
                                         out_ty=R.Tensor((batch, 4, seq, seq), "float32"))
                middle = R.call_dps_packed("edgec_dnnl_softmax", (rows, R.prim_value(1)),
                                           out_ty=R.Tensor((8, 400, 3), "float32"))
                small = R.nn.softmax(tiny, axis=-1)
                R.output(last, middle, small)
            return last, middle, small

    stats = DispatchStats()
    tvm.ir.assert_structural_equal(Offload(DispatchRules(softmax=True), stats)(_Softmaxes),
                                   Expected)
    assert stats.calls == {"edgec_dnnl_softmax": 2}
    tvm.ir.assert_structural_equal(Offload(DispatchRules())(_Softmaxes), _Softmaxes)
    with pytest.raises(ValueError, match="only the oneDNN shim"):
        DispatchRules(library="xnn", softmax=True)


@I.ir_module
class _LayerNorms:
    @R.function
    def main(x: R.Tensor(("batch", "seq", 64), "float32"), gamma: R.Tensor((64,), "float32"),
             beta: R.Tensor((64,), "float32"), image: R.Tensor((2, 64, 8, 8), "float32")):
        batch, seq = T.int64(), T.int64()
        with R.dataflow():
            last = R.nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=1e-6)  # the library
            # over the channel axis of an image: not the last axis, stays TVM's
            channels = R.nn.layer_norm(image, gamma, beta, axes=[1])
            R.output(last, channels)
        return last, channels


def test_offload_sends_a_last_axis_layer_norm_to_the_library():
    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor(("batch", "seq", 64), "float32"), gamma: R.Tensor((64,), "float32"),
                 beta: R.Tensor((64,), "float32"), image: R.Tensor((2, 64, 8, 8), "float32")):
            batch, seq = T.int64(), T.int64()
            with R.dataflow():
                last = R.call_dps_packed(
                    "edgec_dnnl_layer_norm", (x, gamma, beta, R.prim_value(T.float64(1e-6))),
                    out_ty=R.Tensor((batch, seq, 64), "float32"))
                channels = R.nn.layer_norm(image, gamma, beta, axes=[1])
                R.output(last, channels)
            return last, channels

    stats = DispatchStats()
    tvm.ir.assert_structural_equal(Offload(DispatchRules(layer_norm=True), stats)(_LayerNorms),
                                   Expected)
    assert stats.calls == {"edgec_dnnl_layer_norm": 1}
    tvm.ir.assert_structural_equal(Offload(DispatchRules())(_LayerNorms), _LayerNorms)
    with pytest.raises(ValueError, match="only the oneDNN shim"):
        DispatchRules(library="xnn", layer_norm=True)


@I.ir_module
class _Standardizations:
    """Three standardizations over trailing axes (instance norm as TVM imports it, layer norm as
    exported before opset 17, over [H, W]) and two that are not one: a mean over a leading axis,
    and a centered tensor used again after."""

    @R.function
    def main(x: R.Tensor((1, 64, "t"), "float32"), image: R.Tensor((2, 8, 32, 32), "float32")):
        t = T.int64()
        with R.dataflow():
            m1 = R.mean(x, axis=[2], keepdims=True)
            d1 = R.subtract(x, m1)
            v1 = R.variance(x, axis=[2], keepdims=True)
            e1 = R.add(v1, R.const(1e-5, "float32"))
            s1 = R.sqrt(e1)
            instance = R.divide(d1, s1)
            m2 = R.mean(x, axis=[-1], keepdims=True)
            d2 = R.subtract(x, m2)
            p2 = R.power(d2, R.const(2.0, "float32"))
            v2 = R.mean(p2, axis=[-1], keepdims=True)
            e2 = R.add(R.const(1e-12, "float32"), v2)
            s2 = R.sqrt(e2)
            layer = R.divide(d2, s2)
            m3 = R.mean(image, axis=[2, 3], keepdims=True)
            d3 = R.subtract(image, m3)
            v3 = R.variance(image, axis=[2, 3], keepdims=True)
            e3 = R.add(v3, R.const(1e-5, "float32"))
            s3 = R.sqrt(e3)
            spatial = R.divide(d3, s3)
            m4 = R.mean(image, axis=[1], keepdims=True)
            d4 = R.subtract(image, m4)
            v4 = R.variance(image, axis=[1], keepdims=True)
            e4 = R.add(v4, R.const(1e-5, "float32"))
            s4 = R.sqrt(e4)
            leading = R.divide(d4, s4)
            m5 = R.mean(x, axis=[2], keepdims=True)
            d5 = R.subtract(x, m5)
            v5 = R.variance(x, axis=[2], keepdims=True)
            e5 = R.add(v5, R.const(1e-5, "float32"))
            s5 = R.sqrt(e5)
            reused = R.divide(d5, s5)
            again = R.add(reused, d5)
            R.output(instance, layer, spatial, leading, again)
        return instance, layer, spatial, leading, again


def test_offload_sends_standardizations_over_trailing_axes_to_the_library():
    out, stats = Offload(DispatchRules(layer_norm=True), stats := DispatchStats())(
        _Standardizations), stats
    text = out.script(show_meta=False)
    assert stats.calls == {"edgec_dnnl_standardize": 3}
    for name, source, trailing, eps in (("instance", "x", 1, 1e-5), ("layer", "x", 1, 1e-12),
                                        ("spatial", "image", 2, 1e-5)):
        found = re.search(rf'{name} = R.call_dps_packed\("edgec_dnnl_standardize", '
                          rf'\({source}, {trailing}, T.float64\(([-+.e0-9]+)\)\)', text)
        assert found and float(found.group(1)) == pytest.approx(eps, rel=1e-6), text
    for gone in ("m1", "v2", "p2", "s3"):  # steps of the three
        assert f"{gone}:" not in text
    for kept in ("m4:", "v4:", "leading: R.Tensor((2, 8, 32, 32), dtype=\"float32\") = R.divide",
                 "d5:", "reused: R.Tensor((1, 64, t), dtype=\"float32\") = R.divide"):
        assert kept in text
    tvm.ir.assert_structural_equal(Offload(DispatchRules())(_Standardizations), _Standardizations)
