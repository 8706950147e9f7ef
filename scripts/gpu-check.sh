#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: say which GPU and driver, then run tests/compiler/backends/test_gpu.py, which
# builds zoo models (cnn, early_exit) for this GPU's CUDA target and the CPU, checks that the GPU
# gives the CPU's outputs, and prints p50 latency per call for both (GPU/CPU ratio).
# Needs the project's Python environment (PYTHON, default .venv/bin/python, else python3) and
# nvcc to build the CUDA library. Without a GPU the tests skip and say why (exit 0).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv
else
    echo "gpu-check: nvidia-smi not found"
fi
echo "gpu-check: python $python, nvcc $(command -v nvcc || echo 'not on PATH')"
exec "$python" -m pytest -q -rs -s -p no:cacheprovider tests/compiler/backends/test_gpu.py
