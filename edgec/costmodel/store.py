"""The measurement store: ``measurements.jsonl`` per target, one JSON object a line.

Append-only. A line holds what was measured (model, region, option, shape), the features the
cost model learns from, and the timing; no clock time, so two runs on the same inputs differ only
in their timings. Rows are read from the store shipped with edgec and the user's, and appended to
the user's only (which files: :mod:`edgec.core.locations`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from edgec.core.locations import COSTMODEL_FILE, MEASUREMENTS_FILE, read_files, user_file
from edgec.core.targets import Target
from edgec.errors import StageInputError

__all__ = ["COSTMODEL_FILE", "MEASUREMENTS_FILE", "append_measurements", "load_measurements",
           "measurements_path"]


def measurements_path(target: Target | str) -> Path:
    """The store ``append_measurements`` writes: the user's for the target."""
    return user_file(target, MEASUREMENTS_FILE)


def append_measurements(target: Target | str, rows: Iterable[dict[str, Any]]) -> Path:
    """Append ``rows`` to the target's store (created when missing); return its path.

    One ``write`` of whole lines in append mode: a concurrent reader sees whole lines only.
    """
    path = measurements_path(target)
    text = "".join(json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n" for row in rows)
    if text:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(text)
    return path


def load_measurements(target: Target | str) -> list[dict[str, Any]]:
    """Every row of the target's stores, the shipped ones first; a line cut short (an interrupted
    append) is skipped."""
    paths = read_files(target, MEASUREMENTS_FILE)
    if not paths:
        name = target if isinstance(target, str) else target.name
        raise StageInputError(f"target '{name}' has no measurements at "
                              f"'{measurements_path(target)}'; run "
                              f"`edgec costmodel collect --target {name}` first")
    rows = []
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows
