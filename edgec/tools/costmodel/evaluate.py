"""``edgec costmodel eval``: leave-one-model-out over the measured zoo models.

For each held-out model the cost model is fitted on the other models' rows only. Reported:

- Spearman rank correlation and MAPE of its predicted region latencies against the measured ones
  (every region, option and shape of the held-out model);
- the measured expected latency of the plan every policy makes for it: the profiled shape
  distribution weighted sum, over regions, of the measured latency of the function the plan runs
  for that region at that shape (regions run one after the other; ``measure`` checks that the
  regions' sum tracks ``main``);
- run-to-run noise, two ways: per timing, the median over rows of the spread between collect
  passes (max/min - 1); per plan, the spread of its expected latency between passes, each pass's
  times on their own (one burst of load in one pass shows here in full).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from edgec.core.regions import cut_regions
from edgec.core.targets import Target
from edgec.costmodel import decide, learn
from edgec.costmodel.model import fit
from edgec.stages.measure import latency_table
from edgec.stages.plan import FIXED_POLICIES, PlanSettings, plan
from edgec.tools.costmodel.collect import zoo_case

POLICY_ORDER = FIXED_POLICIES + ("auto", "oracle")


def _best_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, region, option, shape): the least time over passes (bursts of load
    from other processes only ever add time)."""
    best: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        key = (row["model"], row["model_sha256"], row["region_index"], row["option"],
               decide.dims_key(row["dims"]))
        if key not in best or row["ms"] < best[key]["ms"]:
            best[key] = row
    return list(best.values())


def train(target: Target, rows: list[dict[str, Any]]):
    """The cost model for ``target`` fitted on its measurement rows (``edgec costmodel train``):
    the least time per region option over passes, and the build rows for size and time."""
    regions = _best_rows([r for r in rows if r.get("kind") == "region" and r["target"] == target.name])
    builds = [r for r in rows if r.get("kind") == "build" and r["target"] == target.name]
    return fit(regions, builds, target.name, execution_rows(rows, target)), len(regions)


def execution_rows(rows: list[dict[str, Any]], target: Target) -> list[dict[str, Any]]:
    """The target's execution timings, one per (model, shape, option, load): the least over
    passes."""
    best: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        if row.get("kind") != "execution" or row["target"] != target.name:
            continue
        key = (row["model_sha256"], row["shape"], row["route"], row["threads"], row["load"])
        if key not in best or row["ms"] < best[key]["ms"]:
            best[key] = row
    return list(best.values())


def _additivity(rows, model, test, table) -> float | None:
    """Median over shapes of (sum of the measured region times) / (measured ``main`` time) of
    the all-options build collect timed: how well composing region times stands for the whole."""
    mains: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row.get("kind") == "main" and row["model_sha256"] == model.sha256:
            mains[row["shape"]].append(row["ms"])
    regions = sorted({r["region_index"] for r in test})
    ratios = []
    for row in test:
        key = decide.dims_key(row["dims"])
        if key in mains and row["region_index"] == regions[0] and row["option"] == "symbolic":
            total = sum(table(i, "specialized", row["dims"]) for i in regions)
            ratios.append(total / min(mains[key]))
    return round(float(np.median(ratios)), 4) if ratios else None


def _row_noise(rows: list[dict[str, Any]]) -> float | None:
    """Median over (region, option, shape) of max/min - 1 between the passes that timed it."""
    by_key: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        by_key[(row["model"], row["region_index"], row["option"], decide.dims_key(row["dims"]))].append(row["ms"])
    spreads = [max(v) / min(v) - 1 for v in by_key.values() if len(v) > 1 and min(v) > 0]
    return round(float(np.median(spreads)), 4) if spreads else None


def plan_expected_ms(the_plan, model, prof, table) -> float:
    """Measured expected latency of ``the_plan``: see the module doc."""
    distribution = prof.shape_distribution()
    total = 0.0
    for index, region in enumerate(the_plan.regions):
        specs = [s["dims"] for s in region.specializations] if region.dims else []
        pad_dims = region.padding.get("dims", []) if region.padding.get("used") else []
        for graph_dims, share in distribution:
            projected = {d: int(graph_dims[d]) for d in region.dims}
            option, bucket = decide.run_option(specs, pad_dims, projected)
            total += share * (table(index, option, graph_dims, bucket) if bucket else
                              table(index, option, graph_dims))
    return total


def evaluate(target: Target, rows: list[dict[str, Any]], holdout: list[str],
             settings: PlanSettings = PlanSettings()) -> dict[str, Any]:
    """Leave each of ``holdout`` out in turn; see the module doc."""
    region_rows = [r for r in rows if r.get("kind") == "region" and r["target"] == target.name]
    builds = [r for r in rows if r.get("kind") == "build" and r["target"] == target.name]
    best = _best_rows(region_rows)
    results = []
    pooled_predicted: list[float] = []
    pooled_measured: list[float] = []
    for name in holdout:
        train = [r for r in best if r["model"] != name]
        train_builds = [b for b in builds if b["model"] != name]
        cost_model = fit(train, train_builds, target.name)
        model, samples, prof = zoo_case(name)
        test = [r for r in best if r["model"] == name and r["model_sha256"] == model.sha256]
        if not test:
            results.append({"model": name, "error": "no measurements of this model"})
            continue
        predicted = cost_model.predict_ms([r["features"] for r in test])
        measured = np.asarray([r["ms"] for r in test])
        pooled_predicted += predicted.tolist()
        pooled_measured += measured.tolist()
        row_noise = _row_noise([r for r in region_rows if r["model"] == name])
        table = latency_table(test)
        per_pass = defaultdict(list)
        for r in region_rows:
            if r["model"] == name and r["model_sha256"] == model.sha256:
                per_pass[r["pass"]].append(r)
        pass_tables = [latency_table(v) for _, v in sorted(per_pass.items())]
        policies = {}
        for policy in POLICY_ORDER:
            policy_settings = PlanSettings(policy, settings.max_specializations, settings.min_share)
            the_plan = plan(model, prof, target, policy_settings, cost_model=cost_model, measured=table,
                            samples=samples, one_program=False)
            expected = plan_expected_ms(the_plan, model, prof, table)
            by_pass = [plan_expected_ms(the_plan, model, prof, t) for t in pass_tables]
            policies[policy] = {
                "expected_ms": round(expected, 5),
                "expected_ms_by_pass": [round(v, 5) for v in by_pass],
                "specializations": [len(r.specializations) for r in the_plan.regions],
                "padded": [bool(r.padding.get("used")) for r in the_plan.regions],
            }
        additivity = _additivity(rows, model, test, table)
        spreads = [max(p["expected_ms_by_pass"]) / min(p["expected_ms_by_pass"]) - 1
                   for p in policies.values() if len(p["expected_ms_by_pass"]) > 1]
        oracle = policies["oracle"]["expected_ms"]
        auto = policies["auto"]["expected_ms"]
        results.append({
            "model": name, "regions": len(cut_regions(model)), "rows": len(test),
            "spearman": learn.finite(learn.spearman(predicted, measured)),
            "mape": learn.finite(learn.mape(predicted, measured)),
            "policies": policies,
            "auto_over_oracle": round(auto / oracle, 4),
            "auto_over": {p: round(auto / policies[p]["expected_ms"], 4) for p in FIXED_POLICIES},
            "noise_pass_spread": round(max(spreads), 4) if spreads else None,
            "noise_row_median": row_noise,
            "regions_sum_over_main": additivity,
            "learner": cost_model.training["learner"],
        })
    ok = [r for r in results if "error" not in r]
    summary = {
        "geomean_auto_over": {
            p: round(math.exp(np.mean([math.log(r["auto_over"][p]) for r in ok])), 4) if ok else None
            for p in FIXED_POLICIES},
        "worst_auto_over_oracle": max((r["auto_over_oracle"] for r in ok), default=None),
        "min_spearman": min((r["spearman"] for r in ok if r["spearman"] is not None), default=None),
        "max_noise_pass_spread": max((r["noise_pass_spread"] for r in ok
                                      if r["noise_pass_spread"] is not None), default=None),
        "noise_row_median": _row_noise([r for r in region_rows if r["model"] in holdout]),
        "pooled_spearman": learn.finite(learn.spearman(pooled_predicted, pooled_measured)),
        "pooled_mape": learn.finite(learn.mape(np.asarray(pooled_predicted),
                                               np.asarray(pooled_measured))) if pooled_measured else None,
    }
    return {"target": target.name, "holdout": holdout, "models": results, "summary": summary}


def render(result: dict[str, Any]) -> str:
    """The eval result as a Markdown table."""
    lines = [f"# costmodel eval, target {result['target']} (leave one model out)", "",
             "| model | regions | rows | spearman | MAPE | " + " | ".join(POLICY_ORDER)
             + " | auto/oracle | noise: timing median | noise: plan, between passes | regions sum / main |",
             "|---|---|---|---|---|" + "---|" * len(POLICY_ORDER) + "---|---|---|---|"]
    for r in result["models"]:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['error']} |")
            continue
        cells = " | ".join(f"{r['policies'][p]['expected_ms']:.4f}" for p in POLICY_ORDER)
        lines.append(f"| {r['model']} | {r['regions']} | {r['rows']} | {r['spearman']} | "
                     f"{r['mape']} | {cells} | {r['auto_over_oracle']} | {r['noise_row_median']} | "
                     f"{r['noise_pass_spread']} | {r['regions_sum_over_main']} |")
    s = result["summary"]
    lines += ["", "expected latencies in ms (measured, composed from measured region times)", "",
              f"- geomean auto/policy: {s['geomean_auto_over']}",
              f"- worst auto/oracle: {s['worst_auto_over_oracle']}",
              f"- min Spearman per model: {s['min_spearman']}; pooled over every held-out row: "
              f"{s['pooled_spearman']} (MAPE {s['pooled_mape']})",
              f"- run-to-run noise per timing (median spread between passes): {s['noise_row_median']}",
              f"- run-to-run noise (largest spread of a plan's expected latency between collect "
              f"passes): {s['max_noise_pass_spread']}"]
    return "\n".join(lines) + "\n"
