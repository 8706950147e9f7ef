import numpy as np
import tvm
from tvm import relax

from conftest import mlp_model
from edgec.compiler.dispatch import add_shape_dispatch
from edgec.compiler.frontend import import_onnx
from edgec.model import from_proto


def test_dispatch_adds_static_functions_and_keeps_results_exact():
    mod = import_onnx(from_proto(mlp_model()))
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
    mod = import_onnx(from_proto(mlp_model()))
    assert add_shape_dispatch(mod, []) is mod
