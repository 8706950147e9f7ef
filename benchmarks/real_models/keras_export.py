"""Keras models (tf-keras 2.21, weights=None) converted with tf2onnx (``tf2onnx.convert.from_keras``).
Dynamic dims are ``None`` in the Keras input specs, as Keras users write them.

Run in the tf export venv (see setup_export_env.sh):

    python benchmarks/real_models/keras_export.py --cache ~/.cache/edgec/real_models [--only NAME]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SEED, Input, Spec, main, make_inputs  # noqa: E402

NHWC = lambda size=224: Input("input", ("batch", size, size, 3), kind="image")  # noqa: E731
BATCH_12 = [{"batch": 1}, {"batch": 2}, {"batch": 1}]
TEXT = [Input("tokens", ("batch", "seq"), "int32", "tokens", 5000)]
TEXT_SAMPLES = [{"batch": 1, "seq": 16}, {"batch": 1, "seq": 32}, {"batch": 2, "seq": 24}]


def _seed():
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(SEED)
    tf.random.set_seed(SEED)


def _calibrate_bn(model, shape, batches=3):
    """Realistic BatchNorm moving statistics: a few seeded random batches through in training
    mode (tf-keras BN updates its moving mean/var when called with training=True)."""
    import numpy as np
    import tf_keras

    bns = [layer for layer in _all_layers(model)
           if isinstance(layer, tf_keras.layers.BatchNormalization)]
    if not bns:
        return model
    for bn in bns:
        bn.momentum = 0.5
    rng = np.random.default_rng(SEED + 7)
    for _ in range(batches * 2):
        model(rng.standard_normal(shape).clip(-2.5, 2.5).astype("float32"), training=True)
    return model


def _all_layers(model):
    for layer in model.layers:
        yield layer
        if hasattr(layer, "layers"):
            yield from _all_layers(layer)


def app(name, size=224, **kwargs):
    def build():
        import tf_keras

        _seed()
        model = getattr(tf_keras.applications, name)(weights=None, input_shape=(size, size, 3),
                                                     **kwargs)
        return _calibrate_bn(model, (4, size, size, 3))
    return build


def conv1d_text():
    def build():
        import tf_keras as k

        _seed()
        inp = k.Input(shape=(None,), dtype="int32", name="tokens")
        x = k.layers.Embedding(5000, 64)(inp)
        x = k.layers.Conv1D(64, 5, padding="same", activation="relu")(x)
        x = k.layers.BatchNormalization()(x)
        x = k.layers.Conv1D(64, 3, padding="same", activation="relu")(x)
        x = k.layers.GlobalMaxPooling1D()(x)
        x = k.layers.Dense(32, activation="relu")(x)
        out = k.layers.Dense(4, activation="softmax")(x)
        model = k.Model(inp, out)
        import numpy as np
        rng = np.random.default_rng(SEED + 7)
        for _ in range(4):
            model(rng.integers(0, 5000, (4, 32)).astype("int32"), training=True)
        return model
    return build


def lstm_text(bidirectional=False, cell="LSTM"):
    def build():
        import tf_keras as k

        _seed()
        inp = k.Input(shape=(None,), dtype="int32", name="tokens")
        x = k.layers.Embedding(5000, 32)(inp)
        layer = getattr(k.layers, cell)(32)
        x = k.layers.Bidirectional(layer)(x) if bidirectional else layer(x)
        out = k.layers.Dense(4, activation="softmax")(x)
        return k.Model(inp, out)
    return build


T = "tf2onnx"
SPECS = [
    Spec("keras_mobilenet_v2", T, "keras.applications MobileNetV2", app("MobileNetV2"), [NHWC()], BATCH_12),
    Spec("keras_mobilenet_v3_small", T, "keras.applications MobileNetV3Small",
         app("MobileNetV3Small"), [NHWC()], BATCH_12),
    Spec("keras_efficientnet_b0", T, "keras.applications EfficientNetB0", app("EfficientNetB0"), [NHWC()], BATCH_12),
    Spec("keras_resnet50", T, "keras.applications ResNet50", app("ResNet50"), [NHWC()], BATCH_12),
    Spec("keras_densenet121", T, "keras.applications DenseNet121", app("DenseNet121"), [NHWC()], BATCH_12),
    Spec("keras_conv1d_text", T, "keras Embedding + Conv1D + GlobalMaxPool text classifier",
         conv1d_text(), TEXT, TEXT_SAMPLES),
    Spec("keras_lstm_text", T, "keras Embedding + LSTM text classifier", lstm_text(), TEXT, TEXT_SAMPLES),
    Spec("keras_bigru_text", T, "keras Embedding + Bidirectional(GRU) text classifier",
         lstm_text(True, "GRU"), TEXT, TEXT_SAMPLES),
]


def export(spec: Spec, folder: Path) -> None:
    import tensorflow as tf
    import tf2onnx

    model = spec.build()
    signature = [tf.TensorSpec([None if isinstance(d, str) else d for d in i.shape],
                               tf.as_dtype(i.dtype), name=i.name) for i in spec.inputs]
    # check the model runs on the trace dims before converting
    model(make_inputs(spec, spec.trace_dims(), seed=SEED)[0])
    tf2onnx.convert.from_keras(model, input_signature=signature, opset=spec.opset,
                               output_path=str(folder / "model.onnx"))


def versions() -> dict:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("tensorflow", "tf_keras", "tf2onnx", "onnx")}


if __name__ == "__main__":
    sys.exit(main(SPECS, export, versions))
