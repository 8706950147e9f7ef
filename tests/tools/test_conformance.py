"""ONNX's operator conformance cases through the whole pipeline: the CI subset must not regress.

The full run (`edgec conformance --subset all -o reports/conformance/all`) takes long; CI runs the
fixed subset and fails when fewer cases pass than the floor recorded in the repo.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from edgec.tools import conformance
from edgec.errors import ModelError

FLOOR_FILE = Path(__file__).resolve().parents[2] / "reports" / "conformance" / "ci_floor.json"


def test_run_compiles_and_returns_outputs_in_graph_order():
    graph = helper.make_graph(
        [helper.make_node("Greater", ["a", "b"], ["gt"], name="g"),
         helper.make_node("Add", ["a", "b"], ["sum"], name="s")], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("a", "b")],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("gt", TensorProto.BOOL, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    total, greater = conformance.run(model, [np.array([1, 2, 3], np.float32), np.full(3, 2, np.float32)])
    np.testing.assert_array_equal(total, [3, 4, 5])
    np.testing.assert_array_equal(greater, [False, False, True])


def test_unsupported_operator_is_an_error_naming_it():
    graph = helper.make_graph(
        [helper.make_node("TfIdfVectorizer", ["x"], ["y"], name="tfidf", mode="TF", min_gram_length=1,
                          max_gram_length=1, max_skip_count=0, ngram_counts=[0], ngram_indexes=[0],
                          pool_int64s=[1])],
        "g", [helper.make_tensor_value_info("x", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(ModelError, match="cannot import: TfIdfVectorizer"):
        conformance.run(model, [np.array([1, 2, 1, 3], np.int64)])


@pytest.mark.slow
def test_ci_subset_pass_count_does_not_drop_below_the_floor():
    floor = json.loads(FLOOR_FILE.read_text())
    names = conformance.ci_subset(sorted(conformance.node_cases()))
    assert len(names) == floor["cases"], "the CI subset changed: rerun it and update the floor"
    results = list(conformance.run_suite(names))
    summary = conformance.summarize(results)
    failed = sorted(r.name for r in results if r.status != "pass")
    assert summary["pass"] >= floor["pass"], f"{summary['pass']} < floor {floor['pass']}; failing: {failed}"
    assert summary["control_flow"]["pass"] >= floor["control_flow_pass"]


def test_fixed_input_other_value_is_refused_by_the_python_runtime(tmp_path):
    from edgec import runtime
    from edgec.stages.build import build
    from edgec.errors import SamplesError
    from edgec.core.model import from_proto
    from edgec.stages.plan import plan
    from edgec.stages.profile import profile
    from edgec.core.samples import Sample
    from edgec.core.targets import load_target

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0, name="sum")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    proto.ir_version = 8
    model = from_proto(proto, "sum")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    arrays = {"x": x, "axes": np.array([1], np.int64)}
    target = load_target("x86_64")
    artifact = build(model, plan(model, profile(model, [Sample("s", arrays)]), target), [target])
    assert artifact.manifest["inputs"][1]["fixed"] == {"shape": [1], "value": [1]}
    loaded = runtime.load(artifact.save(tmp_path / "sum.edgec"))
    np.testing.assert_array_equal(loaded.run(arrays)["y"], x.sum(axis=1))
    with pytest.raises(SamplesError, match=r"input 'axes' is \[0\], the artifact was compiled for "
                                           r"\[1\] \(its value in every profiled sample\); recompile"):
        loaded.run({"x": x, "axes": np.array([0], np.int64)})


def test_bfloat16_and_float8_cross_the_runtime_boundary():
    import ml_dtypes

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT, name="up"),
         helper.make_node("Cast", ["y"], ["z"], to=TensorProto.BFLOAT16, name="down")], "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("z", TensorProto.BFLOAT16, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    x = np.array([1.5, -2.0, 0.25, 3.0], dtype=ml_dtypes.bfloat16)
    y, z = conformance.run(model, [x])
    np.testing.assert_array_equal(y, x.astype(np.float32))
    assert z.dtype == x.dtype and np.array_equal(z, x)


def test_low_precision_outputs_compare_as_floats():
    import ml_dtypes

    nan = np.array([np.nan, 1.0], dtype=ml_dtypes.float8_e4m3fn)
    assert conformance._compare([nan], [nan.copy()], 1e-3, 1e-7) == ""
    assert "differs" in conformance._compare([nan], [np.array([np.nan, 2.0], nan.dtype)], 1e-3, 1e-7)


def test_fixed_input_falls_back_to_the_general_program_when_one_imports(tmp_path):
    """Slice with runtime starts/ends imports symbolically too: other values take that path."""
    from edgec import runtime
    from edgec.stages.build import build
    from edgec.core.model import from_proto
    from edgec.stages.plan import plan
    from edgec.stages.profile import profile
    from edgec.core.samples import Sample
    from edgec.core.targets import load_target

    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "starts", "ends"], ["y"], name="slice")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10]),
         helper.make_tensor_value_info("starts", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("ends", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m"])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = from_proto(proto, "slice")
    x = np.arange(10, dtype=np.float32)
    sample = {"x": x, "starts": np.array([2]), "ends": np.array([5])}
    target = load_target("x86_64")
    the_plan = plan(model, profile(model, [Sample("s", sample)]), target)
    assert set(the_plan.constant_inputs) == {"starts", "ends"}
    artifact = build(model, the_plan, [target])
    assert all("fixed" not in spec for spec in artifact.manifest["inputs"])
    loaded = runtime.load(artifact.save(tmp_path / "slice.edgec"))
    np.testing.assert_array_equal(loaded.run(sample)["y"], x[2:5])
    other = {"x": x, "starts": np.array([1]), "ends": np.array([8])}
    np.testing.assert_array_equal(loaded.run(other)["y"], x[1:8])
