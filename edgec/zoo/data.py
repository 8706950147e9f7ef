"""Input distributions for the zoo's sample generators.

The shapes and values are meant to look like traffic a deployed model sees: a few sizes dominate and
a long tail of others shows up now and then, which is what shape specialization is judged on.
"""

from __future__ import annotations

import numpy as np


def skewed_lengths(rng: np.random.Generator, count: int, median: float, sigma: float, low: int,
                   high: int) -> np.ndarray:
    """``count`` integer lengths from a lognormal with the given median, clipped to [low, high]."""
    raw = rng.lognormal(np.log(median), sigma, size=count)
    return np.clip(np.rint(raw), low, high).astype(np.int64)


def images(rng: np.random.Generator, shape: tuple[int, int, int, int]) -> np.ndarray:
    """Normalized float32 images of ``shape`` [N, C, H, W]: smooth blobs, a colour cast and noise.

    Every term is Gaussian, so these are random normal images, but with the spatial structure and
    per-image statistics of photos: without it, global pooling averages i.i.d. pixel noise away
    and a randomly initialized network gives every sample nearly the same output. Each image gets
    its own contrast (lognormal), so a classifier sees both faint and clear inputs.
    """
    n, c, h, w = shape
    # An 8x8 grid of blobs, whatever the resolution.
    block_h, block_w = -(-h // 8), -(-w // 8)
    coarse = rng.standard_normal((n, c, 8, 8))
    smooth = np.repeat(np.repeat(coarse, block_h, axis=2), block_w, axis=3)[:, :, :h, :w]
    # Averaging with shifted copies rounds off the blocky upsampling edges.
    shift_h, shift_w = max(1, block_h // 2), max(1, block_w // 2)
    smooth = (smooth + np.roll(smooth, shift_h, axis=2) + np.roll(smooth, shift_w, axis=3)) / 3.0
    cast = 0.3 * rng.standard_normal((n, c, 1, 1))
    contrast = rng.lognormal(0.0, 0.6, size=(n, 1, 1, 1))
    noise = 0.2 * rng.standard_normal((n, c, h, w))
    return (cast + contrast * smooth + noise).astype(np.float32)
