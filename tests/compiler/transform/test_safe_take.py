"""ClipTakes: gathers in mode fast become mode clip (same elements in range, clamped out of
range), and compiling a model with an embedding no longer logs TVM's fast-mode warning."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import edgec
from edgec import runtime
from edgec.compiler.transform.safe_take import ClipTakes
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.core.targets import load_target
from edgec.driver import CompileSettings
from edgec.stages.quantize import QuantizeSettings


@I.ir_module
class _Takes:
    @R.function
    def main(x: R.Tensor((10, 4), "float32"), i: R.Tensor(("n",), "int64")):
        with R.dataflow():
            rows = R.take(x, i, axis=0)
            cols = R.take(rows, R.const(np.array([1, 0]), "int64"), axis=1, mode="wrap")
            R.output(cols)
        return cols


@I.ir_module
class _Clipped:
    @R.function
    def main(x: R.Tensor((10, 4), "float32"), i: R.Tensor(("n",), "int64")):
        with R.dataflow():
            rows = R.take(x, i, axis=0, mode="clip")
            cols = R.take(rows, R.const(np.array([1, 0]), "int64"), axis=1, mode="wrap")
            R.output(cols)
        return cols


def test_fast_takes_become_clip_and_other_modes_stay():
    tvm.ir.assert_structural_equal(ClipTakes(_Takes), _Clipped, map_free_vars=True)


def test_clipped_take_reads_the_same_rows_in_range_and_the_nearest_out_of_range():
    vm = relax.VirtualMachine(tvm.compile(ClipTakes(_Takes), target="llvm"), tvm.cpu())
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    for ids, want in [([0, 9, 3], [0, 9, 3]), ([12, 9], [9, 9])]:
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array(ids, np.int64)))
        np.testing.assert_array_equal(got.numpy(), x[want][:, [1, 0]])


def _embedding() -> onnx.ModelProto:
    table = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(table, "table")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("quantize", ["none", "int8-weight"])
def test_an_embedding_compiles_without_the_fast_mode_warning(tmp_path, capfd, quantize):
    """Also with int8 weights, whose lowering adds takes of its own after the importer's."""
    rng = np.random.default_rng(1)
    samples = [Sample(f"s{i}", {"ids": rng.integers(0, 50, (1, n))}) for i, n in
               enumerate([4, 4, 4, 7, 4, 7, 4, 4])]
    settings = CompileSettings(quantize=QuantizeSettings(quantize, max_accuracy_drop=1.0))
    capfd.readouterr()
    artifact = edgec.compile(from_proto(_embedding(), "embedding"), samples,
                             [load_target("x86_64")], settings,
                             held_out=samples if quantize != "none" else None).artifact
    assert "Fast mode" not in capfd.readouterr().err
    compiled = runtime.load(artifact.save(tmp_path / "e.edgec"), target="x86_64")
    session = ort.InferenceSession(_embedding().SerializeToString())
    for sample in samples:
        want = session.run(None, sample.arrays)[0]
        np.testing.assert_allclose(compiled.run(sample.arrays)["y"], want, atol=0.05)
