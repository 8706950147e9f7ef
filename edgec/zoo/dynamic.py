"""Generated models with data-dependent shapes: a transformer encoder, a mixture of experts and a
keyword-spotting LSTM."""

from __future__ import annotations

import numpy as np
import onnx

from edgec.zoo import data
from edgec.zoo.builders import (FLOAT, GraphBuilder, INT64, linear, make_model, small_normal,
                                value_info)

VOCAB = 1000
D_MODEL = 64
HEADS = 4
HEAD_DIM = D_MODEL // HEADS
FFN = 128
LAYERS = 2
MAX_SEQ = 128
PAD_ID = 0


def _layer_norm(b: GraphBuilder, x: str, name: str) -> str:
    scale = b.weight(f"{name}.scale", np.ones(D_MODEL, np.float32))
    bias = b.weight(f"{name}.bias", np.zeros(D_MODEL, np.float32))
    return b.op("LayerNormalization", [x, scale, bias], name=name, axis=-1, epsilon=1e-5)


def _gelu(b: GraphBuilder, x: str, name: str) -> str:
    """Exact GELU, ``0.5 * x * (1 + erf(x / sqrt(2)))``, in opset-17 ops."""
    inv_sqrt2 = b.const(f"{name}.inv_sqrt2", 1.0 / np.sqrt(2.0), np.float32)
    one = b.const(f"{name}.one", 1.0, np.float32)
    half = b.const(f"{name}.half", 0.5, np.float32)
    erf = b.op("Erf", [b.op("Mul", [x, inv_sqrt2], name=f"{name}.scale")], name=f"{name}.erf")
    gate = b.op("Add", [erf, one], name=f"{name}.add")
    return b.op("Mul", [b.op("Mul", [x, gate], name=f"{name}.mul"), half], name=f"{name}.half")


def _attention(b: GraphBuilder, rng: np.random.Generator, x: str, mask_bias: str,
               name: str) -> str:
    """Multi-head self-attention on [batch, seq, D_MODEL] with an additive [batch,1,1,seq] mask."""
    # Reshape shapes use 0 (copy the input dim) so batch and seq stay symbolic.
    split = b.const(f"{name}.split_shape", [0, 0, HEADS, HEAD_DIM])
    merge = b.const(f"{name}.merge_shape", [0, 0, D_MODEL])
    heads = {}
    for part, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        proj = linear(b, rng, x, D_MODEL, D_MODEL, f"{name}.{part}", gain=1.0)
        split_heads = b.op("Reshape", [proj, split], name=f"{name}.{part}.split")
        heads[part] = b.op("Transpose", [split_heads], name=f"{name}.{part}.heads", perm=perm)
    scale = b.const(f"{name}.scale", 1.0 / np.sqrt(HEAD_DIM), np.float32)
    scores = b.op("MatMul", [heads["q"], heads["k"]], name=f"{name}.scores")
    scores = b.op("Mul", [scores, scale], name=f"{name}.scaled")
    scores = b.op("Add", [scores, mask_bias], name=f"{name}.masked")
    probs = b.op("Softmax", [scores], name=f"{name}.softmax", axis=-1)
    ctx = b.op("MatMul", [probs, heads["v"]], name=f"{name}.context")
    ctx = b.op("Transpose", [ctx], name=f"{name}.context.t", perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, merge], name=f"{name}.merge")
    return linear(b, rng, ctx, D_MODEL, D_MODEL, f"{name}.out", gain=1.0)


def make_transformer(seed: int) -> onnx.ModelProto:
    """A 2-layer pre-norm transformer encoder with dynamic batch and sequence length.

    Inputs ``input_ids`` int64 [batch, seq] and ``attention_mask`` float32 [batch, seq] (1 = token,
    0 = padding, seq <= 128); output ``hidden`` float32 [batch, seq, 64].
    """
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    ids, mask = b.name("input_ids"), b.name("attention_mask")

    tok_table = b.weight("embed.tokens", small_normal(rng, (VOCAB, D_MODEL), 1.0))
    pos_table = b.weight("embed.positions", small_normal(rng, (MAX_SEQ, D_MODEL), 0.5))
    tokens = b.op("Gather", [tok_table, ids], name="embed.token_gather", axis=0)
    # Position ids are arange(MAX_SEQ)[:seq], with seq read from the input's shape at run time.
    positions = b.const("embed.position_ids", np.arange(MAX_SEQ))
    seq_len = b.op("Shape", [ids], name="embed.seq_len", start=1, end=2)
    zero = b.const("embed.zero", [0])
    axis0 = b.const("embed.axis0", [0])
    pos_ids = b.op("Slice", [positions, zero, seq_len, axis0], name="embed.position_slice")
    pos = b.op("Gather", [pos_table, pos_ids], name="embed.position_gather", axis=0)
    x = b.op("Add", [tokens, pos], name="embed.add")

    one = b.const("mask.one", 1.0, np.float32)
    neg = b.const("mask.neg", -1e4, np.float32)
    mask_axes = b.const("mask.axes", [1, 2])
    padding = b.op("Sub", [one, mask], name="mask.padding")
    bias = b.op("Mul", [padding, neg], name="mask.bias")
    bias = b.op("Unsqueeze", [bias, mask_axes], name="mask.unsqueeze")

    for layer in range(LAYERS):
        name = f"layer{layer}"
        attn = _attention(b, rng, _layer_norm(b, x, f"{name}.ln1"), bias, f"{name}.attn")
        x = b.op("Add", [x, attn], name=f"{name}.residual1")
        h = linear(b, rng, _layer_norm(b, x, f"{name}.ln2"), D_MODEL, FFN, f"{name}.ffn1")
        h = linear(b, rng, _gelu(b, h, f"{name}.gelu"), FFN, D_MODEL, f"{name}.ffn2", gain=1.0)
        x = b.op("Add", [x, h], name=f"{name}.residual2")
    hidden = b.rename(_layer_norm(b, x, "final_ln"), "hidden")

    graph = b.graph("transformer",
                    [value_info(ids, INT64, ["batch", "seq"]),
                     value_info(mask, FLOAT, ["batch", "seq"])],
                    [value_info(hidden, FLOAT, ["batch", "seq", D_MODEL])])
    return make_model(graph)


def transformer_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Batches of token sequences, mostly single short requests with a long tail.

    Lengths are lognormal (median 16) in [4, 128]; a batch is padded to its longest sequence rounded
    up to a multiple of 8 (so a few shapes dominate), and padding is masked out. Batch is 1 for most
    samples, sometimes 2 or 4. Token ids follow a Zipf-like law, as words do.
    """
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        batch = int(rng.choice([1, 2, 4], p=[0.75, 0.15, 0.10]))
        lengths = data.skewed_lengths(rng, batch, median=16, sigma=0.7, low=4, high=MAX_SEQ)
        seq = min(MAX_SEQ, int(-(-lengths.max() // 8) * 8))
        ids = np.full((batch, seq), PAD_ID, np.int64)
        mask = np.zeros((batch, seq), np.float32)
        for row, length in enumerate(lengths):
            ids[row, :length] = np.minimum(rng.zipf(1.3, size=length), VOCAB - 1)
            mask[row, :length] = 1.0
        samples.append({"input_ids": ids, "attention_mask": mask})
    return samples


MOE_DIM = 32
MOE_HIDDEN = 64
EXPERTS = 4
TOP_K = 2
# Token clusters of the sample distribution: fixed, so every seed sees the same "domain", and
# unequal in weight, so some experts get more tokens than others.
_CLUSTER_SEED = 20240
_CLUSTER_WEIGHTS = (0.45, 0.25, 0.18, 0.12)


def make_moe(seed: int) -> onnx.ModelProto:
    """A mixture-of-experts layer with top-2 routing over 4 expert MLPs (32 -> 64 -> 32).

    Input ``x`` float32 [tokens, 32]; output ``y`` float32 [tokens, 32], the sum of each token's two
    chosen experts weighted by the renormalized router probabilities. Each expert gathers its tokens
    with ``NonZero`` + ``Gather`` (a data-dependent count, possibly zero) and scatters its results
    back with ``ScatterND``.
    """
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.name("x")
    router = linear(b, rng, x, MOE_DIM, EXPERTS, "router", gain=1.0)
    probs = b.op("Softmax", [router], name="router.softmax", axis=-1)
    k = b.const("router.k", [TOP_K])
    top_probs, top_experts = b.op("TopK", [probs, k], name="router.topk", outputs=2, axis=-1)
    axis1 = b.const("router.axis1", [1])
    total = b.op("ReduceSum", [top_probs, axis1], name="router.total", keepdims=1)
    gates = b.op("Div", [top_probs, total], name="router.gates")
    zeros = b.op("ConstantOfShape", [b.op("Shape", [x], name="combine.shape")],
                 name="combine.zeros", value=onnx.numpy_helper.from_array(np.zeros(1, np.float32)))
    zero = b.const("router.zero", 0.0, np.float32)
    axis0 = b.const("router.axis0", [0])

    parts = []
    for e in range(EXPERTS):
        name = f"expert{e}"
        chosen = b.op("Equal", [top_experts, b.const(f"{name}.id", e)], name=f"{name}.chosen")
        gate = b.op("ReduceSum", [b.op("Where", [chosen, gates, zero], name=f"{name}.gate_mask"),
                                  axis1], name=f"{name}.gate", keepdims=0)
        routed = b.op("ReduceMax", [b.op("Cast", [chosen], name=f"{name}.chosen_f",
                                         to=onnx.TensorProto.FLOAT)],
                      name=f"{name}.routed", axes=[1], keepdims=0)
        rows = b.op("NonZero", [routed], name=f"{name}.rows")
        token_ids = b.op("Squeeze", [rows, axis0], name=f"{name}.token_ids")
        tokens = b.op("Gather", [x, token_ids], name=f"{name}.gather", axis=0)
        hidden = b.op("Relu", [linear(b, rng, tokens, MOE_DIM, MOE_HIDDEN, f"{name}.fc1")],
                      name=f"{name}.relu")
        out = linear(b, rng, hidden, MOE_HIDDEN, MOE_DIM, f"{name}.fc2", gain=1.0)
        weight = b.op("Unsqueeze", [b.op("Gather", [gate, token_ids], name=f"{name}.gate_rows",
                                         axis=0), axis1], name=f"{name}.gate_col")
        weighted = b.op("Mul", [out, weight], name=f"{name}.weighted")
        scatter_ids = b.op("Transpose", [rows], name=f"{name}.scatter_ids", perm=[1, 0])
        parts.append(b.op("ScatterND", [zeros, scatter_ids, weighted], name=f"{name}.scatter"))
    y = b.rename(b.op("Sum", parts, name="combine.sum"), "y")
    graph = b.graph("moe", [value_info(x, FLOAT, ["tokens", MOE_DIM])],
                    [value_info(y, FLOAT, ["tokens", MOE_DIM])])
    return make_model(graph)


def moe_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Token batches of 8..64 tokens (lognormal, median 16) drawn from 4 unequal clusters."""
    centers = np.random.default_rng(_CLUSTER_SEED).standard_normal((len(_CLUSTER_WEIGHTS), MOE_DIM))
    rng = np.random.default_rng(seed)
    lengths = data.skewed_lengths(rng, count, median=16, sigma=0.6, low=8, high=64)
    samples = []
    for length in lengths:
        cluster = rng.choice(len(_CLUSTER_WEIGHTS), size=length, p=_CLUSTER_WEIGHTS)
        x = 1.5 * centers[cluster] + rng.standard_normal((length, MOE_DIM))
        samples.append({"x": x.astype(np.float32)})
    return samples


KWS_FEATURES = 40
KWS_HIDDEN = 128
KWS_CLASSES = 12
KWS_MAX_FRAMES = 200


def make_speech_lstm(seed: int) -> onnx.ModelProto:
    """A keyword-spotting acoustic model: two stacked LSTM layers (hidden 128) over log-mel frames
    and a per-frame classifier, as streaming speech models are built.

    Input ``features`` float32 [frames, 1, 40]; output ``logits`` float32 [frames, 12]. Forget-gate
    biases start at 1, as trained LSTMs' do, so the state carries over many frames.
    """
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.name("features")
    h, inputs = KWS_HIDDEN, KWS_FEATURES
    for layer in range(2):
        bias = small_normal(rng, (1, 8 * h), 0.05)
        bias[0, 2 * h:3 * h] += 1.0  # ONNX gate order i, o, f, c: the forget gate's input bias
        w = b.weight(f"lstm{layer}.w", (rng.standard_normal((1, 4 * h, inputs)) / np.sqrt(inputs))
                     .astype(np.float32))
        r = b.weight(f"lstm{layer}.r", (rng.standard_normal((1, 4 * h, h)) / np.sqrt(h))
                     .astype(np.float32))
        seq = b.op("LSTM", [x, w, r, b.weight(f"lstm{layer}.b", bias)], name=f"lstm{layer}",
                   hidden_size=h)
        # [frames, 1 direction, 1, hidden] -> [frames, 1, hidden]
        x = b.op("Squeeze", [seq, b.const(f"lstm{layer}.axis", [1])], name=f"lstm{layer}.squeeze")
        inputs = h
    frames = b.op("Squeeze", [x, b.const("frames.axis", [1])], name="frames")
    logits = linear(b, rng, frames, h, KWS_CLASSES, "classifier")
    logits = b.rename(logits, "logits")
    graph = b.graph("speech_lstm", [value_info("features", FLOAT, ["frames", 1, KWS_FEATURES])],
                    [value_info(logits, FLOAT, ["frames", KWS_CLASSES])])
    return make_model(graph)


def speech_lstm_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Utterances of lognormal length (median 60 frames, 10 ms each) in [10, 200]: log-mel-like
    features, smooth over time and frequency, with a per-utterance loudness."""
    rng = np.random.default_rng(seed)
    samples = []
    for frames in data.skewed_lengths(rng, count, median=60, sigma=0.5, low=10, high=KWS_MAX_FRAMES):
        slow = np.cumsum(rng.standard_normal((frames, KWS_FEATURES)) * 0.3, axis=0)  # over time
        bands = np.stack([np.convolve(row, np.ones(5) / 5, mode="same") for row in slow])
        loud = rng.normal(0.0, 1.0)
        features = (bands - bands.mean(axis=0)) * 0.5 + loud
        samples.append({"features": features[:, None, :].astype(np.float32)})
    return samples
