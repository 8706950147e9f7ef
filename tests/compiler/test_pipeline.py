"""The pipeline lists what runs per backend, from capabilities; IR dumps after each phase."""

from __future__ import annotations

import dataclasses

import pytest
import tvm
from tvm.relax.frontend.onnx import onnx_frontend
from tvm.script import ir as I, relax as R  # noqa: E741

from conftest import mlp_model, mlp_samples
from edgec.compiler import pipeline
from edgec.compiler.backends import BACKENDS, backend_for
from edgec.compiler.importer import converter_table
from edgec.compiler.importer.converters import ops
from edgec.compiler.transform.fast_math import FastMath
from edgec.compiler.transform.quantized import QuantizedLowering
from edgec.compiler.transform.unique_vars import UniqueVars
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.core.targets import load_target
from edgec.errors import CompileError


def _names(phases):
    return [(phase.name, [p.info.name for p in phase.passes]) for phase in phases]


def _prepare(phases):
    return dict(_names(phases))["prepare"]


def test_cpu_phases_with_the_library_route():
    target = load_target("x86_64")
    phases = pipeline.phases(backend_for(target), target, pipeline.Options(), pipeline.Record())
    assert [p.name for p in phases] == ["prepare", "legalize", "tune", "schedule", "lower"]
    assert _prepare(phases) == [
        "edgec.UniqueVars", "edgec.library_offload.Canonicalize",
        "edgec.library_offload.Offload", "edgec.library_offload.PropagateLayout",
        "edgec.FastMath", "edgec.SplitWideConcats", "edgec.ClipTakes", "edgec.NativeKernels",
        "edgec.UnfusedShapeReads"]


def test_a_cpu_target_without_libraries_offloads_nothing():
    target = dataclasses.replace(load_target("x86_64"), libraries={})
    prepare = _prepare(pipeline.phases(backend_for(target), target, pipeline.Options(),
                                       pipeline.Record()))
    assert prepare == ["edgec.UniqueVars", "edgec.FastMath", "edgec.SplitWideConcats",
                       "edgec.ClipTakes", "edgec.NativeKernels", "edgec.UnfusedShapeReads"]


def test_gpu_phases_come_from_the_backends_capabilities():
    target = load_target("cuda-sm90")
    backend = backend_for(target)
    assert not backend.native_kernels and backend.fp16 and not backend.int8
    phases = pipeline.phases(backend, target, pipeline.Options(native_loops=False),
                             pipeline.Record())
    assert [p.name for p in phases] == ["prepare", "legalize", "lower"]
    assert _prepare(phases) == ["edgec.UniqueVars", "edgec.SplitWideConcats", "edgec.ClipTakes",
                                "edgec.NativeKernels", "edgec.UnfusedShapeReads"]
    fp16 = pipeline.Options(quantized=QuantizedLowering("fp16", "asymmetric", {}, None))
    assert "edgec.FP16" in _prepare(pipeline.phases(backend, target, fp16, pipeline.Record()))
    int8 = pipeline.Options(quantized=QuantizedLowering("int8-weight", "asymmetric", {}, None))
    with pytest.raises(CompileError, match="int8 kernels"):
        pipeline.phases(backend, target, int8, pipeline.Record())


def test_quantized_builds_send_every_quantized_layer_to_the_library():
    target = load_target("x86_64-avx512")
    backend = backend_for(target)
    fp32 = pipeline.library_rules(backend, target, pipeline.Options())
    assert fp32.dense_min_macs > 0 and not fp32.nhwc
    for mode, kind, nhwc in (("int8-static", "conv", True), ("int8-static", "dense", False),
                             ("bf16", "conv", True), ("bf16", "dense", False)):
        decisions = {"layer": {"precision": mode, "kind": kind}}
        lowering = QuantizedLowering(mode, "asymmetric", decisions, None)
        rules = pipeline.library_rules(backend, target, pipeline.Options(quantized=lowering))
        # Every int8 layer a library call (tiny bf16 ones stay TVM kernels, in fp32); with a
        # quantized convolution, activations NHWC, the AMX kernels' layout.
        assert (rules.dense_min_macs == 0) == (mode != "bf16"), mode
        assert rules.nhwc == nhwc and rules.block == 16, (mode, kind)
    avx2 = load_target("x86_64")  # its int8 convolutions (8-channel blocks) stay blocked
    int8_conv = QuantizedLowering("int8-static", "asymmetric",
                                  {"layer": {"precision": "int8-static", "kind": "conv"}}, None)
    assert not pipeline.library_rules(backend_for(avx2), avx2,
                                      pipeline.Options(quantized=int8_conv)).nhwc
    kept = QuantizedLowering("bf16", "asymmetric",
                             {"layer": {"precision": "fp32", "kind": "conv"}}, None)
    assert not pipeline.library_rules(backend, target, pipeline.Options(quantized=kept)).nhwc


def test_every_registered_backend_names_a_lowering_the_pipeline_knows():
    for backend in BACKENDS.values():
        assert pipeline._tvm_lowering(backend.lowering) is not None


def test_the_importer_uses_its_own_table_and_leaves_tvms_alone():
    tvm_map = onnx_frontend._get_convert_map()
    table = converter_table.converter_table(native_rows=True)
    assert table["CumProd"] is ops.CumProd and tvm_map.get("CumProd") is not ops.CumProd
    assert table["Loop"].native_rows and table["Loop"].converters is table
    assert not converter_table.converter_table(native_rows=False)["Scan"].native_rows


@I.ir_module
class _Softmax:
    @R.function
    def main(x: R.Tensor(("n", 16), "float32")) -> R.Tensor(("n", 16), "float32"):
        with R.dataflow():
            y = R.nn.softmax(x, axis=-1)
            z = R.erf(y)
            s = R.sigmoid(z)
            t = R.tanh(s)
            R.output(t)
        return t


def test_fast_math_replaces_erf_softmax_sigmoid_and_tanh_before_legalization():
    out = FastMath(_Softmax)
    script = out.script()
    for op in ("R.nn.softmax", "R.erf", "R.sigmoid", "R.tanh"):
        assert op not in script
    for kernel in ("fast_softmax", "fast_erf", "fast_sigmoid", "fast_tanh"):
        assert kernel in script
    assert "R.nn.softmax" in _Softmax.script()  # the input is not changed


def test_unique_vars_gives_each_function_its_own_variables():
    twin = tvm.IRModule({"main": _Softmax["main"], "copy": _Softmax["main"]})
    out = UniqueVars(twin)
    tvm.ir.assert_structural_equal(out["main"], out["copy"])
    assert not out["main"].params[0].same_as(out["copy"].params[0])


def test_lower_to_stops_after_the_phase_named():
    target = load_target("x86_64")
    prepared = pipeline.lower_to(_Softmax, target, "prepare")
    assert not any(isinstance(f, tvm.tirx.PrimFunc) for f in _Softmax.functions.values())
    # The symbolic softmax went to oneDNN; erf, sigmoid and tanh stay TVM's fast kernels.
    assert "edgec_dnnl_softmax" in prepared.script() and "fast_erf" in prepared.script()
    assert "R.call_tir" in prepared.script()
    legalized = pipeline.lower_to(_Softmax, target, "legalize")
    assert any(f.attrs and "fused" in str(gv) for gv, f in legalized.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc)), "legalize fuses the two kernels"
    with pytest.raises(ValueError, match="no phase"):
        pipeline.lower_to(_Softmax, target, "nonsense")


def test_build_dumps_the_program_after_each_phase(tmp_path):
    import edgec

    model = from_proto(mlp_model())
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples([(1, 8), (2, 4)]))]
    edgec.compile(model, samples, [load_target("x86_64")],
                  edgec.CompileSettings(dump_ir=tmp_path / "ir"))
    names = sorted(p.name for p in (tmp_path / "ir").iterdir())
    assert names == ["00_specialize.py", "01_prepare.py", "02_legalize.py", "03_tune.py",
                     "04_schedule.py", "05_lower.py"]
    assert "edgec_dnnl_dense" in (tmp_path / "ir" / "01_prepare.py").read_text()
