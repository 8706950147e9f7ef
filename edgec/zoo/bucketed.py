"""Generated dynamic models on which the plan policies differ: what a region should become
(symbolic, specialized, padded to a bucket) depends on the shape distribution and on the ops.

- ``cnn_batch``: a CNN over micro-batches of images, dynamic ``batch``. Static shapes pay here
  (oneDNN picks blocked layouts and the TVM kernels get fixed loop bounds), and nothing in a CNN
  mixes values across the batch, so a batch padded to a bucket and sliced back is exact.
- ``token_tagger``: a per-token tagger (embedding, MLP, LayerNorm over features, per-token
  logits) over sentences of many distinct lengths, dynamic ``seq``. No shape reaches 10% of the
  samples, so specialize-seen specializes nothing; no op mixes tokens, so padding to a bucket is
  exact.
- ``prompt_encoder``: self-attention over a prompt's tokens (no padding mask: one unpadded prompt
  per call), dynamic ``seq``. Its attention matmuls are TVM kernels whose loops run over ``seq``,
  up to 1.5x faster static (measured, at 20 tokens); softmax mixes tokens, so padding is refused.
  Prompts are four canned templates (each about 8% of calls) or free text of many lengths: the
  10% rule of specialize-seen misses a template unless free text often has its length too.

Both are seeded, small (under 100 k weights) and build in seconds.
"""

from __future__ import annotations

import numpy as np
import onnx

from edgec.zoo import data
from edgec.zoo.builders import (FLOAT, GraphBuilder, INT64, classifier_head, conv_relu, linear,
                                make_model, small_normal, value_info)

CNN_BATCH_CLASSES = 10
CNN_BATCH_IMAGE = 16
CNN_BATCH_MAX = 16

PROMPT_DIM = 32
PROMPT_TEMPLATES = (12, 20, 32, 44)
PROMPT_TEMPLATE_SHARE = 0.08
PROMPT_MAX_SEQ = 96

TAGGER_VOCAB = 500
TAGGER_DIM = 32
TAGGER_HIDDEN = 64
TAGGER_TAGS = 12
TAGGER_MAX_SEQ = 64


def make_cnn_batch(seed: int) -> onnx.ModelProto:
    """Input ``images`` float32 [batch, 3, 16, 16]; output ``logits`` float32 [batch, 10]."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    images = b.name("images")
    x = conv_relu(b, rng, images, 3, 16, "stage1")
    x = b.op("MaxPool", [x], name="stage1.pool", kernel_shape=[2, 2], strides=[2, 2])
    x = conv_relu(b, rng, x, 16, 32, "stage2")
    x = conv_relu(b, rng, x, 32, 32, "stage3")
    logits = classifier_head(b, rng, x, 32, CNN_BATCH_CLASSES, "head")
    b.rename(logits, "logits")
    graph = b.graph("cnn_batch",
                    [value_info(images, FLOAT, ["batch", 3, CNN_BATCH_IMAGE, CNN_BATCH_IMAGE])],
                    [value_info("logits", FLOAT, ["batch", CNN_BATCH_CLASSES])])
    return make_model(graph)


def cnn_batch_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Micro-batches as a server forms them from a queue: the batch is the number of requests
    waiting, 1 + Poisson(3) capped at 16, so 1-6 are common and no size dominates (the most
    frequent, 3 and 4, are each about 22% of batches)."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        batch = int(min(CNN_BATCH_MAX, 1 + rng.poisson(3.0)))
        samples.append({"images": data.images(rng, (batch, 3, CNN_BATCH_IMAGE, CNN_BATCH_IMAGE))})
    return samples


def make_token_tagger(seed: int) -> onnx.ModelProto:
    """Input ``input_ids`` int64 [1, seq]; output ``tag_logits`` float32 [1, seq, 12]."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    ids = b.name("input_ids")
    table = b.weight("embedding", small_normal(rng, (TAGGER_VOCAB, TAGGER_DIM), std=0.5))
    x = b.op("Gather", [table, ids], name="embed", axis=0)
    h = linear(b, rng, x, TAGGER_DIM, TAGGER_HIDDEN, "mlp.up")
    h = b.op("Relu", [h], name="mlp.relu")
    h = linear(b, rng, h, TAGGER_HIDDEN, TAGGER_DIM, "mlp.down", gain=1.0)
    x = b.op("Add", [x, h], name="residual")
    scale = b.weight("norm.scale", np.ones(TAGGER_DIM, np.float32))
    shift = b.weight("norm.shift", np.zeros(TAGGER_DIM, np.float32))
    x = b.op("LayerNormalization", [x, scale, shift], name="norm", axis=-1, epsilon=1e-5)
    logits = linear(b, rng, x, TAGGER_DIM, TAGGER_TAGS, "tags", gain=1.0)
    b.rename(logits, "tag_logits")
    graph = b.graph("token_tagger", [value_info(ids, INT64, [1, "seq"])],
                    [value_info("tag_logits", FLOAT, [1, "seq", TAGGER_TAGS])])
    return make_model(graph)


def token_tagger_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Single sentences, unpadded: lengths lognormal (median 22 tokens, sigma 0.6) in [4, 64],
    so there are many distinct lengths and none is 10% of the samples; token ids Zipf-like."""
    rng = np.random.default_rng(seed)
    lengths = data.skewed_lengths(rng, count, median=22, sigma=0.6, low=4, high=TAGGER_MAX_SEQ)
    return [{"input_ids": np.minimum(rng.zipf(1.3, size=(1, int(n))), TAGGER_VOCAB - 1).astype(np.int64)}
            for n in lengths]


def make_prompt_encoder(seed: int) -> onnx.ModelProto:
    """Input ``input_ids`` int64 [1, seq]; output ``encoded`` float32 [1, seq, 32]: one
    self-attention layer (projections, scaled dot-product softmax attention, residual)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    ids = b.name("input_ids")
    table = b.weight("embedding", small_normal(rng, (TAGGER_VOCAB, PROMPT_DIM), std=0.5))
    x = b.op("Gather", [table, ids], name="embed", axis=0)
    q = linear(b, rng, x, PROMPT_DIM, PROMPT_DIM, "attn.q", gain=1.0)
    k = linear(b, rng, x, PROMPT_DIM, PROMPT_DIM, "attn.k", gain=1.0)
    v = linear(b, rng, x, PROMPT_DIM, PROMPT_DIM, "attn.v", gain=1.0)
    kt = b.op("Transpose", [k], name="attn.kt", perm=[0, 2, 1])
    scores = b.op("MatMul", [q, kt], name="attn.scores")
    scale = b.const("attn.scale", 1.0 / np.sqrt(PROMPT_DIM), np.float32)
    scores = b.op("Mul", [scores, scale], name="attn.scaled")
    weights = b.op("Softmax", [scores], name="attn.softmax", axis=-1)
    context = b.op("MatMul", [weights, v], name="attn.context")
    out = b.op("Add", [x, context], name="attn.residual")
    b.rename(out, "encoded")
    graph = b.graph("prompt_encoder", [value_info(ids, INT64, [1, "seq"])],
                    [value_info("encoded", FLOAT, [1, "seq", PROMPT_DIM])])
    return make_model(graph)


def prompt_encoder_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """One prompt per call: with probability 0.08 each, one of four canned templates (12, 20, 32
    or 44 tokens); else free text, lognormal lengths (median 28, sigma 0.7) in [4, 96]. Token ids
    Zipf-like."""
    rng = np.random.default_rng(seed)
    templates = len(PROMPT_TEMPLATES)
    probabilities = [PROMPT_TEMPLATE_SHARE] * templates + [1 - PROMPT_TEMPLATE_SHARE * templates]
    samples = []
    for _ in range(count):
        which = int(rng.choice(templates + 1, p=probabilities))
        length = (PROMPT_TEMPLATES[which] if which < templates else
                  int(data.skewed_lengths(rng, 1, median=28, sigma=0.7, low=4, high=PROMPT_MAX_SEQ)[0]))
        samples.append({"input_ids": np.minimum(rng.zipf(1.3, size=(1, length)),
                                                TAGGER_VOCAB - 1).astype(np.int64)})
    return samples
