"""Send a Relax program's convolutions and matmuls to a CPU library through edgec's native shims.

TVM's default CPU build applies no schedules, so its convolutions and matmuls run as naive loops
(60-80x slower than onnxruntime, TVM_NOTES.md). :func:`dispatch_to_dnnl` rewrites them, with the
ops around them that the library can fuse, into ``call_dps_packed`` calls of the functions in
``edgec/native/dnnl_shim.cc`` (oneDNN, x86) or ``edgec/native/xnnpack_shim.cc`` (XNNPACK, Arm),
as ``DispatchRules.library`` says; everything else stays with TVM. The codegen links the shim
into the model library (``edgec.compiler.native``).

The oneDNN shim's functions and their arguments (``out`` is the destination TVM allocates); the
XNNPACK shim's are ``edgec_xnn_conv2d``, ``edgec_xnn_conv2d_add`` and ``edgec_xnn_dense`` with the
same arguments, its activations NCHW or NHWC as [N, 1, H, W, C] only::

    edgec_dnnl_conv2d(x, w, b, sh, sw, pt, pl, pb, pr, dh, dw, groups, flags, wid, out)
    edgec_dnnl_conv2d_add(x, w, b, r, sh, sw, pt, pl, pb, pr, dh, dw, groups, flags, wid, out)
        out = act(conv2d(x, w) + b [+ r]); x, r, out NCHW [N, C, H, W] or blocked
        [N, C/k, H, W, k] (k = 8, 16, or C for NHWC); w OIHW, b [O]
    edgec_dnnl_dense(x[..., K], w[K, N], b[N], flags, wid, out[..., N])
        out = act(x @ w + b)
    edgec_dnnl_batch_matmul(a[*batch, M, K], b[*batch, K, N], out[*batch, M, N])
    edgec_dnnl_softmax(x, axis, out)
    edgec_dnnl_layer_norm(x[..., C], gamma[C], beta[C], epsilon, out[..., C])
    edgec_dnnl_standardize(x, k, epsilon, out)
        out = (x - mean) / sqrt(variance + epsilon) over x's last k axes
    edgec_dnnl_pool2d(x, kind, kh, kw, sh, sw, pt, pl, out)
        kind 0 max, 1 average with the padding, 2 without; x, out blocked alike
    edgec_dnnl_resize2d(x, kind, out)
        kind 0 nearest, 1 bilinear; x, out blocked alike

``flags``: FLAG_RELU applies relu last, ``activation_flags`` another activation of
``ACTIVATIONS`` (oneDNN only: clip(0, hi), sigmoid, tanh, swish, hard swish, GELU); FLAG_BF16
(oneDNN) computes in bf16 (set by ``transform.quantized`` for the layers ``--quantize bf16``
keeps there). ``wid`` identifies a constant weight by its content: the shim repacks each weight
once per id and layout, so ids are content hashes.

What :func:`dispatch_to_dnnl` does, as three module passes run in this order, each rewriting every
Relax function (``main``, the ``spec_*`` and ``generic`` copies of shape dispatch, ``If`` branches
included) and leaving its input module unchanged:

1. :func:`Canonicalize` (``canonicalize.py``), canonical forms: simple computations on constants
   are folded in numpy (the importer writes weights as ``broadcast_to``, Gemm's transposed
   weight, batch-norm parameters); inference batch norms become a multiply and an add;
   ``sum(stack([a, b]))`` (ONNX Sum) becomes ``a + b``; ``broadcast_to`` a tensor's own shape,
   inference dropout and slices of everything disappear.
2. :func:`Offload` (``match.py``), library calls: a conv2d with a constant weight takes the
   per-channel affine ops after it (folded into weight and bias), then a residual add and an
   activation (``activation.py``: the exporter's chain of scalar ops, compared numerically with
   each activation's definition); a matmul with a constant weight takes its bias and activation;
   attention's matmuls of two activations (``DispatchRules.batch_matmul``), softmax,
   last-axis layer norm and standardization over trailing axes (instance norm, layer norm
   written out) go alone (oneDNN only; tiny static ones stay TVM's). Every conv and dense
   matmul goes to the library: TVM's untuned kernels lose by 60x and more, even on a 64x64 matmul
   (measured).
3. :func:`PropagateLayout` (``layout.py``), library layout (``DispatchRules.block``): activations
   stay in the library's layout between its calls (oneDNN: blocked NCHW{b}c; XNNPACK: NHWC), and
   the TVM ops between them run in that layout too, squeeze-excite gates ([N, C, 1, 1]) included
   (see :func:`layout._block_layout`); pooling and resizing there are oneDNN's
   (``DispatchRules.pool2d``, ``resize2d``).

``analysis.py`` holds what the steps share: where each variable is bound and used, the rewriting
of groups of bindings, and small IR helpers (:func:`constant_value`,
:func:`weight_id`, which ``quantized.py`` and the importer use too).
"""

from __future__ import annotations

from typing import Callable

import tvm
from tvm import relax

from edgec.compiler.transform.library_offload.analysis import (_rewrite_function, constant_value,
                                                               weight_id)
from edgec.compiler.transform.library_offload.canonicalize import _canonical_groups
from edgec.compiler.transform.library_offload.layout import _block_layout
from edgec.compiler.transform.library_offload.match import _library_groups
from edgec.compiler.transform.library_offload.rules import (
    ACTIVATIONS, FLAG_BF16, FLAG_RELU, LIBRARIES, DispatchRules, DispatchStats, activation_flags)

__all__ = [
    "ACTIVATIONS", "FLAG_BF16", "FLAG_RELU", "LIBRARIES", "activation_flags", "DispatchRules",
    "DispatchStats", "Canonicalize", "Offload", "PropagateLayout", "dispatch_to_dnnl",
    "dispatch_with_stats", "constant_value", "weight_id",
]


def _each_function(mod: tvm.IRModule,
                   rewrite: Callable[[relax.Function], relax.Function]) -> tvm.IRModule:
    """A new module: ``mod`` with ``rewrite`` applied to each of its Relax functions."""
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            updates[gvar] = rewrite(func)
    result = tvm.IRModule(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    for gvar, func in updates.items():
        result[gvar] = func
    return result


def Canonicalize() -> tvm.transform.Pass:
    """Step 1: the canonical forms the library patterns rely on (``canonicalize.py``)."""

    def transform(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _each_function(mod, lambda func: _rewrite_function(func, _canonical_groups, mod))

    return tvm.transform.module_pass(transform, opt_level=0,
                                     name="edgec.library_offload.Canonicalize")


def Offload(rules: DispatchRules = DispatchRules(),
            stats: DispatchStats | None = None) -> tvm.transform.Pass:
    """Step 2: convolutions and matmuls, with their epilogues, into calls of ``rules.library``'s
    shim (``match.py``). Each run counts the calls it writes into ``stats`` when given."""
    stats = DispatchStats() if stats is None else stats

    def transform(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _each_function(mod, lambda func: _rewrite_function(
            func, lambda analysis: _library_groups(analysis, rules, stats), mod))

    return tvm.transform.module_pass(transform, opt_level=0, name="edgec.library_offload.Offload")


def PropagateLayout(rules: DispatchRules = DispatchRules()) -> tvm.transform.Pass:
    """Step 3: activations kept in the library's layout between its convolutions
    (``layout.py``); ``rules.block`` 0 leaves the module as it is."""
    preferred = None if rules.nhwc else rules.block

    def transform(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        if not rules.block:
            return mod
        library = {op: rules.symbol(op) for op in ("pool2d", "resize2d") if getattr(rules, op)}
        return _each_function(mod, lambda func: _block_layout(func, preferred, mod, library))

    return tvm.transform.module_pass(transform, opt_level=0,
                                     name="edgec.library_offload.PropagateLayout")


def dispatch_to_dnnl(mod: tvm.IRModule, rules: DispatchRules = DispatchRules()) -> tvm.IRModule:
    """Return ``mod`` with its matching ops rewritten into calls of ``rules.library``'s shim
    (oneDNN by default).

    Every Relax function is rewritten (``main``, the ``spec_*`` and ``generic`` copies that shape
    dispatch adds, and bindings inside ``If`` branches). Simple computations on constants are
    folded first (in numpy), so weights the importer writes as computations become constants.
    The input module is not changed.
    """
    return dispatch_with_stats(mod, rules)[0]


def dispatch_with_stats(
    mod: tvm.IRModule, rules: DispatchRules = DispatchRules()
) -> tuple[tvm.IRModule, DispatchStats]:
    """:func:`dispatch_to_dnnl`, also returning how many ops went to each shim function.

    Runs :func:`Canonicalize`, :func:`Offload` and :func:`PropagateLayout`, in that order.
    """
    stats = DispatchStats()
    steps = tvm.transform.Sequential(
        [Canonicalize(), Offload(rules, stats), PropagateLayout(rules)], opt_level=0,
        name="edgec.library_offload.dispatch")
    return steps(mod), stats
