"""The measurement store: ``autotune/<target>/measurements.jsonl``, one JSON object a line.

Append-only. A line holds what was measured (model, region, option, shape), the features the
cost model learns from, and the timing; no clock time, so two runs on the same inputs differ only
in their timings. ``$EDGEC_AUTOTUNE_DIR`` moves the whole ``autotune/`` folder;
``$EDGEC_MEASUREMENTS_DIR`` moves only the measurement stores (the tests point it at a temporary
folder so that benchmarks they run do not append to the committed store).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from edgec.core.targets import Target, autotune_dir
from edgec.errors import StageInputError

MEASUREMENTS_FILE = "measurements.jsonl"
COSTMODEL_FILE = "costmodel.json"


def measurements_path(target: Target | str) -> Path:
    """The target's store: ``<autotune>/<target>/measurements.jsonl`` (see the module doc)."""
    root = os.environ.get("EDGEC_MEASUREMENTS_DIR")
    name = target if isinstance(target, str) else target.name
    return (Path(root) / name if root else autotune_dir(target)) / MEASUREMENTS_FILE


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


def load_measurements(target: Target | str, path: Path | None = None) -> list[dict[str, Any]]:
    """Every row of the target's store; a line cut short (an interrupted append) is skipped."""
    path = path or measurements_path(target)
    if not path.is_file():
        name = target if isinstance(target, str) else target.name
        raise StageInputError(f"target '{name}' has no measurements at '{path}'; "
                              f"run `edgec costmodel collect --target {name}` first")
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
