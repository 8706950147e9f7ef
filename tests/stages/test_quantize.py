"""Tests of the quantize stage: the int8 arithmetic, the simulation the guard ranks layers with,
the compiled int8 kernels against fp32, the guard keeping layers in fp32, and the manifest."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgec.stages.build import build
from edgec.cli import main
from edgec.errors import CompileError, EdgecError, SamplesError
from edgec.core.model import from_proto
from edgec.stages.plan import plan
from edgec.stages.profile import profile
from edgec.driver import build_guarded
from edgec.stages.quantize import (QuantizeSettings, Quantization, held_out_split,
                            quantize)
from edgec.core import quant_schemes as schemes
from edgec.stages.quantize import accuracy, simulate
from edgec.core.quant_layers import PRECISIONS, find_layers
from edgec.core.reference import reference_session
from edgec.runtime import load
from edgec.core.samples import Sample
from edgec.core.targets import load_target

from conftest import write_samples

TARGET = "x86_64"


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def embed_mlp(vocab: int = 64, dim: int = 32, width: int = 48,
              out: int = 16) -> onnx.ModelProto:
    """ids[1, 6] -> Gather(table) -> MatMul+Add -> Relu -> MatMul+Add -> hidden[1, 6, out]."""
    rng = np.random.default_rng(0)
    inits = {
        "table": rng.standard_normal((vocab, dim)), "w1": rng.standard_normal((dim, width)) / 6,
        "b1": rng.standard_normal(width) * 0.1, "w2": rng.standard_normal((width, out)) / 7,
        "b2": rng.standard_normal(out) * 0.1,
    }
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=0),
        helper.make_node("MatMul", ["e", "w1"], ["m1"], name="fc1"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="fc1.bias"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
        helper.make_node("MatMul", ["r1", "w2"], ["m2"], name="fc2"),
        helper.make_node("Add", ["m2", "b2"], ["hidden"], name="fc2.bias"),
    ]
    graph = helper.make_graph(
        nodes, "embed_mlp", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 6])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, 6, out])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return _model(graph)


def embed_samples(count: int, seed: int, vocab: int = 64) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [Sample(f"s{i}", {"ids": rng.integers(0, vocab, (1, 6)).astype(np.int64)})
            for i in range(count)]


def small_cnn() -> onnx.ModelProto:
    """image[4, 3, 8, 8] -> Conv+Relu (8) -> Conv+Relu (16) -> GAP -> Gemm -> logits[4, 10]."""
    rng = np.random.default_rng(1)
    inits = {
        "c1.w": rng.standard_normal((8, 3, 3, 3)) / 5, "c1.b": rng.standard_normal(8) * 0.1,
        "c2.w": rng.standard_normal((16, 8, 3, 3)) / 8, "c2.b": rng.standard_normal(16) * 0.1,
        "fc.w": rng.standard_normal((10, 16)) / 4, "fc.b": rng.standard_normal(10) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["image", "c1.w", "c1.b"], ["c1"], name="conv1", pads=[1] * 4),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "c2.w", "c2.b"], ["c2"], name="conv2", pads=[1] * 4),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [4, 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [4, 10])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return _model(graph)


def cnn_samples(count: int, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [Sample(f"s{i}", {"image": rng.standard_normal((4, 3, 8, 8)).astype(np.float32)})
            for i in range(count)]


def _setup(proto, samples):
    model = from_proto(proto, proto.graph.name)
    target = load_target(TARGET)
    prof = profile(model, samples)
    return model, target, prof, plan(model, prof, target)


def _reference(model, samples):
    session = reference_session(model.proto)
    return [session.run(s.arrays) for s in samples]


def _simulated(model, quant, target, samples):
    """The outputs of ``quant``'s simulation on ``samples``, with ``target``'s int8 weight range
    (the compiled kernels' arithmetic)."""
    activations = {l["name"]: schemes.ActivationParams(**l["activation"])
                   for l in quant.layers if l["activation"]}
    proto = simulate.simulated_model(
        model.proto, find_layers(model.proto), {l["name"]: l["precision"] for l in quant.layers},
        activations, "asymmetric", schemes.integer_weight_levels(target.arch, target.cpu_features))
    return simulate.run(proto, [s.arrays for s in samples])


def _run(artifact, tmp_path, samples):
    compiled = load(artifact.save(tmp_path / "model.edgec"))
    return [compiled.run(s.arrays) for s in samples]


# ---------------------------------------------------------------------------------------------
# Arithmetic


def test_weight_round_trip_is_within_half_a_step_per_channel():
    w = np.random.default_rng(0).standard_normal((32, 5)).astype(np.float32) * [1, 10, 0.1, 3, 0]
    q, scale = schemes.quantize_weight(w, axis=1)
    assert q.dtype == np.int8 and scale.shape == (5,)
    assert np.abs(q).max() <= 127
    back = schemes.dequantize_weight(q, scale, axis=1)
    assert np.all(np.abs(back - w) <= scale / 2 + 1e-7)
    assert np.all(back[:, 4] == 0)  # an all-zero channel stays zero, without dividing by 0


def test_integer_weights_are_7_bit_on_x86_without_vnni():
    """vpmaddubsw (x86 int8 before VNNI) adds two u8 x s8 products in a saturating int16:
    255 * 127 * 2 overflows it, 255 * 63 * 2 does not. Weights keep 8 bits where products add in
    int32 (VNNI, AMX, Arm), and weight-only layers everywhere."""
    avx2 = load_target("x86_64")
    assert schemes.integer_weight_levels(avx2.arch, avx2.cpu_features) == 63
    assert 2 * 255 * 63 <= np.iinfo(np.int16).max < 2 * 255 * 127
    assert schemes.integer_weight_levels("x86_64", ("avx2", "avx512_vnni")) == 127
    assert schemes.integer_weight_levels("aarch64", ("asimd",)) == 127
    w = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    q, scale = schemes.quantize_weight(w, axis=1, levels=63)
    assert np.abs(q).max() == 63
    assert np.all(np.abs(schemes.dequantize_weight(q, scale, axis=1) - w) <= scale / 2 + 1e-7)


def test_rows_asymmetric_beats_symmetric_on_shifted_rows():
    table = (np.random.default_rng(0).random((8, 64)) + 5.0).astype(np.float32)  # all positive
    errors = {}
    for scheme in schemes.SCHEMES:
        back = schemes.dequantize_rows(*schemes.quantize_rows(table, scheme))
        errors[scheme] = np.abs(back - table).max()
    assert errors["asymmetric"] < errors["symmetric"]


def test_activation_params_from_profiled_ranges():
    observed = {"min": -1.0, "max": 50.0, "absmax_p999": 3.0}
    minmax = schemes.activation_params(observed, "minmax", "asymmetric")
    assert minmax.scale == pytest.approx(51.0 / 255) and minmax.zero == 5
    clipped = schemes.activation_params(observed, "percentile", "asymmetric")
    assert clipped.scale == pytest.approx(4.0 / 255)  # [-1, 3]: the outlier max is clipped
    symmetric = schemes.activation_params(observed, "percentile", "symmetric")
    assert symmetric.zero == 128 and symmetric.scale == pytest.approx(3.0 / 127)
    relu = schemes.activation_params({"min": 0.0, "max": 2.0, "absmax_p999": 2.0}, "minmax",
                                     "asymmetric")
    assert relu.zero == 0
    x = np.linspace(-1, 3, 101, dtype=np.float32)
    assert np.abs(schemes.fake_quantize(x, clipped) - x).max() <= clipped.scale / 2 + 1e-6


def test_entropy_threshold_clips_outliers_but_not_a_uniform_range():
    rng = np.random.default_rng(0)
    bulk = np.abs(rng.standard_normal(100_000))
    for outlier, levels in ((100.0, 127), (8.0, 127), (30.0, 255)):
        x = np.append(bulk, outlier)
        counts = np.histogram(x, 1024, (0, x.max()))[0]
        threshold = schemes.entropy_threshold(counts, float(x.max()), levels)
        # At most `levels` bins' worth of range below the outlier; never past the bulk's tail.
        assert 3.0 < threshold <= max(outlier * levels / 1024 + 1e-9, bulk.max() + 0.02)
    uniform = np.abs(rng.uniform(-1, 1, 100_000))
    counts = np.histogram(uniform, 1024, (0, uniform.max()))[0]
    assert schemes.entropy_threshold(counts, float(uniform.max()), 127) == pytest.approx(1.0, abs=0.01)


def outlier_matmul() -> onnx.ModelProto:
    """x[1, 16, 64] -> MatMul -> y[1, 16, 32]."""
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32) / 8
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], "outlier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32])],
        [numpy_helper.from_array(w, "w")])
    return _model(graph)


def test_entropy_calibration_survives_an_outlier_that_ruins_minmax():
    """One calibration value 50x the rest: min/max spreads the 256 levels over it (drop 0.027
    when measured); entropy and percentile clip it (both near 0.0006)."""
    rng = np.random.default_rng(0)
    calibration = [rng.standard_normal((1, 16, 64)).astype(np.float32) for _ in range(12)]
    calibration[5][0, 3, 7] = 200.0
    held_out = [Sample(f"h{i}", {"x": rng.standard_normal((1, 16, 64)).astype(np.float32)})
                for i in range(6)]
    model, target, prof, _ = _setup(outlier_matmul(), [Sample(f"s{i}", {"x": a})
                                                        for i, a in enumerate(calibration)])
    drops, ranges = {}, {}
    for calibration_method in ("minmax", "percentile", "entropy"):
        quant = quantize(model, prof, target,
                         QuantizeSettings("int8-static", 1.0, calibration_method), held_out)
        drops[calibration_method] = quant.accuracy["simulated"]["drop"]
        ranges[calibration_method] = quant.layers[0]["activation"]["scale"] * 255
    assert ranges["minmax"] > 200 and ranges["entropy"] < 40
    assert drops["entropy"] < drops["minmax"] / 10
    assert drops["entropy"] < 2 * drops["percentile"] + 1e-4
    # A profile without histograms (an older edgec's) is refused in one line.
    del prof.ranges["x"]["abs_hist"]
    with pytest.raises(CompileError, match="edgec profile"):
        quantize(model, prof, target, QuantizeSettings("int8-static", 1.0, "entropy"), held_out)


def test_find_layers_names_kinds_and_channel_axes():
    layers = {layer.name: layer for layer in find_layers(embed_mlp())}
    assert {n: layer.kind for n, layer in layers.items()} == {
        "embed": "embedding", "fc1": "dense", "fc2": "dense"}
    assert layers["fc1"].activation == "e"
    cnn = {layer.name: layer for layer in find_layers(small_cnn())}
    assert [cnn[n].kind for n in ("conv1", "conv2", "fc")] == ["conv", "conv", "dense"]
    w = np.arange(20, dtype=np.float32).reshape(10, 2)
    assert cnn["fc"].weight_axis == 0 and cnn["fc"].compiled_weight(w).shape == (2, 10)


def test_compare_reports_cosine_max_abs_and_top1():
    ref = [{"logits": np.array([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]], np.float32)}]
    test = [{"logits": np.array([[1.0, 2.0, 0.0], [0.0, 3.5, 0.0]], np.float32)}]
    result = accuracy.compare(ref, test, ["logits"])
    out = result["outputs"]["logits"]
    assert out["top1_agreement"] == 0.5 and out["max_abs"] == pytest.approx(3.5)
    assert result["drop"] == pytest.approx(max(0.5, 1 - out["min_cosine"]))
    assert accuracy.compare(ref, ref, ["logits"])["drop"] == pytest.approx(0.0, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# Compiled modes against fp32, and against the simulation the guard relies on


@pytest.mark.parametrize("mode,min_cosine", [("int8-weight", 0.9999), ("int8-dynamic", 0.999),
                                             ("int8-static", 0.99)])
def test_compiled_mode_is_close_to_fp32_and_matches_its_simulation(mode, min_cosine, tmp_path):
    proto = embed_mlp()
    model, target, prof, the_plan = _setup(proto, embed_samples(8, 0))
    held_out = embed_samples(6, 1)
    quant = quantize(model, prof, target, QuantizeSettings(mode, max_accuracy_drop=0.5), held_out)
    expected = {"int8-weight": "int8-weight", "int8-dynamic": "int8-dynamic",
                "int8-static": "int8-static"}[mode]
    assert [(l["name"], l["precision"]) for l in quant.layers] == [
        ("embed", "int8-weight"), ("fc1", expected), ("fc2", expected)]
    outputs = _run(build_guarded(model, the_plan, [target], quant, held_out)[0], tmp_path, held_out)
    reference = _reference(model, held_out)
    result = accuracy.compare(reference, outputs)
    assert result["outputs"]["hidden"]["min_cosine"] >= min_cosine
    assert result["outputs"]["hidden"]["max_abs"] > 1e-5  # it really is quantized
    agreement = accuracy.compare(_simulated(model, quant, target, held_out), outputs)
    assert agreement["outputs"]["hidden"]["min_cosine"] >= 0.99999


def test_simulation_runs_on_opset_9_graphs(tmp_path):
    """QuantizeLinear needs opset 10 and DynamicQuantizeLinear 11; the simulation's elementary
    ops work on the zoo's opset-9 CNNs too, and agree with the compiled kernels."""
    proto = small_cnn()
    proto.opset_import[0].version = 9
    model, target, prof, the_plan = _setup(proto, cnn_samples(6, 0))
    held_out = cnn_samples(3, 1)
    for mode in ("int8-static", "int8-dynamic"):
        quant = quantize(model, prof, target, QuantizeSettings(mode, 1.0), held_out)
        assert quant.accuracy["simulated"]["drop"] < 0.05
    assert [l["precision"] for l in quant.layers] == ["int8-weight"] * 2 + ["int8-dynamic"]
    outputs = _run(build_guarded(model, the_plan, [target], quant, held_out)[0], tmp_path, held_out)
    simulated = _simulated(model, quant, target, held_out)
    assert accuracy.compare(simulated, outputs)["outputs"]["logits"]["min_cosine"] >= 0.99999


def test_int8_cnn_static_matches_fp32_top1(tmp_path):
    model, target, prof, the_plan = _setup(small_cnn(), cnn_samples(6, 0))
    held_out = cnn_samples(4, 1)
    quant = quantize(model, prof, target, QuantizeSettings("int8-static", 0.5), held_out)
    assert all(l["precision"] == "int8-static" for l in quant.layers)
    outputs = _run(build_guarded(model, the_plan, [target], quant, held_out)[0], tmp_path, held_out)
    result = accuracy.compare(_reference(model, held_out), outputs, ["logits"])
    assert result["outputs"]["logits"]["min_cosine"] >= 0.995
    assert result["outputs"]["logits"]["top1_agreement"] >= 0.9


@pytest.mark.parametrize("mode", ["int8-weight", "int8-static"])
def test_batch_norm_folded_and_residual_convolutions_are_quantized_too(mode, tmp_path):
    """Library dispatch folds a batch norm into its convolution's weight and fuses a residual add
    into it: the quantized program holds the folded weight's int8 form and calls the _add form,
    so no layer of a BN/ResNet-style CNN is left fp32; the compiled outputs agree with the
    simulation (which quantizes the unfolded weight: the same per channel, up to rounding)."""
    from compiler.transform.test_library_offload_build import cnn_model

    proto = cnn_model()
    rng = np.random.default_rng(3)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)})
               for i in range(8)]
    model, target, prof, the_plan = _setup(proto, samples[:6])
    held_out = samples[6:]
    quant = quantize(model, prof, target, QuantizeSettings(mode, 0.5), held_out)
    artifact = build_guarded(model, the_plan, [target], quant, held_out)[0]
    assert {l["precision"] for l in quant.layers} == {mode}
    linked = artifact.manifest["libraries"][TARGET]["linked_functions"]
    suffix = "w8" if mode == "int8-weight" else "i8"
    assert {f"edgec_q8_conv2d_{suffix}", f"edgec_q8_conv2d_add_{suffix}"} <= set(linked)
    assert not any(f.startswith("edgec_dnnl_conv2d") for f in linked)
    outputs = _run(artifact, tmp_path, held_out)
    agreement = accuracy.compare(_simulated(model, quant, target, held_out), outputs)
    assert agreement["outputs"]["y"]["min_cosine"] >= 0.9999


def _library_symbols_and_sections(artifact, tmp_path) -> tuple[set[str], set[str]]:
    """The dynamic symbols and the section names of an artifact's library."""
    import subprocess

    path = tmp_path / "lib.so"
    path.write_bytes(artifact.files[f"lib/{TARGET}.so"])
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True,
                             text=True, check=True).stdout.split()
    sections = subprocess.run(["readelf", "-W", "-S", str(path)], capture_output=True,
                              text=True, check=True).stdout
    return set(symbols), {line.split("]")[1].split()[0] for line in sections.splitlines()
                          if "]" in line and line.split("]")[1].split()}


def test_int8_library_links_only_the_code_it_calls(tmp_path):
    """A program whose every dense layer is int8 links the int8 dense kernels only: not the fp32
    shim it no longer calls, not the convolution kernels, no debug information; and the library
    still needs oneDNN at run time."""
    model, target, prof, the_plan = _setup(embed_mlp(), embed_samples(4, 0))
    quant = quantize(model, prof, target, QuantizeSettings("int8-weight", 0.5), embed_samples(2, 1))
    artifact = build(model, the_plan, [target], quantization=quant)
    symbols, sections = _library_symbols_and_sections(artifact, tmp_path)
    assert "__tvm_ffi_edgec_q8_dense_w8" in symbols
    assert not [s for s in symbols if "edgec_dnnl_" in s or "conv2d" in s]
    assert not [s for s in sections if s.startswith(".debug")]
    assert (artifact.manifest["libraries"][TARGET]["native_dependencies"]
            == ["libdnnl.so.2", "libgomp.so.1"])
    # With one layer kept fp32 the shim stays: its call remains.
    for layer in quant.layers:
        if layer["name"] == "fc2":
            layer["precision"], layer["activation"] = "fp32", None
    symbols, _ = _library_symbols_and_sections(
        build(model, the_plan, [target], quantization=quant), tmp_path)
    assert "__tvm_ffi_edgec_dnnl_dense" in symbols and "__tvm_ffi_edgec_q8_dense_w8" in symbols


@pytest.mark.slow
def test_int8_weights_shrink_the_library():
    proto = embed_mlp(vocab=16384, dim=64)  # a 4 MB table: its int8 copy saves 3 MB
    model, target, prof, the_plan = _setup(proto, embed_samples(4, 0, vocab=16384))
    fp32 = build(model, the_plan, [target])
    quant = quantize(model, prof, target, QuantizeSettings("int8-weight", 0.5),
                     embed_samples(3, 1, vocab=16384))
    int8 = build(model, the_plan, [target], quantization=quant)
    fp32_bytes = fp32.manifest["libraries"][TARGET]["bytes"]
    int8_bytes = int8.manifest["libraries"][TARGET]["bytes"]
    # 3 MB saved, less the int8 kernels' code (about 0.2 MB) linked in with them.
    assert fp32_bytes - int8_bytes > 2_500_000


# ---------------------------------------------------------------------------------------------
# The accuracy guard


def test_guard_keeps_the_most_sensitive_layers_fp32_within_budget(tmp_path):
    model, target, prof, the_plan = _setup(small_cnn(), cnn_samples(6, 0))
    held_out = cnn_samples(4, 1)
    loose = quantize(model, prof, target, QuantizeSettings("int8-static", 0.5), held_out)
    full_drop = loose.accuracy["simulated"]["drop"]
    assert full_drop > 0
    budget = full_drop * 0.5
    quant = quantize(model, prof, target, QuantizeSettings("int8-static", budget), held_out)
    kept = quant.fp32_layers()
    assert kept and len(kept) < len(quant.layers)
    most_sensitive = max(loose.layers, key=lambda l: l["sensitivity"])["name"]
    assert most_sensitive in kept
    assert quant.accuracy["simulated"]["drop"] <= budget
    artifact = build_guarded(model, the_plan, [target], quant, held_out)[0]
    manifest = artifact.manifest["quantization"]
    assert manifest["mode"] == "int8-static" and manifest["fp32_layers"] == kept
    assert manifest["accuracy"]["measured"]["drop"] <= budget
    assert {l["name"] for l in manifest["layers"]} == {"conv1", "conv2", "fc"}
    assert all("budget" in l["reason"] for l in manifest["layers"] if l["precision"] == "fp32")
    outputs = _run(artifact, tmp_path, held_out)
    measured = accuracy.compare(_reference(model, held_out), outputs, ["logits"])
    assert measured["drop"] == pytest.approx(manifest["accuracy"]["measured"]["drop"], abs=1e-6)


def test_auto_steps_layers_down_and_a_zero_budget_keeps_all_fp32():
    model, target, prof, _ = _setup(small_cnn(), cnn_samples(6, 0))
    held_out = cnn_samples(4, 1)
    loose = quantize(model, prof, target, QuantizeSettings("auto", 0.5), held_out)
    assert {l["precision"] for l in loose.layers} == {"int8-static"}
    tight = quantize(model, prof, target, QuantizeSettings("auto", 0.0), held_out)
    assert tight.fp32_layers() == ["conv1", "conv2", "fc"] and not tight.active
    manifest = tight.manifest()
    assert manifest["mode"] == "auto" and manifest["fp32_layers"] == ["conv1", "conv2", "fc"]
    # Between: each demotion moves one step along the layer's precision ladder.
    mid = quantize(model, prof, target,
                   QuantizeSettings("auto", loose.accuracy["simulated"]["drop"] * 0.5), held_out)
    for layer in mid.layers:
        assert layer["precision"] in PRECISIONS[layer["kind"]]
    assert any(l["precision"] != "int8-static" for l in mid.layers)
    assert mid.accuracy["simulated"]["drop"] <= loose.accuracy["simulated"]["drop"] * 0.5


def test_quantization_saves_and_loads(tmp_path):
    model, target, prof, _ = _setup(embed_mlp(), embed_samples(4, 0))
    quant = quantize(model, prof, target, QuantizeSettings("int8-weight", 0.1), embed_samples(2, 1))
    loaded = Quantization.load(quant.save(tmp_path / "quantization.json"))
    assert loaded.layers == quant.layers and loaded.settings == quant.settings
    assert loaded.accuracy["simulated"]["drop"] == quant.accuracy["simulated"]["drop"]


def test_refusals():
    model, target, prof, _ = _setup(embed_mlp(), embed_samples(4, 0))
    held_out = embed_samples(2, 1)
    with pytest.raises(CompileError, match="GPU"):
        quantize(model, prof, target, QuantizeSettings("fp16"), held_out)
    with pytest.raises(CompileError, match="int8 kernels"):
        quantize(model, prof, load_target("cuda-sm90"), QuantizeSettings("int8-weight"), held_out)
    arm = load_target("arm64-cortex-a72")  # XNNPACK: weight-only int8, no integer kernels
    for mode in ("int8-static", "int8-dynamic"):
        with pytest.raises(CompileError, match="int8-weight or auto"):
            quantize(model, prof, arm, QuantizeSettings(mode), held_out)
    auto = quantize(model, prof, arm, QuantizeSettings("auto", 0.5), held_out)
    assert {layer["precision"] for layer in auto.layers} == {"int8-weight"}
    with pytest.raises(SamplesError, match="held-out"):
        quantize(model, prof, target, QuantizeSettings("int8-weight"), [])
    for bad in (QuantizeSettings("int4"), QuantizeSettings("auto", 2.0),
                QuantizeSettings("auto", calibration="kl")):
        with pytest.raises(EdgecError):
            bad.check()
    none = quantize(model, prof, target, QuantizeSettings("none"), [])
    assert not none.active and none.layers == []


def wide_mlp(width: int = 256) -> onnx.ModelProto:
    """x[2, width] -> Gemm+Relu -> Gemm -> y[2, 8]: 260 KB of fp32 weights."""
    rng = np.random.default_rng(2)
    inits = {"w1": rng.standard_normal((width, width)) / 16, "b1": rng.standard_normal(width) * 0.1,
             "w2": rng.standard_normal((width, 8)) / 16, "b2": rng.standard_normal(8) * 0.1}
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="fc2")],
        "wide_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return _model(graph)


def test_fp16_builds_cuda_programs_in_half_precision():
    """fp16 on a CUDA target: the library holds the weights in half the bytes, the manifest
    records it (and, on a machine without a GPU, why the artifact was not measured); a CPU
    target is refused in one line."""
    from edgec.compiler.backends.cuda import find_nvcc

    try:
        find_nvcc()
    except EdgecError as exc:
        pytest.skip(str(exc))
    rng = np.random.default_rng(3)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((2, 256)).astype(np.float32)})
               for i in range(6)]
    model, _, prof, the_plan = _setup(wide_mlp(), samples)
    gpu = load_target("cuda-sm89")
    quant = quantize(model, prof, gpu, QuantizeSettings("fp16", 0.01), samples[:3])
    assert [(l["name"], l["precision"]) for l in quant.layers] == [("fc1", "fp16"), ("fc2", "fp16")]
    assert quant.accuracy["simulated"]["drop"] < 1e-4
    fp32 = build(model, the_plan, [gpu])
    fp16 = build_guarded(model, the_plan, [gpu], quant, samples[:3])[0]
    saved = fp32.manifest["libraries"]["cuda-sm89"]["bytes"] - fp16.manifest["libraries"]["cuda-sm89"]["bytes"]
    assert saved > 100_000  # 260 KB of fp32 weights stored as fp16
    recorded = fp16.manifest["quantization"]
    assert recorded["mode"] == "fp16" and recorded["fp32_layers"] == []
    if recorded["accuracy"]["measured"] is None:
        assert "GPU" in recorded["accuracy"]["not_measured"]
    else:
        assert recorded["accuracy"]["measured"]["drop"] <= 0.01
    with pytest.raises(CompileError, match="GPU targets"):
        quantize(model, prof, load_target(TARGET), QuantizeSettings("fp16"), samples[:3])
    # int8 decisions cannot build for a CUDA target: oneDNN's and XNNPACK's kernels are CPU code.
    int8 = quantize(model, prof, load_target(TARGET), QuantizeSettings("int8-weight", 1.0),
                    samples[:3])
    with pytest.raises(CompileError, match=r"oneDNN's \(x86\) and XNNPACK's \(Arm\)"):
        build(model, the_plan, [gpu], quantization=int8)


def test_held_out_split_is_disjoint():
    samples = embed_samples(9, 0)
    calibration, held = held_out_split(samples)
    assert [s.name for s in held] == ["s3", "s7"]
    assert not {s.name for s in calibration} & {s.name for s in held}
    assert held_out_split(samples[:1]) == (samples[:1], samples[:1])


def test_cli_compile_quantize_writes_manifest_and_stage(tmp_path, capsys):
    onnx.save(small_cnn(), str(tmp_path / "model.onnx"))
    write_samples(tmp_path / "samples", [s.arrays for s in cnn_samples(6, 0)])
    write_samples(tmp_path / "held_out", [s.arrays for s in cnn_samples(3, 1)])
    out = tmp_path / "model.edgec"
    code = main(["compile", str(tmp_path / "model.onnx"), "--samples", str(tmp_path / "samples"),
                 "--held-out-samples", str(tmp_path / "held_out"), "--target", TARGET,
                 "--quantize", "int8-static", "--max-accuracy-drop", "0.05",
                 "--save-stages", str(tmp_path), "-o", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "quantization int8-static" in printed and "measured on 3 held-out samples" in printed
    assert Quantization.load(tmp_path / "quantization.json").settings.mode == "int8-static"
    main(["inspect", "--json", str(out)])
    manifest = json.loads(capsys.readouterr().out)
    quant = manifest["quantization"]
    assert quant["mode"] == "int8-static" and quant["accuracy"]["measured"]["samples"] == 3
    assert quant["accuracy"]["measured"]["drop"] <= 0.05
    assert main(["compile", str(tmp_path / "model.onnx"), "--samples", str(tmp_path / "samples"),
                 "--target", TARGET, "--quantize", "fp16", "-o", str(tmp_path / "x.edgec")]) == 8
    assert not (tmp_path / "x.edgec").exists()


def test_report_lines_name_the_fp32_layers_and_the_accuracy():
    from edgec.stages.bench import BenchResult
    from edgec.stages.report import _quantization_lines

    model, target, prof, _ = _setup(small_cnn(), cnn_samples(6, 0))
    held_out = cnn_samples(4, 1)
    loose = quantize(model, prof, target, QuantizeSettings("int8-static", 0.5), held_out)
    budget = loose.accuracy["simulated"]["drop"] * 0.5
    quant = quantize(model, prof, target, QuantizeSettings("int8-static", budget), held_out)
    lines = _quantization_lines(BenchResult({"quantization": quant.manifest()}))
    text = "\n".join(lines)
    assert "quantization `int8-static`" in text and "simulated, 4 held-out samples" in text
    assert "top-1 agreement" in text
    assert "kept fp32: " + ", ".join(f"`{n}`" for n in quant.fp32_layers()) in text
    assert _quantization_lines(BenchResult({"quantization": {"mode": "none"}})) == []
    assert _quantization_lines(BenchResult({})) == []


def test_layers_without_an_int8_form_are_reported_fp32(monkeypatch):
    """A convolution the library does not run (its dispatch turned off here) has no int8 kernel:
    the manifest says fp32, and why."""
    import dataclasses

    from edgec.compiler.backends import llvm as codegen

    rules = codegen.dnnl_rules
    monkeypatch.setattr(codegen, "dnnl_rules",
                        lambda target: dataclasses.replace(rules(target), conv2d=False))
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["image", "c.w", "c.b"], ["c"], name="conv", pads=[1] * 4),
        helper.make_node("Add", ["c", "image"], ["sum"], name="residual"),
        helper.make_node("Relu", ["sum"], ["out"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "residual", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 8, 6, 6])],
        [numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32), "c.w"),
         numpy_helper.from_array(np.zeros(8, np.float32), "c.b")])
    samples = [Sample(f"s{i}", {"image": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)})
               for i in range(4)]
    model, target, prof, the_plan = _setup(_model(graph), samples[:3])
    quant = quantize(model, prof, target, QuantizeSettings("int8-static", 0.5), samples[3:])
    assert quant.layers[0]["precision"] == "int8-static"
    artifact = build_guarded(model, the_plan, [target], quant, samples[3:])[0]
    layer = artifact.manifest["quantization"]["layers"][0]
    assert layer["precision"] == "fp32" and "no int8 form" in layer["reason"]
    assert artifact.manifest["quantization"]["fp32_layers"] == ["conv"]


def test_cpp_host_runs_an_int8_artifact_like_the_python_runtime(tmp_path):
    """The int8 kernels are linked into the library, so the C++ host needs nothing more."""
    from runtime.test_cpp_host import build_host, missing_tools, run_host

    if missing_tools("g++", "make"):
        pytest.skip("needs g++ and make")
    model, target, prof, the_plan = _setup(small_cnn(), cnn_samples(6, 0))
    held_out = cnn_samples(2, 1)
    quant = quantize(model, prof, target, QuantizeSettings("int8-static", 0.5), held_out)
    path = build_guarded(model, the_plan, [target], quant, held_out)[0].save(tmp_path / "q.edgec")
    expected = load(path).run(held_out[0].arrays)
    got = run_host(build_host(), path, held_out[0].arrays, tmp_path / "host")
    np.testing.assert_allclose(got["logits"], expected["logits"], rtol=0, atol=1e-5)


def test_auto_weighs_integer_against_weight_only_by_measured_latency():
    model, target, prof, the_plan = _setup(embed_mlp(), embed_samples(8, 0))
    held_out = embed_samples(3, 1)
    quant = quantize(model, prof, target, QuantizeSettings("auto", 0.5), held_out)
    assert {l["precision"] for l in quant.layers if l["kind"] == "dense"} == {"int8-static"}
    artifact = build_guarded(model, the_plan, [target], quant, held_out)[0]
    cost = artifact.manifest["quantization"]["cost"]
    assert cost["integer_ms"] > 0 and cost["weight_only_ms"] > 0
    dense = {l["precision"] for l in artifact.manifest["quantization"]["layers"]
             if l["name"].startswith("fc")}
    if cost["chosen"] == "weight-only":
        assert cost["weight_only_ms"] < cost["integer_ms"] and dense == {"int8-weight"}
    else:
        assert cost["chosen"] == "integer" and dense == {"int8-static"}
    assert artifact.manifest["quantization"]["accuracy"]["measured"]["drop"] <= 0.5


def test_cli_stages_profile_plan_quantize_build(tmp_path, capsys):
    onnx.save(small_cnn(), str(tmp_path / "model.onnx"))
    write_samples(tmp_path / "samples", [s.arrays for s in cnn_samples(4, 0)])
    write_samples(tmp_path / "held_out", [s.arrays for s in cnn_samples(2, 1)])
    model, quant = str(tmp_path / "model.onnx"), str(tmp_path / "quant.json")
    assert main(["profile", model, "--samples", str(tmp_path / "samples"),
                 "-o", str(tmp_path / "profile.json")]) == 0
    assert main(["plan", model, "--profile", str(tmp_path / "profile.json"), "--target", TARGET,
                 "-o", str(tmp_path / "plan.json")]) == 0
    assert main(["quantize", model, "--profile", str(tmp_path / "profile.json"), "--target",
                 TARGET, "--quantize", "int8-static", "-o", quant]) == 2  # no held-out samples
    assert main(["quantize", model, "--profile", str(tmp_path / "profile.json"), "--target",
                 TARGET, "--quantize", "int8-static", "--max-accuracy-drop", "0.5",
                 "--held-out-samples", str(tmp_path / "held_out"), "-o", quant]) == 0
    assert "simulated on 2 held-out samples" in capsys.readouterr().out
    out = tmp_path / "model.edgec"
    assert main(["build", model, "--plan", str(tmp_path / "plan.json"), "--target", TARGET,
                 "--quantization", quant, "-o", str(out)]) == 0
    manifest = load(out).manifest["quantization"]
    assert manifest["mode"] == "int8-static" and manifest["fp32_layers"] == []
    assert manifest["accuracy"]["simulated"]["samples"] == 2
    assert main(["build", model, "--plan", str(tmp_path / "plan.json"), "--target", TARGET,
                 "--quantization", str(tmp_path / "plan.json"), "-o", str(tmp_path / "y.edgec")]) == 10


# ---------------------------------------------------------------------------------------------
# bf16

def _host_has_bf16() -> bool:
    from edgec.runtime import host_cpu_features

    return "avx512_bf16" in host_cpu_features()


needs_bf16 = pytest.mark.skipif(not _host_has_bf16(), reason="this CPU lacks avx512_bf16")


def test_bf16_rounding_is_to_nearest_even_and_the_graph_rounds_alike():
    """bf16 keeps the top 16 bits of a float32, rounded to nearest (ties to even); the
    simulation's in-graph rounding (opset 9 ops) gives the same values as bf16_round."""
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.7182817, 3e38, 1e-40,
                  np.inf, np.nan], np.float32)
    rounded = simulate.bf16_round(x)
    np.testing.assert_array_equal(rounded[:4], [1.0, 1.0, 1 + 4 * 2**-8, 1 + 2 * 2**-8])
    assert rounded[4] == -2.71875 and np.isinf(rounded[7]) and np.isnan(rounded[8])
    assert (rounded.view(np.uint32)[:7] & 0xFFFF == 0).all()
    values = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32) * 37
    graph = helper.make_graph(
        [], "round", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1000])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1000])])
    graph.output[0].name = simulate._bf16_input(graph, "x", "layer")
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    proto.ir_version = 8
    got = simulate.run(proto, [{"x": values}])[0][graph.output[0].name]
    np.testing.assert_array_equal(got, simulate.bf16_round(values))


def test_bf16_is_refused_where_the_target_has_no_avx512_kernels():
    model, target, prof, _ = _setup(embed_mlp(), embed_samples(4, 0))
    held_out = embed_samples(2, 1)
    for name in ("x86_64", "arm64-cortex-a72", "cuda-sm90"):  # AVX2 only, XNNPACK, a GPU
        with pytest.raises(CompileError, match="bf16") as caught:
            quantize(model, prof, load_target(name), QuantizeSettings("bf16"), held_out)
        assert "\n" not in str(caught.value) and name in str(caught.value)


def bf16_cnn() -> onnx.ModelProto:
    """image[2, 3, 8, 8] -> Conv 3->32 -> Conv 32->128 -> depthwise Conv -> Conv 1x1 128->32
    -> GAP -> Gemm 32->64 -> Gemm 64->10 -> logits[2, 10], Relu after each but the last."""
    rng = np.random.default_rng(2)
    shapes = {"c1": (32, 3, 3, 3), "c2": (128, 32, 3, 3), "dw": (128, 1, 3, 3),
              "pw": (32, 128, 1, 1)}
    inits = {f"{n}.w": rng.standard_normal(s) / np.sqrt(np.prod(s[1:])) for n, s in shapes.items()}
    inits.update({f"{n}.b": rng.standard_normal(s[0]) * 0.1 for n, s in shapes.items()})
    inits.update({"fc1.w": rng.standard_normal((32, 64)) / 6, "fc1.b": np.zeros(64),
                  "fc2.w": rng.standard_normal((64, 10)) / 8, "fc2.b": np.zeros(10)})
    nodes, x = [], "image"
    for name in shapes:
        group = {"group": 128} if name == "dw" else {}
        pads = [0] * 4 if name == "pw" else [1] * 4
        nodes += [helper.make_node("Conv", [x, f"{name}.w", f"{name}.b"], [name], name=name,
                                   pads=pads, **group),
                  helper.make_node("Relu", [name], [f"{name}.r"])]
        x = f"{name}.r"
    nodes += [helper.make_node("GlobalAveragePool", [x], ["gap"]),
              helper.make_node("Flatten", ["gap"], ["flat"], axis=1),
              helper.make_node("Gemm", ["flat", "fc1.w", "fc1.b"], ["fc1"], name="fc1"),
              helper.make_node("Relu", ["fc1"], ["fc1.r"]),
              helper.make_node("Gemm", ["fc1.r", "fc2.w", "fc2.b"], ["logits"], name="fc2")]
    graph = helper.make_graph(
        nodes, "bf16_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 10])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return _model(graph)


def bf16_cnn_samples(count: int, seed: int) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [Sample(f"s{i}", {"image": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)})
            for i in range(count)]


@needs_bf16
def test_bf16_layers_run_in_bf16_close_to_fp32_and_the_artifact_needs_the_feature(tmp_path):
    """dense and conv layers in bf16 where they have the work for it (the embedding, the
    depthwise and the narrow layers stay fp32): the outputs move off fp32 by bf16's rounding,
    not more, match the simulation, and the manifest requires avx512_bf16."""
    target = load_target("x86_64-avx512")
    # Reductions under 32 (conv c1: 27, the depthwise: 9) and fan-outs under 96 (pw: 32, fc1:
    # 64, fc2: 10) stay fp32; c2 and the MLP's 512x512 layers (large enough to run bf16) are bf16.
    expected = [(embed_mlp(dim=512, width=512, out=512), embed_samples, "hidden",
                 {"fc1": "bf16", "fc2": "bf16"}),
                (bf16_cnn(), bf16_cnn_samples, "logits",
                 {"c1": "fp32", "c2": "bf16", "dw": "fp32", "pw": "fp32", "fc1": "fp32",
                  "fc2": "fp32"})]
    for proto, samples, output, precisions in expected:
        model = from_proto(proto, proto.graph.name)
        prof = profile(model, samples(6, 0))
        held_out = samples(3, 1)
        quant = quantize(model, prof, target, QuantizeSettings("bf16", 0.5), held_out)
        assert {l["name"]: l["precision"] for l in quant.layers
                if l["kind"] != "embedding"} == precisions
        assert all(l["precision"] == "fp32" for l in quant.layers if l["kind"] == "embedding")
        artifact = build_guarded(model, plan(model, prof, target), [target], quant, held_out)[0]
        library = artifact.manifest["libraries"][target.name]
        assert "avx512_bf16" in library["cpu_features"]
        assert {l["name"]: l["precision"] for l in artifact.manifest["quantization"]["layers"]
                if l["op"] != "Gather"} == precisions
        outputs = _run(artifact, tmp_path, held_out)
        result = accuracy.compare(_reference(model, held_out), outputs)["outputs"][output]
        assert 1e-4 < result["max_abs"] and result["min_cosine"] > 0.9999
        precisions = {l["name"]: l["precision"] for l in quant.layers}
        simulated = simulate.run(simulate.simulated_model(
            model.proto, find_layers(model.proto), precisions, {}, "asymmetric"),
            [s.arrays for s in held_out])
        for got, want in zip(outputs, simulated):
            np.testing.assert_allclose(got[output], want[output], rtol=1e-4, atol=1e-4)


@needs_bf16
def test_bf16_dense_calls_too_small_to_gain_run_fp32(tmp_path):
    """A bf16 dense of 6 rows over a 128x128 weight: converting its input costs more than bf16
    saves, so the shim runs it fp32 (the guard assumed bf16: the result is only more exact)."""
    model, _, prof, _ = _setup(embed_mlp(width=128, out=128), embed_samples(6, 0))
    target = load_target("x86_64-avx512")
    held_out = embed_samples(3, 1)
    quant = quantize(model, prof, target, QuantizeSettings("bf16", 0.5), held_out)
    assert {l["name"]: l["precision"] for l in quant.layers
            if l["kind"] == "dense"} == {"fc1": "bf16", "fc2": "bf16"}
    artifact = build_guarded(model, plan(model, prof, target), [target], quant, held_out)[0]
    outputs = _run(artifact, tmp_path, held_out)
    result = accuracy.compare(_reference(model, held_out), outputs)["outputs"]["hidden"]
    assert result["max_abs"] < 1e-5  # bf16 moves it past 1e-4 (the test above)


@needs_bf16
def test_auto_weighs_bf16_too_where_the_cpu_has_it():
    model, _, prof, _ = _setup(embed_mlp(dim=512, width=512, out=512), embed_samples(8, 0))
    target = load_target("x86_64-avx512")
    held_out = embed_samples(3, 1)
    quant = quantize(model, prof, target, QuantizeSettings("auto", 0.5), held_out)
    artifact = build_guarded(model, plan(model, prof, target), [target], quant, held_out)[0]
    held = artifact.manifest["quantization"]
    assert {"integer_ms", "weight_only_ms", "bf16_ms"} <= set(held["cost"])
    chosen = held["cost"]["chosen"]
    fastest = min(("integer", "weight-only", "bf16"),
                  key=lambda n: held["cost"][f"{n.replace('-', '_')}_ms"])
    assert chosen == fastest
    dense = {l["precision"] for l in held["layers"] if l["name"].startswith("fc")}
    assert dense == {"bf16": {"bf16"}, "weight-only": {"int8-weight"},
                     "integer": {"int8-static"}}[chosen]
