"""Writing files so that a reader never sees a partial one, and reading saved JSON values."""

from __future__ import annotations

import errno
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgec.errors import InputFileError, OutputFileError, StageInputError

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def atomic_write(path: str | Path, write: Callable[[Path], None], mode: int | None = None) -> Path:
    """Call ``write(tmp_path)`` and rename the temporary file onto ``path`` only if it succeeds.

    The temporary file lives in the destination folder, so the rename is atomic; it is flushed to
    disk before the rename, so a crash never leaves a renamed but empty file. On any error it is
    removed and ``path`` is left as it was; a full disk or an unwritable folder raises
    OutputFileError naming the path. A process killed mid-write (SIGKILL cannot be caught) leaves
    its temporary file behind: the next write to the same path removes it. The file gets ``mode``,
    by default what ``open`` would give it (0666 less the umask; the temporary file starts 0600).
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(path)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise _output_error(path, exc) from exc
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        with open(tmp_path, "rb+") as handle:
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), _default_mode() if mode is None else mode)
        os.replace(tmp_path, path)
    except BaseException as exc:
        tmp_path.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE + _NOT_WRITABLE:
            raise _output_error(path, exc) from exc
        raise
    return path


def _default_mode() -> int:
    umask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(umask)
    return 0o666 & ~umask


def _output_error(path: Path, exc: OSError) -> OutputFileError:
    reason = exc.strerror or str(exc)
    if exc.errno in _NO_SPACE:
        return OutputFileError(f"cannot write '{path}': {reason}; free space in '{path.parent}' "
                               f"(nothing was written) and rerun")
    return OutputFileError(f"cannot write '{path}': {reason}; pick a writable folder for it")


def _remove_stale_temporaries(path: Path) -> None:
    """Remove temporary files of ``path`` left by writers that were killed (their process is gone)."""
    prefix = f".{path.name}."
    for entry in path.parent.iterdir():
        name = entry.name
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not _process_alive(int(pid)):
            entry.unlink(missing_ok=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def check_writable(path: str | Path) -> Path:
    """``path`` if a file can be written there, checked before a command does its work (a compile
    takes minutes): not an existing folder, and under a folder that exists or can be made and
    is writable. Raises OutputFileError naming the path and the fix."""
    path = Path(path)
    if path.is_dir():
        raise OutputFileError(f"cannot write '{path}': it is a folder; -o takes the path of a "
                              f"file (one inside it, for example)")
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise OutputFileError(f"cannot write '{path}': '{folder}' is a file, not a folder; "
                              f"pick another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputFileError(f"cannot write '{path}': folder '{folder}' is not writable; "
                              f"pick a writable folder for it")
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


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """The bytes ``np.savez`` writes for ``arrays``, but with fixed zip timestamps.

    ``np.savez`` stamps each member with the current time; a fixed stamp makes the same samples
    byte-identical, so files can be compared and cached by hash. ``np.load`` reads both alike.
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key, array in arrays.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    return buffer.getvalue()
