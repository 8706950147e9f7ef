"""The library dispatch: the Relax rewrite for oneDNN and XNNPACK (IR checks, no library
needed), the choice of route per target, and compiled models against onnxruntime (skipped when
oneDNN's development files are not installed; XNNPACK's run under qemu in test_qemu_arm.py)."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from edgec.stages.build import build
from edgec.compiler import native, pipeline
from edgec.compiler.backends import llvm
from edgec.compiler.backends.llvm import LLVMBackend
from edgec.compiler.transform.shape_dispatch import add_shape_dispatch
from edgec.compiler.pipeline import import_model
from edgec.compiler.transform.library_offload import (
    ACTIVATIONS, FLAG_RELU, DispatchRules, dispatch_with_stats)
from edgec.errors import CompileError, TargetError, ToolchainError
from edgec.core.model import from_proto
import edgec.runtime
from edgec.stages.plan import PlanSettings, plan
from edgec.stages.profile import profile
from edgec.core.samples import Sample
from edgec.core.targets import load_target, parse_target


def _dnnl_missing() -> str | None:
    try:
        native.dnnl_shim()
    except ToolchainError as exc:
        return str(exc)
    return None


needs_dnnl = pytest.mark.skipif(_dnnl_missing() is not None,
                                reason=f"oneDNN shim cannot be built: {_dnnl_missing()}")


def _weight(rng, *shape, scale=None):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return (rng.standard_normal(shape) * (scale or np.sqrt(2.0 / fan_in))).astype(np.float32)


def cnn_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch, 3, 16, 16] -> 10 logits, with each pattern the pass handles.

    conv+BN+relu; max pool; conv + Sum residual + relu; a grouped conv whose groups are not whole
    channel blocks, then a channel shuffle; a depthwise strided conv; two branches concatenated to
    40 channels (a count 16 does not divide); global average pool; Gemm with a transposed weight.
    """
    rng = np.random.default_rng(seed)
    inits = {
        "w1": _weight(rng, 16, 3, 3, 3), "bn_s": rng.uniform(0.5, 1.5, 16).astype(np.float32),
        "bn_b": rng.uniform(-0.5, 0.5, 16).astype(np.float32),
        "bn_m": rng.uniform(-0.5, 0.5, 16).astype(np.float32),
        "bn_v": rng.uniform(0.5, 1.5, 16).astype(np.float32),
        "w2": _weight(rng, 16, 16, 3, 3), "b2": _weight(rng, 16, scale=0.1),
        "w3": _weight(rng, 24, 4, 1, 1), "w4": _weight(rng, 24, 1, 3, 3),
        "w5": _weight(rng, 32, 24, 1, 1), "w6": _weight(rng, 8, 24, 1, 1),
        "fc": _weight(rng, 10, 40), "fc_b": _weight(rng, 10, scale=0.1),
        "split": np.array([0, 4, 6, 8, 8], np.int64), "merge": np.array([0, 24, 8, 8], np.int64),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Sum", ["c2", "p1"], ["s2"]),
        helper.make_node("Relu", ["s2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["c3"], group=4),
        helper.make_node("Relu", ["c3"], ["r3g"]),
        # ShuffleNet's channel shuffle: groups of 6 channels interleaved.
        helper.make_node("Reshape", ["r3g", "split"], ["sh1"]),
        helper.make_node("Transpose", ["sh1"], ["sh2"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["sh2", "merge"], ["r3"]),
        helper.make_node("Conv", ["r3", "w4"], ["c4"], group=24, strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c4", "w5"], ["c5"]),
        helper.make_node("Relu", ["c5"], ["r5"]),
        helper.make_node("Conv", ["c4", "w6"], ["c6"]),
        helper.make_node("Concat", ["r5", "c6"], ["cat"], axis=1),
        helper.make_node("GlobalAveragePool", ["cat"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc", "fc_b"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def pools_model(seed: int = 0, channels: int = 16) -> onnx.ModelProto:
    """x[batch, 3, 15, 15] -> pools between convs, each a case of oneDNN's pooling route or not;
    the first pool over ``channels`` channels (one NHWC block where the block does not divide it).

    Library pooling: max 3x3/2 with padding in ceil mode; average 3x3/1 counting the padding;
    average 2x2/2 in floor mode (an odd size: a row left over); a spatial mean gating its input
    (squeeze-excite) as a global average pool. TVM's: a dilated max pool and an average in ceil
    mode.
    """
    rng = np.random.default_rng(seed)
    inits = {"w1": _weight(rng, channels, 3, 3, 3), "w2": _weight(rng, 16, channels, 1, 1),
             "w3": _weight(rng, 32, 16, 3, 3), "w4": _weight(rng, 16, 32, 1, 1),
             "hw": np.array([2, 3], np.int64)}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["c1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], ceil_mode=1),
        helper.make_node("Conv", ["p1", "w2"], ["c2"]),
        helper.make_node("AveragePool", ["c2"], ["p2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         count_include_pad=1),
        helper.make_node("Conv", ["p2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["c3"], ["p3"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("MaxPool", ["p3"], ["p4"], kernel_shape=[2, 2], dilations=[2, 2]),
        helper.make_node("Conv", ["p4", "w4"], ["c4"]),
        helper.make_node("ReduceMean", ["c4", "hw"], ["m4"], keepdims=1),
        helper.make_node("Mul", ["c4", "m4"], ["g4"]),
        helper.make_node("AveragePool", ["g4"], ["y"], kernel_shape=[2, 2], strides=[2, 2],
                         pads=[0, 0, 1, 1], ceil_mode=1),
    ]
    graph = helper.make_graph(
        nodes, "pools",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 15, 15])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16, "oh", "ow"])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def resize_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch, 3, 10, 10] -> resizes between convs: bilinear half-pixel to a size no whole
    factor reaches (10 -> 17) and nearest x2 go to oneDNN; nearest x1.5 and bilinear in
    align-corners mode stay TVM's."""
    rng = np.random.default_rng(seed)
    inits = {"w1": _weight(rng, 16, 3, 3, 3), "w2": _weight(rng, 16, 16, 1, 1),
             "w3": _weight(rng, 16, 16, 1, 1),
             "to17": np.array([1, 16, 17, 17], np.int64),
             "x2": np.array([1, 1, 2, 2], np.float32),
             "x15": np.array([1, 1, 1.5, 1.5], np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Shape", ["c1"], ["shape"], end=1),
        helper.make_node("Concat", ["shape", "to17_tail"], ["size"], axis=0),
        helper.make_node("Resize", ["c1", "", "", "size"], ["r1"], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"]),
        helper.make_node("Resize", ["c2", "", "x2"], ["r2"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Conv", ["r2", "w3"], ["c3"]),
        helper.make_node("Resize", ["c3", "", "x15"], ["r3"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Resize", ["r3", "", "x15"], ["y"], mode="linear",
                         coordinate_transformation_mode="align_corners"),
    ]
    inits["to17_tail"] = inits.pop("to17")[1:]
    graph = helper.make_graph(
        nodes, "resize",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16, "oh", "ow"])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def matmul_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch, seq, 32] -> MatMul+bias -> Relu -> MatMul -> y[batch, seq, 16]."""
    rng = np.random.default_rng(seed)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]),
         helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])],
        [numpy_helper.from_array(_weight(rng, 32, 64), "w1"),
         numpy_helper.from_array(_weight(rng, 64, scale=0.1), "b1"),
         numpy_helper.from_array(_weight(rng, 64, 16), "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def if_model(seed: int = 0) -> onnx.ModelProto:
    """An If whose two branches each hold a conv+relu of x[batch, 8, 8, 8]."""
    rng = np.random.default_rng(seed)

    def branch(name):
        return helper.make_graph(
            [helper.make_node("Conv", ["x", f"{name}_w"], [f"{name}_c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", [f"{name}_c"], [f"{name}_y"])],
            name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(_weight(rng, 16, 8, 3, 3), f"{name}_w")])

    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0),
         helper.make_node("Greater", ["m", "zero"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=branch("then"),
                          else_branch=branch("else"))],
        "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16, 8, 8])],
        [numpy_helper.from_array(np.zeros((), np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _ops(mod: tvm.IRModule) -> list[str]:
    return re.findall(r"= (R\.[a-z_.0-9]+)\(", mod.script(show_meta=False))


def _calls(mod: tvm.IRModule) -> list[str]:
    return re.findall(r'R\.call_dps_packed\("(\w+)"', mod.script(show_meta=False))


def test_rewrite_fuses_conv_epilogues_and_leaves_the_input_alone():
    mod = import_model(from_proto(cnn_model(), "cnn"))
    before = mod.script(show_meta=False)
    out, stats = dispatch_with_stats(mod, DispatchRules(block=0))
    assert mod.script(show_meta=False) == before
    # 6 convs (BN folded into the first, the Sum residual into the second) and the Gemm.
    assert stats.calls == {
        "edgec_dnnl_conv2d": 5, "edgec_dnnl_conv2d_add": 1, "edgec_dnnl_dense": 1}
    ops = _ops(out)
    for gone in ("R.nn.conv2d", "R.nn.batch_norm", "R.matmul", "R.stack", "R.sum"):
        assert gone not in ops
    assert "R.layout_transform" not in ops
    # A relu fused into a conv leaves no relu behind; concat, pools and flatten stay with TVM.
    assert "R.nn.relu" not in ops
    assert {"R.concat", "R.nn.max_pool2d", "R.mean"} <= set(ops)


def test_blocked_layout_keeps_activations_blocked_between_library_calls():
    mod = import_model(from_proto(cnn_model(), "cnn"))
    out, _ = dispatch_with_stats(mod, DispatchRules(block=16))
    text = out.script(show_meta=False)
    assert 'layout="NCHW16c"' in text  # the max pool runs blocked in TVM
    # 40 channels: not a multiple of 16, so the concat runs in NHWC, one block of all channels.
    assert re.search(r"R\.concat\(.*axis=4\)", text)
    # The channel shuffle is a gather along NHWC's channel axis, not a trip through NCHW.
    assert "R.take" in _ops(out) and "R.permute_dims" not in _ops(out)
    # Layouts change only where a tensor leaves the blocked world: before the flatten.
    assert _ops(out).count("R.layout_transform") <= 2


def test_grouped_conv_stays_grouped_for_the_shim_to_decide():
    mod = import_model(from_proto(cnn_model(), "cnn"))
    for block in (8, 16):
        out, _ = dispatch_with_stats(mod, DispatchRules(block=block))
        # The group-4 conv's groups argument: the 9th integer of its call.
        calls = re.findall(r'"edgec_dnnl_conv2d", \((?:[^,]+, ){3}((?:-?\d+, ){9})',
                           out.script(show_meta=False))
        groups = [int(c.split(", ")[8]) for c in calls]
        assert groups.count(4) == 1, (block, groups)


def test_rewrite_reaches_specializations_fallback_and_if_branches():
    mod = import_model(from_proto(matmul_model(), "mlp"))
    mod = add_shape_dispatch(mod, [{"batch": 1, "seq": 4}])
    out, stats = dispatch_with_stats(mod)
    assert stats.calls == {"edgec_dnnl_dense": 4}  # two matmuls in spec_0 and in generic
    for name in ("spec_0", "generic"):
        assert "R.matmul" not in out[name].script(show_meta=False)
    assert "R.nn.relu" not in _ops(out)  # bias and relu went into the first dense

    out, stats = dispatch_with_stats(import_model(from_proto(if_model(), "branches")))
    assert stats.calls == {"edgec_dnnl_conv2d": 2}
    assert "R.nn.conv2d" not in out.script(show_meta=False)


def test_tiny_static_matmuls_stay_tvm_kernels():
    """At batch 1, seq 1 the MLP's matmuls are 2048 and 1024 multiply-adds: less than a library
    call costs. The symbolic function still calls the library; a quantized build (every layer a
    library call) sets the bound to 0."""
    mod = add_shape_dispatch(import_model(from_proto(matmul_model(), "mlp")), [{"batch": 1, "seq": 1}])
    out, stats = dispatch_with_stats(mod)
    assert stats.calls == {"edgec_dnnl_dense": 2}  # the generic function's two
    assert "R.matmul" in out["spec_0"].script(show_meta=False)
    assert "R.matmul" not in out["generic"].script(show_meta=False)
    _, every = dispatch_with_stats(mod, DispatchRules(dense_min_macs=0))
    assert every.calls == {"edgec_dnnl_dense": 4}


def _library_calls(mod: tvm.IRModule) -> list[tuple[str, tuple]]:
    """(symbol, output shape) of every library call in ``mod``'s Relax functions."""
    found = []

    def visit(expr):
        if (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
                and expr.op.name == "relax.call_dps_packed"):
            shape = tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d)
                          for d in expr.ty.shape.values)
            found.append((str(expr.args[0].global_symbol), shape))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def test_xnn_rules_send_the_same_ops_to_xnnpack_in_nhwc():
    mod = import_model(from_proto(cnn_model(), "cnn"))
    out, stats = dispatch_with_stats(mod, DispatchRules(library="xnn"))
    # The ops oneDNN takes (BN folded into the first conv, the Sum residual into the second).
    assert stats.calls == {"edgec_xnn_conv2d": 5, "edgec_xnn_conv2d_add": 1, "edgec_xnn_dense": 1}
    calls = _library_calls(out)
    assert all(name.startswith("edgec_xnn_") for name, _ in calls)
    # Every convolution writes NHWC as [N, 1, H, W, C], the grouped and depthwise ones included:
    # XNNPACK has no blocked layouts, so 16- and 24-channel tensors are not blocked either.
    convs = [shape for name, shape in calls if "conv2d" in name]
    assert len(convs) == 6 and all(len(s) == 5 and s[1] == 1 for s in convs), convs
    assert {s[4] for s in convs} == {16, 24, 32, 8}
    text = out.script(show_meta=False)
    assert 'layout="NCHW16c"' in text  # the max pool on the 16-channel NHWC tensor, in TVM
    assert "R.take" in _ops(out) and "R.permute_dims" not in _ops(out)  # shuffle on NHWC
    assert _ops(out).count("R.layout_transform") <= 2  # only the image in, and before flatten


def test_xnn_rules_without_layout_keep_nchw():
    mod = import_model(from_proto(cnn_model(), "cnn"))
    out, stats = dispatch_with_stats(mod, DispatchRules(library="xnn", block=0))
    assert sum(stats.calls.values()) == 7
    assert "R.layout_transform" not in _ops(out)
    assert all(len(shape) in (2, 4) for _, shape in _library_calls(out))


def test_channels_last_keeps_onednn_activations_nhwc():
    """bf16 builds: oneDNN's AMX kernels read and write NHWC, so no tensor between its
    convolutions is blocked, whatever its channel count."""
    mod = import_model(from_proto(cnn_model(), "cnn"))
    out, stats = dispatch_with_stats(mod, DispatchRules(block=16, channels_last=True))
    assert stats.calls["edgec_dnnl_conv2d"] == 5
    convs = [shape for name, shape in _library_calls(out) if "conv2d" in name]
    assert len(convs) == 6 and all(len(s) == 5 and s[1] == 1 for s in convs), convs
    blocked, _ = dispatch_with_stats(mod, DispatchRules(block=16))
    assert any(s[1] > 1 for name, s in _library_calls(blocked) if "conv2d" in name)


def test_dispatch_rules_refuse_an_unknown_library():
    with pytest.raises(ValueError, match="known: dnnl, xnn"):
        DispatchRules(library="acl")


def _target(name: str, **changes):
    return dataclasses.replace(load_target(name), **changes)


def test_codegen_picks_the_library_route_from_the_target_file():
    for name in ("arm64-cortex-a72", "arm64-cortex-a76"):
        rules = LLVMBackend().library_rules(load_target(name))
        assert rules is not None and rules.library == "xnn" and rules.nhwc, name
    x86 = LLVMBackend().library_rules(load_target("x86_64"))
    assert x86.library == "dnnl" and x86.block == 8 and not x86.nhwc
    assert LLVMBackend().library_rules(_target("x86_64", libraries={})) is None
    with pytest.raises(CompileError, match="both"):
        LLVMBackend().library_rules(_target("x86_64", libraries={"dnnl": True, "xnnpack": True}))
    with pytest.raises(CompileError, match="xnnpack is for aarch64"):
        LLVMBackend().library_rules(_target("x86_64", libraries={"xnnpack": True}))
    assert set(native.ROUTE_SHIMS) == {"dnnl", "xnnpack"}


def test_target_file_with_a_misspelt_library_is_refused():
    doc = {"name": "t", "kind": "llvm", "arch": "aarch64", "tvm": {"kind": "llvm"},
           "libraries": {"xnnpak": True}}
    with pytest.raises(TargetError, match="did you mean 'libraries.xnnpack'"):
        parse_target(doc, "t.toml")


def _fake_cross_compiler(tmp_path: Path, missing: str) -> Path:
    """A stand-in for aarch64-linux-gnu-g++ on a machine without XNNPACK's arm64 packages: it
    fails like GCC on the missing header, and finds no library."""
    script = tmp_path / "fake-aarch64-g++"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  --version) echo "fake-g++ 1.0 (missing ' + missing + ')";;\n'
        '  -print-file-name=*) echo "${1#-print-file-name=}";;\n'
        '  *) echo "/usr/include/xnnpack.h:15:10: fatal error: ' + missing
        + ': No such file or directory" >&2; exit 1;;\n'
        "esac\n")
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("header,package", [("xnnpack.h", "libxnnpack-dev:arm64"),
                                            ("pthreadpool.h", "libpthreadpool-dev:arm64")])
def test_missing_xnnpack_packages_are_one_line_errors(tmp_path, monkeypatch, header, package):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(ToolchainError) as info:
        native.xnnpack_shim(str(_fake_cross_compiler(tmp_path, header)))
    message = str(info.value)
    assert "\n" not in message and f"'{header}' not found" in message
    assert package in message and "apt-get install" in message
    assert "dpkg --add-architecture arm64" in message


def test_missing_xnnpack_library_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_compile_object", lambda *a, **k: tmp_path / "shim.o")
    with pytest.raises(ToolchainError) as info:
        native.xnnpack_shim(str(_fake_cross_compiler(tmp_path, "nothing")))
    message = str(info.value)
    assert "\n" not in message and "libXNNPACK.so" in message and "libxnnpack-dev:arm64" in message


def test_compile_without_xnnpack_is_a_one_line_cli_error(mlp_dir, tmp_path, capfd, monkeypatch):
    from test_hardening import check_cli_error

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fake = _fake_cross_compiler(tmp_path, "pthreadpool.h")
    target = tmp_path / "pi4.toml"
    target.write_text(Path(load_target("arm64-cortex-a72").source).read_text().replace(
        'cross_compiler = "aarch64-linux-gnu-g++"', f'cross_compiler = "{fake}"'))
    out = tmp_path / "out" / "a.edgec"
    out.parent.mkdir()
    args = ["compile", mlp_dir / "model.onnx", "--samples", mlp_dir / "samples",
            "--target", target, "-o", out]
    message = check_cli_error(args, ToolchainError, out, capfd, monkeypatch)
    assert "libpthreadpool-dev:arm64" in message and "apt-get install" in message


def test_erf_and_softmax_become_vectorizable_kernels_before_legalization():
    # GELU's erf and softmax's exp lower to one libm call per element otherwise (the hottest
    # functions of the zoo's transformer); prepare() legalizes, so the swap must come first.
    # Static and small, the softmax stays TVM's (larger ones go to oneDNN on x86).
    graph = helper.make_graph(
        [helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Softmax", ["e"], ["y"], axis=-1)],
        "gelu_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    mod = import_model(from_proto(model, "gelu_softmax"))
    prepared = pipeline.lower_to(mod, load_target("x86_64"), "prepare")
    kernels = [gvar.name_hint for gvar, func in prepared.functions.items()
               if isinstance(func, tvm.tirx.PrimFunc)]
    assert any("fast_erf" in name for name in kernels), kernels
    assert any("fast_softmax" in name for name in kernels), kernels
    assert not any(name in ("erf", "softmax") for name in kernels), kernels
    assert "tirx.erf" not in prepared.script(show_meta=False)


def test_missing_toolchain_is_a_one_line_error(tmp_path):
    with pytest.raises(ToolchainError, match="C\\+\\+ compiler 'no-such-g\\+\\+' not found"):
        native.dnnl_shim("no-such-g++")
    source = tmp_path / "needs_header.cc"
    source.write_text("#include <no_such_library.hpp>\n")
    with pytest.raises(ToolchainError) as info:
        native._compile_object(source, "g++", "install libfoo-dev", header="no_such_library.hpp")
    assert "\n" not in str(info.value) and str(info.value).endswith("install libfoo-dev")


def _compile(proto, name, samples, monkeypatch, block, tmp_path, settings=PlanSettings(),
             rules=DispatchRules()):
    """Build ``proto`` for the host through every stage, with ``rules`` (default: convolutions
    and matmuls only) and activation blocks of ``block``."""
    model = from_proto(proto, name)
    target = load_target("x86_64")
    monkeypatch.setattr(llvm, "dnnl_rules", lambda t: dataclasses.replace(rules, block=block))
    artifact = build(model, plan(model, profile(model, samples), target, settings), [target])
    assert (artifact.manifest["libraries"]["x86_64"]["native_dependencies"]
            == ["libdnnl.so.2", "libgomp.so.1"])
    path = tmp_path / f"{name}.edgec"
    artifact.save(path)
    return edgec.runtime.load(path)


def _reference(proto, inputs):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


def test_blocked_pools_go_to_the_library_unless_dilated_or_averaged_in_ceil_mode():
    mod = import_model(from_proto(pools_model(), "pools"))
    out, _ = dispatch_with_stats(mod, DispatchRules(block=16, pool2d=True))
    calls = re.findall(r'"edgec_dnnl_pool2d", \(\w+, ([, \d]+)\)', out.script(show_meta=False))
    assert sorted(calls) == ["0, 3, 3, 2, 2, 1, 1", "1, 0, 0, 1, 1, 0, 0", "1, 3, 3, 1, 1, 1, 1",
                             "2, 2, 2, 2, 2, 0, 0"]  # max, the mean, the two averages
    ops = _ops(out)
    assert ops.count("R.nn.max_pool2d") == 1 and ops.count("R.nn.avg_pool2d") == 1
    assert "R.mean" not in ops
    # Without the route every pool is TVM's, blocked.
    out, _ = dispatch_with_stats(mod, DispatchRules(block=16))
    assert "edgec_dnnl_pool2d" not in _calls(out)


def test_blocked_resizes_go_to_the_library_in_the_modes_it_computes_alike():
    mod = import_model(from_proto(resize_model(), "resize"))
    out, _ = dispatch_with_stats(mod, DispatchRules(block=16, resize2d=True))
    calls = re.findall(r'"edgec_dnnl_resize2d", \(\w+, (\d)\)', out.script(show_meta=False))
    assert sorted(calls) == ["0", "1"]  # nearest x2, bilinear half-pixel
    assert _ops(out).count("R.image.resize2d") == 2


@needs_dnnl
@pytest.mark.parametrize("block", [8, 16])
def test_compiled_library_resizes_match_onnxruntime(block, monkeypatch, tmp_path):
    proto = resize_model()
    monkeypatch.setattr(llvm, "dnnl_rules",
                        lambda t: DispatchRules(block=block, resize2d=True))
    rng = np.random.default_rng(3)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((1, 3, 10, 10)).astype(np.float32)})
               for i in range(3)]
    target = load_target("x86_64")
    model = from_proto(proto, "resize")
    artifact = build(model, plan(model, profile(model, samples), target), [target])
    assert "edgec_dnnl_resize2d" in artifact.manifest["libraries"]["x86_64"]["linked_functions"]
    loaded = edgec.runtime.load(artifact.save(tmp_path / "resize.edgec"))
    for batch in (1, 2):
        x = rng.standard_normal((batch, 3, 10, 10)).astype(np.float32)
        np.testing.assert_allclose(loaded.run({"x": x})["y"], _reference(proto, {"x": x}),
                                   rtol=1e-4, atol=1e-4, err_msg=f"batch {batch}")


@needs_dnnl
@pytest.mark.parametrize("block, channels", [(8, 16), (16, 16), (16, 12)])
def test_compiled_library_pools_match_onnxruntime(block, channels, monkeypatch, tmp_path):
    proto = pools_model(channels=channels)
    monkeypatch.setattr(llvm, "dnnl_rules",
                        lambda t: DispatchRules(block=block, pool2d=True))
    rng = np.random.default_rng(2)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((1, 3, 15, 15)).astype(np.float32)})
               for i in range(3)]
    target = load_target("x86_64")
    model = from_proto(proto, "pools")
    artifact = build(model, plan(model, profile(model, samples), target), [target])
    assert "edgec_dnnl_pool2d" in artifact.manifest["libraries"]["x86_64"]["linked_functions"]
    loaded = edgec.runtime.load(artifact.save(tmp_path / "pools.edgec"))
    for batch in (1, 2):  # the specialization, then the symbolic fallback
        x = rng.standard_normal((batch, 3, 15, 15)).astype(np.float32)
        np.testing.assert_allclose(loaded.run({"x": x})["y"], _reference(proto, {"x": x}),
                                   rtol=1e-5, atol=1e-5, err_msg=f"batch {batch}")


@needs_dnnl
@pytest.mark.parametrize("block", [0, 8, 16])
def test_compiled_cnn_matches_onnxruntime(block, monkeypatch, tmp_path):
    proto = cnn_model()
    rng = np.random.default_rng(1)
    profiled = [Sample(f"s{i}", {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)})
                for i in range(3)]
    model = _compile(proto, "cnn", profiled, monkeypatch, block, tmp_path)
    assert [f["name"] for f in model.manifest["libraries"]["x86_64"]["functions"]] == [
        "main", "spec_0", "generic"]
    for batch in (1, 3):  # the batch-1 specialization, then the symbolic fallback
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        got = model.run({"x": x})["y"]
        np.testing.assert_allclose(got, _reference(proto, {"x": x}), rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_compiled_dynamic_matmul_matches_onnxruntime(monkeypatch, tmp_path):
    proto = matmul_model()
    rng = np.random.default_rng(2)
    profiled = [Sample(f"s{i}", {"x": rng.standard_normal((1, 4, 32)).astype(np.float32)})
                for i in range(3)]
    model = _compile(proto, "mlp", profiled, monkeypatch, 8, tmp_path)
    for shape in ((1, 4), (2, 7), (1, 4), (3, 1)):  # specialized, fallback, again, fallback
        x = rng.standard_normal((*shape, 32)).astype(np.float32)
        got = model.run({"x": x})["y"]
        np.testing.assert_allclose(got, _reference(proto, {"x": x}), rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_grouped_conv_runs_ungrouped_where_onednn_has_no_direct_kernel(monkeypatch, tmp_path):
    """With oneDNN held to AVX2 (as on an AVX2 machine), the group-4 conv whose groups are not
    whole 8-channel blocks has only a GEMM-based kernel: the shim runs it ungrouped, with zero
    weights between groups, and the outputs still match onnxruntime."""
    proto = cnn_model()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    _compile(proto, "cnn", [Sample("s0", {"x": x})], monkeypatch, 8, tmp_path)
    y, convs = _run_verbose(tmp_path / "cnn.edgec", x, tmp_path, ONEDNN_MAX_CPU_ISA="AVX2")
    assert convs and not any(",g4mb" in line for line in convs)  # ungrouped: no g4 primitive
    assert not any("gemm" in line for line in convs)
    np.testing.assert_allclose(y, _reference(proto, {"x": x}), rtol=1e-4, atol=1e-4)


def _run_verbose(artifact: Path, x: np.ndarray, tmp_path: Path,
                 **env: str) -> tuple[np.ndarray, list[str]]:
    """Run ``artifact`` on input ``x`` in a fresh process with ONEDNN_VERBOSE=1 (and ``env``,
    read by oneDNN when it loads): its output ``y`` and oneDNN's convolution lines, in order."""
    np.save(tmp_path / "x.npy", x)
    script = ("import sys, numpy as np, edgec.runtime as r; "
              "m = r.load(sys.argv[1]); "
              "np.save(sys.argv[3], m.run({'x': np.load(sys.argv[2])})['y'])")
    env = {**os.environ, **env, "ONEDNN_VERBOSE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    result = subprocess.run([sys.executable, "-c", script, str(artifact),
                             str(tmp_path / "x.npy"), str(tmp_path / "y.npy")],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    convs = [line for line in result.stdout.splitlines() if ",exec,cpu,convolution," in line]
    return np.load(tmp_path / "y.npy"), convs


def residual_block_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch, 16, 12, 12] -> a 3x3 conv to 64 channels (relu), a 3x3 conv 64 -> 64 plus that
    as a residual (relu), and a 3x3 conv down to 16 channels."""
    rng = np.random.default_rng(seed)
    inits = {"w1": _weight(rng, 64, 16, 3, 3), "b1": _weight(rng, 64, scale=0.1),
             "w2": _weight(rng, 64, 64, 3, 3), "b2": _weight(rng, 64, scale=0.1),
             "w3": _weight(rng, 16, 64, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s2"]),
        helper.make_node("Relu", ["s2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "residual_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16, 12, 12])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _has_avx512() -> bool:
    try:
        return " avx512f " in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@needs_dnnl
@pytest.mark.parametrize("block", [16, 0])
def test_wide_3x3_convolutions_run_winograd_with_the_residual_as_a_sum(block, monkeypatch,
                                                                       tmp_path):
    """On AVX-512, the two 3x3 convs with at least 32 channels on both sides run oneDNN's
    Winograd kernels (the residual added as a sum post-op, copied into the output first, in
    blocked and in plain layouts); the one reading 16 channels stays direct. Outputs match
    onnxruntime."""
    proto = residual_block_model()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    _compile(proto, "block", [Sample("s0", {"x": x})], monkeypatch, block, tmp_path)
    y, convs = _run_verbose(tmp_path / "block.edgec", x, tmp_path)
    assert len(convs) == 3
    if _has_avx512():
        assert ["wino" in line for line in convs] == [False, True, False]
        assert "attr-post-ops:sum" in convs[1]
    np.testing.assert_allclose(y, _reference(proto, {"x": x}), rtol=1e-4, atol=1e-4)


@needs_dnnl
@pytest.mark.parametrize("split", [[16, 16], [24, 8]])
def test_compiled_channel_split_of_a_blocked_tensor_matches_onnxruntime(split, monkeypatch,
                                                                         tmp_path):
    """conv -> Split along channels -> the parts concatenated the other way round -> conv: the
    split runs on the blocked tensor (whole blocks) or in NHWC (parts of 24 and 8)."""
    rng = np.random.default_rng(6)
    inits = {"w1": _weight(rng, 32, 16, 1, 1), "w2": _weight(rng, 16, 32, 3, 3),
             "split": np.array(split, np.int64)}
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"]),
        helper.make_node("Split", ["c1", "split"], ["a", "b"], axis=1),
        helper.make_node("Concat", ["b", "a"], ["ba"], axis=1),
        helper.make_node("Conv", ["ba", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 10, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    x = rng.standard_normal((1, 16, 10, 10)).astype(np.float32)
    model = _compile(proto, "split", [Sample("s0", {"x": x})], monkeypatch, 16, tmp_path)
    np.testing.assert_allclose(model.run({"x": x})["y"], _reference(proto, {"x": x}),
                               rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_compiled_instance_norm_and_written_out_layer_norm_match_onnxruntime(monkeypatch,
                                                                            tmp_path):
    """InstanceNormalization over a symbolic length, then a layer norm over channels written out
    as opset 13 exporters do (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add): both
    standardizations run in oneDNN, at the profiled length and another."""
    rng = np.random.default_rng(7)
    inits = {"scale": _weight(rng, 16), "bias": _weight(rng, 16), "gamma": _weight(rng, 16),
             "beta": _weight(rng, 16), "two": np.array(2.0, np.float32),
             "eps": np.array(1e-6, np.float32)}
    nodes = [
        helper.make_node("InstanceNormalization", ["x", "scale", "bias"], ["n"], epsilon=1e-5),
        helper.make_node("Transpose", ["n"], ["t"], perm=[0, 2, 1]),
        helper.make_node("ReduceMean", ["t"], ["m"], axes=[-1]),
        helper.make_node("Sub", ["t", "m"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
        helper.make_node("Add", ["v", "eps"], ["e"]),
        helper.make_node("Sqrt", ["e"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["q"]),
        helper.make_node("Mul", ["q", "gamma"], ["g"]),
        helper.make_node("Add", ["g", "beta"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "norms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, "length"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, "length", 16])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    x = rng.standard_normal((2, 16, 300)).astype(np.float32) * 3 + 1
    model = _compile(proto, "norms", [Sample("s0", {"x": x})], monkeypatch, 16, tmp_path,
                     rules=DispatchRules(layer_norm=True))
    for length in (300, 257):
        x = rng.standard_normal((2, 16, length)).astype(np.float32) * 3 + 1
        np.testing.assert_allclose(model.run({"x": x})["y"], _reference(proto, {"x": x}),
                                   rtol=1e-4, atol=1e-4)


def conv1d_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch, 8, length] -> strided, dilated 1-D convs with bias, GELU and a residual relu."""
    rng = np.random.default_rng(seed)
    inits = {"w1": _weight(rng, 16, 8, 3), "b1": _weight(rng, 16, scale=0.1),
             "w2": _weight(rng, 16, 16, 5), "w3": _weight(rng, 16, 16, 1),
             "sqrt2": np.array(np.sqrt(2.0), np.float32), "one": np.array(1.0, np.float32),
             "half": np.array(0.5, np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[2, 2], dilations=[2]),
        helper.make_node("Div", ["c1", "sqrt2"], ["g1"]),
        helper.make_node("Erf", ["g1"], ["g2"]),
        helper.make_node("Add", ["g2", "one"], ["g3"]),
        helper.make_node("Mul", ["c1", "g3"], ["g4"]),
        helper.make_node("Mul", ["g4", "half"], ["h1"]),
        helper.make_node("Conv", ["h1", "w2"], ["c2"], pads=[2, 2], strides=[2]),
        helper.make_node("Conv", ["c2", "w3"], ["c3"]),
        helper.make_node("Add", ["c3", "c2"], ["s3"]),
        helper.make_node("Relu", ["s3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "conv1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, "length"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16, "out_length"])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_1d_convolutions_become_library_calls_over_a_height_of_one():
    mod = import_model(from_proto(conv1d_model(), "conv1d"))
    out, stats = dispatch_with_stats(mod, DispatchRules(block=0))
    assert stats.calls == {"edgec_dnnl_conv2d": 2, "edgec_dnnl_conv2d_add": 1}
    assert "R.nn.conv1d" not in out.script(show_meta=False)


@needs_dnnl
def test_compiled_1d_convolutions_match_onnxruntime(monkeypatch, tmp_path):
    proto = conv1d_model()
    rng = np.random.default_rng(4)
    profiled = [Sample(f"s{i}", {"x": rng.standard_normal((1, 8, 40)).astype(np.float32)})
                for i in range(3)]
    model = _compile(proto, "conv1d", profiled, monkeypatch, 16, tmp_path)
    for batch, length in ((1, 40), (2, 23)):  # the specialization, then the symbolic fallback
        x = rng.standard_normal((batch, 8, length)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], _reference(proto, {"x": x}),
                                   rtol=1e-4, atol=1e-4)


@needs_dnnl
def test_attention_matmuls_run_as_library_batched_matmuls_and_match_onnxruntime(tmp_path):
    """softmax(q kᵀ) v over symbolic batch and seq: both activation matmuls are oneDNN batched
    matmuls (edgec_dnnl_batch_matmul) and the softmax oneDNN's (edgec_dnnl_softmax), at the
    profiled shapes and at one never seen."""
    import edgec

    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 2, "seq", 16])
              for n in ("q", "k", "v")]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2, "seq", 16])
    proto = helper.make_model(helper.make_graph(nodes, "attention", inputs, [output]),
                              opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(0)

    def sample(name, batch, seq):
        return Sample(name, {n: rng.standard_normal((batch, 2, seq, 16)).astype(np.float32)
                             for n in ("q", "k", "v")})

    samples = [sample(f"s{i}", b, s) for i, (b, s) in enumerate([(1, 8), (1, 8), (2, 33)])]
    target = load_target("x86_64")
    compiled = edgec.compile(from_proto(proto, "attention"), samples, [target])
    library = compiled.artifact.manifest["libraries"]["x86_64"]
    assert library["linked_functions"] == ["edgec_dnnl_batch_matmul", "edgec_dnnl_softmax"]
    loaded = edgec.runtime.load(compiled.artifact.save(tmp_path / "attention.edgec"))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for s in samples + [sample("unseen", 3, 21)]:
        np.testing.assert_allclose(loaded.run(s.arrays)["y"], session.run(None, s.arrays)[0],
                                   rtol=1e-5, atol=1e-5, err_msg=s.name)


@needs_dnnl
def test_library_softmax_along_a_middle_axis_matches_onnxruntime(tmp_path):
    """oneDNN's softmax over [outer, axis, inner] views: axis 1 of a symbolic [batch, 5, 2000]
    (opset 13), and opset 11's Softmax, which normalizes everything after its axis; at the
    profiled shapes (static, over norm_min_elements) and at one never seen."""
    import edgec

    for opset, axis in ((13, 1), (11, 1)):
        graph = helper.make_graph(
            [helper.make_node("Softmax", ["x"], ["y"], axis=axis)], "softmax",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5, 2000])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5, 2000])])
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        proto.ir_version = 8
        rng = np.random.default_rng(opset)
        samples = [Sample(f"s{i}", {"x": 4 * rng.standard_normal((b, 5, 2000)).astype(np.float32)})
                   for i, b in enumerate((1, 1, 2))]
        compiled = edgec.compile(from_proto(proto, "softmax"), samples, [load_target("x86_64")])
        library = compiled.artifact.manifest["libraries"]["x86_64"]
        assert library["linked_functions"] == ["edgec_dnnl_softmax"], opset
        loaded = edgec.runtime.load(compiled.artifact.save(tmp_path / f"softmax{opset}.edgec"))
        session = ort.InferenceSession(proto.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        unseen = Sample("unseen", {"x": 4 * rng.standard_normal((3, 5, 2000)).astype(np.float32)})
        for s in samples + [unseen]:
            np.testing.assert_allclose(loaded.run(s.arrays)["y"], session.run(None, s.arrays)[0],
                                       rtol=1e-5, atol=1e-6, err_msg=f"opset {opset} {s.name}")


@needs_dnnl
def test_library_layer_norm_matches_onnxruntime(tmp_path):
    """ONNX LayerNormalization over the last axis of a symbolic [batch, seq, 96], as oneDNN's
    layer normalization (edgec_dnnl_layer_norm), at the profiled shapes and one never seen."""
    import edgec

    rng = np.random.default_rng(5)
    scale = numpy_helper.from_array(rng.uniform(0.5, 2, 96).astype(np.float32), "scale")
    bias = numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "bias")
    graph = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1,
                          epsilon=1e-3)], "layer_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 96])],
        initializer=[scale, bias])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8

    def sample(name, batch, seq):  # an offset and a spread per row: the statistics matter
        x = rng.standard_normal((batch, seq, 96)) * rng.uniform(0.1, 5, (batch, seq, 1))
        return Sample(name, {"x": (x + rng.uniform(-3, 3, (batch, seq, 1))).astype(np.float32)})

    samples = [sample(f"s{i}", b, n) for i, (b, n) in enumerate([(1, 100), (1, 100), (2, 90)])]
    compiled = edgec.compile(from_proto(proto, "layer_norm"), samples, [load_target("x86_64")])
    library = compiled.artifact.manifest["libraries"]["x86_64"]
    assert library["linked_functions"] == ["edgec_dnnl_layer_norm"]
    loaded = edgec.runtime.load(compiled.artifact.save(tmp_path / "layer_norm.edgec"))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for s in samples + [sample("unseen", 3, 33)]:
        np.testing.assert_allclose(loaded.run(s.arrays)["y"], session.run(None, s.arrays)[0],
                                   rtol=1e-4, atol=1e-4, err_msg=s.name)


_BUSY_CALLS = """
import sys, time
import numpy as np
import edgec.runtime
from edgec.core.busy import busy_processes

if __name__ == "__main__":
    loaded = edgec.runtime.load(sys.argv[1], threads=2)
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    quiet = loaded.run({"x": x})["y"]
    print("quiet done", flush=True)
    with busy_processes(int(sys.argv[2])):
        end = time.monotonic() + 5
        while time.monotonic() < end:
            np.testing.assert_allclose(loaded.run({"x": x})["y"], quiet, rtol=1e-5, atol=1e-5)
"""


@needs_dnnl
@pytest.mark.slow
def test_library_calls_go_serial_while_busy_processes_hold_the_cores(tmp_path):
    """A parallel oneDNN call whose caller waited off its CPU (a descheduled OpenMP thread) makes
    the next calls run on one thread (dnnl_common.h, Contention): beside as many CPU-bound
    processes as cores, the matmul is created a second time, for one thread (oneDNN's verbose
    log shows each creation), and every call's output still matches the quiet one."""
    import edgec

    weight = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
    proto = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "wide_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", 256])],
        [numpy_helper.from_array(weight, "w")]), opset_imports=[helper.make_opsetid("", 17)])
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    compiled = edgec.compile(from_proto(proto, "wide_matmul"), [Sample("s0", {"x": x})],
                             [load_target("x86_64")])
    assert "edgec_dnnl_dense" in compiled.artifact.manifest["libraries"]["x86_64"]["linked_functions"]
    path = compiled.artifact.save(tmp_path / "wide.edgec")
    script = tmp_path / "busy_calls.py"
    script.write_text(_BUSY_CALLS)
    run = subprocess.run([sys.executable, str(script), str(path), str(os.cpu_count() or 2)],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, ONEDNN_VERBOSE="2"))
    assert run.returncode == 0, run.stderr[-2000:]
    quiet, busy = run.stdout.split("quiet done\n")
    created = ",create:cache_miss,cpu,matmul,"
    assert quiet.count(created) == 1 and busy.count(created) == 1, run.stdout[-2000:]


def activations_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch, 16, 8, 8] through convolutions, each followed by an activation as exporters spell
    it, then matmuls followed by GELU (erf) and tanh; y[batch, 8, 32].

    relu6 as Clip(0, 6); HardSwish; swish as x * Sigmoid(x); a gate (Sigmoid, then Mul with
    another tensor); torch's hard swish x * (Clip(x + 3, 0, 6) / 6); a squeeze-excite block (its
    [batch, 16, 1, 1] gate scales the image); HardSigmoid;
    Clip(0, 6) / 6 (the library scales the conv instead); a residual add then Clip(0, 6); two
    the library must not take: Clip(-1, 1) and x * (Clip(x + 3, 0, 6) / 5); GELU as
    (x * (1 + Erf(x / sqrt 2))) * 0.5.
    """
    rng = np.random.default_rng(seed)
    inits = {f"w{i}": _weight(rng, 16, 16, 3, 3) for i in range(12)}
    inits.update({f"b{i}": _weight(rng, 16, scale=0.5) for i in range(12)})
    inits.update({"m1": _weight(rng, 64, 128), "mb1": _weight(rng, 128, scale=0.5),
                  "m2": _weight(rng, 128, 32), "w_se": _weight(rng, 16, 16, 1, 1), "three": np.array(3.0, np.float32),
                  "six": np.array(6.0, np.float32), "five": np.array(5.0, np.float32),
                  "zero": np.array(0.0, np.float32), "one": np.array(1.0, np.float32),
                  "minus_one": np.array(-1.0, np.float32), "half": np.array(0.5, np.float32),
                  "sqrt2": np.array(np.sqrt(2.0), np.float32),
                  "shape": np.array([0, 8, 128], np.int64)})
    nodes = []

    def conv(i, x):
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1] * 4))
        return f"c{i}"

    def op(kind, inputs, out, **attrs):
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    a = op("Clip", [conv(0, "x"), "zero", "six"], "relu6")
    a = op("HardSwish", [conv(1, a)], "hswish")
    c = conv(2, a)
    a = op("Mul", [c, op("Sigmoid", [c], "sig2")], "swish")
    a = op("Mul", [op("Sigmoid", [conv(3, a)], "gate"), a], "excited")
    c = conv(4, a)
    t = op("Clip", [op("Add", [c, "three"], "p4"), "zero", "six"], "q4")
    a = op("Mul", [c, op("Div", [t, "six"], "r4")], "torch_hswish")
    nodes.append(helper.make_node("Conv", [op("GlobalAveragePool", [a], "pooled"), "w_se"],
                                  ["c_se"]))
    a = op("Mul", [a, op("Sigmoid", ["c_se"], "se_gate")], "squeezed")  # gate [batch, 16, 1, 1]
    a = op("Mul", [op("HardSigmoid", [conv(5, a)], "hsig"), a], "hs_gated")
    a = op("Div", [op("Clip", [conv(6, a), "zero", "six"], "q6"), "six"], "relu6_scaled")
    a = op("Clip", [op("Add", [conv(7, a), a], "res7"), "zero", "six"], "res_relu6")
    a = op("Clip", [conv(8, a), "minus_one", "one"], "hardtanh")
    c = conv(9, a)
    t = op("Clip", [op("Add", [c, "three"], "p9"), "zero", "six"], "q9")
    a = op("Mul", [c, op("Div", [t, "five"], "r9")], "not_hswish")
    c = conv(11, a)  # GELU as ConvNeXt's export spells it: (x * (1 + erf(x / sqrt 2))) * 0.5
    t = op("Add", [op("Erf", [op("Div", [c, "sqrt2"], "d11")], "e11"), "one"], "f11")
    a = op("Mul", [op("Mul", [c, t], "g11"), "half"], "gelu_after")
    h = op("Reshape", [conv(10, a), "shape"], "rows")  # [batch, 8, 128]... as 8 rows of 128
    h = op("Add", [op("MatMul", [op("Slice", [h, "s0", "s1", "s2"], "half_rows"), "m1"], "mm1"),
                   "mb1"], "mm1b")
    g = op("Mul", [h, op("Mul", ["half", op("Add", [op("Erf", [op("Div", [h, "sqrt2"], "d")],
                                                      "e"), "one"], "e1")], "e2")], "gelu")
    op("Tanh", [op("MatMul", [g, "m2"], "mm2")], "y")
    inits.update({"s0": np.array([0], np.int64), "s1": np.array([64], np.int64),
                  "s2": np.array([2], np.int64)})
    graph = helper.make_graph(
        nodes, "activations",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 32])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _fused_activations(mod: tvm.IRModule) -> list[tuple[str, str | None, float]]:
    """Each library call's function, the activation its flags fuse and clip's bound."""
    calls = []

    def visit(expr):
        if (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
                and expr.op.name == "relax.call_dps_packed"):
            calls.append((str(expr.args[0].global_symbol), expr.args[1].fields))

    relax.analysis.post_order_visit(mod["main"], visit)
    found = []
    for name, args in calls:
        flags = int(args[-2].value)
        code = (flags >> 4) & 15
        upper = float(np.array([flags >> 32], np.uint32).view(np.float32)[0])
        act = ("relu" if flags & FLAG_RELU else None) if code == 0 else ACTIVATIONS[code - 1]
        found.append((name, act, upper if act == "clip" else 0.0))
    return found


def test_activations_as_exporters_spell_them_fuse_into_the_library_calls():
    mod = import_model(from_proto(activations_model(), "activations"))
    out, stats = dispatch_with_stats(mod, DispatchRules(block=0))
    assert stats.calls == {"edgec_dnnl_conv2d": 12, "edgec_dnnl_conv2d_add": 1,
                           "edgec_dnnl_dense": 2}
    assert [act[1:] for act in _fused_activations(out)] == [
        ("clip", 6.0), ("hardswish", 0.0), ("swish", 0.0), ("sigmoid", 0.0), ("hardswish", 0.0),
        ("sigmoid", 0.0),  # the squeeze-excite gate
        ("clip", 1.0),  # HardSigmoid: its x / 6 + 0.5 folds into the conv, clip(0, 1) stays
        ("clip", 1.0),  # Clip(0, 6) / 6 as clip(0, 1) of the conv scaled by 1/6
        ("clip", 6.0),  # after the residual add
        (None, 0.0), (None, 0.0),  # Clip(-1, 1); x * Clip(x + 3, 0, 6) / 5
        ("gelu_erf", 0.0), (None, 0.0), ("gelu_erf", 0.0), ("tanh", 0.0)]
    ops = _ops(out)
    for gone in ("R.sigmoid", "R.erf", "R.tanh", "R.clip"):
        assert gone not in ops
    # The two the library must not take stay: max/min, and the / 5 chain's ops.
    assert ops.count("R.maximum") == 2 and ops.count("R.divide") == 1


def test_blocked_layout_reaches_through_squeeze_excite_gates():
    """The [batch, C, 1, 1] gate and the image it scales are blocked alike, so the whole chain of
    convolutions stays blocked: one layout transform, back to NCHW for the final reshape."""
    mod = import_model(from_proto(activations_model(), "activations"))
    out, _ = dispatch_with_stats(mod, DispatchRules(block=16))
    assert _ops(out).count("R.layout_transform") == 1


def test_xnn_rules_fuse_relu_only():
    mod = import_model(from_proto(activations_model(), "activations"))
    out, _ = dispatch_with_stats(mod, DispatchRules(library="xnn", block=0))
    # relu6's max(x, 0) fuses as relu, its min(x, 6) stays; nothing else fuses.
    assert {act for _, act, _ in _fused_activations(out)} == {None, "relu"}
    assert "R.sigmoid" in _ops(out) and "R.minimum" in _ops(out)


@needs_dnnl
@pytest.mark.parametrize("block", [0, 16])
def test_compiled_fused_activations_match_onnxruntime(block, monkeypatch, tmp_path):
    proto = activations_model()
    rng = np.random.default_rng(5)
    profiled = [Sample(f"s{i}", {"x": rng.standard_normal((1, 16, 8, 8)).astype(np.float32)})
                for i in range(3)]
    model = _compile(proto, "activations", profiled, monkeypatch, block, tmp_path)
    for batch in (1, 2):  # the specialization, then the symbolic fallback
        x = (3 * rng.standard_normal((batch, 16, 8, 8))).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], _reference(proto, {"x": x}),
                                   rtol=1e-4, atol=1e-4)


def wide_dense_model(seed: int = 0, k: int = 80, n: int = 65540) -> onnx.ModelProto:
    """x[batch, seq, k] -> relu(x @ w + b) over a weight of 21 MB (k x n, n not a multiple of
    16): a vocabulary projection's shape, which the shim runs by panels for 2-6 rows."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["s"]),
         helper.make_node("Relu", ["s"], ["y"])],
        "wide_dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", n])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@needs_dnnl
def test_wide_dense_of_a_few_rows_runs_by_panels_and_matches_onnxruntime(monkeypatch, tmp_path):
    proto = wide_dense_model()
    rng = np.random.default_rng(4)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((1, 4, 80)).astype(np.float32)})
               for i in range(3)]
    model = _compile(proto, "wide_dense", samples, monkeypatch, 0, tmp_path)
    shapes = [(1, 1), (1, 4), (2, 3), (1, 5), (1, 7)]  # rows 1 and 7: oneDNN's; 4, 6, 5: panels
    inputs = {shape: rng.standard_normal((*shape, 80)).astype(np.float32) for shape in shapes}
    for shape, x in inputs.items():
        np.testing.assert_allclose(model.run({"x": x})["y"], _reference(proto, {"x": x}),
                                   rtol=1e-4, atol=1e-4, err_msg=f"shape {shape}")
    # Which kernel ran: oneDNN logs each matmul it executes; the panels are not oneDNN's.
    script = ("import sys, numpy as np, edgec.runtime\n"
              "m = edgec.runtime.load(sys.argv[1])\n"
              "for rows in (1, 4, 7):\n"
              "    print(f'rows {rows}', flush=True)\n"
              "    m.run({'x': np.ones((1, rows, 80), np.float32)})\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "wide_dense.edgec")],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "ONEDNN_VERBOSE": "1"}).stdout
    logged = {rows: sum(",exec,cpu,matmul," in line for line in part.splitlines())
              for rows, part in zip((1, 4, 7), out.split("rows ")[1:])}
    assert logged[1] == 1 and logged[4] == 0 and logged[7] == 1, out


def grouped_pointwise_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch, 16, 6, 6] -> ShuffleNet's pointwise group convolutions, groups that are not whole
    8-channel blocks: 4 groups of 4 channels with a bias, the input added back and relu6; then 2
    groups of 8 -> 6 channels and a sigmoid."""
    rng = np.random.default_rng(seed)
    inits = {"w1": _weight(rng, 16, 4, 1, 1), "b1": _weight(rng, 16, scale=0.1),
             "w2": _weight(rng, 12, 8, 1, 1), "lo": np.array(0, np.float32),
             "hi": np.array(6, np.float32)}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], group=4),
        helper.make_node("Add", ["c1", "x"], ["s1"]),
        helper.make_node("Clip", ["s1", "lo", "hi"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], group=2),
        helper.make_node("Sigmoid", ["c2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "grouped_pointwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 12, 6, 6])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@needs_dnnl
@pytest.mark.parametrize("block", [0, 8, 16])
def test_compiled_grouped_pointwise_convs_match_onnxruntime(block, monkeypatch, tmp_path):
    proto = grouped_pointwise_model()
    rng = np.random.default_rng(5)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((1, 16, 6, 6)).astype(np.float32)})
               for i in range(3)]
    model = _compile(proto, "grouped", samples, monkeypatch, block, tmp_path)
    for batch in (1, 2):
        x = 3 * rng.standard_normal((batch, 16, 6, 6)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], _reference(proto, {"x": x}),
                                   rtol=1e-5, atol=1e-5, err_msg=f"batch {batch}")
