"""The learners: ridge regression and gradient-boosted trees on log latency, in numpy, saved as JSON.

Both predict ``log(ms)`` from :data:`features.FEATURE_NAMES`; ``train`` fits each on all but one
model at a time and keeps the learner whose held-out error is lower (leave-one-model-out: the
error a model never seen gets). Nothing is pickled: a fitted learner is plain JSON.
"""

from __future__ import annotations
from edgec.costmodel.features import FEATURE_NAMES

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

LEARNERS = ("ridge", "ridge-core", "gbdt", "roofline")
# The few features ``ridge-core`` uses: work, size, op mix, loops and whether it is static. With
# five models to learn from, fewer features generalize better to a model left out.
CORE_FEATURES = ("log_flops", "log_bytes", "log_nodes", "static", "dispatch", "dispatch_x_inv_bytes",
                 "log_trips", "log_sub_nodes",
                 "control_flow", "log_input_elements", "frac_matmul", "frac_movement", "frac_reduce",
                 "padded", "pad_fraction", "log_library_flops", "log_tvm_flops", "log_kernels",
                 "static_x_log_tvm_matmul_flops", "static_x_log_tvm_flops")


class Ridge:
    """Linear regression with an L2 penalty on standardized features (``columns``: only these)."""

    def __init__(self, alpha: float = 1.0, columns: Sequence[int] | None = None) -> None:
        self.alpha = alpha
        self.columns = list(columns) if columns is not None else None
        self.mean = self.scale = self.coef = None
        self.intercept = 0.0

    def _pick(self, x: np.ndarray) -> np.ndarray:
        return x if self.columns is None else x[:, self.columns]

    def fit(self, x: np.ndarray, y: np.ndarray) -> "Ridge":
        x = self._pick(x)
        self.mean = x.mean(axis=0)
        self.scale = x.std(axis=0)
        self.scale[self.scale == 0] = 1.0
        z = (x - self.mean) / self.scale
        self.intercept = float(y.mean())
        gram = z.T @ z + self.alpha * np.eye(z.shape[1])
        self.coef = np.linalg.solve(gram, z.T @ (y - self.intercept))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return ((self._pick(x) - self.mean) / self.scale) @ self.coef + self.intercept

    def to_json(self) -> dict[str, Any]:
        return {"learner": "ridge", "alpha": self.alpha, "columns": self.columns, "mean": self.mean.tolist(),
                "scale": self.scale.tolist(), "coef": self.coef.tolist(), "intercept": self.intercept}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Ridge":
        model = cls(doc["alpha"], doc.get("columns"))
        model.mean, model.scale = np.asarray(doc["mean"]), np.asarray(doc["scale"])
        model.coef, model.intercept = np.asarray(doc["coef"]), float(doc["intercept"])
        return model


class BoostedTrees:
    """Gradient boosting of depth-limited regression trees (squared error), deterministic.

    A tree is stored flat: per node ``feature`` (-1 for a leaf), ``threshold``, ``left``,
    ``right`` and ``value``; ``x[feature] <= threshold`` goes left.
    """

    def __init__(self, rounds: int = 150, depth: int = 3, rate: float = 0.1, min_leaf: int = 3) -> None:
        self.rounds, self.depth, self.rate, self.min_leaf = rounds, depth, rate, min_leaf
        self.base = 0.0
        self.trees: list[dict[str, list]] = []

    def fit(self, x: np.ndarray, y: np.ndarray) -> "BoostedTrees":
        self.base = float(y.mean())
        pred = np.full(len(y), self.base)
        self.trees = []
        for _ in range(self.rounds):
            tree = {"feature": [], "threshold": [], "left": [], "right": [], "value": []}
            self._grow(tree, x, y - pred, np.arange(len(y)), 0)
            self.trees.append(tree)
            pred += self.rate * self._predict_tree(tree, x)
        return self

    def _grow(self, tree: dict[str, list], x: np.ndarray, residual: np.ndarray,
              rows: np.ndarray, depth: int) -> int:
        node = len(tree["feature"])
        for key, value in (("feature", -1), ("threshold", 0.0), ("left", -1), ("right", -1),
                           ("value", float(residual[rows].mean()) if len(rows) else 0.0)):
            tree[key].append(value)
        if depth >= self.depth or len(rows) < 2 * self.min_leaf:
            return node
        best = None
        r = residual[rows]
        total_sum, count = r.sum(), len(rows)
        for feature in range(x.shape[1]):
            values = x[rows, feature]
            order = np.argsort(values, kind="stable")
            sorted_values, sorted_r = values[order], r[order]
            left_sum = np.cumsum(sorted_r)[:-1]
            left_n = np.arange(1, count)
            valid = (sorted_values[1:] > sorted_values[:-1]) & (left_n >= self.min_leaf) & \
                (count - left_n >= self.min_leaf)
            if not valid.any():
                continue
            gain = left_sum ** 2 / left_n + (total_sum - left_sum) ** 2 / (count - left_n)
            gain[~valid] = -np.inf
            at = int(np.argmax(gain))
            if best is None or gain[at] > best[0] + 1e-12:
                best = (float(gain[at]), feature,
                        float((sorted_values[at] + sorted_values[at + 1]) / 2))
        if best is None or best[0] <= total_sum ** 2 / count + 1e-12:
            return node
        _, feature, threshold = best
        go_left = x[rows, feature] <= threshold
        tree["feature"][node], tree["threshold"][node] = feature, threshold
        tree["left"][node] = self._grow(tree, x, residual, rows[go_left], depth + 1)
        tree["right"][node] = self._grow(tree, x, residual, rows[~go_left], depth + 1)
        return node

    @staticmethod
    def _predict_tree(tree: dict[str, list], x: np.ndarray) -> np.ndarray:
        out = np.empty(len(x))
        for i, row in enumerate(x):
            node = 0
            while tree["feature"][node] >= 0:
                node = tree["left"][node] if row[tree["feature"][node]] <= tree["threshold"][node] \
                    else tree["right"][node]
            out[i] = tree["value"][node]
        return out

    def predict(self, x: np.ndarray) -> np.ndarray:
        pred = np.full(len(x), self.base)
        for tree in self.trees:
            pred += self.rate * self._predict_tree(tree, x)
        return pred

    def to_json(self) -> dict[str, Any]:
        return {"learner": "gbdt", "rounds": self.rounds, "depth": self.depth, "rate": self.rate,
                "min_leaf": self.min_leaf, "base": self.base,
                "trees": [{k: [round(v, 8) if isinstance(v, float) else v for v in vs]
                           for k, vs in t.items()} for t in self.trees]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "BoostedTrees":
        model = cls(doc["rounds"], doc["depth"], doc["rate"], doc["min_leaf"])
        model.base, model.trees = float(doc["base"]), doc["trees"]
        return model


def nonnegative_least_squares(a: np.ndarray, b: np.ndarray, iterations: int = 1000) -> np.ndarray:
    """``argmin |a x - b|`` subject to ``x >= 0`` (Lawson and Hanson's active set method)."""
    n = a.shape[1]
    active = np.zeros(n, dtype=bool)  # the coefficients free to be positive
    x = np.zeros(n)
    for _ in range(iterations):
        gradient = a.T @ (b - a @ x)
        if active.all() or (gradient[~active] <= 1e-12).all():
            break
        active[int(np.argmax(np.where(active, -np.inf, gradient)))] = True
        while True:
            z = np.zeros(n)
            z[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
            if (z[active] > 0).all():
                x = z
                break
            # Step back to where the first coefficient reaches zero and drop it (one just freed,
            # still at zero, leaves at once: a step of 0).
            leaving = active & (z <= 0)
            gap = x[leaving] - z[leaving]
            step = np.min(np.divide(x[leaving], gap, out=np.zeros_like(gap), where=gap > 0))
            x = x + step * (z - x)
            active &= x > 1e-15
    return x


class Roofline:
    """Latency as a sum of costs, each a non-negative price times an amount of work: a constant,
    per node, per kernel, per library FLOP, per FLOP of TVM's kernels and of native recurrent
    loops, per byte, per loop trip and per loop body node and trip, each priced apart for
    symbolic and static functions (specializing makes some work cheaper); and the dispatch, and
    the padding copies' bytes.

    Fitted as relative error (each row weighted by 1/its time) with every price >= 0, so it
    extrapolates to regions bigger or smaller than any it saw as their work does, which trees
    and log-linear fits cannot. Reads the work back from the log features; predicts ``log(ms)``
    like the others.
    """

    def __init__(self, names: Sequence[str] = ()) -> None:
        self.names = list(names)
        self.coef: np.ndarray | None = None

    def _terms(self, x: np.ndarray) -> np.ndarray:
        col = {n: x[:, i] for i, n in enumerate(self.names)}

        def amount(name: str) -> np.ndarray:  # the features are log10(amount + 1)
            return 10 ** col[name] - 1

        work = [np.ones(len(x)), 10 ** col["log_nodes"], amount("log_kernels") + 1,
                amount("log_library_flops"), amount("log_tvm_flops"), amount("log_recurrent_flops"),
                amount("log_bytes"), amount("log_trips"), amount("log_sub_nodes") * amount("log_trips")]
        static = col["static"]
        return np.stack([w * (1 - static) for w in work] + [w * static for w in work] +
                        [col["dispatch"], col["padded"], col["padded"] * amount("log_pad_bytes")], axis=1)

    def fit(self, x: np.ndarray, y: np.ndarray) -> "Roofline":
        terms = self._terms(x)
        ms = np.exp(y)
        scale = terms.max(axis=0)
        scale[scale == 0] = 1.0
        self.coef = nonnegative_least_squares(terms / scale / ms[:, None], np.ones(len(ms))) / scale
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(self._terms(x) @ self.coef, 1e-4))

    def to_json(self) -> dict[str, Any]:
        return {"learner": "roofline", "names": self.names, "coef": self.coef.tolist()}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Roofline":
        model = cls(doc["names"])
        model.coef = np.asarray(doc["coef"])
        return model


def make(name: str):
    core = [FEATURE_NAMES.index(n) for n in CORE_FEATURES]
    return {"ridge": Ridge, "ridge-core": lambda: Ridge(1.0, core), "gbdt": BoostedTrees,
            "roofline": lambda: Roofline(FEATURE_NAMES)}[name]()


def from_json(doc: dict[str, Any]):
    return {"ridge": Ridge, "gbdt": BoostedTrees, "roofline": Roofline}[doc["learner"]].from_json(doc)


def log_rmse(predicted: np.ndarray, actual: np.ndarray) -> float:
    return float(np.sqrt(np.mean((predicted - actual) ** 2)))


def mape(predicted_ms: np.ndarray, actual_ms: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted_ms - actual_ms) / actual_ms))


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(values: Sequence[float]) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        order = np.argsort(values, kind="stable")
        rank = np.empty(len(values))
        rank[order] = np.arange(len(values), dtype=np.float64)
        for value in np.unique(values):
            tied = values == value
            rank[tied] = rank[tied].mean()
        return rank
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


@dataclass
class Selection:
    learner: str
    held_out: dict[str, dict[str, float]]  # learner -> {"log_rmse", "mape"}


def select_learner(x: np.ndarray, y: np.ndarray, groups: Sequence[str],
                   learners: Sequence[str] = LEARNERS) -> Selection:
    """Pick the learner whose predictions for a model left out are closest to its timings.

    Each learner is fitted on all groups (models) but one and predicts the one left out. The
    error that picks is the log RMSE of those predictions: the planner compares options of one
    region, but it also sums regions and shapes into an expected latency and sets compile and
    size budgets against it, so the level must be right as well as the order. The rank error
    (1 - the mean over held-out models of Spearman's rho) breaks ties; it and MAPE are reported.
    ``x``'s columns are :data:`features.FEATURE_NAMES` (the roofline learner reads them by name).
    """
    groups = np.asarray(groups)
    scores: dict[str, dict[str, float]] = {}
    unique = sorted(set(groups.tolist()))
    for name in learners:
        predicted = np.empty(len(y))
        if len(unique) < 2:
            predicted[:] = make(name).fit(x, y).predict(x)
        else:
            for group in unique:
                held = groups == group
                predicted[held] = make(name).fit(x[~held], y[~held]).predict(x[held])
        rhos = [spearman(predicted[groups == g], y[groups == g]) for g in unique
                if (groups == g).sum() >= 3]
        rhos = [r if math.isfinite(r) else 0.0 for r in rhos]
        scores[name] = {"rank_error": round(1 - float(np.mean(rhos)), 4) if rhos else 1.0,
                        "log_rmse": round(log_rmse(predicted, y), 4),
                        "mape": round(mape(np.exp(predicted), np.exp(y)), 4)}
    best = min(learners, key=lambda n: (scores[n]["log_rmse"], scores[n]["rank_error"], n))
    return Selection(best, scores)


def fit_linear(x: Sequence[float], y: Sequence[float]) -> list[float]:
    """Least squares ``y = a + b*x`` with ``a, b >= 0`` clipped (compile time and bytes grow)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 2 or x.std() == 0:
        return [float(y.mean()) if len(y) else 0.0, 0.0]
    b = max(float(np.cov(x, y, bias=True)[0, 1] / x.var()), 0.0)
    a = max(float(y.mean() - b * x.mean()), 0.0)
    return [round(a, 6), round(b, 9)]


def finite(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)
