"""Generated models with ONNX control flow: ``If`` (early exit), ``Loop`` (decoding), ``Scan``."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from edgec.zoo import data
from edgec.zoo.builders import (BOOL, FLOAT, GraphBuilder, INT64, classifier_head, conv_relu,
                                he_normal, make_model, small_normal, value_info)

CLASSES = 10
EXIT_RATE = 0.7
# Calibration draws its own stream from the seed, so it never replays the samples an export writes.
_CALIBRATION_STREAM = 1
_CALIBRATION_SAMPLES = 200


def _early_exit_graph(seed: int, threshold: float | None) -> onnx.ModelProto:
    """The early-exit model; with ``threshold=None``, a probe that outputs the exit score."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    image = b.name("image")
    x = conv_relu(b, rng, image, 3, 16, "stage1.block1")
    x = b.op("MaxPool", [x], name="stage1.pool1", kernel_shape=[2, 2], strides=[2, 2])
    x = conv_relu(b, rng, x, 16, 32, "stage1.block2")
    features = b.op("MaxPool", [x], name="stage1.pool2", kernel_shape=[2, 2], strides=[2, 2])
    early = classifier_head(b, rng, features, 32, CLASSES, "early_head")

    # The exit score is the smallest top-1 probability in the batch: exit only if all are sure.
    probs = b.op("Softmax", [early], name="exit.softmax", axis=1)
    top1 = b.op("ReduceMax", [probs], name="exit.top1", axes=[1], keepdims=0)
    score = b.op("ReduceMin", [top1], name="exit.score", axes=[0], keepdims=0)

    inputs = [value_info(image, FLOAT, ["batch", 3, 32, 32])]
    if threshold is None:
        # The early weights are drawn first, so the probe shares them with the full model.
        graph = b.graph("early_exit_probe", inputs, [value_info(score, FLOAT, [])])
        return make_model(graph)

    late = b.subgraph()
    y = conv_relu(late, rng, features, 32, 64, "stage2.block1")
    y = conv_relu(late, rng, y, 64, 64, "stage2.block2")
    y = late.op("MaxPool", [y], name="stage2.pool", kernel_shape=[2, 2], strides=[2, 2])
    late_logits = classifier_head(late, rng, y, 64, CLASSES, "late_head")
    # Weights go to the outer graph: branches read them from the enclosing scope.
    b.initializers.extend(late.initializers)
    late.initializers.clear()

    thr = b.const("exit.threshold", threshold, np.float32)
    confident = b.op("Greater", [score, thr], name="exit.confident")
    then = b.subgraph()
    exit_logits = then.op("Identity", [early], name="exit.early_logits")
    logits_dims = ["batch", CLASSES]
    then_graph = then.graph("exit_early", [], [value_info(exit_logits, FLOAT, logits_dims)])
    else_graph = late.graph("run_late_stages", [], [value_info(late_logits, FLOAT, logits_dims)])
    logits = b.op("If", [confident], name="exit.if", then_branch=then_graph,
                  else_branch=else_graph)
    logits = b.rename(logits, "logits")
    graph = b.graph("early_exit", inputs, [value_info(logits, FLOAT, logits_dims)])
    return make_model(graph)


def _exit_scores(probe: onnx.ModelProto, samples: list[dict[str, np.ndarray]]) -> np.ndarray:
    options = ort.SessionOptions()
    # One thread keeps the reduction order, and so the calibrated threshold, reproducible.
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(probe.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return np.array([session.run(None, s)[0] for s in samples], dtype=np.float64)


def make_early_exit(seed: int) -> onnx.ModelProto:
    """A CNN that skips its later stages (``If``) when an early head is confident enough.

    Input ``image`` float32 [batch, 3, 32, 32]; output ``logits`` float32 [batch, 10] from the early
    head (then branch) or from two more conv blocks and a later head (else branch). The threshold on
    the early head's confidence is calibrated on :func:`early_exit_samples` so that about 70% of
    samples exit early. It is rounded to 4 decimals, so that last-bit differences in the
    calibration run (another machine, another onnxruntime build) rarely change the model's bytes.
    """
    calibration = _early_exit_samples(np.random.default_rng([seed, _CALIBRATION_STREAM]),
                                      _CALIBRATION_SAMPLES)
    scores = _exit_scores(_early_exit_graph(seed, None), calibration)
    threshold = round(float(np.quantile(scores, 1.0 - EXIT_RATE)), 4)
    return _early_exit_graph(seed, threshold)


def _early_exit_samples(rng: np.random.Generator, count: int) -> list[dict[str, np.ndarray]]:
    batches = rng.choice([1, 2], size=count, p=[0.85, 0.15])
    return [{"image": data.images(rng, (int(batch), 3, 32, 32))} for batch in batches]


def early_exit_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Images of varying contrast (clear ones exit early), batch 1 mostly and sometimes 2."""
    return _early_exit_samples(np.random.default_rng(seed), count)


DECODER_HIDDEN = 64
DECODER_VOCAB = 50
BOS_ID = 0
END_ID = 1
MEDIAN_STEPS = 8
# The longest max_len the samples use; calibration decodes this far.
_DECODER_MAX_LEN = 64


def _decoder_weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, v = DECODER_HIDDEN, DECODER_VOCAB
    return {
        "embed": small_normal(rng, (v, h), 1.0),
        "w_in": he_normal(rng, (h, h), h, gain=1.0),
        # A recurrent gain above 1 keeps the state moving (chaotic rather than stuck at a fixed
        # point), so when the end token wins depends on the initial state.
        "w_rec": he_normal(rng, (h, h), h, gain=1.5 ** 2),
        "bias": small_normal(rng, (h,), 0.1),
        "w_out": he_normal(rng, (h, v), h, gain=1.0),
        "out_bias": np.zeros(v, np.float32),
    }


def _decode_steps(w: dict[str, np.ndarray], init_states: np.ndarray, max_len: int) -> np.ndarray:
    """Number of steps the decoder runs from each of ``init_states`` [n, hidden]; numpy, batched."""
    state = init_states.astype(np.float64)
    token = np.full(len(state), BOS_ID)
    steps = np.full(len(state), max_len)
    running = np.ones(len(state), bool)
    for step in range(1, max_len + 1):
        state = np.tanh(w["embed"][token] @ w["w_in"] + state @ w["w_rec"] + w["bias"])
        token = np.argmax(state @ w["w_out"] + w["out_bias"], axis=1)
        ended = running & (token == END_ID)
        steps[ended] = step
        running &= ~ended
    return steps


def _calibrate_end_bias(w: dict[str, np.ndarray], init_states: np.ndarray) -> float:
    """Logit bias of the end token for a median decode of ``MEDIAN_STEPS``; sets it in ``w``."""
    low, high = -5.0, 5.0
    for _ in range(30):
        mid = (low + high) / 2
        w["out_bias"][END_ID] = mid
        if np.median(_decode_steps(w, init_states, _DECODER_MAX_LEN)) > MEDIAN_STEPS:
            low = mid
        else:
            high = mid
    # Rounded so that last-bit differences in the simulation rarely change the model's bytes.
    return round((low + high) / 2, 2)


def make_greedy_decoder(seed: int) -> onnx.ModelProto:
    """A tanh-RNN decoder that greedily emits tokens in a ``Loop`` until the end token or max_len.

    Inputs ``init_state`` float32 [1, 64] and ``max_len`` int64 scalar; outputs ``tokens`` int64
    [steps] (the end token included when reached) and ``final_state`` float32 [1, 64]. The end
    token's bias is calibrated on :func:`greedy_decoder_samples`'s distribution so that the median
    decode is about 8 steps with a long tail.
    """
    w = _decoder_weights(seed)
    calibration = _decoder_samples(np.random.default_rng([seed, _CALIBRATION_STREAM]),
                                   _CALIBRATION_SAMPLES)
    init_states = np.concatenate([s["init_state"] for s in calibration])
    w["out_bias"][END_ID] = _calibrate_end_bias(w, init_states)

    b = GraphBuilder()
    init_state, max_len = b.name("init_state"), b.name("max_len")
    names = {key: b.weight(f"decoder.{key}", value) for key, value in w.items()}
    bos = b.const("decoder.bos", [BOS_ID])
    keep_going = b.const("decoder.start", True, np.bool_)

    body = b.subgraph()
    step, cond_in = body.name("step.iteration"), body.name("step.cond_in")
    state, token = body.name("step.state_in"), body.name("step.token_in")
    emb = body.op("Gather", [names["embed"], token], name="step.embed", axis=0)
    pre = body.op("Add", [body.op("MatMul", [emb, names["w_in"]], name="step.in_proj"),
                          body.op("MatMul", [state, names["w_rec"]], name="step.rec_proj")],
                  name="step.sum")
    new_state = body.op("Tanh", [body.op("Add", [pre, names["bias"]], name="step.bias")],
                        name="step.tanh")
    logits = body.op("Add", [body.op("MatMul", [new_state, names["w_out"]], name="step.out_proj"),
                             names["out_bias"]], name="step.logits")
    next_token = body.op("ArgMax", [logits], name="step.argmax", axis=1, keepdims=0)
    end = body.const("step.end_id", [END_ID])
    axis0 = body.const("step.axis0", [0])
    is_end = body.op("Equal", [next_token, end], name="step.is_end")
    cond_out = body.op("Squeeze", [body.op("Not", [is_end], name="step.not_end"), axis0],
                       name="step.cond_out")
    emitted = body.op("Squeeze", [next_token, axis0], name="step.emitted")
    body_graph = body.graph(
        "decode_step",
        [value_info(step, INT64, []), value_info(cond_in, BOOL, []),
         value_info(state, FLOAT, [1, DECODER_HIDDEN]), value_info(token, INT64, [1])],
        [value_info(cond_out, BOOL, []), value_info(new_state, FLOAT, [1, DECODER_HIDDEN]),
         value_info(next_token, INT64, [1]), value_info(emitted, INT64, [])])

    final_state, _, tokens = b.op("Loop", [max_len, keep_going, init_state, bos],
                                  name="decoder.loop", outputs=3, body=body_graph)
    final_state = b.rename(final_state, "final_state")
    tokens = b.rename(tokens, "tokens")
    graph = b.graph("greedy_decoder",
                    [value_info(init_state, FLOAT, [1, DECODER_HIDDEN]),
                     value_info(max_len, INT64, [])],
                    [value_info(tokens, INT64, ["steps"]),
                     value_info(final_state, FLOAT, [1, DECODER_HIDDEN])])
    return make_model(graph)


def _decoder_samples(rng: np.random.Generator, count: int) -> list[dict[str, np.ndarray]]:
    max_lens = rng.choice([8, 16, 32, _DECODER_MAX_LEN], size=count, p=[0.2, 0.3, 0.3, 0.2])
    return [{"init_state": (0.5 * rng.standard_normal((1, DECODER_HIDDEN))).astype(np.float32),
             "max_len": np.array(max_len, np.int64)} for max_len in max_lens]


def greedy_decoder_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Initial states (encoder summaries) and length limits between 8 and 64 for the decoder.

    Most decodes end after a few steps, some run long, and some are cut off at ``max_len``.
    """
    return _decoder_samples(np.random.default_rng(seed), count)


SCAN_FEATURES = 16
SCAN_HIDDEN = 32


def make_scan_rnn(seed: int) -> onnx.ModelProto:
    """A tanh RNN over a sequence written with ``Scan``.

    Input ``x`` float32 [seq, 1, 16]; outputs ``states`` float32 [seq, 1, 32] (every hidden state)
    and ``last`` float32 [1, 32]. The initial state is a zero initializer.
    """
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.name("x")
    w_in = b.weight("rnn.w_in", he_normal(rng, (SCAN_FEATURES, SCAN_HIDDEN), SCAN_FEATURES, 0.5))
    # Recurrent gain below 1: the state remembers the recent past and forgets the distant one.
    w_rec = b.weight("rnn.w_rec", he_normal(rng, (SCAN_HIDDEN, SCAN_HIDDEN), SCAN_HIDDEN, 0.8))
    bias = b.weight("rnn.bias", small_normal(rng, (SCAN_HIDDEN,), 0.1))
    h0 = b.weight("rnn.h0", np.zeros((1, SCAN_HIDDEN), np.float32))

    body = b.subgraph()
    state, x_t = body.name("cell.state_in"), body.name("cell.x_in")
    pre = body.op("Add", [body.op("MatMul", [x_t, w_in], name="cell.in_proj"),
                          body.op("MatMul", [state, w_rec], name="cell.rec_proj")],
                  name="cell.sum")
    new_state = body.op("Tanh", [body.op("Add", [pre, bias], name="cell.bias")], name="cell.tanh")
    # A tensor can be a graph output only once, so the per-step copy needs its own name.
    emitted = body.op("Identity", [new_state], name="cell.emitted")
    hidden = [1, SCAN_HIDDEN]
    body_graph = body.graph(
        "rnn_cell",
        [value_info(state, FLOAT, hidden), value_info(x_t, FLOAT, [1, SCAN_FEATURES])],
        [value_info(new_state, FLOAT, hidden), value_info(emitted, FLOAT, hidden)])

    last, states = b.op("Scan", [h0, x], name="rnn.scan", outputs=2, body=body_graph,
                        num_scan_inputs=1)
    last, states = b.rename(last, "last"), b.rename(states, "states")
    graph = b.graph("scan_rnn", [value_info(x, FLOAT, ["seq", 1, SCAN_FEATURES])],
                    [value_info(states, FLOAT, ["seq", 1, SCAN_HIDDEN]),
                     value_info(last, FLOAT, hidden)])
    return make_model(graph)


def scan_rnn_samples(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Sensor-like signals (sines plus noise) of lognormal length (median 12) in [2, 128]."""
    rng = np.random.default_rng(seed)
    lengths = data.skewed_lengths(rng, count, median=12, sigma=0.7, low=2, high=128)
    samples = []
    for length in lengths:
        t = np.arange(length)[:, None]
        freq = rng.uniform(0.05, 0.5, size=SCAN_FEATURES)
        phase = rng.uniform(0, 2 * np.pi, size=SCAN_FEATURES)
        signal = np.sin(freq * t + phase) + 0.1 * rng.standard_normal((length, SCAN_FEATURES))
        samples.append({"x": signal[:, None, :].astype(np.float32)})
    return samples
