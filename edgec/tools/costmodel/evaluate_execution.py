"""``edgec costmodel eval --execution``: leave-one-model-out over the execution timings.

For each held-out model and load (quiet, busy) the execution prices are fitted on every other
model's rows only; they pick the option of least predicted expected latency (the mean over the
model's timed shapes), among the options offered at that load (``execution.offered``), as
``plan --policy auto`` does. Reported per model and load, all measured:
the expected latency of that pick, of the oracle's (the least measured), of the hand rules
(the target's library on every core) and of each fixed option; and Spearman's rho of predicted
against measured latency over the model's options and shapes. The geomeans over held-out models
compare auto with the oracle, the hand rules and the best fixed option (the one of least
geomean over the held-out models, as if one rule set were picked for all of them).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from edgec.core.targets import Target
from edgec.costmodel import execution, learn
from edgec.costmodel.execution import ExecutionOption, ExecutionPrices
from edgec.tools.costmodel.evaluate import execution_rows


def _geomean(values: list[float]) -> float | None:
    return round(math.exp(float(np.mean(np.log(values)))), 4) if values else None


def evaluate_execution(target: Target, rows: list[dict[str, Any]],
                       holdout: list[str]) -> dict[str, Any]:
    """Leave each of ``holdout`` out in turn; see the module doc."""
    data = execution_rows(rows, target)
    options = execution.options_for(target)
    baseline = execution.hand_rules(options)
    results = []
    pooled: dict[str, tuple[list[float], list[float]]] = {}
    for load in execution.LOADS:
        predicted_all, measured_all = pooled.setdefault(load, ([], []))
        for name in holdout:
            test = [r for r in data if r["model"] == name and r["load"] == load]
            train = [r for r in data if r["model"] != name]
            measured: dict[ExecutionOption, dict[str, float]] = defaultdict(dict)
            features: dict[str, dict[str, float]] = {}
            for row in test:
                measured[ExecutionOption(row["route"], row["threads"])][row["shape"]] = row["ms"]
                features[row["shape"]] = row["features"]
            shapes = sorted(features)
            timed = [o for o in options if shapes and all(s in measured[o] for s in shapes)]
            if not timed or baseline not in timed:
                results.append({"model": name, "load": load,
                                "error": "not every option was timed at every shape"})
                continue
            prices = ExecutionPrices(execution.fit(train))
            if not prices.covers(timed, load):
                results.append({"model": name, "load": load,
                                "error": "no other model's timings to learn from"})
                continue
            feats = [features[s] for s in shapes]
            predicted = {o: prices.predict_ms(o, load, feats) for o in timed}
            actual = {o: np.asarray([measured[o][s] for s in shapes]) for o in timed}
            expected = {o: float(actual[o].mean()) for o in timed}
            choices = execution.offered(timed, load)
            auto = min(choices, key=lambda o: (float(predicted[o].mean()), timed.index(o)))
            oracle = min(timed, key=lambda o: (expected[o], timed.index(o)))
            flat_predicted = np.concatenate([predicted[o] for o in timed])
            flat_measured = np.concatenate([actual[o] for o in timed])
            predicted_all += flat_predicted.tolist()
            measured_all += flat_measured.tolist()
            results.append({
                "model": name, "load": load, "shapes": len(shapes),
                "auto": auto.label, "auto_ms": round(expected[auto], 5),
                "oracle": oracle.label, "oracle_ms": round(expected[oracle], 5),
                "hand_rules_ms": round(expected[baseline], 5),
                "fixed_ms": {o.label: round(expected[o], 5) for o in timed},
                "predicted_ms": {o.label: round(float(predicted[o].mean()), 5) for o in timed},
                "spearman": learn.finite(learn.spearman(flat_predicted, flat_measured)),
            })
    summary = {}
    for load in execution.LOADS:
        ok = [r for r in results if r["load"] == load and "error" not in r]
        fixed = {label: _geomean([r["fixed_ms"][label] / r["hand_rules_ms"] for r in ok
                                  if label in r["fixed_ms"]]) for label in
                 dict.fromkeys(label for r in ok for label in r["fixed_ms"])}
        best_fixed = min(fixed, key=lambda label: fixed[label]) if fixed else None
        summary[load] = {
            "models": len(ok),
            "geomean_auto_over_hand_rules": _geomean([r["auto_ms"] / r["hand_rules_ms"]
                                                      for r in ok]),
            "geomean_auto_over_oracle": _geomean([r["auto_ms"] / r["oracle_ms"] for r in ok]),
            "worst_auto_over_oracle": max((round(r["auto_ms"] / r["oracle_ms"], 4) for r in ok),
                                          default=None),
            "fixed_over_hand_rules": fixed,
            "best_fixed": best_fixed,
            "worst_auto_over_best_fixed": max(
                (round(r["auto_ms"] / r["fixed_ms"][best_fixed], 4) for r in ok
                 if best_fixed in r["fixed_ms"]), default=None),
            "pooled_spearman": learn.finite(learn.spearman(*pooled[load])),
            "median_model_spearman": (round(float(np.median(
                [r["spearman"] for r in ok if r["spearman"] is not None])), 4)
                if any(r["spearman"] is not None for r in ok) else None),
        }
    return {"target": target.name, "holdout": holdout, "hand_rules": baseline.label,
            "models": results, "summary": summary}


def render_execution(result: dict[str, Any]) -> str:
    """The execution eval as Markdown: a table per load and its summary."""
    lines = [f"# costmodel eval --execution, target {result['target']} (leave one model out)",
             "", "Expected latency in ms over each model's timed shapes (all measured); auto's "
             f"option is picked from prices fitted without the model. Hand rules: "
             f"{result['hand_rules']}.", ""]
    for load in execution.LOADS:
        rows = [r for r in result["models"] if r["load"] == load]
        lines += [f"## {load}", "", "| model | shapes | auto picks | auto | oracle picks | "
                  "oracle | hand rules | auto/hand | auto/oracle | spearman |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['model']} | {r['error']} |")
                continue
            lines.append(
                f"| {r['model']} | {r['shapes']} | {r['auto']} | {r['auto_ms']:.4f} | "
                f"{r['oracle']} | {r['oracle_ms']:.4f} | {r['hand_rules_ms']:.4f} | "
                f"{r['auto_ms'] / r['hand_rules_ms']:.3f} | {r['auto_ms'] / r['oracle_ms']:.3f} | "
                f"{r['spearman']} |")
        s = result["summary"][load]
        lines += ["", f"- geomean auto/hand rules {s['geomean_auto_over_hand_rules']}, "
                      f"auto/oracle {s['geomean_auto_over_oracle']} (worst "
                      f"{s['worst_auto_over_oracle']}), over {s['models']} models",
                  f"- fixed options / hand rules (geomean): {s['fixed_over_hand_rules']}; best "
                  f"fixed: {s['best_fixed']}; worst auto/best fixed: "
                  f"{s['worst_auto_over_best_fixed']}",
                  f"- Spearman predicted vs measured: pooled {s['pooled_spearman']}, median per "
                  f"model {s['median_model_spearman']}", ""]
    return "\n".join(lines)
