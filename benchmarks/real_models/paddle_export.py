"""PaddlePaddle models (paddle.vision.models, pretrained=False; a small LSTM) exported with
``paddle.onnx.export`` (paddle2onnx). Dynamic dims are -1 in ``paddle.static.InputSpec``.

Run in the tf export venv, which also holds paddle (see setup_export_env.sh):

    python benchmarks/real_models/paddle_export.py --cache ~/.cache/edgec/real_models [--only NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SEED, Input, Spec, main  # noqa: E402

IMG = lambda: Input("image", ("batch", 3, 224, 224), kind="image")  # noqa: E731
BATCH_12 = [{"batch": 1}, {"batch": 2}, {"batch": 1}]


def _calibrate_bn(model, shape, batches=3):
    import numpy as np
    import paddle

    bns = [m for m in model.sublayers() if isinstance(m, (paddle.nn.BatchNorm2D, paddle.nn.BatchNorm))]
    for bn in bns:
        bn._momentum = 0.5
        bn.train()
    rng = np.random.default_rng(SEED + 7)
    with paddle.no_grad():
        for _ in range(batches * 2):
            model(paddle.to_tensor(rng.standard_normal(shape).clip(-2.5, 2.5).astype("float32")))
    for bn in bns:
        bn.eval()
    return model


def vision(name, **kwargs):
    def build():
        import paddle

        paddle.seed(SEED)
        model = getattr(paddle.vision.models, name)(pretrained=False, **kwargs)
        model.eval()
        return _calibrate_bn(model, (4, 3, 224, 224))
    return build


def lstm_tagger():
    def build():
        import paddle

        paddle.seed(SEED)

        class Tagger(paddle.nn.Layer):
            def __init__(self):
                super().__init__()
                self.emb = paddle.nn.Embedding(3000, 48)
                self.lstm = paddle.nn.LSTM(48, 64, num_layers=2, direction="bidirect")
                self.fc = paddle.nn.Linear(128, 9)

            def forward(self, tokens):
                x, _ = self.lstm(self.emb(tokens))
                return self.fc(x)
        model = Tagger()
        model.eval()
        return model
    return build


P = "paddle2onnx"
SPECS = [
    Spec("paddle_mobilenet_v2", P, "paddle.vision.models mobilenet_v2", vision("mobilenet_v2"), [IMG()], BATCH_12),
    Spec("paddle_resnet18", P, "paddle.vision.models resnet18", vision("resnet18"), [IMG()], BATCH_12),
    Spec("paddle_shufflenet_v2", P, "paddle.vision.models shufflenet_v2_x1_0", vision("shufflenet_v2_x1_0"),
         [IMG()], BATCH_12),
    Spec("paddle_mobilenet_v3_small", P, "paddle.vision.models mobilenet_v3_small",
         vision("mobilenet_v3_small"), [IMG()], BATCH_12),
    Spec("paddle_lstm_tagger", P, "paddle Embedding + 2-layer bidirectional LSTM tagger", lstm_tagger(),
         [Input("tokens", ("batch", "seq"), "int64", "tokens", 3000)],
         [{"batch": 1, "seq": 10}, {"batch": 1, "seq": 20}, {"batch": 2, "seq": 15}]),
]


def export(spec: Spec, folder: Path) -> None:
    import paddle

    model = spec.build()
    specs = [paddle.static.InputSpec([-1 if isinstance(d, str) else d for d in i.shape], i.dtype, i.name)
             for i in spec.inputs]
    paddle.onnx.export(model, str(folder / "model"), input_spec=specs, opset_version=spec.opset)


def versions() -> dict:
    import importlib.metadata as md

    return {p: md.version(p) for p in ("paddlepaddle", "paddle2onnx", "onnx")}


if __name__ == "__main__":
    sys.exit(main(SPECS, export, versions))
