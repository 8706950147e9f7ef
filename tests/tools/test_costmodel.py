import dataclasses
import json

import numpy as np
import pytest

from conftest import MLP_SHAPES, mlp_model, mlp_samples
from edgec.costmodel import learn
from edgec.tools.costmodel.evaluate import _best_rows, plan_expected_ms
from edgec.costmodel.features import FEATURE_NAMES, region_features
from edgec.stages.measure import measure_model
from edgec.costmodel.model import CostModel, default_path, fit
from edgec.costmodel.store import append_measurements, load_measurements, measurements_path
from edgec.errors import StageInputError
from edgec.core.model import from_proto
from edgec.stages.plan import PlanSettings, plan
from edgec.stages.profile import profile
from edgec.core.regions import cut_regions
from edgec.core.samples import Sample
from edgec.core.targets import load_target

TARGET = load_target("x86_64")
MLP = from_proto(mlp_model(), "mlp")


def test_features_count_the_work_at_a_shape():
    cut = cut_regions(MLP)[0]
    small = region_features(MLP, cut, {"batch": 1, "seq": 4}, "symbolic", TARGET)
    big = region_features(MLP, cut, {"batch": 2, "seq": 8}, "specialized", TARGET)
    assert list(small) == list(FEATURE_NAMES)
    # MatMul [1,4,16]x[16,8]: 2*4*8*16 FLOPs, plus the Relu's 32 outputs.
    assert 10 ** small["log_flops"] - 1 == pytest.approx(2 * 4 * 8 * 16 + 32, rel=1e-4)
    assert big["log_flops"] == pytest.approx(small["log_flops"] + np.log10(4), abs=0.01)
    assert small["static"] == 0 and big["static"] == 1 and big["static_x_log_nodes"] > 0
    assert small["frac_matmul"] == 0.5 and small["target_vector_bits"] == 256


def test_padded_features_are_the_buckets_with_the_padded_share():
    cut = cut_regions(MLP)[0]
    padded = region_features(MLP, cut, {"batch": 1, "seq": 4}, "padded", TARGET, bucket={"seq": 8})
    bucket = region_features(MLP, cut, {"batch": 1, "seq": 8}, "specialized", TARGET)
    assert padded["log_flops"] == bucket["log_flops"] and padded["static"] == 1
    assert padded["padded"] == 1 and padded["pad_fraction"] == pytest.approx(0.5)
    assert bucket["padded"] == 0 and bucket["pad_fraction"] == 0 and bucket["log_pad_bytes"] == 0
    # The MatMul has a constant weight (a oneDNN call); the Relu is a TVM kernel.
    assert bucket["frac_library"] == 0.5
    assert 10 ** bucket["log_library_flops"] - 1 == pytest.approx(2 * 8 * 8 * 16, rel=1e-4)
    assert 10 ** bucket["log_tvm_flops"] - 1 == pytest.approx(8 * 8, rel=1e-4)
    with pytest.raises(ValueError, match="bucket"):
        region_features(MLP, cut, {"batch": 1, "seq": 4}, "padded", TARGET)


@pytest.mark.parametrize("name", learn.LEARNERS)
def test_learners_fit_and_round_trip_through_json(name):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 3, (120, len(FEATURE_NAMES)))
    x[:, FEATURE_NAMES.index("static")] = rng.integers(0, 2, 120)
    y = np.log(1e-3 * 10 ** x[:, FEATURE_NAMES.index("log_library_flops")] + 0.01)
    model = learn.make(name).fit(x, y)
    again = learn.from_json(json.loads(json.dumps(model.to_json())))
    np.testing.assert_allclose(again.predict(x), model.predict(x), rtol=1e-6, atol=1e-6)
    assert learn.spearman(model.predict(x), y) > 0.9


def test_select_learner_prefers_trees_where_order_is_not_linear():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((160, 4))
    y = x[:, 0] ** 2 + 0.05 * rng.standard_normal(160)  # no linear function ranks this
    groups = [f"m{i % 4}" for i in range(160)]
    chosen = learn.select_learner(x, y, groups, ("ridge", "gbdt"))
    assert set(chosen.held_out) == {"ridge", "gbdt"} and chosen.learner == "gbdt"
    assert chosen.held_out["gbdt"]["rank_error"] < chosen.held_out["ridge"]["rank_error"]


def test_nonnegative_least_squares_matches_the_best_nonnegative_active_set():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((40, 5))
    b = a @ np.array([1.0, -2.0, 0.5, 0.0, 3.0]) + 0.1 * rng.standard_normal(40)
    x = learn.nonnegative_least_squares(a, b)
    assert (x >= 0).all() and x[1] == 0  # the negative price is held at zero
    # Brute force: the least-squares fit on every subset of columns whose solution is >= 0.
    best = np.inf
    for mask in range(1, 32):
        cols = [i for i in range(5) if mask >> i & 1]
        z = np.linalg.lstsq(a[:, cols], b, rcond=None)[0]
        if (z >= 0).all():
            best = min(best, float(np.sum((a[:, cols] @ z - b) ** 2)))
    assert np.sum((a @ x - b) ** 2) == pytest.approx(best, rel=1e-9)


def test_roofline_prices_work_and_extrapolates_past_what_it_saw():
    """Latency = per-call overhead + library FLOPs at one price + TVM kernels' FLOPs at another,
    cheaper in static functions: the roofline learns the prices from small regions and predicts
    regions 10x bigger than any it saw."""
    rng = np.random.default_rng(4)

    def rows(n, scale):
        x = np.zeros((n, len(FEATURE_NAMES)))
        col = {name: i for i, name in enumerate(FEATURE_NAMES)}
        library, tvm = rng.uniform(1e4, 1e6, n) * scale, rng.uniform(1e3, 1e5, n) * scale
        static = rng.integers(0, 2, n)
        x[:, col["log_library_flops"]] = np.log10(library + 1)
        x[:, col["log_tvm_flops"]] = np.log10(tvm + 1)
        x[:, col["static"]] = static
        ms = 0.002 + library * 2e-8 + tvm * np.where(static, 5e-8, 1e-7)
        return x, np.log(ms)

    x, y = rows(200, 1.0)
    big_x, big_y = rows(50, 10.0)
    model = learn.make("roofline").fit(x, y)
    np.testing.assert_allclose(np.exp(model.predict(big_x)), np.exp(big_y), rtol=1e-3)
    assert (model.coef >= 0).all()


def test_spearman_and_mape():
    assert learn.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert learn.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert learn.spearman([1, 1, 2], [5, 6, 7]) == pytest.approx(np.sqrt(3) / 2)
    assert learn.mape(np.array([1.1, 0.9]), np.array([1.0, 1.0])) == pytest.approx(0.1)


def test_store_appends_whole_lines_and_skips_a_torn_one(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEC_MEASUREMENTS_DIR", str(tmp_path))
    with pytest.raises(StageInputError, match="costmodel collect"):
        load_measurements(TARGET)
    append_measurements(TARGET, [{"a": 1}, {"b": 2}])
    path = measurements_path(TARGET)
    assert path == tmp_path / "x86_64" / "measurements.jsonl"
    with open(path, "a") as handle:
        handle.write('{"torn": ')
    append_measurements(TARGET, [])
    assert load_measurements(TARGET) == [{"a": 1}, {"b": 2}]


@pytest.fixture(scope="module")
def mlp_measured():
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))]
    prof = profile(MLP, samples)
    return prof, samples, measure_model(MLP, prof, samples, TARGET, max_specializations=2, runs=2,
                                        batches=1)


def test_measure_times_every_option_and_feeds_fit_and_oracle(mlp_measured):
    prof, samples, measured = mlp_measured
    rows = measured.rows
    options = {(tuple(sorted(r["dims"].items())), r["option"]) for r in rows}
    hot = [((("batch", 1), ("seq", 8))), ((("batch", 2), ("seq", 4)))]
    for shape in hot:
        assert (shape, "specialized") in options and (shape, "symbolic") in options
    # The MLP pads safely along both dims: the largest shape is compiled too, as the bucket every
    # other fits; a shape that is not compiled runs padded and, through the dispatch without
    # buckets, the fallback.
    assert ((("batch", 3), ("seq", 5)), "specialized") in options
    assert ((("batch", 1), ("seq", 3)), "padded") in options
    assert ((("batch", 1), ("seq", 3)), "fallback") in options
    padded = next(r for r in rows if r["option"] == "padded")
    assert padded["bucket"] in ({"batch": 1, "seq": 8}, {"batch": 2, "seq": 4})
    assert padded["features"]["padded"] == 1 and 0 < padded["features"]["pad_fraction"] < 1
    assert all(r["ms"] > 0 and r["region"] == "region_0" and r["features"] for r in rows)
    assert measured.build["node_copies"] == 2 * 4 and measured.build["library_bytes"] > 0
    assert set(measured.main_ms) == {"batch=1,seq=8", "batch=2,seq=4", "batch=1,seq=3", "batch=3,seq=5"}

    table = measured.table()
    oracle = plan(MLP, prof, TARGET, PlanSettings("oracle", max_specializations=2), measured=table,
                  samples=samples)
    symbolic = plan(MLP, prof, TARGET, PlanSettings("symbolic"))
    assert plan_expected_ms(oracle, MLP, prof, table) <= plan_expected_ms(symbolic, MLP, prof, table) + 1e-9

    fitted = fit(_best_rows(rows * 2), [measured.build, {**measured.build, "node_copies": 2,
                                                         "compile_s": 1.0, "library_bytes": 10}], "x86_64")
    assert fitted.training["learner"] in learn.LEARNERS
    assert fitted.compile_seconds(6) >= fitted.compile_seconds(2)


def test_costmodel_saves_as_json_and_a_missing_one_is_a_clear_error(tmp_path):
    rng = np.random.default_rng(2)
    rows = [{"model": f"m{i % 3}", "features": dict(zip(FEATURE_NAMES, rng.uniform(0, 2, len(FEATURE_NAMES)))),
             "ms": float(rng.uniform(0.01, 1))} for i in range(30)]
    fitted = fit(rows, [], "x86_64")
    path = fitted.save(tmp_path / "cm.json")
    assert json.loads(path.read_text())["kind"] == "costmodel"
    again = CostModel.load(path)
    feats = [r["features"] for r in rows[:5]]
    np.testing.assert_allclose(again.predict_ms(feats), fitted.predict_ms(feats), rtol=1e-6)
    # A target that neither the package nor the user has a model for.
    unmodelled = dataclasses.replace(TARGET, name="no-model")
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))]
    with pytest.raises(StageInputError, match="costmodel train"):
        plan(MLP, profile(MLP, samples), unmodelled, PlanSettings("auto"))


@pytest.mark.parametrize("name", ["x86_64", "x86_64-avx512"])
def test_the_committed_x86_models_load_and_plan(name):
    """Both x86 targets have a model: x86_64-avx512 is `edgec plan`'s default on an AVX-512
    machine, so without one there `--policy auto` would fail on the default target."""
    target = load_target(name)
    if not default_path(target).is_file():
        pytest.fail(f"autotune/{name}/costmodel.json is not committed")
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))]
    prof = profile(MLP, samples)
    result = plan(MLP, prof, target, PlanSettings("auto"))
    assert result.predicted["expected_ms"] > 0 and result.regions[0].options
    # A fixed policy decides alone but still records what the model predicts of its plan.
    fixed = plan(MLP, prof, target, PlanSettings("symbolic"))
    assert fixed.predicted["expected_ms"] > 0 and not fixed.regions[0].specializations
    assert fixed.summary()["regions"][0]["predicted_ms"]


def test_bench_records_each_regions_measured_and_predicted_time(tmp_path):
    from edgec.stages.bench import BenchSettings, bench, record_measurements
    from edgec.stages.build import build
    from compiler.transform.test_shape_dispatch import nonzero_model
    from stages.test_plan import _table

    model = from_proto(nonzero_model(), "nonzero")
    rng = np.random.default_rng(0)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((b, 4)).astype(np.float32)})
               for i, b in enumerate([2, 2, 3])]
    prof = profile(model, samples)
    the_plan = plan(model, prof, TARGET, PlanSettings("oracle", 1), measured=_table({0}))
    path = build(model, the_plan, [TARGET]).save(tmp_path / "nz.edgec")
    result = bench(path, model, samples, BenchSettings(runs=2, warmup=1), baselines=("onnxruntime",))
    rows = result["regions"]
    assert [(r["region"], r["shape"]) for r in rows] == [
        (f"region_{i}", s) for s in ("batch=2", "batch=3") for i in range(3)]
    # batch=3 is not hot: region 0's dispatch finds no static copy and runs its fallback.
    assert [r["option"] for r in rows] == ["specialized", "symbolic", "symbolic",
                                           "fallback", "symbolic", "symbolic"]
    assert all(r["measured_ms"] > 0 for r in rows)
    # The oracle's table predicted 0.01 * batch for region 0 (half when specialized).
    assert rows[0]["predicted_ms"] == pytest.approx(0.01) and rows[3]["predicted_ms"] == pytest.approx(0.03)

    record_measurements("x86_64", model, rows, threads=2)
    stored = load_measurements(TARGET)
    assert len(stored) == 6 and all(r["source"] == "bench" and r["features"] for r in stored)
    assert stored[0]["predicted_ms"] == rows[0]["predicted_ms"] and stored[0]["ms"] == rows[0]["measured_ms"]


def test_costmodel_commands_default_to_the_machines_target(capsys, monkeypatch):
    """Like `edgec plan`, the costmodel commands take the target with the most CPU features this
    machine has when none is given, so what they collect and train is what plan looks up."""
    from edgec.cli import main
    from edgec.core.targets import default_target

    monkeypatch.delenv("EDGEC_MEASUREMENTS_DIR")  # the committed stores; eval only reads them
    assert main(["costmodel", "eval", "--holdout", "cnn_batch"]) == 0
    out, err = capsys.readouterr()
    assert f"target: {default_target().name} (default" in err
    assert f"target {default_target().name}" in out and "cnn_batch" in out
