import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import MLP_SHAPES, mlp_model, mlp_samples
from edgec.errors import SamplesError, StageInputError
from edgec.core.model import from_proto
from edgec.stages.profile import Profile, profile
from edgec.core.samples import Sample


def _samples(arrays_list):
    return [Sample(f"s{i}", a) for i, a in enumerate(arrays_list)]


def if_model() -> onnx.ModelProto:
    """y = x * 2 if sum(x) > 0 else x - 1."""
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["t"], name="mul")], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n"])])
    else_graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "one"], ["e"], name="sub")], "else", [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n"])])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
         helper.make_node("Greater", ["s", "zero"], ["c"], name="gt"),
         helper.make_node("If", ["c"], ["y"], then_branch=then_graph, else_branch=else_graph, name="branch")],
        "ifg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
         helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def loop_model() -> onnx.ModelProto:
    """Doubles x until its sum exceeds 100 (at most 20 times); scan output: sum per step."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["v_in", "two"], ["v_out"], name="double"),
         helper.make_node("ReduceSum", ["v_out"], ["total"], keepdims=0, name="total"),
         helper.make_node("Less", ["total", "limit"], ["cond_out"], name="less"),
         helper.make_node("Identity", ["total"], ["scan"], name="scan_id")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["max", "true", "x"], ["final", "sums"], body=body, name="loop")],
        "loopg", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("final", TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("sums", TensorProto.FLOAT, ["steps"])],
        [helper.make_tensor("max", TensorProto.INT64, [], [20]),
         helper.make_tensor("true", TensorProto.BOOL, [], [True]),
         helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
         helper.make_tensor("limit", TensorProto.FLOAT, [], [100.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_profile_records_dims_shapes_nodes_and_ranges():
    model = from_proto(mlp_model())
    prof = profile(model, _samples(mlp_samples(MLP_SHAPES)))
    assert prof.sample_count == 10
    assert prof.dims == {"batch": {"1": 6, "2": 3, "3": 1}, "seq": {"3": 1, "4": 3, "5": 1, "8": 5}}
    assert [s["dims"] for s in prof.shapes[:2]] == [{"batch": 1, "seq": 8}, {"batch": 2, "seq": 4}]
    assert [s["count"] for s in prof.shapes] == [5, 3, 1, 1]
    assert set(prof.nodes) == {"matmul", "relu"} and prof.nodes["matmul"]["op"] == "MatMul"
    assert prof.ranges["y"]["min"] == 0.0 and prof.ranges["h"]["min"] < 0 < prof.ranges["h"]["max"]
    assert all(s["reference_ms"] > 0 for s in prof.shapes)


def test_profile_keeps_histograms_of_the_activations_quantization_calibrates():
    """|x| histograms for the inputs of layers with constant weights (here the MLP's MatMul
    input), over [0, largest |x| seen], holding every value once; none for other tensors."""
    from edgec.stages.profile import HISTOGRAM_BINS
    from edgec.core.quant_layers import find_layers

    model = from_proto(mlp_model(), "mlp")
    samples = _samples(mlp_samples(MLP_SHAPES))
    prof = profile(model, samples)
    activations = {layer.activation for layer in find_layers(model.proto)
                   if layer.kind != "embedding"}
    assert activations and all(name in prof.ranges for name in activations)
    for name, entry in prof.ranges.items():
        if name not in activations:
            assert "abs_hist" not in entry
            continue
        assert len(entry["abs_hist"]) == HISTOGRAM_BINS
        assert entry["abs_hist_max"] == pytest.approx(max(abs(entry["min"]), abs(entry["max"])))
        if name in samples[0].arrays:
            assert sum(entry["abs_hist"]) == sum(s.arrays[name].size for s in samples)
    assert profile(model, samples).ranges == prof.ranges  # deterministic


def test_profile_counts_branches_of_if():
    xs = [np.array(v, np.float32) for v in ([1, 2], [-5, 1], [3, 3, 3], [-1, -1, -1], [0.5])]
    prof = profile(from_proto(if_model()), _samples([{"x": x} for x in xs]))
    assert prof.control_flow == {"branch": {"op": "If", "branches": {"then": 3, "else": 2}}}


def test_profile_counts_loop_trips():
    xs = [np.array(v, np.float32) for v in ([1, 1], [60, 0], [200.0], [1e-6])]
    prof = profile(from_proto(loop_model()), _samples([{"x": x} for x in xs]))
    loop = prof.control_flow["loop"]
    # Sums 2 -> doubles until >= 100: 6 steps; 60 -> 120: 1; 200 -> 1; 1e-6 hits the max of 20.
    assert loop["trips"] == {"1": 2, "6": 1, "20": 1}
    assert (loop["trip_min"], loop["trip_max"]) == (1, 20)


def test_profile_round_trips_through_json(tmp_path):
    prof = profile(from_proto(mlp_model()), _samples(mlp_samples([(1, 2), (2, 2)])))
    path = prof.save(tmp_path / "p.json")
    assert Profile.load(path) == prof


def test_profile_needs_samples_and_the_right_file(tmp_path):
    with pytest.raises(SamplesError):
        profile(from_proto(mlp_model()), [])
    other = tmp_path / "x.json"
    other.write_text('{"kind": "plan", "format_version": 1}')
    with pytest.raises(StageInputError, match="holds a 'plan', not a profile"):
        Profile.load(other)
    other.write_text("{")
    with pytest.raises(StageInputError, match="not a JSON profile"):
        Profile.load(other)


def test_profile_keeps_shapes_when_onnxruntime_cannot_run_the_model():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu", domain="com.example")],
        "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    prof = profile(from_proto(model), _samples([{"x": np.ones(3, np.float32)}]))
    assert prof.shapes[0]["dims"] == {"n": 3} and prof.shapes[0]["reference_ms"] is None
    assert "onnxruntime" in prof.reference_error and prof.nodes == {}


def _topk_model() -> onnx.ModelProto:
    """TopK(x[n, 8], k) with ``k`` a graph input: a shape-like argument."""
    graph = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["values", "indices"], name="topk")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["n", "kk"]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, ["n", "kk"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_profile_records_values_of_shape_like_inputs_and_the_plan_fixes_constant_ones(tmp_path):
    from edgec.stages.plan import plan
    from edgec.core.targets import load_target

    model = from_proto(_topk_model())
    rng = np.random.default_rng(0)
    x = [rng.standard_normal((n, 8)).astype(np.float32) for n in (2, 3, 3)]
    same = profile(model, _samples([{"x": a, "k": np.array([3], np.int64)} for a in x]))
    assert same.values == {"k": [{"shape": [1], "value": [3], "count": 3}]}
    assert Profile.load(same.save(tmp_path / "p.json")).values == same.values
    fixed = plan(model, same, load_target("x86_64")).constant_inputs
    assert fixed["k"]["value"] == [3] and fixed["k"]["shape"] == [1] and fixed["k"]["dtype"] == "int64"
    assert "all 3 samples" in fixed["k"]["reason"]

    varied = profile(model, _samples([{"x": a, "k": np.array([k], np.int64)} for a, k in zip(x, (2, 3, 3))]))
    assert varied.values["k"][0] == {"shape": [1], "value": [3], "count": 2}
    assert plan(model, varied, load_target("x86_64")).constant_inputs == {}
    assert "x" not in varied.values  # data, not a shape-like argument


def test_inputs_reaching_a_shape_argument_through_integer_arithmetic_are_shape_like():
    from edgec.stages.profile import shape_argument_inputs

    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"], name="shape"),
         helper.make_node("Sub", ["s", "crop"], ["d"], name="sub"),
         helper.make_node("Slice", ["x", "d", "s"], ["y"], name="slice")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8]),
         helper.make_tensor_value_info("crop", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert shape_argument_inputs(model) == ["crop"]  # x reaches Slice only as its data


def test_inputs_reaching_a_shape_argument_through_if_and_split_are_shape_like():
    """An expanded AffineGrid: its size input is split into dims inside an If's branches."""
    from edgec.stages.profile import shape_argument_inputs

    def branch(tag):
        return helper.make_graph(
            [helper.make_node("Split", ["size"], [f"a_{tag}", f"b_{tag}"], name=f"split_{tag}")],
            tag, [], [helper.make_tensor_value_info(f"b_{tag}", TensorProto.INT64, [1])])

    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["b"], then_branch=branch("then"),
                          else_branch=branch("else"), name="if"),
         helper.make_node("Split", ["pair"], ["p0", "p1"], name="split"),
         helper.make_node("Concat", ["b", "p1"], ["shape"], axis=0, name="cat"),
         helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
         helper.make_tensor_value_info("size", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("pair", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert shape_argument_inputs(model) == ["size", "pair"]
