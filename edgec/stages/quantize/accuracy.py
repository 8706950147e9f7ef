"""How far quantized outputs are from fp32 ones: cosine and max abs per output, top-1 agreement
for classifiers, and the one number the accuracy budget holds (``drop``)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from edgec.runtime.signature import TensorSpec

Outputs = dict[str, np.ndarray]


def classifier_outputs(outputs: Sequence[TensorSpec]) -> list[str]:
    """Outputs that look like class scores: float, rank 2, a fixed class dim of at least 2."""
    return [s.name for s in outputs
            if s.dtype.startswith("float") and len(s.dims) == 2
            and isinstance(s.dims[1], int) and s.dims[1] >= 2]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def compare(reference: Sequence[Outputs], test: Sequence[Outputs],
            classifiers: Sequence[str] = ()) -> dict[str, Any]:
    """Per output over all samples: the lowest cosine (each sample's output flattened), the
    largest abs difference and, for classifier outputs, the share of rows whose arg-max agrees.

    ``drop`` is ``1 - lowest cosine`` over every output, or ``1 - top-1 agreement`` where that is
    larger.
    """
    per_output: dict[str, dict[str, float]] = {}
    for name in reference[0]:
        if reference[0][name].dtype.kind != "f":
            continue
        cosines = [_cosine(r[name], t[name]) for r, t in zip(reference, test)]
        max_abs = max(float(np.max(np.abs(r[name].astype(np.float64) - t[name])))
                      if r[name].size else 0.0 for r, t in zip(reference, test))
        entry = {"min_cosine": min(cosines), "mean_cosine": float(np.mean(cosines)),
                 "max_abs": max_abs}
        if name in classifiers:
            agree = [np.argmax(r[name], -1) == np.argmax(t[name], -1) for r, t in zip(reference, test)]
            entry["top1_agreement"] = float(np.mean(np.concatenate([a.ravel() for a in agree])))
        per_output[name] = entry
    drop = 0.0
    for entry in per_output.values():
        drop = max(drop, 1.0 - entry["min_cosine"], 1.0 - entry.get("top1_agreement", 1.0))
    return {"drop": drop, "outputs": per_output, "samples": len(reference)}
