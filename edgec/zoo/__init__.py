"""The model zoo: seeded ONNX models and matching sample inputs to compile, profile and test on.

Each :class:`ZooModel` makes its model from a seed and its samples from a count and a seed, both
deterministically; :func:`export` writes them in the layout the CLI stages read
(``model.onnx`` and ``samples/sample_NNN.npz``).
"""

from __future__ import annotations

import io
import os
import re
import zipfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from edgec.errors import EdgecError
from edgec.fileio import npz_bytes
from edgec.zoo import bucketed, calibration, control_flow, digits, dynamic, light, static

Samples = list[dict[str, np.ndarray]]


@dataclass(frozen=True)
class ZooModel:
    """One zoo entry: how to make the model and its samples, and what it exercises.

    ``kind`` is ``"static"`` (every shape fixed) or ``"dynamic"``; ``features`` names what makes the
    model interesting to the compiler (``"If"``, ``"Loop"``, ``"Scan"``, ``"NonZero"``,
    ``"dynamic-shape"``).
    """

    name: str
    kind: str
    description: str
    make_model: Callable[[int], onnx.ModelProto]
    make_samples: Callable[[int, int], Samples]
    default_samples: int
    features: tuple[str, ...]


def _light_model(name: str, seed: int) -> onnx.ModelProto:
    # The shipped model has no seed-dependent part.
    return light.load_light(name)


def _rand_model(name: str, seed: int) -> onnx.ModelProto:
    return light.randomize_weights(light.load_light(name), seed)


def _light_samples(name: str, count: int, seed: int) -> Samples:
    return light.light_samples(name, count, seed)


def _calibration_models() -> list[ZooModel]:
    """The cost model's calibration suite (:mod:`edgec.zoo.calibration`): one block each, at sizes
    spread over two or three decades of their one symbolic dim."""
    c = calibration
    rows = c.row_samples
    entries = [
        ("calib_mlp_wide", "3 linear layers 128-512-512-128 over a dynamic number of rows",
         partial(c.make_mlp, width=128, hidden=512, layers=3), partial(rows, width=128, median=16, low=1, high=512)),
        ("calib_mlp_narrow", "8 linear layers of width 16-32 over a dynamic number of rows",
         partial(c.make_mlp, width=16, hidden=32, layers=8), partial(rows, width=16, median=16, low=1, high=512)),
        ("calib_elementwise", "16 elementwise ops, LayerNorm and Softmax over [rows, 256]",
         c.make_elementwise, partial(rows, width=256, median=16, low=1, high=512)),
        ("calib_attention", "single-head self-attention (width 64) over a dynamic sequence",
         c.make_attention, partial(rows, width=64, median=24, low=2, high=256)),
        ("calib_scan_small", "Scan with a 1-layer body on a [1, 16] state over a dynamic sequence",
         partial(c.make_scan, width=16, depth=1), partial(rows, width=16, median=16, low=2, high=256, lead=(1,))),
        ("calib_scan_wide", "Scan with a 3-layer body on a [1, 128] state over a dynamic sequence",
         partial(c.make_scan, width=128, depth=3), partial(rows, width=128, median=16, low=2, high=128, lead=(1,))),
        ("calib_gru", "GRU layer (hidden 64) over a dynamic sequence",
         c.make_gru, partial(rows, width=32, median=40, low=4, high=400, lead=(1,))),
        ("calib_conv", "three 3x3 convolutions and a max pool over a dynamic batch of 24x24 images",
         c.make_conv, c.image_samples),
    ]
    return [ZooModel(name, "dynamic", f"cost-model calibration: {text}", make, samples, 24,
                     ("calibration", "dynamic-shape"))
            for name, text, make, samples in entries]


def calibration_names() -> list[str]:
    """The calibration suite's model names: cost-model training data, never held out."""
    return [name for name in names() if "calibration" in _MODELS[name].features]


def _registry() -> dict[str, ZooModel]:
    models = [
        ZooModel("cnn", "static", "small CNN classifier, [1,3,32,32] image to 10 logits",
                 static.make_cnn, static.cnn_samples, 8, ()),
        ZooModel("digits", "dynamic",
                 "trained CNN classifier for 8x8 handwritten digits, [batch,1,8,8] to 10 logits",
                 digits.make_digits, digits.digits_samples, 16, ("dynamic-shape", "trained")),
        ZooModel("transformer", "dynamic",
                 "2-layer transformer encoder (d_model 64, 4 heads), dynamic batch and sequence",
                 dynamic.make_transformer, dynamic.transformer_samples, 24, ("dynamic-shape",)),
        ZooModel("early_exit", "dynamic",
                 "CNN that exits early (If) when an early head is confident, ~70% of inputs",
                 control_flow.make_early_exit, control_flow.early_exit_samples, 16,
                 ("If", "dynamic-shape")),
        ZooModel("greedy_decoder", "dynamic",
                 "tanh-RNN greedy decoder looping (Loop) until the end token or max_len",
                 control_flow.make_greedy_decoder, control_flow.greedy_decoder_samples, 16,
                 ("Loop", "dynamic-shape")),
        ZooModel("moe", "dynamic",
                 "mixture-of-experts layer, top-2 of 4 experts, data-dependent tokens per expert",
                 dynamic.make_moe, dynamic.moe_samples, 16, ("NonZero", "dynamic-shape")),
        ZooModel("speech_lstm", "dynamic",
                 "keyword-spotting LSTM (2 layers, hidden 128) over 10-200 log-mel frames",
                 dynamic.make_speech_lstm, dynamic.speech_lstm_samples, 16, ("LSTM", "dynamic-shape")),
        ZooModel("scan_rnn", "dynamic", "tanh RNN over a variable-length sequence (Scan)",
                 control_flow.make_scan_rnn, control_flow.scan_rnn_samples, 16,
                 ("Scan", "dynamic-shape")),
        ZooModel("cnn_batch", "dynamic",
                 "CNN over micro-batches of 16x16 images, dynamic batch (1 + Poisson(3))",
                 bucketed.make_cnn_batch, bucketed.cnn_batch_samples, 24, ("dynamic-shape",)),
        ZooModel("token_tagger", "dynamic",
                 "per-token tagger (embedding, MLP, LayerNorm), sentences of many distinct lengths",
                 bucketed.make_token_tagger, bucketed.token_tagger_samples, 24, ("dynamic-shape",)),
        ZooModel("prompt_encoder", "dynamic",
                 "self-attention prompt encoder, four canned prompt lengths and free text",
                 bucketed.make_prompt_encoder, bucketed.prompt_encoder_samples, 24, ("dynamic-shape",)),
    ]
    models += _calibration_models()
    for name in light.light_names():
        models.append(ZooModel(
            f"light_{name}", "static",
            f"{name} as shipped with the onnx package (constant weights, constant output)",
            partial(_light_model, name), partial(_light_samples, name), 4, ()))
        models.append(ZooModel(
            f"{name}_rand", "static", f"{name} graph with seeded random weights",
            partial(_rand_model, name), partial(_light_samples, name), 4, ()))
    return {model.name: model for model in models}


_MODELS = _registry()


def names() -> list[str]:
    """The names of all zoo models, sorted."""
    return sorted(_MODELS)


def get(name: str) -> ZooModel:
    """The zoo model called ``name``; raises :class:`EdgecError` listing the known names if none."""
    try:
        return _MODELS[name]
    except KeyError:
        raise EdgecError(f"unknown zoo model {name!r}; known: {', '.join(names())}") from None


def _write_atomic(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` via a temporary file in the same directory and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


_SAMPLE_FILE = re.compile(r"sample_(\d+)\.npz")


def export(name: str, out_dir: str | Path, seed: int = 0, count: int | None = None) -> Path:
    """Write the zoo model ``name`` and its samples to ``out_dir``; return ``out_dir`` as a Path.

    Writes ``model.onnx`` and ``samples/sample_000.npz``... (``count`` of them, the model's
    ``default_samples`` if None), each npz holding one array per model input, keyed by input name,
    in the input's dtype. The same seed gives byte-identical files. Each file is written under a
    temporary name and renamed into place, so an interrupted export leaves no partial file; sample
    files left from an earlier, larger export are removed.
    """
    model_def = get(name)
    count = model_def.default_samples if count is None else count
    if count < 0:
        raise EdgecError(f"sample count must be >= 0, got {count}")
    out = Path(out_dir)
    sample_dir = out / "samples"
    try:
        sample_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EdgecError(f"cannot create export directory {str(out)!r}: {e.strerror}") from None

    model = model_def.make_model(seed)
    _write_atomic(out / "model.onnx", model.SerializeToString())
    for index, sample in enumerate(model_def.make_samples(count, seed)):
        _write_atomic(sample_dir / f"sample_{index:03d}.npz", npz_bytes(sample))
    for stale in sample_dir.iterdir():
        match = _SAMPLE_FILE.fullmatch(stale.name)
        if match and int(match.group(1)) >= count:
            stale.unlink()
    return out
