#!/usr/bin/env bash
# Install the Debian packages edgec needs to compile models for the host (Debian 12, as root);
# idempotent and quiet.
#   g++           links model libraries; builds edgec's native kernels (edgec/native/)
#   libdnnl-dev   oneDNN 2.x headers and libdnnl.so: convolutions and matmuls on x86 targets
#                 with [libraries] dnnl = true; devices running those libraries need libdnnl2
set -euo pipefail
packages=(g++ libdnnl-dev)
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
    echo "install-system-deps: run as root to install: ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# debconf notes the missing apt-utils on stderr: noise, not an error.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2> >(grep -v "^debconf: delaying" >&2)
echo "install-system-deps: installed ${missing[*]}"
