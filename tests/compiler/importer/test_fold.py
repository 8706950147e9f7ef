"""The fold pass's rewrites that the importer relies on: Constants of every value form (in
subgraphs too) and Ifs whose condition is known at compile time."""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from compiler.importer.test_converters_ops import _model

from edgec.compiler.importer.fold import fold_constants
from edgec.core.model import all_nodes
from edgec.tools import conformance


def _onnxruntime(model, inputs):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: v for i, v in zip(session.get_inputs(), inputs)})


def _branch(tag, constant_attrs):
    """y = x + c with c a Constant of the given value form."""
    return helper.make_graph(
        [helper.make_node("Constant", [], [f"c_{tag}"], name=f"c_{tag}", **constant_attrs),
         helper.make_node("Add", ["x", f"c_{tag}"], [f"y_{tag}"], name=f"add_{tag}")],
        tag, [], [helper.make_tensor_value_info(f"y_{tag}", TensorProto.FLOAT, [3])])


def _if_model(cond_input: bool):
    then_branch = _branch("then", {"value_floats": [1.0, 2.0, 3.0]})
    else_branch = _branch("else", {"value_float": 0.5})
    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=then_branch,
                              else_branch=else_branch, name="if")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])]
    inits = []
    if cond_input:
        inputs.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    else:
        nodes.insert(0, helper.make_node("Constant", [], ["flag"], value_int=0, name="flag_int"))
        nodes.insert(1, helper.make_node("Cast", ["flag"], ["flag_b"], to=TensorProto.BOOL, name="cast"))
        nodes[2].input[0] = "flag_b"
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
                  inits, opset=18)


def test_constant_value_forms_inside_if_branches():
    model = _if_model(cond_input=True)
    folded = fold_constants(model)
    assert all(n.attribute[0].name == "value" for n in all_nodes(folded.graph)
               if n.op_type == "Constant")
    x = np.array([1.0, -1.0, 4.0], np.float32)
    for flag in (True, False):
        inputs = [x, np.array(flag)]
        np.testing.assert_allclose(conformance.run(model, inputs)[0], _onnxruntime(model, inputs)[0])


def test_sparse_and_int_constants():
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([5, 7], np.int64), "values"),
        numpy_helper.from_array(np.array([1, 4], np.int64), "indices"), [6])
    nodes = [helper.make_node("Constant", [], ["s"], sparse_value=sparse, name="s"),
             helper.make_node("Constant", [], ["k"], value_int=2, name="k"),
             helper.make_node("Mul", ["s", "k"], ["sk"], name="mul"),
             helper.make_node("Add", ["x", "sk"], ["y"], name="add")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.INT64, [6])],
                   [helper.make_tensor_value_info("y", TensorProto.INT64, [6])])
    x = np.arange(6, dtype=np.int64)
    np.testing.assert_array_equal(conformance.run(model, [x])[0], _onnxruntime(model, [x])[0])


def test_if_with_a_known_condition_becomes_its_branch():
    model = _if_model(cond_input=False)
    folded = fold_constants(model)
    assert "If" not in [n.op_type for n in folded.graph.node]
    x = np.array([1.0, -1.0, 4.0], np.float32)
    np.testing.assert_allclose(conformance.run(model, [x])[0], _onnxruntime(model, [x])[0])


def test_an_inlined_branch_gets_fresh_names_where_the_graph_uses_them():
    """Both the graph and the taken branch define 'c': the branch's is renamed."""
    branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["c"], name="neg")], "then", [],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("Constant", [], ["t"], value=numpy_helper.from_array(np.array(True)),
                              name="t"),
             helper.make_node("If", ["t"], ["y"], then_branch=branch, else_branch=branch, name="if"),
             helper.make_node("Abs", ["x"], ["c"], name="abs"),
             helper.make_node("Add", ["y", "c"], ["z"], name="add")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                   [helper.make_tensor_value_info("z", TensorProto.FLOAT, [3])])
    folded = fold_constants(model)
    outputs = [o for n in folded.graph.node for o in n.output]
    assert len(outputs) == len(set(outputs))
    x = np.array([1.0, -2.0, 3.0], np.float32)
    np.testing.assert_allclose(conformance.run(model, [x])[0], np.abs(x) - x)


def test_a_model_without_inputs_compiles_to_its_constant_outputs():
    nodes = [helper.make_node("Constant", [], ["a"], value_floats=[1.0, 2.5], name="a"),
             helper.make_node("Constant", [], ["b"],
                              value=numpy_helper.from_array(np.array([3.0, 4.0], np.float32)),
                              name="b"),
             helper.make_node("Mul", ["a", "b"], ["y"], name="mul")]
    model = _model(nodes, [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    np.testing.assert_array_equal(conformance.run(model, [])[0], _onnxruntime(model, [])[0])
