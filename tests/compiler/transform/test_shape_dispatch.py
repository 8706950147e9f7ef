import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from conftest import mlp_model
from edgec.compiler.transform.shape_dispatch import add_shape_dispatch, lower_regions
from edgec.compiler.pipeline import import_model
from edgec.core.model import from_proto
from edgec.core.reference import reference_session
from edgec.core.regions import cut_regions, region_model


def test_dispatch_adds_static_functions_and_keeps_results_exact():
    mod = import_model(from_proto(mlp_model()))
    dispatched = add_shape_dispatch(mod, [{"batch": 1, "seq": 4}, {"seq": 2}])
    names = sorted(gv.name_hint for gv in dispatched.functions)
    assert names == ["generic", "main", "spec_0", "spec_1"]
    spec0 = dispatched["spec_0"].params[0].ty.shape.values
    assert [int(v) for v in spec0] == [1, 4, 16]
    assert "main" in [gv.name_hint for gv in mod.functions] and len(mod.functions) == 1

    vm = relax.VirtualMachine(tvm.compile(dispatched, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    weight = {init.name: init for init in mlp_model().graph.initializer}["W"]
    w = np.frombuffer(weight.raw_data, np.float32).reshape(16, 8)
    rng = np.random.default_rng(0)
    for shape in [(1, 4, 16), (3, 2, 16), (2, 5, 16)]:
        x = rng.standard_normal(shape).astype(np.float32)
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


def test_no_specializations_leaves_the_module_alone():
    mod = import_model(from_proto(mlp_model()))
    assert add_shape_dispatch(mod, []) is mod


def nonzero_model() -> onnx.ModelProto:
    """x[batch, 4] -> MatMul -> (NonZero of the positive entries) -> Relu*2 and the indices:
    three regions, the middle one data-dependent."""
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["mm"], name="mm"),
         helper.make_node("Greater", ["mm", "zero"], ["pos"], name="pos"),
         helper.make_node("NonZero", ["pos"], ["nz"], name="nz"),
         helper.make_node("Relu", ["mm"], ["r"], name="relu"),
         helper.make_node("Mul", ["r", "two"], ["y"], name="double"),
         helper.make_node("Transpose", ["nz"], ["idx"], name="idx", perm=[1, 0])],
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, ["k", 2])],
        [numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "W"),
         numpy_helper.from_array(np.zeros((), np.float32), "zero"),
         numpy_helper.from_array(np.full((), 2.0, np.float32), "two")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _imported(model, cuts):
    """Each region of ``cuts`` imported alone, as the build stage imports them."""
    return [import_model(from_proto(region_model(model, cut, f"region_{i}"), f"region_{i}"))
            for i, cut in enumerate(cuts)]


def test_regions_lower_to_one_program_with_a_dispatch_per_region():
    model = from_proto(nonzero_model(), "nonzero")
    cuts = cut_regions(model)
    regions = [{"name": f"region_{i}", "nodes": c.nodes, "inputs": c.inputs, "outputs": c.outputs,
                "specializations": [] if c.boundary else [{"batch": 2}]}
               for i, c in enumerate(cuts)]
    mod = lower_regions(model, regions, _imported(model, cuts))
    names = sorted(gv.name_hint for gv in mod.functions)
    assert names == ["main", "region_0", "region_0__generic", "region_0__spec_0", "region_1",
                     "region_2", "region_2__generic", "region_2__spec_0"]
    spec = mod["region_0__spec_0"].params[0].ty.shape.values
    assert [int(v) for v in spec] == [2, 4]

    vm = relax.VirtualMachine(tvm.compile(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    reference = reference_session(model.proto)
    rng = np.random.default_rng(0)
    for batch in (2, 3, 1):  # specialized, then fallback shapes
        x = rng.standard_normal((batch, 4)).astype(np.float32)
        y, idx = vm["main"](tvm.runtime.tensor(x))
        want = reference.run({"x": x})
        np.testing.assert_allclose(y.numpy(), want["y"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(idx.numpy(), want["idx"])


def test_a_specialization_naming_a_dim_the_region_lacks_is_refused():
    model = from_proto(nonzero_model(), "nonzero")
    cut = cut_regions(model)[0]
    with pytest.raises(ValueError, match="does not have"):
        lower_regions(model, [{"name": "region_0", "nodes": cut.nodes, "inputs": cut.inputs,
                               "outputs": cut.outputs, "specializations": [{"seq": 3}]}],
                      _imported(model, [cut]))


def test_a_plan_whose_regions_do_not_lower_builds_the_model_whole(monkeypatch, tmp_path):
    import edgec.stages.build
    from edgec import runtime
    from edgec.stages.plan import PlanSettings, plan
    from edgec.stages.profile import profile
    from edgec.core.samples import Sample
    from edgec.core.targets import load_target

    model = from_proto(nonzero_model(), "nonzero")
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    the_plan = plan(model, profile(model, [Sample("s", {"x": x})]), load_target("x86_64"),
                    PlanSettings("symbolic"), one_program=False)

    def refuse(*args, **kwargs):
        raise ValueError("region region_2 does not import alone")

    monkeypatch.setattr(edgec.stages.build, "lower_regions", refuse)
    artifact = edgec.stages.build.build(model, the_plan, [load_target("x86_64")])
    (function,) = artifact.manifest["libraries"]["x86_64"]["functions"]
    assert function["kind"] == "symbolic" and "does not import alone" in function["note"]
    got = runtime.load(artifact.save(tmp_path / "a.edgec")).run({"x": x})
    want = reference_session(model.proto).run({"x": x})
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["idx"], want["idx"])
