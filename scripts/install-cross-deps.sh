#!/usr/bin/env bash
# Install what the C++ host, aarch64 cross and qemu tests need (Debian 12, as root); idempotent.
#   g++, make                       build the example host (tests/test_cpp_host.py)
#   g++-aarch64-linux-gnu           cross-compile the host and aarch64 model libraries
#   qemu-user                       run aarch64 binaries here (tests/test_qemu_arm.py)
#   python3-venv                    the runtime-only wheel's fresh venv (tests/test_runtime_dist.py)
set -euo pipefail
packages=(g++ make g++-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user python3-venv)
missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-cross-deps: run as root to install: ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-cross-deps: installed ${missing[*]}"
