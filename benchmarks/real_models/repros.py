"""Minimal ONNX reproducers, one per failure class that the real-model suite found
(reports/real_models.md). Each is a few nodes built with onnx.helper, with samples, compiled with
``edgec compile`` at its defaults; the script prints edgec's error line per case.

    PYTHONPATH=. .venv/bin/python benchmarks/real_models/repros.py [--out DIR] [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

REPO = Path(__file__).resolve().parents[2]


def _c(name, value, dtype=np.int64):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.array(value, dtype=dtype)))


def _model(nodes, inputs, outputs, inits=()):
    graph = h.make_graph(nodes, "repro", inputs, outputs, list(inits))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


def chunk_slice():
    """torch.chunk on channels with a dynamic batch (shufflenet, T5/wav2vec2 similar): the slice
    end comes from Gather(Shape(x), [1]), a runtime tensor, so the Slice becomes
    dynamic_strided_slice with an unknown output shape; Shape of a later tensor is then an
    R.shape_of call that Gather cannot take."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("one", [1]), _c("zero", [0]), _c("two", [2]),
             h.make_node("Gather", ["s", "one"], ["c"], axis=0),
             h.make_node("Div", ["c", "two"], ["half"]),
             h.make_node("Slice", ["x", "zero", "half", "one"], ["a"]),
             h.make_node("Shape", ["a"], ["s2"]),
             h.make_node("Gather", ["s2", "zero"], ["n"], axis=0),
             h.make_node("Relu", ["a"], ["out"])]
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["N", 4, 8, 8])],
                   [h.make_tensor_value_info("out", T.FLOAT, ["N", "c", 8, 8]),
                    h.make_tensor_value_info("n", T.INT64, [1])])
    return model, [{"x": np.random.rand(b, 4, 8, 8).astype(np.float32)} for b in (1, 2)]


def range_broadcast():
    """arange(seq) (position ids, causal masks) broadcast against a [batch, seq] tensor: Range's
    length becomes a fresh var range_len_0, unrelated to seq."""
    nodes = [h.make_node("Shape", ["x"], ["s"], start=1, end=2), _c("one", 1), _c("zero", 0),
             h.make_node("Squeeze", ["s"], ["seq"]),
             h.make_node("Range", ["zero", "seq", "one"], ["pos"]),
             h.make_node("Cast", ["pos"], ["posf"], to=T.FLOAT),
             h.make_node("Add", ["x", "posf"], ["out"])]
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq"])],
                   [h.make_tensor_value_info("out", T.FLOAT, ["batch", "seq"])])
    return model, [{"x": np.random.rand(b, s).astype(np.float32)} for b, s in ((1, 8), (1, 16), (2, 32))]


def shape_reduce():
    """x.numel() as TorchScript exports it: ReduceProd(Shape(x)) on a symbolic shape."""
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("ReduceProd", ["s"], ["numel"], keepdims=0),
             h.make_node("Cast", ["numel"], ["nf"], to=T.FLOAT),
             h.make_node("Div", ["x", "nf"], ["out"])]
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["n", 4])],
                   [h.make_tensor_value_info("out", T.FLOAT, ["n", 4])])
    return model, [{"x": np.random.rand(n, 4).astype(np.float32)} for n in (3, 5)]


def slice_squeeze():
    """Keras LSTM's last step as tf2onnx writes it: Slice(Y, -1:INT_MAX, axis 0) then Squeeze(0)
    on a symbolic sequence axis; the slice's length is a min/max expression, not 1."""
    nodes = [_c("start", [-1]), _c("end", [2**31 - 1]), _c("axes", [0]),
             h.make_node("Slice", ["y", "start", "end", "axes"], ["last"]),
             h.make_node("Squeeze", ["last", "axes"], ["out"])]
    model = _model(nodes, [h.make_tensor_value_info("y", T.FLOAT, ["seq", "batch", 8])],
                   [h.make_tensor_value_info("out", T.FLOAT, ["batch", 8])])
    return model, [{"y": np.random.rand(s, 1, 8).astype(np.float32)} for s in (4, 9)]


def dynamic_pad():
    """F.pad(mask, (0, total - mask.shape[1])) with pads computed from shapes (transformers'
    padding mask with past key values)."""
    nodes = [h.make_node("Shape", ["mask"], ["s"]), h.make_node("Shape", ["kv"], ["t"]),
             _c("one", [1]), _c("zero2", [0, 0, 0]),
             h.make_node("Gather", ["s", "one"], ["len"], axis=0),
             h.make_node("Gather", ["t", "one"], ["total"], axis=0),
             h.make_node("Sub", ["total", "len"], ["extra"]),
             h.make_node("Concat", ["zero2", "extra"], ["pads"], axis=0),
             h.make_node("Pad", ["mask", "pads"], ["out"], mode="constant")]
    model = _model(nodes, [h.make_tensor_value_info("mask", T.FLOAT, ["batch", "seq"]),
                           h.make_tensor_value_info("kv", T.FLOAT, ["batch", "total"])],
                   [h.make_tensor_value_info("out", T.FLOAT, ["batch", "total"])])
    return model, [{"mask": np.ones((1, s), np.float32), "kv": np.ones((1, s + 3), np.float32)}
                   for s in (4, 8)]


def conv_same_upper():
    """tf2onnx's Conv1D: Unsqueeze(-3), Transpose(0,3,1,2), Conv(auto_pad=SAME_UPPER). The
    static-shape specialization fails in TVM's FuseTIR (explicit pads compile)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((100, 8)).astype(np.float32), "W"),
             nh.from_array(rng.standard_normal((8, 8, 1, 3)).astype(np.float32), "K"),
             nh.from_array(np.array([-3], np.int64), "axm3"), nh.from_array(np.array([2], np.int64), "ax2")]
    nodes = [h.make_node("Gather", ["W", "tokens"], ["e"], axis=0),
             h.make_node("Unsqueeze", ["e", "axm3"], ["t"]),
             h.make_node("Transpose", ["t"], ["u"], perm=[0, 3, 1, 2]),
             h.make_node("Conv", ["u", "K"], ["c"], auto_pad="SAME_UPPER", kernel_shape=[1, 3]),
             h.make_node("Squeeze", ["c", "ax2"], ["out"])]
    model = _model(nodes, [h.make_tensor_value_info("tokens", T.INT32, ["batch", "seq"])],
                   [h.make_tensor_value_info("out", T.FLOAT, ["batch", 8, "seq"])], inits)
    return model, [{"tokens": rng.integers(0, 100, (1, 16)).astype(np.int32)}]


CASES = {f.__name__: f for f in (chunk_slice, range_broadcast, shape_reduce, slice_squeeze,
                                  dynamic_pad, conv_same_upper)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="edgec-repros-"))
    np.random.seed(0)
    for name, make in CASES.items():
        if args.only and name not in args.only.split(","):
            continue
        model, samples = make()
        folder = out / name / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(out / name / "model.onnx"))
        for k, sample in enumerate(samples):
            np.savez(folder / f"sample_{k:03d}.npz", **sample)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        result = subprocess.run([sys.executable, "-m", "edgec", "compile", str(out / name / "model.onnx"),
                                 "--samples", str(folder), "-o", str(out / name / "a.edgec")],
                                capture_output=True, text=True, env=env)
        lines = [line for line in result.stderr.splitlines() if line.startswith("edgec:")]
        print(f"{name}: {'compiled' if result.returncode == 0 else (lines[0] if lines else result.stderr[-300:])[:300]}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
