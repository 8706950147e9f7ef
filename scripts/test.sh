#!/usr/bin/env bash
# Install edgec with its test dependencies into .venv and run the whole test suite, slow tests
# included (pass pytest options, e.g. -m "not slow", to narrow it). Debian packages the tests use
# (oneDNN, the aarch64 cross toolchain and qemu, chromium) are installed when running as root;
# otherwise the tests that need a missing one skip and say so.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then
    bash scripts/install-system-deps.sh build cross report
else
    bash scripts/install-system-deps.sh build cross report || echo "test.sh: continuing without them" >&2
fi
bash scripts/setup-venv.sh dev,torch
exec .venv/bin/python -m pytest "$@"
