#!/usr/bin/env bash
# Builds the exporter virtualenvs for benchmarks/real_models (outside any checkout).
#
#   bash benchmarks/real_models/setup_export_env.sh [BASE_DIR]
#
# BASE_DIR (or $EDGEC_EXPORT_VENV) defaults to ~/.cache/edgec/export-venv. Two venvs are made
# under it, because the frameworks' pins conflict (protobuf, numpy):
#   BASE_DIR/torch : torch + torchvision + timm + transformers (torch.onnx, both exporters)
#   BASE_DIR/tf    : tensorflow-cpu + tf-keras + tf2onnx, and paddlepaddle + paddle2onnx
# Re-running is cheap: pip skips what is installed.
set -euo pipefail
BASE="${1:-${EDGEC_EXPORT_VENV:-$HOME/.cache/edgec/export-venv}}"
PY="${PYTHON:-python3.11}"
mkdir -p "$BASE"

mkvenv() { [ -x "$1/bin/python" ] || "$PY" -m venv "$1"; "$1/bin/pip" install -q -U pip wheel; }

# torch 2.14.1 + torchvision 0.29.1 are the pair whose C ops load together (torch 2.13.0+cpu and
# PyPI's torchvision do not).
mkvenv "$BASE/torch"
"$BASE/torch/bin/pip" install -q torch==2.14.1 torchvision==0.29.1
"$BASE/torch/bin/pip" install -q timm==1.0.31 transformers==5.23.0 onnx onnxscript onnxruntime

mkvenv "$BASE/tf"
"$BASE/tf/bin/pip" install -q tensorflow-cpu==2.21.* tf-keras==2.21.* tf2onnx==1.17.0 onnx onnxruntime
"$BASE/tf/bin/pip" install -q paddlepaddle==3.3.1 paddle2onnx==2.1.0
echo "export venvs ready under $BASE"
