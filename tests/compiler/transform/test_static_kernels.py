"""Static shape specializations get static copies of the kernels that were TIR before
specialization (transform/static_kernels.py): TVM's importer emits Clip, Pad and a Conv's
auto_pad with emit_te, and TVM's FuseTIR cannot fuse such a symbolic kernel with the static
kernels around it ("Inconsistent buffers ... mapped to the same relax var")."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, te, tirx, topi

import edgec
from edgec import runtime
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.compiler.pipeline import lower_to
from edgec.compiler.transform.shape_dispatch import add_shape_dispatch
from edgec.compiler.transform.static_kernels import specialized_kernel
from edgec.compiler.transform.unique_vars import UniqueVars
from edgec.core.targets import load_target


def clip_module():
    """main(x[n, 8]) = clip(x * 2, 0, 6) + 3, the clip already TIR (as TVM's Clip converter
    emits it), the rest Relax ops legalized later."""
    bb = relax.BlockBuilder()
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 8], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            doubled = bb.emit(relax.op.multiply(x, relax.const(2.0, "float32")))
            clipped = bb.emit_te(topi.clip, doubled, 0.0, 6.0)
            out = bb.emit_output(relax.op.add(clipped, relax.const(3.0, "float32")))
        bb.emit_func_output(out)
    return bb.get()


def called_kernels(mod, name):
    """The kernels function ``name`` of ``mod`` calls with call_tir, in order."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    found = []
    relax.analysis.post_order_visit(mod[name], lambda e: found.append(e.args[0].name_hint) if (
        isinstance(e, relax.Call) and e.op == call_tir) else None)
    return found


def test_specialization_calls_a_static_copy_of_the_kernel():
    mod = add_shape_dispatch(clip_module(), [{"n": 4}])
    generic, spec = called_kernels(mod, "generic"), called_kernels(mod, "spec_0")
    assert len(generic) == len(spec) == 1 and generic != spec
    static = mod[spec[0]]
    assert [[int(d) for d in p.ty.shape] for p in static.params] == [[4, 8], [4, 8]]
    assert any(isinstance(d, tirx.Var) for d in mod[generic[0]].params[0].ty.shape)


def test_specialized_module_fuses():
    """Through TVM's legalization and fusion (FuseTIR) for the CPU."""
    mod = UniqueVars(add_shape_dispatch(clip_module(), [{"n": 4}, {"n": 1}]))
    lowered = lower_to(mod, load_target("x86_64"), "legalize")
    assert "spec_0" in [gv.name_hint for gv in lowered.functions]


def test_kernels_that_do_not_fit_are_left_alone():
    n = tirx.Var("n", "int64")
    a = te.placeholder((n, 4), name="A")
    func = te.create_prim_func([a, topi.nn.pad(a, [0, 1], [0, 2])])
    assert specialized_kernel(func, [[3, 4], [3, 7]]) is not None
    assert specialized_kernel(func, [[3, 4], [3, 8]]) is None  # the output does not fit
    assert specialized_kernel(func, [[3, 5], [3, 7]]) is None  # a static dim differs
    b = te.placeholder((3, 4), name="B")
    static = te.create_prim_func([b, topi.nn.relu(b)])
    assert specialized_kernel(static, [[3, 4], [3, 4]]) is None  # nothing symbolic


def test_conv1d_same_upper_after_a_gather_builds_specialized(tmp_path):
    """tf2onnx's Conv1D (keras_conv1d_text): Gather, Unsqueeze(-3), Transpose, Conv(SAME_UPPER)
    with a static specialization and the symbolic fallback in one module."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((100, 8)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((8, 8, 1, 3)).astype(np.float32), "K"),
             numpy_helper.from_array(np.array([-3], np.int64), "axm3"),
             numpy_helper.from_array(np.array([2], np.int64), "ax2")]
    nodes = [helper.make_node("Gather", ["W", "tokens"], ["e"], axis=0),
             helper.make_node("Unsqueeze", ["e", "axm3"], ["t"]),
             helper.make_node("Transpose", ["t"], ["u"], perm=[0, 3, 1, 2]),
             helper.make_node("Conv", ["u", "K"], ["c"], auto_pad="SAME_UPPER", kernel_shape=[1, 3]),
             helper.make_node("Squeeze", ["c", "ax2"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("tokens", TensorProto.INT32, ["batch", "seq"])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 8, "seq"])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = [{"tokens": rng.integers(0, 100, shape).astype(np.int32)} for shape in ((1, 16),) * 3 + ((2, 5),)]
    compiled = edgec.compile(from_proto(proto, "conv1d"), [Sample(f"s{i}", f) for i, f in enumerate(feeds)])
    path = tmp_path / "a.edgec"
    compiled.artifact.save(path)
    model = runtime.load(path)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        np.testing.assert_allclose(model.run(feed)["out"], session.run(None, feed)[0], rtol=1e-5, atol=1e-5)
