"""The execution options (library route, threads): footprints, learned prices, the plan's choice
under budgets, the build and runtime that honour it, and their leave-one-model-out evaluation."""

import dataclasses
import json

import numpy as np
import pytest

from conftest import MLP_SHAPES, mlp_model, mlp_samples, write_samples
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.core.targets import load_target
from edgec.costmodel import execution
from edgec.costmodel.execution import ExecutionOption, ExecutionPrices
from edgec.costmodel.model import CostModel, default_path
from edgec.stages.plan import Plan, PlanSettings, plan
from edgec.stages.profile import profile
from edgec.tools.costmodel.evaluate_execution import evaluate_execution, render_execution

TARGET = load_target("x86_64")
MLP = from_proto(mlp_model(), "mlp")
# Synthetic prices: a fixed cost and a cost per FLOP per option, so that one thread of TVM
# kernels wins small models and the library on every core wins large ones.
PRICES = {("library", 0): (0.05, 1e-7), ("library", 1): (0.04, 2e-7),
          ("tvm", 0): (0.03, 5e-7), ("tvm", 1): (0.02, 8e-7)}
SHAPES = [(1, 4), (2, 8), (4, 16), (8, 64), (16, 256), (64, 512), (3, 5), (32, 128), (6, 12)]


def _synthetic_rows(load: str = "quiet") -> list[dict]:
    rows = []
    for index, (batch, seq) in enumerate(SHAPES):
        dims = {"batch": batch, "seq": seq}
        feats = execution.execution_features(MLP, TARGET, dims)
        flops = 10 ** feats["log_flops"] - 1
        for (route, threads), (fixed, per_flop) in PRICES.items():
            rows.append({"kind": "execution", "target": TARGET.name, "model": f"m{index % 3}",
                         "model_sha256": f"sha{index % 3}", "shape": f"batch={batch},seq={seq}",
                         "route": route, "threads": threads, "load": load,
                         "ms": fixed + per_flop * flops, "features": feats})
    return rows


def test_cpu_targets_choose_route_and_threads_and_count_what_a_device_holds():
    options = execution.options_for(TARGET)
    assert set(options) == {ExecutionOption(r, t) for r in ("library", "tvm") for t in (0, 1)}
    assert execution.hand_rules(options) == ExecutionOption("library", 0)
    no_library = dataclasses.replace(TARGET, libraries={})
    assert {o.route for o in execution.options_for(no_library)} == {"tvm"}
    assert execution.hand_rules(execution.options_for(no_library)) == ExecutionOption("tvm", 0)
    assert execution.options_for(load_target("cuda-sm89")) == [execution.HAND_RULES]
    with_library = execution.runtime_files(TARGET, "library")
    tvm_only = execution.runtime_files(TARGET, "tvm")
    assert "libtvm_runtime.so" in tvm_only and "libtvm_ffi.so" in tvm_only
    assert "libdnnl.so.2" in with_library and "libdnnl.so.2" not in tvm_only
    assert sum(with_library.values()) > sum(tvm_only.values()) + 10e6


def test_prices_are_fitted_per_option_and_rank_the_options():
    fitted = execution.fit(_synthetic_rows())
    assert set(fitted) == {ExecutionOption(r, t).key("quiet") for r, t in PRICES}
    assert all(doc["rows"] == len(SHAPES) and doc["held_out"] for doc in fitted.values())
    prices = ExecutionPrices(json.loads(json.dumps(fitted)))
    small = [execution.execution_features(MLP, TARGET, {"batch": 1, "seq": 3})]
    large = [execution.execution_features(MLP, TARGET, {"batch": 48, "seq": 512})]
    options = execution.options_for(TARGET)
    assert min(options, key=lambda o: prices.predict_ms(o, "quiet", small)[0]) == \
        ExecutionOption("tvm", 1)
    assert min(options, key=lambda o: prices.predict_ms(o, "quiet", large)[0]) == \
        ExecutionOption("library", 0)
    assert not prices.covers(options, "busy")


def test_the_decision_keeps_the_hand_rules_for_fixed_policies_and_the_budget_always():
    distribution = [({"batch": 1, "seq": 4}, 1.0)]
    prices = ExecutionPrices(execution.fit(_synthetic_rows()))
    fixed = execution.decide(MLP, TARGET, distribution, {}, prices, learned=False)
    assert (fixed["route"], fixed["threads"]) == ("library", 0)
    assert fixed["reason"].startswith("the hand rules")
    # Predictions are recorded even where they do not decide.
    assert all(o["expected_ms"] is not None for o in fixed["options"])

    learned = execution.decide(MLP, TARGET, distribution, {}, prices, learned=True)
    assert (learned["route"], learned["threads"]) == ("tvm", 1)
    assert "least predicted expected latency" in learned["reason"]

    tvm_mb = sum(execution.runtime_files(TARGET, "tvm").values()) / 1e6
    large = [({"batch": 48, "seq": 512}, 1.0)]
    budgeted = execution.decide(MLP, TARGET, large, {}, prices, learned=True,
                                max_runtime_mb=tvm_mb + 1)
    assert budgeted["route"] == "tvm" and "excludes library" in budgeted["reason"]
    assert "latency" in budgeted["reason"]
    assert [o["fits"] for o in budgeted["options"]].count(False) == 2
    unpriced = execution.decide(MLP, TARGET, large, {}, None, learned=True,
                                max_runtime_mb=tvm_mb + 1)
    assert (unpriced["route"], unpriced["threads"]) == ("tvm", 0)
    assert "no learned execution prices" in unpriced["reason"]
    # Beside busy processes TVM's kernels on every core are not offered (its pool collapses).
    shared = execution.decide(MLP, TARGET, large, {}, None, learned=False, busy=2,
                              max_runtime_mb=tvm_mb + 1)
    assert (shared["route"], shared["threads"]) == ("tvm", 1) and shared["load"] == "busy"
    assert [o["offered"] for o in shared["options"]].count(False) == 1
    # A quantized build of a TVM-only plan takes the library option priced least, if it fits.
    assert execution.library_fallback(learned) == ExecutionOption("library", 1)
    assert execution.library_fallback(budgeted) is None
    with pytest.raises(ValueError, match="smallest runtime .* needs"):
        execution.decide(MLP, TARGET, large, {}, prices, learned=False, max_runtime_mb=0.5)


def test_auto_plans_the_execution_and_explains_it(tmp_path):
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))]
    prof = profile(MLP, samples)
    shipped = CostModel.load(default_path(TARGET))
    priced = dataclasses.replace(shipped, execution=execution.fit(
        _synthetic_rows() + _synthetic_rows("busy")))
    auto = plan(MLP, prof, TARGET, PlanSettings(policy="auto"), cost_model=priced)
    assert (auto.execution["route"], auto.execution["threads"]) == ("tvm", 1)
    text = auto.explain()
    assert "execution (quiet machine): tvm route, 1 thread" in text
    assert "why: least predicted expected latency on a quiet machine" in text
    busy = plan(MLP, prof, TARGET, PlanSettings(policy="auto", busy=2), cost_model=priced)
    assert busy.execution["load"] == "busy" and "beside 2 busy" in busy.execution["reason"]
    again = Plan.load(auto.save(tmp_path / "plan.json"))
    assert again.execution == auto.execution
    assert again.summary()["execution"]["route"] == "tvm"
    fixed = plan(MLP, prof, TARGET, PlanSettings(), cost_model=priced)
    assert (fixed.execution["route"], fixed.execution["threads"]) == ("library", 0)


def test_a_tvm_route_plan_builds_without_the_library_and_runs_alike(tmp_path):
    from edgec import runtime
    from edgec.stages.build import build

    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))]
    base = plan(MLP, profile(MLP, samples), TARGET)
    outputs = {}
    for route, threads in (("library", 0), ("tvm", 1)):
        chosen = dataclasses.replace(base, execution={"route": route, "threads": threads})
        artifact = build(MLP, chosen, [TARGET])
        library = artifact.manifest["libraries"][TARGET.name]
        assert library["threads"] == threads and library["route"] == route
        assert ("libdnnl.so.2" in library["native_dependencies"]) == (route == "library")
        model = runtime.load(artifact.save(tmp_path / f"{route}.edgec"))
        outputs[route] = [model.run(s.arrays)["y"] for s in samples]
    for ours, theirs in zip(outputs["tvm"], outputs["library"]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_plan_command_keeps_the_runtime_budget(tmp_path, capsys):
    from edgec.cli import main

    (tmp_path / "model.onnx").write_bytes(mlp_model().SerializeToString())
    write_samples(tmp_path / "samples", mlp_samples(MLP_SHAPES))
    assert main(["profile", str(tmp_path / "model.onnx"), "--samples", str(tmp_path / "samples"),
                 "-o", str(tmp_path / "profile.json")]) == 0
    common = ["plan", str(tmp_path / "model.onnx"), "--profile", str(tmp_path / "profile.json"),
              "--target", "x86_64", "-o", str(tmp_path / "plan.json")]
    capsys.readouterr()
    assert main(common + ["--max-runtime-mb", "0.5"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("edgec: error: --max-runtime-mb 0.5: the smallest runtime")
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "plan.json").exists()
    assert main(common + ["--max-runtime-mb", "20", "--explain"]) == 0
    out = capsys.readouterr().out
    assert json.loads((tmp_path / "plan.json").read_text())["execution"]["route"] == "tvm"
    assert "excludes the library" in out and "(over --max-runtime-mb)" in out


def test_eval_picks_from_other_models_prices_and_compares_with_every_rule_set():
    rows = _synthetic_rows() + _synthetic_rows("busy")
    result = evaluate_execution(TARGET, rows, ["m0", "m1", "m2"])
    quiet = result["summary"]["quiet"]
    assert quiet["models"] == 3
    # Noise-free prices that a roofline fits exactly: auto is the oracle.
    assert quiet["geomean_auto_over_oracle"] == pytest.approx(1.0, abs=0.01)
    assert quiet["geomean_auto_over_hand_rules"] < 1.0
    assert set(quiet["fixed_over_hand_rules"]) == {o.label for o in execution.options_for(TARGET)}
    assert quiet["pooled_spearman"] > 0.9
    assert "| m0 |" in render_execution(result)


@pytest.mark.slow
def test_collect_times_every_option_in_processes_of_their_own(monkeypatch):
    from edgec import runtime
    from edgec.costmodel.store import load_measurements
    from edgec.tools.costmodel import collect_execution as collector

    monkeypatch.setattr(collector, "MIN_SECONDS", 0.01)
    monkeypatch.setattr(collector, "ROUNDS", 1)
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))]
    rows = collector.collect_execution(TARGET, [("mlp", MLP, samples)])
    # The 4 distinct shapes, every option, quiet and busy.
    assert len(rows) == 4 * 4 * 2
    assert {(r["route"], r["threads"], r["load"]) for r in rows} == {
        (o.route, o.threads, load) for o in execution.options_for(TARGET)
        for load in execution.LOADS}
    assert all(r["ms"] > 0 and r["features"]["log_flops"] > 0 for r in rows)
    assert {r["busy"] for r in rows if r["load"] == "busy"} == {runtime.default_threads()}
    stored = [r for r in load_measurements(TARGET) if r.get("kind") == "execution"]
    assert len(stored) == len(rows)
