"""The arithmetic of edgec's int8 schemes, in numpy: the kernels and the simulation share it.

Weights: int8, symmetric (zero point 0), one scale per output channel, ``scale = absmax / 127``
(oneDNN's s8 weights need zero point 0); for integer (u8 x s8) layers on an x86 target without
VNNI, ``absmax / 63`` (:func:`integer_weight_levels`). Embedding tables (Gather) use one scale
per row and, with the asymmetric scheme, one zero point per row too.

Activations: uint8 with a zero point, ``real = scale * (q - zero)``. Asymmetric: the calibrated
range [lo, hi], widened to hold 0 so that zero (padding) is exact, spread over 0..255. Symmetric:
``scale = absmax / 127`` and zero point 128. The range comes from the profile: ``minmax`` takes the
observed min and max, ``percentile`` clips both to the 99.9th percentile of |x| (robust to rare
outliers, which would otherwise waste most of the 256 levels), ``entropy`` clips them to the
threshold whose quantized distribution of |x| is closest to the observed one (the least
Kullback-Leibler divergence, over the profile's |x| histogram: TensorRT's method).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CALIBRATIONS = ("percentile", "minmax", "entropy")
SCHEMES = ("asymmetric", "symmetric")


# The precisions whose layers multiply u8 activations by s8 weights (int8-weight computes fp32).
INTEGER_PRECISIONS = ("int8-static", "int8-dynamic")
WEIGHT_LEVELS = 127
# x86 without VNNI multiplies u8 activations by s8 weights with vpmaddubsw, which sums each pair
# of products into a saturating int16: 2 * 255 * 127 overflows it, 2 * 255 * 63 does not (what
# oneDNN's int8 guide advises). The CPU features that add products in int32 instead:
REDUCED_WEIGHT_LEVELS = 63
VNNI_FEATURES = ("avx512_vnni", "avx_vnni", "amx_int8")


def integer_weight_levels(arch: str, cpu_features: tuple[str, ...] | list[str]) -> int:
    """The largest |int8| an integer layer's weight may take on a target of ``arch`` that
    promises ``cpu_features`` (as /proc/cpuinfo names them): 63 on x86 without VNNI, else 127.
    The simulation and the compiled weights must use the same."""
    if arch.startswith("x86") and not any(f in cpu_features for f in VNNI_FEATURES):
        return REDUCED_WEIGHT_LEVELS
    return WEIGHT_LEVELS


def layer_weight_levels(precision: str, integer_levels: int) -> int:
    """The int8 range of a layer's weight at ``precision``: ``integer_levels`` (the target's,
    :func:`integer_weight_levels`) for u8 x s8 layers; 127 for weight-only ones (fp32 sums)."""
    return integer_levels if precision in INTEGER_PRECISIONS else WEIGHT_LEVELS


def quantize_weight(w: np.ndarray, axis: int,
                    levels: int = WEIGHT_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """``w`` as int8 with one symmetric scale per index of ``axis``, over -levels..levels:
    (int8 array, float32 scales)."""
    moved = np.moveaxis(w.astype(np.float32), axis, 0)
    absmax = np.abs(moved.reshape(moved.shape[0], -1)).max(axis=1)
    scale = np.where(absmax > 0, absmax / float(levels), 1.0).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w / scale.reshape(shape)), -levels, levels).astype(np.int8)
    return q, scale


def dequantize_weight(q: np.ndarray, scale: np.ndarray, axis: int) -> np.ndarray:
    shape = [1] * q.ndim
    shape[axis] = -1
    return (q.astype(np.float32) * scale.reshape(shape)).astype(np.float32)


def quantize_rows(table: np.ndarray, scheme: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [rows, ...] table as int8 per row: (int8 table, float32 scale [rows], int8 zero [rows]).

    Symmetric: zero 0, ``scale = absmax / 127``. Asymmetric: the row's [min, max] over -128..127.
    """
    flat = table.reshape(table.shape[0], -1).astype(np.float32)
    if scheme == "symmetric":
        q, scale = quantize_weight(flat, 0)
        return q.reshape(table.shape), scale, np.zeros(len(scale), np.int8)
    lo, hi = np.minimum(flat.min(axis=1), 0.0), np.maximum(flat.max(axis=1), 0.0)
    scale = np.where(hi > lo, (hi - lo) / 255.0, 1.0).astype(np.float32)
    zero = np.clip(np.rint(-128.0 - lo / scale), -128, 127).astype(np.int8)
    q = np.clip(np.rint(flat / scale[:, None]) + zero[:, None], -128, 127).astype(np.int8)
    return q.reshape(table.shape), scale, zero


def dequantize_rows(q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
    shape = (-1,) + (1,) * (q.ndim - 1)
    return ((q.astype(np.float32) - zero.astype(np.float32).reshape(shape))
            * scale.reshape(shape)).astype(np.float32)


@dataclass(frozen=True)
class ActivationParams:
    """uint8 quantization of one activation: ``real = scale * (q - zero)``."""

    scale: float
    zero: int

    def to_json(self) -> dict[str, float]:
        return {"scale": self.scale, "zero": self.zero}


def activation_params(observed: dict[str, float], calibration: str,
                      scheme: str) -> ActivationParams:
    """uint8 parameters for an activation whose profiled range is ``observed`` (the profile's
    ``min``, ``max`` and ``absmax_p999``)."""
    lo, hi = float(observed["min"]), float(observed["max"])
    clip = None
    if calibration == "percentile":
        clip = float(observed["absmax_p999"])
    elif calibration == "entropy":
        # The levels |x| gets: all 256 for a non-negative input with a zero point, half else.
        levels = 255 if scheme == "asymmetric" and lo >= 0 else 127
        clip = entropy_threshold(observed["abs_hist"], float(observed["abs_hist_max"]), levels)
    if clip is not None:
        lo, hi = max(lo, -clip), min(hi, clip)
    if scheme == "symmetric":
        absmax = max(abs(lo), abs(hi))
        return ActivationParams(absmax / 127.0 if absmax > 0 else 1.0, 128)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255.0 if hi > lo else 1.0
    return ActivationParams(scale, int(np.clip(np.rint(-lo / scale), 0, 255)))


def entropy_threshold(counts, top: float, levels: int) -> float:
    """The clipping threshold for |x| with the least KL divergence between the observed
    distribution (``counts``: a histogram over [0, ``top``]) and its ``levels``-level
    quantization, searched over the bin edges from ``levels`` bins up (TensorRT's entropy
    calibration: values past the threshold count in the last kept bin, as clipping puts them).
    """
    hist = np.asarray(counts, np.float64)
    bins = len(hist)
    if bins <= levels or hist.sum() == 0:
        return top
    best, best_kl = bins, np.inf
    for edge in range(levels, bins + 1):
        reference = hist[:edge].copy()
        reference[-1] += hist[edge:].sum()
        # The quantized distribution: each of `levels` groups of bins spreads its count evenly
        # over the group's bins that the reference has (empty ones stay empty).
        groups = np.minimum((np.arange(edge) * levels) // edge, levels - 1)
        nonzero = reference > 0
        group_count = np.bincount(groups, weights=hist[:edge], minlength=levels)
        group_nonzero = np.bincount(groups, weights=nonzero, minlength=levels)
        spread = np.where(nonzero, group_count[groups] / np.maximum(group_nonzero[groups], 1), 0.0)
        if spread.sum() == 0:
            continue
        p, q = reference / reference.sum(), _smoothed(spread)
        mask = p > 0
        kl = float(np.sum(p[mask] * np.log(p[mask] / q[mask])))
        if kl < best_kl:
            best, best_kl = edge, kl
    return top * best / bins


def _smoothed(counts: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """``counts`` as a distribution with no empty bin (``eps`` added to each before normalizing),
    so that a bin only the reference has costs much but not infinitely."""
    return (counts / counts.sum() + eps) / (1.0 + eps * len(counts))


def fake_quantize(x: np.ndarray, params: ActivationParams) -> np.ndarray:
    """``x`` through uint8 and back, as the kernels see it."""
    q = np.clip(np.rint(x / params.scale) + params.zero, 0, 255)
    return ((q - params.zero) * params.scale).astype(np.float32)
