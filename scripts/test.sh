#!/usr/bin/env bash
# Install edgec with its test dependencies into .venv and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-venv.sh dev
exec .venv/bin/python -m pytest "$@"
