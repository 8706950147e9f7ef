"""Generated models whose every shape is known before the first run."""

from __future__ import annotations

import numpy as np
import onnx

from edgec.zoo import data
from edgec.zoo.builders import (FLOAT, GraphBuilder, classifier_head, conv_relu, make_model,
                                value_info)

CNN_CLASSES = 10


def make_cnn(seed: int) -> onnx.ModelProto:
    """A small image classifier: three Conv+Relu stages with max pooling and a linear head.

    Input ``image`` float32 [1, 3, 32, 32]; output ``logits`` float32 [1, 10].
    """
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    image = b.name("image")
    x = conv_relu(b, rng, image, 3, 16, "stage1")
    x = b.op("MaxPool", [x], name="stage1.pool", kernel_shape=[2, 2], strides=[2, 2])
    x = conv_relu(b, rng, x, 16, 32, "stage2")
    x = b.op("MaxPool", [x], name="stage2.pool", kernel_shape=[2, 2], strides=[2, 2])
    x = conv_relu(b, rng, x, 32, 64, "stage3")
    logits = classifier_head(b, rng, x, 64, CNN_CLASSES, "head")
    b.rename(logits, "logits")
    graph = b.graph("cnn", [value_info(image, FLOAT, [1, 3, 32, 32])],
                    [value_info("logits", FLOAT, [1, CNN_CLASSES])])
    return make_model(graph)


def cnn_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``count`` single images for :func:`make_cnn`."""
    rng = np.random.default_rng(seed)
    return [{"image": data.images(rng, (1, 3, 32, 32))} for _ in range(count)]
