"""A CNN classifier with trained weights: handwritten digits (8x8, the UCI set scikit-learn ships).

The data (``digits_data.npz``: 1797 images as uint8 pixels 0..16 and their labels, from
scikit-learn 1.9.1's bundled ``digits.csv.gz``) and the trained weights (``digits_weights.npz``,
float32, no pickle) are committed, so accuracy can be measured without scikit-learn or torch.
``digits_train.py`` made the weights, once, seeded, from the training split.

The split is fixed: a seeded permutation, the last :data:`HELD_OUT` images are held out and never
trained on; samples (and so profiles and quantization calibration) come from the training split
unless asked for the held-out one.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx

from edgec.fileio import npz_bytes, write_bytes
from edgec.zoo.builders import FLOAT, GraphBuilder, make_model, value_info

DATA_FILE = Path(__file__).resolve().parent / "digits_data.npz"
WEIGHTS_FILE = Path(__file__).resolve().parent / "digits_weights.npz"
SPLIT_SEED = 1797
HELD_OUT = 360
CLASSES = 10
BATCH = 16
# (name, in channels, out channels) of the 3x3 convolutions; pooling follows conv2 and conv3.
CONVS = (("conv1", 1, 16), ("conv2", 16, 32), ("conv3", 32, 64))
FLAT = 64 * 2 * 2


@lru_cache(maxsize=1)
def _dataset() -> tuple[np.ndarray, np.ndarray]:
    with np.load(DATA_FILE, allow_pickle=False) as data:
        return data["pixels"], data["labels"]


def split(which: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (float32 [n, 1, 8, 8], pixels scaled to 0..1) and int64 labels of ``which``:
    ``"train"`` or ``"held_out"``."""
    pixels, labels = _dataset()
    order = np.random.default_rng(SPLIT_SEED).permutation(len(labels))
    index = order[-HELD_OUT:] if which == "held_out" else order[:-HELD_OUT]
    images = (pixels[index].astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    return images, labels[index].astype(np.int64)


def load_weights() -> dict[str, np.ndarray]:
    with np.load(WEIGHTS_FILE, allow_pickle=False) as weights:
        return {key: weights[key].astype(np.float32) for key in weights.files}


def make_digits(seed: int) -> onnx.ModelProto:  # noqa: ARG001 - trained weights, no seed
    """The trained digits CNN: three 3x3 Conv+Relu (16, 32, 64 channels), 2x2 max pooling after
    the second and third, and a linear head.

    Input ``image`` float32 [batch, 1, 8, 8] (pixels scaled to 0..1); output ``logits`` float32
    [batch, 10].
    """
    weights = load_weights()
    b = GraphBuilder()
    image = b.name("image")
    x = image
    for index, (name, _, _) in enumerate(CONVS):
        w = b.weight(f"{name}.w", weights[f"{name}.w"])
        bias = b.weight(f"{name}.b", weights[f"{name}.b"])
        x = b.op("Conv", [x, w, bias], name=f"{name}.conv", kernel_shape=[3, 3], pads=[1] * 4)
        x = b.op("Relu", [x], name=f"{name}.relu")
        if index > 0:
            x = b.op("MaxPool", [x], name=f"{name}.pool", kernel_shape=[2, 2], strides=[2, 2])
    flat = b.op("Flatten", [x], name="head.flatten", axis=1)
    w = b.weight("head.w", weights["head.w"])
    bias = b.weight("head.b", weights["head.b"])
    logits = b.op("Gemm", [flat, w, bias], name="head.gemm", transB=1)
    b.rename(logits, "logits")
    graph = b.graph("digits", [value_info(image, FLOAT, ["batch", 1, 8, 8])],
                    [value_info("logits", FLOAT, ["batch", CLASSES])])
    return make_model(graph)


def digits_samples(count: int, seed: int, which: str = "train") -> list[dict[str, np.ndarray]]:
    """``count`` batches of :data:`BATCH` images from the ``which`` split, drawn seeded."""
    images, _ = split(which)
    rng = np.random.default_rng(seed)
    return [{"image": images[rng.choice(len(images), BATCH, replace=False)]}
            for _ in range(count)]


def held_out_batches() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    """The whole held-out split, in order, as (inputs, labels) batches of :data:`BATCH`."""
    images, labels = split("held_out")
    return [({"image": images[i:i + BATCH]}, labels[i:i + BATCH])
            for i in range(0, len(labels), BATCH)]


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


def export_held_out(out_dir: str | Path) -> tuple[Path, np.ndarray]:
    """Write the held-out split as ``held_out_NNN.npz`` batches (the layout ``--samples`` and
    ``--held-out-samples`` read) into ``out_dir``; return the folder and the labels in order."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = []
    for index, (inputs, batch_labels) in enumerate(held_out_batches()):
        write_bytes(out / f"held_out_{index:03d}.npz", npz_bytes(inputs))
        labels.append(batch_labels)
    return out, np.concatenate(labels)
