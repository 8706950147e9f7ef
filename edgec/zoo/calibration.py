"""The cost model's calibration suite: small models, each one building block at several sizes.

The zoo's real models each mix many blocks, and there are few of them, so a cost model fitted on
all but one sees some blocks in one model only (a Scan in ``scan_rnn``, a native recurrent loop in
``speech_lstm``) and cannot price them for the one left out. These models price the blocks apart,
over a wide range of sizes, as microbenchmarks price instructions: library matmuls wide and
narrow, chains of TVM kernels, attention (matmuls of two computed operands), Scan bodies small
and wide, a native GRU loop, convolutions over a dynamic batch. ``edgec costmodel collect``
measures them with the zoo; ``costmodel eval`` never holds them out (they are training data, not
models a plan is judged on).

Every model has one symbolic dim, and its samples spread it lognormally over a wide range.
"""

from __future__ import annotations

import numpy as np
import onnx

from edgec.zoo import data
from edgec.zoo.builders import (FLOAT, GraphBuilder, he_normal, linear, make_model, small_normal,
                                value_info)

Samples = list[dict[str, np.ndarray]]


def row_samples(count: int, seed: int, width: int, median: float, low: int, high: int,
                lead: tuple[int, ...] = ()) -> Samples:
    """``count`` float32 inputs ``x`` of [n, *lead, width], n lognormal in [low, high]."""
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((int(n), *lead, width)).astype(np.float32)}
            for n in data.skewed_lengths(rng, count, median, 1.0, low, high)]


def make_mlp(seed: int, width: int, hidden: int, layers: int) -> onnx.ModelProto:
    """``layers`` linear layers with ReLU over [n, width] rows: library matmuls."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.name("x")
    sizes = [width] + [hidden] * (layers - 1) + [width]
    for i in range(layers):
        x = b.op("Relu", [linear(b, rng, x, sizes[i], sizes[i + 1], f"fc{i}")], name=f"fc{i}.relu")
    y = b.rename(x, "y")
    graph = b.graph("calib_mlp", [value_info("x", FLOAT, ["n", width])], [value_info(y, FLOAT, ["n", width])])
    return make_model(graph)


def make_elementwise(seed: int, width: int = 256) -> onnx.ModelProto:
    """A chain of elementwise ops, a LayerNorm and a Softmax over [n, width]: TVM's kernels only."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.name("x")
    scale = b.weight("scale", small_normal(rng, (width,), 0.5) + 1.0)
    shift = b.weight("shift", small_normal(rng, (width,), 0.5))
    h = x
    for i in range(4):
        h = b.op("Mul", [h, scale], name=f"mul{i}")
        h = b.op("Add", [h, shift], name=f"add{i}")
        h = b.op("Tanh" if i % 2 else "Sigmoid", [h], name=f"act{i}")
        h = b.op("Sub", [h, b.op("Exp", [b.op("Neg", [h], name=f"neg{i}")], name=f"exp{i}")],
                 name=f"sub{i}")
    h = b.op("LayerNormalization", [h, scale, shift], name="norm", axis=-1)
    y = b.rename(b.op("Softmax", [h], name="softmax", axis=-1), "y")
    graph = b.graph("calib_elementwise", [value_info("x", FLOAT, ["n", width])],
                    [value_info(y, FLOAT, ["n", width])])
    return make_model(graph)


def make_attention(seed: int, width: int = 64) -> onnx.ModelProto:
    """Single-head self-attention over [n, width]: two matmuls whose operands are both computed."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.name("x")
    q, k, v = (linear(b, rng, x, width, width, name, gain=1.0) for name in ("q", "k", "v"))
    kt = b.op("Transpose", [k], name="k.t", perm=[1, 0])
    scores = b.op("Mul", [b.op("MatMul", [q, kt], name="scores"),
                          b.const("scale", np.float32(width ** -0.5), np.float32)], name="scaled")
    attended = b.op("MatMul", [b.op("Softmax", [scores], name="softmax", axis=-1), v], name="attend")
    y = b.rename(linear(b, rng, attended, width, width, "out", gain=1.0), "y")
    graph = b.graph("calib_attention", [value_info("x", FLOAT, ["n", width])],
                    [value_info(y, FLOAT, ["n", width])])
    return make_model(graph)


def make_scan(seed: int, width: int, depth: int) -> onnx.ModelProto:
    """A Scan over [n, 1, width] whose body is ``depth`` matmul+tanh layers on a [1, width] state."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.name("x")
    h0 = b.weight("h0", np.zeros((1, width), np.float32))
    body = b.subgraph()
    state, x_t = body.name("cell.state_in"), body.name("cell.x_in")
    h = body.op("Add", [state, x_t], name="cell.in")
    for i in range(depth):
        w = body.weight(f"cell.w{i}", he_normal(rng, (width, width), width, 0.8))
        h = body.op("Tanh", [body.op("MatMul", [h, w], name=f"cell.mm{i}")], name=f"cell.tanh{i}")
    emitted = body.op("Identity", [h], name="cell.emitted")
    body_graph = body.graph("cell", [value_info(state, FLOAT, [1, width]), value_info(x_t, FLOAT, [1, width])],
                            [value_info(h, FLOAT, [1, width]), value_info(emitted, FLOAT, [1, width])])
    last, states = b.op("Scan", [h0, x], name="scan", outputs=2, body=body_graph, num_scan_inputs=1)
    last, states = b.rename(last, "last"), b.rename(states, "states")
    graph = b.graph("calib_scan", [value_info("x", FLOAT, ["n", 1, width])],
                    [value_info(states, FLOAT, ["n", 1, width]), value_info(last, FLOAT, [1, width])])
    return make_model(graph)


def make_gru(seed: int, width: int = 32, hidden: int = 64) -> onnx.ModelProto:
    """A GRU layer over [n, 1, width] (edgec's native loop on CPU targets)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.name("x")
    w = b.weight("gru.w", (rng.standard_normal((1, 3 * hidden, width)) / np.sqrt(width)).astype(np.float32))
    r = b.weight("gru.r", (rng.standard_normal((1, 3 * hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
    seq = b.op("GRU", [x, w, r], name="gru", hidden_size=hidden)
    y = b.rename(b.op("Squeeze", [seq, b.const("axis", [1])], name="squeeze"), "y")
    graph = b.graph("calib_gru", [value_info("x", FLOAT, ["n", 1, width])],
                    [value_info(y, FLOAT, ["n", 1, hidden])])
    return make_model(graph)


def make_conv(seed: int, channels: int = 16, size: int = 24) -> onnx.ModelProto:
    """Three 3x3 convolutions with ReLU and a max pool over [n, 3, size, size] images."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder()
    x = b.name("x")
    h, cin = x, 3
    for i, cout in enumerate((channels, channels, 2 * channels)):
        w = b.weight(f"conv{i}.w", he_normal(rng, (cout, cin, 3, 3), cin * 9))
        h = b.op("Relu", [b.op("Conv", [h, w, b.weight(f"conv{i}.b", small_normal(rng, (cout,)))],
                               name=f"conv{i}", kernel_shape=[3, 3], pads=[1] * 4)], name=f"conv{i}.relu")
        cin = cout
    y = b.rename(b.op("MaxPool", [h], name="pool", kernel_shape=[2, 2], strides=[2, 2]), "y")
    graph = b.graph("calib_conv", [value_info("x", FLOAT, ["n", 3, size, size])],
                    [value_info(y, FLOAT, ["n", 2 * channels, size // 2, size // 2])])
    return make_model(graph)


def image_samples(count: int, seed: int, size: int = 24) -> Samples:
    rng = np.random.default_rng(seed)
    return [{"x": data.images(rng, (int(n), 3, size, size))}
            for n in data.skewed_lengths(rng, count, 3, 0.8, 1, 16)]
