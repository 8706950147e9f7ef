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

``flags``: FLAG_RELU applies relu last. ``wid`` identifies a constant weight by its content:
the shim repacks each weight once per id and layout, so ids are content hashes.

What :func:`dispatch_to_dnnl` does, as three module passes run in this order, each rewriting every
Relax function (``main``, the ``spec_*`` and ``generic`` copies of shape dispatch, ``If`` branches
included) and leaving its input module unchanged:

1. :func:`Canonicalize` (``canonicalize.py``), canonical forms: simple computations on constants
   are folded in numpy (the importer writes weights as ``broadcast_to``, Gemm's transposed
   weight, batch-norm parameters); inference batch norms become a multiply and an add;
   ``sum(stack([a, b]))`` (ONNX Sum) becomes ``a + b``; ``broadcast_to`` a tensor's own shape and
   inference dropout disappear.
2. :func:`Offload` (``match.py``), library calls: a conv2d with a constant weight takes the
   per-channel affine ops after it (folded into weight and bias), then a residual add and a relu;
   a matmul with a constant weight takes its bias and relu. Every conv and dense matmul goes to
   oneDNN: TVM's untuned kernels lose by 60x and more, even on a 64x64 matmul (measured). Matmuls
   of two computed tensors (attention) stay with TVM, where they cost little at the sizes seen.
3. :func:`PropagateLayout` (``layout.py``), library layout (``DispatchRules.block``): activations
   stay in the library's layout between its calls (oneDNN: blocked NCHW{b}c; XNNPACK: NHWC), and
   the TVM ops between them run in that layout too (see :func:`layout._block_layout`).

``analysis.py`` holds what the steps share: where each variable is bound and used, the rewriting
of groups of bindings, and small IR helpers (:func:`static_shape`, :func:`constant_value`,
:func:`weight_id`, which ``quantized.py`` and the importer use too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import tvm
from tvm import relax

FLAG_RELU = 1

LIBRARIES = ("dnnl", "xnn")  # the shims: edgec/native/dnnl_shim.cc, edgec/native/xnnpack_shim.cc


@dataclass(frozen=True)
class DispatchRules:
    """Which ops go to the library, and how activations are laid out between its calls.

    ``library``: ``"dnnl"`` (oneDNN, x86) or ``"xnn"`` (XNNPACK, Arm): whose shim the calls name,
    and the layout activations keep between them.
    ``dense_min_weight``: a matmul with a constant [K, N] weight goes to oneDNN when K*N is at
    least this. 0: on the 2-core machine of this project even the 64x64 matmuls of a small
    transformer ran 4x faster in oneDNN than in TVM's untuned kernel.
    ``dense_min_macs``: a matmul whose every dim is static and whose M*K*N is below this stays
    a TVM kernel: a library call costs about a microsecond however small its work (primitive
    lookup, memory objects), more than a tiny matmul takes. Measured on scan_rnn, whose Scan
    body multiplies [1, 16] by [16, 32] and [1, 32] by [32, 32] each step: 122 -> 88 us a call.
    Quantized builds set it to 0 (codegen): their int8 layers exist only as library calls.
    ``block``: activations between library convolutions stay in oneDNN's blocked layout
    NCHW{block}c (16 suits AVX-512 kernels, 8 AVX2 ones; tensors whose channels 16 does not
    divide use 8), and the TVM ops between them that can run blocked (elementwise, pooling,
    channel concat, spatial mean) do; 0 keeps every tensor NCHW.
    With ``library="xnn"`` any nonzero ``block`` means NHWC ([N, 1, H, W, C], one block of all
    channels): XNNPACK's operators take NHWC only, no blocked layouts.
    Grouped convolutions stay grouped here: whether one runs ungrouped (zero weights between
    groups) is the shim's decision on the machine that runs it (AVX2 machines lack a direct kernel
    for groups that are not whole blocks; AVX-512 ones have one).
    """

    library: str = "dnnl"
    conv2d: bool = True
    dense: bool = True
    dense_min_weight: int = 0
    dense_min_macs: int = 4096
    block: int = 16

    def __post_init__(self) -> None:
        if self.library not in LIBRARIES:
            raise ValueError(f"DispatchRules.library '{self.library}' unknown; known: "
                             f"{', '.join(LIBRARIES)}")

    def symbol(self, function: str) -> str:
        """The shim's exported name for ``function`` (``conv2d``, ``conv2d_add``, ``dense``)."""
        return f"edgec_{self.library}_{function}"

    @property
    def nhwc(self) -> bool:
        """Whether activations between library calls are NHWC rather than blocked."""
        return self.library == "xnn"


@dataclass
class DispatchStats:
    """What one run of the pass sent to the library, per shim function."""

    calls: dict[str, int] = field(default_factory=dict)

    def add(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1



# The steps import the names above from this package: they must be defined before these imports.
from edgec.compiler.transform.library_offload.analysis import (  # noqa: E402
    _rewrite_function, constant_value, static_shape, weight_id)
from edgec.compiler.transform.library_offload.canonicalize import _canonical_groups  # noqa: E402
from edgec.compiler.transform.library_offload.layout import _block_layout  # noqa: E402
from edgec.compiler.transform.library_offload.match import _library_groups  # noqa: E402

__all__ = [
    "FLAG_RELU", "LIBRARIES", "DispatchRules", "DispatchStats", "Canonicalize", "Offload",
    "PropagateLayout", "dispatch_to_dnnl", "dispatch_with_stats", "static_shape",
    "constant_value", "weight_id",
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
        return _each_function(mod, lambda func: _block_layout(func, preferred, mod))

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
