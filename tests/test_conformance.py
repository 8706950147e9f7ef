"""ONNX's operator conformance cases through the whole pipeline: the CI subset must not regress.

The full run (`edgec conformance --subset all -o reports/conformance/all`) takes long; CI runs the
fixed subset and fails when fewer cases pass than the floor recorded in the repo.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from edgec import conformance
from edgec.errors import ModelError

FLOOR_FILE = Path(__file__).resolve().parent.parent / "reports" / "conformance" / "ci_floor.json"


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
