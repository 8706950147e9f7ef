import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import mlp_model
from edgec import runtime
from edgec.errors import ArtifactError, SamplesError
from edgec.core.reference import reference_session


def test_runs_specialized_and_fallback_shapes_matching_onnxruntime(mlp_artifact):
    model = runtime.load(mlp_artifact)
    assert [s.name for s in model.inputs] == ["x"] and [s.name for s in model.outputs] == ["y"]
    reference = reference_session(mlp_model())
    rng = np.random.default_rng(3)
    # (1, 8) and (2, 4) are specialized; (5, 7) and (1, 1) take the symbolic fallback.
    for shape in [(1, 8, 16), (2, 4, 16), (5, 7, 16), (1, 1, 16)]:
        x = rng.standard_normal(shape).astype(np.float32)
        got = model.run({"x": x})["y"]
        np.testing.assert_allclose(got, reference.run({"x": x})["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("inputs, message", [
    ({"x": np.zeros((1, 2, 16), np.float64)}, "is float64, the model expects float32; convert it first"),
    ({"x": np.zeros((1, 16), np.float32)}, "has rank 2"),
    ({"x": np.zeros((1, 2, 3), np.float32)}, "fixes it to 16"),
    ({"z": np.zeros((1, 2, 16), np.float32)}, "missing x"),
])
def test_bad_inputs_are_refused_before_running(mlp_artifact, inputs, message):
    with pytest.raises(SamplesError, match=message):
        runtime.load(mlp_artifact).run(inputs)


@pytest.mark.parametrize("shape, message", [((1, 16), "expect Tensor with ndim 3"),
                                            ((1, 2, 3), "shape\\[2\\] mismatch")])
def test_vm_still_checks_inputs_without_kernel_argument_checks(mlp_artifact, shape, message):
    """Kernels are built without TIR's argument asserts (codegen.without_kernel_asserts): the
    library holds none of their messages, and a tensor that bypasses edgec's own input checks
    is still refused by the VM's checks at ``main``, not read out of bounds."""
    from edgec.runtime.artifact import Artifact

    library = Artifact.load(mlp_artifact).library("x86_64")
    assert b".ndim on argument #" not in library
    model = runtime.load(mlp_artifact)
    bad = model._host_tensor(np.zeros(shape, np.float32))  # pylint: disable=protected-access
    with pytest.raises((ValueError, RuntimeError), match=message):
        model.raw_call([bad])


def test_unknown_target_library(mlp_artifact):
    with pytest.raises(ArtifactError, match="no library for target 'jetson'"):
        runtime.load(mlp_artifact, target="jetson")


def test_runtime_never_loads_the_compiler(mlp_artifact):
    script = textwrap.dedent(f"""
        import sys, numpy as np
        import edgec.runtime as rt
        m = rt.load({str(mlp_artifact)!r})
        y = m.run({{"x": np.ones((1, 8, 16), np.float32)}})["y"]
        maps = open("/proc/self/maps").read()
        compiler_modules = [k for k in sys.modules if k == "tvm" or k.startswith("tvm.")
                            or k in ("onnx", "onnxruntime", "edgec.compiler", "edgec.stages.build")]
        print(y.shape, "libtvm_compiler" in maps, compiler_modules, "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "(1, 8, 8) False [] False"


def test_aligned_copies_only_misaligned_or_strided_arrays():
    from edgec.runtime import ALIGNMENT, aligned

    buffer = np.zeros(4 * 64 + ALIGNMENT, np.uint8)
    start = (-buffer.ctypes.data) % ALIGNMENT
    good = buffer[start: start + 256].view(np.float32)
    assert aligned(good) is good
    bad = buffer[start + 4: start + 4 + 252].view(np.float32)
    fixed = aligned(bad)
    assert fixed.ctypes.data % ALIGNMENT == 0 and np.array_equal(fixed, bad)
    good.flags.writeable = False
    assert aligned(good) is not good and aligned(good).flags.writeable
    empty = np.zeros((0, 3), np.float32)
    empty.flags.writeable = False
    assert aligned(empty).shape == (0, 3) and aligned(empty).flags.writeable
    assert aligned(np.zeros((2, 0, 4), np.float32)).strides == (0, 16, 4)  # compact, as TVM checks
    strided = np.arange(20, dtype=np.float32)[::2]
    assert aligned(strided).flags.c_contiguous and np.array_equal(aligned(strided), strided)


def test_out_of_range_indices_are_refused_before_the_kernel_sees_them(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    from edgec.stages.build import build
    from edgec.core.model import from_proto
    from edgec.stages.plan import plan
    from edgec.stages.profile import profile
    from edgec.core.samples import Sample
    from edgec.core.targets import load_target

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed")], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = from_proto(proto)
    sample = Sample("s", {"ids": np.array([0, 9, -1], np.int64)})
    target = load_target("x86_64")
    path = build(model, plan(model, profile(model, [sample]), target), [target]).save(tmp_path / "g.edgec")
    loaded = runtime.load(path)
    assert loaded.inputs[0].bounds == (-10, 10)
    np.testing.assert_array_equal(loaded.run(sample.arrays)["emb"][1], [36, 37, 38, 39])
    with pytest.raises(SamplesError, match=r"holds 10, outside \[-10, 10\)"):
        loaded.run({"ids": np.array([3, 10], np.int64)})
    many = np.zeros(100, np.int64)  # past the few ids checked through Python's min and max
    many[57] = -11
    with pytest.raises(SamplesError, match=r"holds -11, outside \[-10, 10\)"):
        loaded.run({"ids": many})
    many[57] = -10
    assert loaded.run({"ids": many})["emb"].shape == (100, 4)


def test_serial_tvm_kernels_get_a_one_thread_tvm_pool(mlp_artifact):
    # The MLP's matmuls go to oneDNN, so TVM's kernels are compiled serial: the runtime starts
    # TVM's pool with one thread and gives oneDNN's OpenMP pool the threads asked for.
    script = textwrap.dedent(f"""
        import os
        import edgec.runtime as rt
        m = rt.load({str(mlp_artifact)!r}, threads=2)
        print(m.manifest["libraries"][m.target]["tvm_kernels_parallel"],
              os.environ["TVM_NUM_THREADS"], os.environ["OMP_NUM_THREADS"])
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env=env)
    assert out.stdout.split() == ["False", "1", "2"]


def test_compiled_vm_code_finds_linked_functions_without_leaking_them(mlp_artifact):
    # The MLP's matmuls are oneDNN shim calls, which the library's compiled VM code can only find
    # through the binding at load: it must not stay in TVM's global registry (no other library
    # may pick it up), and each model must keep working when another one is freed.
    script = textwrap.dedent(f"""
        import gc, numpy as np
        import edgec.runtime as rt
        first, second = rt.load({str(mlp_artifact)!r}), rt.load({str(mlp_artifact)!r})
        entry = first.manifest["libraries"][first.target]
        x = np.ones((2, 3, 16), np.float32)
        expected = first.run({{"x": x}})["y"]
        del first
        gc.collect()
        got = second.run({{"x": x}})["y"]
        import tvm_ffi
        print(entry["vm_exec_mode"], entry["linked_functions"], np.array_equal(got, expected),
              tvm_ffi.get_global_func("edgec_dnnl_dense", allow_missing=True))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "compiled ['edgec_dnnl_dense'] True None"


def _misaligned(values: np.ndarray) -> np.ndarray:
    """A C-contiguous, writeable copy of ``values`` at an address 4 bytes past a 64-byte one."""
    from edgec.runtime import ALIGNMENT

    raw = np.empty(values.nbytes + 2 * ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT + 4
    copy = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    copy[...] = values
    assert copy.ctypes.data % ALIGNMENT
    return copy


def test_misaligned_inputs_refill_a_staging_copy_that_outputs_never_share(tmp_path):
    """A misaligned input is copied into an aligned staging copy kept across calls; an output
    over that memory (an Identity of the input) takes it over, so a later call never rewrites
    an output already returned."""
    from onnx import TensorProto, helper

    from edgec.core.model import from_proto
    from edgec.core.samples import Sample
    from edgec.driver import compile as compile_model

    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["same"]),
         helper.make_node("Mul", ["w", "two"], ["twice"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "w")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("same", "twice")],
        [two])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = from_proto(proto)
    sample = Sample("s", {"x": np.zeros((2, 3), np.float32), "w": np.zeros((2, 3), np.float32)})
    path = compile_model(model, [sample]).artifact.save(tmp_path / "g.edgec")
    loaded = runtime.load(path)
    rng = np.random.default_rng(0)
    calls = [{n: rng.standard_normal((2, 3)).astype(np.float32) for n in ("x", "w")}
             for _ in range(3)]
    outputs, staged_w = [], []
    for values in calls:
        outputs.append(loaded.run({n: _misaligned(v) for n, v in values.items()}))
        staged_w.append(loaded._staging["w"][0])  # pylint: disable=protected-access
    for values, got in zip(calls, outputs):  # each call's outputs as returned, after later calls
        np.testing.assert_array_equal(got["same"], values["x"])
        np.testing.assert_array_equal(got["twice"], 2 * values["w"])
    assert staged_w[0] is staged_w[1] is staged_w[2]  # refilled, not reallocated
    assert "x" not in loaded._staging  # pylint: disable=protected-access
