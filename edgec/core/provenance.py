"""Versions of the tools that produced a saved value, read without importing the heavy packages."""

from __future__ import annotations

import platform
from importlib import metadata

from edgec import __version__

_DISTRIBUTIONS = {
    "tvm": "apache-tvm",
    "tvm_ffi": "apache-tvm-ffi",
    "onnx": "onnx",
    "onnxruntime": "onnxruntime",
    "numpy": "numpy",
}


def tool_versions() -> dict[str, str]:
    """Return the versions of edgec, Python and the packages edgec builds on ("" when absent)."""
    versions = {"edgec": __version__, "python": platform.python_version()}
    for key, dist in _DISTRIBUTIONS.items():
        try:
            versions[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[key] = ""
    return versions
