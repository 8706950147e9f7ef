import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import mlp_model
from edgec import runtime
from edgec.errors import ArtifactError, SamplesError
from edgec.reference import reference_session


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
    ({"x": np.zeros((1, 2, 16), np.float64)}, "is float64, the model expects float32"),
    ({"x": np.zeros((1, 16), np.float32)}, "has rank 2"),
    ({"x": np.zeros((1, 2, 3), np.float32)}, "fixes it to 16"),
    ({"z": np.zeros((1, 2, 16), np.float32)}, "missing x"),
])
def test_bad_inputs_are_refused_before_running(mlp_artifact, inputs, message):
    with pytest.raises(SamplesError, match=message):
        runtime.load(mlp_artifact).run(inputs)


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
                            or k in ("onnx", "onnxruntime", "edgec.compiler", "edgec.build")]
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
    strided = np.arange(20, dtype=np.float32)[::2]
    assert aligned(strided).flags.c_contiguous and np.array_equal(aligned(strided), strided)
