"""Where edgec reads and writes its files: the data shipped in the package, and the user's state.

Shipped with the ``edgec`` package (package data, read-only: an installed wheel may sit in a
folder the user cannot write, and a checkout's copies are tracked files):

- ``edgec/targets/*.toml``: the device descriptions;
- ``edgec/autotune/<target>/``: the fitted cost models, their measurements and evaluations
  (and tuning records, should a release ship some);
- ``edgec/native/``: the C++ linked into model libraries;
- ``edgec/runtime/cpp/``: the C++ host.

What edgec learns while it is used (``bench`` and ``costmodel collect`` measurements, ``tune``
records, ``costmodel train`` models) goes to the user's autotune folder,
``$EDGEC_AUTOTUNE_DIR/<target>/`` when that variable is set, else
``$XDG_DATA_HOME/edgec/autotune/<target>/`` (default ``~/.local/share/edgec/autotune/``). That
folder is layered over the shipped one: a whole-file value (a cost model) is read from the user's
folder when it has one, else from the package; a store of lines (measurements, tuning records)
is read from both, the package's lines first. Writers only ever write the user's folder.

``$EDGEC_MEASUREMENTS_DIR`` makes ``<it>/<target>/measurements.jsonl`` a store of its own, read
and written alone, without the shipped rows: for runs whose rows must not mix with the zoo's (the
real-model benchmark, tests that count what they appended).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]
TARGETS_DIR = PACKAGE_DIR / "targets"
SHIPPED_AUTOTUNE_DIR = PACKAGE_DIR / "autotune"
NATIVE_DIR = PACKAGE_DIR / "native"
CPP_RUNTIME_DIR = PACKAGE_DIR / "runtime" / "cpp"

# The files of a target's autotune folder.
MEASUREMENTS_FILE = "measurements.jsonl"
COSTMODEL_FILE = "costmodel.json"
TUNING_RECORDS_FILE = "tuning_records.jsonl"

# A file whose variable, when set, names a root holding a store of its own (see the module doc).
_OWN_STORE = {MEASUREMENTS_FILE: "EDGEC_MEASUREMENTS_DIR"}


def _name(target: object) -> str:
    return target if isinstance(target, str) else target.name  # type: ignore[attr-defined]


def _own_store(name: str) -> str:
    variable = _OWN_STORE.get(name)
    return os.environ.get(variable, "") if variable else ""


def user_autotune_root() -> Path:
    """The root of the user's autotune folders: ``$EDGEC_AUTOTUNE_DIR``, else
    ``$XDG_DATA_HOME/edgec/autotune`` (``~/.local/share/edgec/autotune`` when that is unset)."""
    root = os.environ.get("EDGEC_AUTOTUNE_DIR")
    if root:
        return Path(root)
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "edgec" / "autotune"


def shipped_file(target: object, name: str) -> Path:
    """The package's copy of a target's autotune file ``name`` (it may not exist)."""
    return SHIPPED_AUTOTUNE_DIR / _name(target) / name


def user_file(target: object, name: str) -> Path:
    """Where edgec writes a target's autotune file ``name``: never inside the package."""
    own = _own_store(name)
    return (Path(own) if own else user_autotune_root()) / _name(target) / name


def read_file(target: object, name: str) -> Path | None:
    """The target's file ``name`` to read: the user's when it exists, else the package's, else
    None."""
    layers = read_files(target, name)
    return layers[-1] if layers else None


def read_files(target: object, name: str) -> list[Path]:
    """Every existing layer of the target's file ``name``, the package's first: a store of lines
    read in this order gives the shipped lines, then what this user added."""
    if _own_store(name):
        layers = [user_file(target, name)]
    else:
        layers = [shipped_file(target, name), user_file(target, name)]
    return [p for p in layers if p.is_file()]
