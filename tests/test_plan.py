import pytest

from conftest import MLP_SHAPES, mlp_model, mlp_samples
from edgec.errors import EdgecError, StageInputError
from edgec.model import from_proto
from edgec.plan import Plan, PlanSettings, plan
from edgec.profile import profile
from edgec.samples import Sample
from edgec.targets import load_target

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
