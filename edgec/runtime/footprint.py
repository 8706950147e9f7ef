"""The bytes of the shared libraries a device must hold to run an artifact: TVM's runtime and
the native libraries the model library links (oneDNN, XNNPACK, OpenMP).

Sizes are those of this machine's files: for the host's architecture where its dynamic loader
finds them; for another (an aarch64 target built here) in Debian's multiarch folder
``/usr/lib/<arch>-linux-gnu``. TVM's own runtime is counted at the host's size for any
architecture (a cross-built one is within a few percent).
"""

from __future__ import annotations

import functools
import platform
import subprocess
from pathlib import Path
from typing import Iterable

from edgec import runtime


def find_shared_library(name: str, arch: str | None = None) -> Path | None:
    """Where ``name`` (e.g. ``libdnnl.so.2``) is for ``arch`` (default: the host's): the host's
    from ldconfig's cache, another's from its multiarch folder."""
    if arch is not None and arch != platform.machine():
        candidate = Path(f"/usr/lib/{arch}-linux-gnu") / name
        return candidate if candidate.exists() else None
    for line in _loader_cache().splitlines():
        if line.strip().startswith(name + " ") and "=>" in line:
            return Path(line.split("=>", 1)[1].strip())
    return None


@functools.lru_cache(maxsize=1)
def _loader_cache() -> str:
    """``ldconfig -p``: the libraries the host's dynamic loader knows (read once a process)."""
    try:
        return subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def runtime_footprint(dependencies: Iterable[str], arch: str | None = None) -> dict[str, int]:
    """Bytes per file of what a device needs: TVM's runtime libraries and ``dependencies`` (the
    model library's ``native_dependencies``); a dependency not found here is left out."""
    import tvm_ffi.libinfo

    files = {path.name: path for path in runtime.runtime_libraries()}
    files["libtvm_ffi.so"] = Path(tvm_ffi.libinfo.find_libtvm_ffi())
    for dependency in dependencies:
        found = find_shared_library(dependency, arch)
        if found is not None:
            files[dependency] = found
    return {name: path.resolve().stat().st_size for name, path in files.items() if path.exists()}
