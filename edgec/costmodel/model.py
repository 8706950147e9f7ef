"""A fitted cost model: region latency, compile seconds and library bytes, saved as JSON.

``edgec costmodel train`` saves it in the user's autotune folder; the package ships fitted models
for the x86 targets so a fresh install plans with them (which files: :mod:`edgec.core.locations`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from edgec.core.locations import read_file, user_file
from edgec.core.targets import Target
from edgec.costmodel import execution, learn
from edgec.costmodel.execution import ExecutionPrices
from edgec.costmodel.features import FEATURE_NAMES, vector
from edgec.costmodel.store import COSTMODEL_FILE
from edgec.errors import StageInputError
from edgec.fileio import load_json_value, save_json_value

COSTMODEL_VERSION = 1


@dataclass
class CostModel:
    """Predicts ``ms`` from features; ``compile`` holds ``[a, b]`` of ``seconds = a + b*copies``
    and ``bytes = a + b*copies`` where ``copies`` counts region nodes once per compiled function."""

    target: str
    learner: Any
    feature_names: list[str]
    compile: dict[str, list[float]]
    training: dict[str, Any] = field(default_factory=dict)
    # The execution options' prices (``execution.fit``): empty when none were measured.
    execution: dict[str, Any] = field(default_factory=dict)

    def predict_ms(self, features: list[Mapping[str, float]]) -> np.ndarray:
        if not features:
            return np.zeros(0)
        x = np.asarray([vector(f, self.feature_names) for f in features])
        return np.exp(self.learner.predict(x))

    def compile_seconds(self, node_copies: float) -> float:
        a, b = self.compile.get("seconds", [0.0, 0.0])
        return a + b * node_copies

    def library_bytes(self, node_copies: float) -> float:
        a, b = self.compile.get("bytes", [0.0, 0.0])
        return a + b * node_copies

    def save(self, path: str | Path) -> Path:
        return save_json_value(path, "costmodel", COSTMODEL_VERSION, {
            "target": self.target, "feature_names": self.feature_names,
            "latency": self.learner.to_json(), "compile": self.compile, "training": self.training,
            "execution": self.execution,
        })

    def execution_prices(self) -> ExecutionPrices | None:
        """The learned prices of the execution options, or None when none were measured."""
        return ExecutionPrices(self.execution) if self.execution else None

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        doc = load_json_value(path, "costmodel", COSTMODEL_VERSION)
        return cls(doc["target"], learn.from_json(doc["latency"]), doc["feature_names"],
                   doc["compile"], doc.get("training", {}), doc.get("execution", {}))


def default_path(target: Target | str) -> Path:
    """The target's model to read: the user's, else the one shipped; when there is neither, the
    path ``save_path`` writes (which does not exist)."""
    return read_file(target, COSTMODEL_FILE) or save_path(target)


def save_path(target: Target | str) -> Path:
    """Where ``edgec costmodel train`` writes the target's model: the user's autotune folder."""
    return user_file(target, COSTMODEL_FILE)


def load_for(target: Target) -> CostModel:
    """The target's fitted model; a one-line error naming how to make it when there is none."""
    path = default_path(target)
    if not path.is_file():
        raise StageInputError(
            f"target '{target.name}' has no cost model at '{path}'; run `edgec costmodel collect "
            f"--target {target.name}` and `edgec costmodel train --target {target.name}`, or plan "
            f"with a fixed --policy")
    return CostModel.load(path)


def fit(rows: list[dict[str, Any]], builds: list[dict[str, Any]], target: str,
        execution_rows: list[dict[str, Any]] = ()) -> CostModel:
    """Fit on measurement ``rows`` (with ``features`` and ``ms``) and ``builds`` (with
    ``node_copies``, ``compile_s``, ``library_bytes``), and the execution options' prices on
    ``execution_rows`` (``execution.fit``)."""
    if not rows:
        raise StageInputError(f"no region measurements for target '{target}' to train on")
    names = list(FEATURE_NAMES)
    x = np.asarray([vector(r["features"], names) for r in rows])
    y = np.log(np.asarray([max(r["ms"], 1e-4) for r in rows]))
    groups = [r["model"] for r in rows]
    selection = learn.select_learner(x, y, groups)
    learner = learn.make(selection.learner).fit(x, y)
    compile_fit = {
        "seconds": learn.fit_linear([b["node_copies"] for b in builds], [b["compile_s"] for b in builds]),
        "bytes": learn.fit_linear([b["node_copies"] for b in builds], [b["library_bytes"] for b in builds]),
    }
    training = {"rows": len(rows), "builds": len(builds), "models": sorted(set(groups)),
                "learner": selection.learner, "held_out": selection.held_out}
    return CostModel(target, learner, names, compile_fit, training,
                     execution.fit(execution_rows) if execution_rows else {})


def log_ratio_noise(pairs: list[tuple[float, float]]) -> float:
    """Median |log(a/b)| over pairs of repeated measurements, as a fraction (0.05 = 5%)."""
    values = [abs(math.log(a / b)) for a, b in pairs if a > 0 and b > 0]
    return float(np.median(values)) if values else float("nan")
