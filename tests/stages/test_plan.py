from dataclasses import replace

import pytest

from conftest import MLP_SHAPES, mlp_model, mlp_samples
from edgec.errors import EdgecError, StageInputError
from edgec.core.model import from_proto
from edgec.stages.plan import Plan, PlanSettings, Region, _choices_alike, plan
from edgec.stages.profile import profile
from edgec.core.samples import Sample
from edgec.core.targets import load_target

MODEL = from_proto(mlp_model())
TARGET = load_target("x86_64")


@pytest.fixture(scope="module")
def prof():
    return profile(MODEL, [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))])


def test_specialize_seen_takes_frequent_shapes_and_keeps_a_fallback(prof):
    result = plan(MODEL, prof, TARGET, PlanSettings(min_share=0.2))
    (region,) = result.regions
    assert region.mode == "specialized" and region.fallback
    assert [s["dims"] for s in region.specializations] == [{"batch": 1, "seq": 8}, {"batch": 2, "seq": 4}]
    assert result.coverage == pytest.approx(0.8)
    assert "20%" in region.reason and "fallback" in region.reason


def test_max_specializations_caps_the_count(prof):
    result = plan(MODEL, prof, TARGET, PlanSettings(max_specializations=1, min_share=0.0))
    assert len(result.regions[0].specializations) == 1


def test_symbolic_policy_and_rare_shapes_stay_symbolic(prof):
    assert plan(MODEL, prof, TARGET, PlanSettings(policy="symbolic")).regions[0].mode == "symbolic"
    rare = plan(MODEL, prof, TARGET, PlanSettings(min_share=0.9)).regions[0]
    assert rare.mode == "symbolic" and "no shape reached 90%" in rare.reason


def test_plan_round_trips_and_refuses_another_models_profile(prof, tmp_path):
    result = plan(MODEL, prof, TARGET)
    assert Plan.load(result.save(tmp_path / "plan.json")) == result
    other = from_proto(mlp_model(seed=5))
    with pytest.raises(StageInputError, match="made for another model"):
        plan(other, prof, TARGET)
    with pytest.raises(EdgecError, match="unknown plan policy"):
        plan(MODEL, prof, TARGET, PlanSettings(policy="magic"))


# --- regions and policies ---------------------------------------------------------------------

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402

from edgec.costmodel import learn  # noqa: E402
from edgec.costmodel.features import FEATURE_NAMES  # noqa: E402
from edgec.costmodel.model import CostModel  # noqa: E402
from edgec.core.regions import cut_regions, region_dims  # noqa: E402
from compiler.transform.test_shape_dispatch import nonzero_model  # noqa: E402

NONZERO = from_proto(nonzero_model(), "nonzero")
NZ_SHAPES = [2] * 6 + [3] * 3 + [5]


@pytest.fixture(scope="module")
def nz_prof():
    rng = np.random.default_rng(0)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((b, 4)).astype(np.float32)})
               for i, b in enumerate(NZ_SHAPES)]
    return profile(NONZERO, samples)


def test_regions_cut_at_data_dependent_shapes():
    cuts = cut_regions(NONZERO)
    assert [c.boundary for c in cuts] == ["", "NonZero", ""]
    assert cuts[0].nodes == ["mm", "pos"] and cuts[0].inputs == ["x"]
    assert set(cuts[0].outputs) == {"mm", "pos"}
    assert cuts[1].inputs == ["pos"] and cuts[1].outputs == ["nz"]
    assert cuts[2].nodes == ["relu", "double", "idx"] and set(cuts[2].inputs) == {"mm", "nz"}
    assert region_dims(NONZERO, cuts[0]) == ["batch"]
    # The NonZero output's length depends on values: a dim of its own, not a profiled one.
    assert "batch" in region_dims(NONZERO, cuts[2]) and any(
        d.startswith("nz_d") for d in region_dims(NONZERO, cuts[2]))
    assert len(cut_regions(from_proto(mlp_model()))) == 1


def test_fixed_policies_per_region(nz_prof):
    seen = plan(NONZERO, nz_prof, TARGET, PlanSettings(min_share=0.25), one_program=False)
    assert [r.name for r in seen.regions] == ["region_0", "region_1", "region_2"]
    assert [[s["dims"] for s in r.specializations] for r in seen.regions] == \
        [[{"batch": 2}, {"batch": 3}], [{"batch": 2}, {"batch": 3}], [{"batch": 2}, {"batch": 3}]]
    first = plan(NONZERO, nz_prof, TARGET, PlanSettings("specialize-then-generalize"),
                 one_program=False)
    assert [len(r.specializations) for r in first.regions] == [1, 1, 1]
    assert all("most frequent" in r.reason for r in first.regions)
    symbolic = plan(NONZERO, nz_prof, TARGET, PlanSettings("symbolic"), one_program=False)
    assert [r.mode for r in symbolic.regions] == ["symbolic"] * 3
    assert symbolic.coverage == 0.0 and first.coverage == pytest.approx(0.6)


def test_regions_that_choose_alike_become_one_program(nz_prof):
    # Every region of a fixed policy chose the same specializations: the cut would only add the
    # calls between regions, so the plan is one program specialized the same way.
    for settings, specs in [(PlanSettings(min_share=0.25), [{"batch": 2}, {"batch": 3}]),
                            (PlanSettings("specialize-then-generalize"), [{"batch": 2}]),
                            (PlanSettings("symbolic"), [])]:
        merged = plan(NONZERO, nz_prof, TARGET, settings)
        assert [r.name for r in merged.regions] == ["main"]
        assert [s["dims"] for s in merged.regions[0].specializations] == specs
        assert "one program, not 3 regions" in merged.regions[0].reason
        assert " us " not in merged.regions[0].reason  # measurements stay in code comments
    # Regions that chose differently keep the cut.
    region = lambda dims, specs: Region("r", [], "specialized", [{"dims": d} for d in specs],  # noqa: E731
                                        True, [], "", dims=dims)
    assert _choices_alike([region(["batch"], [{"batch": 2}]), region(["batch"], [{"batch": 2}]),
                           region([], [])])
    assert _choices_alike([region(["batch", "seq"], [{"batch": 1, "seq": 8}]),
                           region(["batch"], [{"batch": 1}])])
    assert not _choices_alike([region(["batch"], [{"batch": 2}]), region(["batch"], [])])
    assert not _choices_alike([region(["batch"], [{"batch": 2}]), region(["batch"], [{"batch": 3}])])


def _table(fast_regions: set[int]):
    """Measured-like latencies: specialized is twice as fast in ``fast_regions``, 10% slower elsewhere."""
    def latency(index, option, dims):
        base = 0.01 * dims["batch"] * (index + 1)
        if option == "specialized":
            return base * (0.5 if index in fast_regions else 1.1)
        return base
    return latency


def test_oracle_specializes_only_where_it_pays(nz_prof):
    result = plan(NONZERO, nz_prof, TARGET, PlanSettings("oracle", max_specializations=2),
                  measured=_table({0}))
    assert [len(r.specializations) for r in result.regions] == [2, 0, 0]
    assert "least measured expected latency" in result.regions[0].reason
    assert "symbolic is the least measured" in result.regions[2].reason
    table = result.regions[0].options
    assert [o["specializations"] for o in table] == [0, 1, 2] and table[2]["chosen"]
    assert table[2]["expected_ms"] < table[1]["expected_ms"] < table[0]["expected_ms"]
    assert result.predicted["expected_ms"] == pytest.approx(
        sum(min(o["expected_ms"] for o in r.options) for r in result.regions), rel=1e-3)
    explained = result.explain()
    assert "region region_0" in explained and "yes" in explained and "why:" in explained


def test_explain_shows_option_labels_whole(nz_prof):
    """Labels of several shapes are long; cut to a width, two rows read the same."""
    result = plan(NONZERO, nz_prof, TARGET, PlanSettings("oracle", max_specializations=2),
                  measured=_table({0}))
    shapes = "; ".join(f"batch={b}, seq=128" for b in (1, 2, 4, 8))
    labels = [f"specialized [{shapes}]", f"specialized [{shapes}; batch=16, seq=64]"]
    options = [dict(result.regions[0].options[0], option=label) for label in labels]
    region = replace(result.regions[0], options=options)
    explained = replace(result, regions=[region]).explain().splitlines()
    assert [line for line in explained if line.endswith(labels[0])]
    assert [line for line in explained if line.endswith(labels[1])]
    with pytest.raises(EdgecError, match="--samples"):
        plan(NONZERO, nz_prof, TARGET, PlanSettings("oracle"))


def _fake_cost_model(specialized_factor: float, seconds_per_node: float) -> CostModel:
    """A cost model fitted on synthetic rows where ms = flops-ish * factor when static."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 3, (80, len(FEATURE_NAMES)))
    static = FEATURE_NAMES.index("static")
    x[:, static] = rng.integers(0, 2, 80)
    y = x[:, FEATURE_NAMES.index("log_flops")] + np.log(specialized_factor) * x[:, static]
    return CostModel("x86_64", learn.Ridge(1e-6).fit(x, y), list(FEATURE_NAMES),
                     {"seconds": [0.0, seconds_per_node], "bytes": [1000.0, 100.0]})


def test_auto_follows_the_cost_model_and_honours_budgets(nz_prof):
    faster = plan(NONZERO, nz_prof, TARGET, PlanSettings("auto", max_specializations=3),
                  cost_model=_fake_cost_model(0.5, 1.0))
    assert any(r.specializations for r in faster.regions)
    assert faster.predicted["expected_ms"] > 0 and "compile_s" in faster.predicted
    slower = plan(NONZERO, nz_prof, TARGET, PlanSettings("auto", max_specializations=3),
                  cost_model=_fake_cost_model(2.0, 1.0))
    assert all(not r.specializations for r in slower.regions)
    # All symbolic compiles 6 node copies (6 s here); a 9 s budget leaves room for 3 more.
    budget = plan(NONZERO, nz_prof, TARGET, PlanSettings("auto", 3, compile_budget_s=9.0),
                  cost_model=_fake_cost_model(0.5, 1.0))
    assert budget.predicted["compile_s"] <= 9.0
    assert sum(len(r.nodes) * len(r.specializations) for r in budget.regions) <= 3
    assert "budget" in " ".join(r.reason for r in budget.regions)


def test_region_plan_round_trips_and_keeps_unknown_keys(nz_prof, tmp_path):
    result = plan(NONZERO, nz_prof, TARGET, PlanSettings("oracle"), measured=_table({0}))
    result = dataclasses.replace(result, extra={"a_later_field": {"x": None}})
    loaded = Plan.load(result.save(tmp_path / "plan.json"))
    assert loaded == result and loaded.extra == {"a_later_field": {"x": None}}
    summary = loaded.summary()
    assert summary["regions"][0]["inputs"] == ["x"] and summary["regions"][0]["predicted_ms"]
