"""Writing files so that a reader never sees a partial one, and reading saved JSON values."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import InputFileError, StageInputError


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)`` and rename the temporary file onto ``path`` only if it succeeds.

    The temporary file lives in the destination folder, so the rename is atomic; on any error it is
    removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise
    return path


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Atomically write ``data`` to ``path``."""
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_text(path: str | Path, text: str) -> Path:
    """Atomically write ``text`` (UTF-8) to ``path``."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def save_json_value(path: str | Path, kind: str, version: int, payload: dict[str, Any]) -> Path:
    """Save a stage result as JSON, tagged with its kind and format version."""
    doc = {"kind": kind, "format_version": version, **payload}
    return write_text(path, json.dumps(doc, indent=1, sort_keys=False) + "\n")


def load_json_value(path: str | Path, kind: str, version: int) -> dict[str, Any]:
    """Read a JSON stage result saved by :func:`save_json_value`, checking its kind and version."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{kind} file '{path}' does not exist; create it with `edgec {kind}`")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StageInputError(f"'{path}' is not a JSON {kind} file ({exc}); regenerate it") from None
    if not isinstance(doc, dict) or doc.get("kind") != kind:
        found = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise StageInputError(f"'{path}' holds a '{found}', not a {kind}; pass the {kind} file")
    if doc.get("format_version") != version:
        raise StageInputError(
            f"'{path}' is {kind} format version {doc.get('format_version')}, this edgec reads "
            f"version {version}; regenerate it with this edgec"
        )
    return doc
