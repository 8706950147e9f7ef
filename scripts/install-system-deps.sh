#!/usr/bin/env bash
# Install the Debian packages edgec needs (Debian 12, as root); idempotent and quiet.
# Usage: scripts/install-system-deps.sh [GROUP...]   (default: build)
#   build    g++ (links model libraries, builds edgec/native/), libdnnl-dev (oneDNN: convolutions
#            and matmuls on x86 targets with [libraries] dnnl = true; devices then need libdnnl2),
#            zlib1g-dev + libssl-dev (the C++ host: inflate and CRC-32, SHA-256 and Ed25519)
#   cross    make, g++-aarch64-linux-gnu + libc6-dev-arm64-cross (aarch64 libraries and C++ host),
#            libxnnpack-dev:arm64 + libpthreadpool-dev:arm64 (XNNPACK: convolutions and matmuls
#            on the arm64 targets; adds the arm64 architecture to dpkg), zlib1g-dev:arm64 +
#            libssl-dev:arm64 (the aarch64 C++ host), qemu-user (runs them here), python3-venv
#            (the runtime-only wheel's test venv)
#   report   chromium (the HTML report's screenshot test)
set -euo pipefail
declare -A groups=(
    [build]="g++ libdnnl-dev zlib1g-dev libssl-dev"
    [cross]="make g++-aarch64-linux-gnu libc6-dev-arm64-cross libxnnpack-dev:arm64 libpthreadpool-dev:arm64 zlib1g-dev:arm64 libssl-dev:arm64 qemu-user python3-venv"
    [report]="chromium"
)
packages=()
for group in "${@:-build}"; do
    if [ -z "${groups[$group]+x}" ]; then
        echo "install-system-deps: unknown group '$group'; known: ${!groups[*]}" >&2
        exit 2
    fi
    read -r -a members <<< "${groups[$group]}"
    packages+=("${members[@]}")
done
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
native_arch=$(dpkg --print-architecture)
native=() foreign=()
for package in "${missing[@]}"; do
    if [[ "$package" == *:* && "${package##*:}" != "$native_arch" ]]; then
        foreign+=("$package")
    else
        native+=("$package")
    fi
done
apt_install() {
    # debconf notes the missing apt-utils on stderr: noise, not an error.
    apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2> >(grep -v "^debconf: delaying" >&2)
}
apt-get update -qq
if [ ${#native[@]} -gt 0 ]; then
    apt_install "${native[@]}"
    echo "install-system-deps: installed ${native[*]}"
fi
# Packages of another architecture (libxnnpack-dev:arm64) need it enabled in dpkg and a mirror
# that serves it. Without them, compiling for the arm64 targets stops with an install hint and
# their tests skip: a warning here, not a failure of the other groups.
if [ ${#foreign[@]} -gt 0 ]; then
    added=()
    for package in "${foreign[@]}"; do
        arch="${package##*:}"
        if ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
            dpkg --add-architecture "$arch"
            added+=("$arch")
        fi
    done
    if { [ ${#added[@]} -eq 0 ] || apt-get update -qq; } && apt_install "${foreign[@]}"; then
        echo "install-system-deps: installed ${foreign[*]}"
    else
        for arch in "${added[@]}"; do
            dpkg --remove-architecture "$arch" 2>/dev/null || true
        done
        [ ${#added[@]} -eq 0 ] || apt-get update -qq || true
        echo "install-system-deps: warning: could not install ${foreign[*]} (does the Debian" \
             "mirror serve ${added[*]:-that architecture}?); builds for the arm64 targets will ask for them" >&2
    fi
fi
