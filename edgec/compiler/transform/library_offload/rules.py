"""What library offload sends where: the rules a backend derives from its target file, and what
a run sent (``DispatchStats``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import struct

FLAG_RELU = 1
# bf16 arithmetic, f32 accumulation and output (``--quantize bf16``; oneDNN's conv2d and dense).
FLAG_BF16 = 2

# An activation applied last (after the bias and the residual add), other than relu, which keeps
# FLAG_RELU: its code in bits 4-7 of the flags; clip's upper bound (its lower is 0: relu6, hard
# sigmoid) as float32 bits in bits 32-63. Decoded by ActivationOf (edgec/native/shim_common.h).
ACTIVATIONS = ("clip", "sigmoid", "tanh", "swish", "hardswish", "gelu_erf", "gelu_tanh")
_ACTIVATION_SHIFT = 4


def activation_flags(name: str | None, upper: float = 0.0) -> int:
    """The flags bits that fuse activation ``name`` (None or "relu": FLAG_RELU or nothing)."""
    if name is None:
        return 0
    if name == "relu":
        return FLAG_RELU
    code = (ACTIVATIONS.index(name) + 1) << _ACTIVATION_SHIFT
    if name == "clip":
        if not upper > 0:
            raise ValueError(f"a fused clip's upper bound must be positive, not {upper}")
        code |= struct.unpack("<I", struct.pack("<f", upper))[0] << 32
    return code

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
    ``channels_last``: activations between library convolutions are NHWC ([N, 1, H, W, C])
    instead of blocked (``block`` must be nonzero). oneDNN's AMX bf16 convolutions read and
    write NHWC only: on blocked tensors they reordered every input and output, 6 of resnet50's
    17.6 ms (measured, 2 cores, Sapphire Rapids). Builds with bf16 convolutions (or int8
    ones, on AVX-512 targets) set it (``pipeline.library_rules``).
    ``batch_matmul``: a matmul of two float32 activations of rank 3 or 4 with the same batch
    dims (attention's scores and weighted values) goes to oneDNN's batched matmul; TVM's kernel
    for it ran ViT at 3.2x and the Whisper encoder at 10.6x onnxruntime's time. oneDNN only: the
    XNNPACK shim has no such function.
    ``softmax``, ``layer_norm``: a float32 softmax (any axis), a layer norm over the last axis
    (or a standardization over trailing axes: instance norm, layer norm written out) goes to
    oneDNN's kernel (vectorized, on oneDNN's threads), unless its shape is static and
    under ``norm_min_elements``. TVM's kernels run serial and scalar between library calls: its
    softmax took a third of the Whisper encoder's time. But a oneDNN call costs about 2 us more:
    TVM's softmax was faster up to about 6400 elements, its layer norm past 2560 (measured, 2
    cores). oneDNN only.
    ``pool2d``, ``resize2d``: 2-D max and average pooling, and bilinear or nearest resizing, of a
    blocked tensor (``block``) run as oneDNN's kernels (on its threads) rather than TVM's
    (serial between library calls). oneDNN only.
    ``activations``: the activations (``relu`` and ``ACTIVATIONS``) a call fuses after its bias
    and residual add; the others stay TVM ops. XNNPACK's shim fuses relu only (its operators
    clamp; the other activations are separate operators there).
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
    batch_matmul: bool = False
    softmax: bool = False
    layer_norm: bool = False
    pool2d: bool = False
    resize2d: bool = False
    norm_min_elements: int = 8192
    channels_last: bool = False
    activations: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.activations is None:
            default = {"relu", *ACTIVATIONS} if self.library == "dnnl" else {"relu"}
            object.__setattr__(self, "activations", frozenset(default))
        if self.library not in LIBRARIES:
            raise ValueError(f"DispatchRules.library '{self.library}' unknown; known: "
                             f"{', '.join(LIBRARIES)}")
        for route in ("batch_matmul", "softmax", "layer_norm", "pool2d", "resize2d"):
            if getattr(self, route) and self.library != "dnnl":
                raise ValueError(f"DispatchRules.{route}: only the oneDNN shim has it")
        unknown = set(self.activations) - {"relu", *ACTIVATIONS}
        if unknown:
            raise ValueError(f"DispatchRules.activations: unknown {', '.join(sorted(unknown))}")

    def symbol(self, function: str) -> str:
        """The shim's exported name for ``function`` (``conv2d``, ``conv2d_add``, ``dense``,
        ``batch_matmul``, ``softmax``, ``layer_norm``, ``pool2d``,
        ``resize2d``)."""
        return f"edgec_{self.library}_{function}"

    @property
    def nhwc(self) -> bool:
        """Whether activations between library calls are NHWC rather than blocked."""
        return self.library == "xnn" or self.channels_last


@dataclass
class DispatchStats:
    """What one run of the pass sent to the library, per shim function."""

    calls: dict[str, int] = field(default_factory=dict)

    def add(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
