"""ARM for real on an x86 machine: artifacts built for ``arm64-cortex-a72`` (and ``-a76``) run
under qemu user emulation in the C++ host cross-compiled against the aarch64 TVM wheels' runtime
libraries, and match the x86 library of the same artifact, and onnxruntime. Their convolutions
and matmuls run in XNNPACK (the targets' ``[libraries] xnnpack``).

Needs ``aarch64-linux-gnu-g++``, ``qemu-aarch64``, the aarch64 sysroot, Debian's arm64 XNNPACK,
zlib and libssl (``scripts/install-system-deps.sh cross``), and the aarch64 wheels of the pinned
apache-tvm and apache-tvm-ffi, which it downloads once into ``~/.cache/edgec``.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgec import runtime, zoo
from edgec.core import remote
from edgec.compiler import native
from edgec.compiler.backends import llvm as codegen
from edgec.compiler.transform.library_offload import DispatchRules
from edgec.errors import ToolchainError
from edgec.runtime.artifact import Artifact
from edgec.core.targets import load_target
from runtime.test_cpp_host import (build_artifact, build_host, missing_tools, run_host,
                           topk_model, topk_samples, zoo_artifact)

ARM = load_target("arm64-cortex-a72")
QEMU = ARM.run.get("qemu", "qemu-aarch64")
SYSROOT = Path(ARM.run.get("sysroot", "/usr/aarch64-linux-gnu"))
# Relative to the scale of the output: LLVM's aarch64 and x86 code (and oneDNN on x86) round
# differently; the MLP of TVM_NOTES.md matched numpy to 4e-5.
TOLERANCE = 1e-4

_missing = missing_tools(ARM.cross_compiler, QEMU, "make")
if not SYSROOT.is_dir():
    _missing.append(f"the aarch64 sysroot {SYSROOT}")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(_missing),
                       reason=f"needs {', '.join(_missing)} (scripts/install-system-deps.sh cross)"),
]


def aarch64_runtime_libraries() -> tuple[Path, Path]:
    """The aarch64 ``libtvm_runtime.so`` and ``libtvm_ffi.so`` directories (downloaded once)."""
    try:
        return remote.aarch64_runtime_libraries()
    except ToolchainError as exc:  # no PyPI access here
        pytest.skip(str(exc))


@pytest.fixture(scope="module", autouse=True)
def xnnpack() -> None:
    """The arm64 targets send convolutions and matmuls to XNNPACK: without its arm64 packages
    they do not build, so every test here skips, saying what to install."""
    try:
        native.xnnpack_shim(ARM.cross_compiler)
    except ToolchainError as exc:
        pytest.skip(str(exc))


def missing_host_libraries(cxx: str, directory: Path) -> str:
    """Why ``cxx`` cannot build the C++ host's zlib and libcrypto calls ('' when it can): the
    arm64 -dev packages are missing, say."""
    probe = directory / "probe.cc"
    probe.write_text("#include <openssl/evp.h>\n#include <zlib.h>\n"
                     "int main() { return crc32(0, nullptr, 0) + (EVP_sha256() == nullptr); }\n")
    result = subprocess.run([cxx, str(probe), "-lcrypto", "-lz", "-o", str(directory / "probe")],
                            capture_output=True, text=True)
    if result.returncode == 0:
        return ""
    lines = result.stderr.strip().splitlines() or ["exit status %d" % result.returncode]
    return next((line for line in lines if "error" in line), lines[-1])


@pytest.fixture(scope="module")
def arm_host(tmp_path_factory) -> Path:
    """The aarch64 host; skips, naming the packages, where its zlib or libcrypto is missing."""
    why = missing_host_libraries(ARM.cross_compiler, tmp_path_factory.mktemp("probe"))
    if why:
        pytest.skip(f"the aarch64 C++ host needs zlib1g-dev:arm64 and libssl-dev:arm64 "
                    f"(scripts/install-system-deps.sh cross): {why}")
    return build_host(ARM.cross_compiler, aarch64_runtime_libraries())


def run_on_arm(host: Path, artifact: Path, inputs: dict, workdir: Path, target: str | None):
    """Outputs of the aarch64 host under qemu; ``target=None`` lets the host pick by its arch."""
    return run_host(host, artifact, inputs, workdir, prefix=remote.qemu_prefix(ARM),
                    extra=["--target", target] if target else [])


def compare(got: dict, expected: dict, label: str, reference: str = "x86") -> float:
    """Assert that the outputs agree within TOLERANCE of their scale; print the differences and
    return the largest."""
    assert sorted(got) == sorted(expected)
    worst = 0.0
    for name, value in expected.items():
        assert got[name].shape == value.shape and got[name].dtype == value.dtype, name
        scale = max(1.0, float(np.abs(value).max(initial=0.0)))
        diff = float(np.abs(got[name] - value).max(initial=0.0))
        print(f"{label} {name}{list(value.shape)}: max abs diff vs {reference} {diff:.3g} "
              f"(scale {scale:.3g})")
        assert diff <= TOLERANCE * scale, (label, name, diff)
        worst = max(worst, diff)
    return worst


def onnxruntime_outputs(proto, inputs: dict) -> dict:
    """onnxruntime's outputs on this machine, keyed as the C++ host names its output files."""
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return {remote._file_name(n): v for n, v in zip(names, session.run(None, inputs))}


def check_xnnpack_library(path: Path) -> None:
    """The artifact's arm64 library calls XNNPACK and its manifest says what it needs."""
    entry = Artifact.load(path).manifest["libraries"][ARM.name]
    assert entry["native_dependencies"] == ["libXNNPACK.so.0", "libpthreadpool.so.0"]
    assert any(f.startswith("edgec_xnn_conv2d") for f in entry["linked_functions"])
    assert not any(f.startswith("edgec_dnnl_") for f in entry["linked_functions"])


def test_compile_cli_makes_a_multi_target_artifact_that_runs_under_qemu(arm_host, tmp_path):
    zoo.export("cnn", tmp_path / "cnn")
    path = tmp_path / "cnn.edgec"
    command = [sys.executable, "-m", "edgec", "compile", str(tmp_path / "cnn" / "model.onnx"),
               "--samples", str(tmp_path / "cnn" / "samples"), "--target", "x86_64",
               "--target", "arm64-cortex-a72", "--target", "arm64-cortex-a76", "-o", str(path)]
    subprocess.run(command, check=True, capture_output=True, text=True)
    libraries = Artifact.load(path).manifest["libraries"]
    assert {n: e["arch"] for n, e in libraries.items()} == {
        "x86_64": "x86_64", "arm64-cortex-a72": "aarch64", "arm64-cortex-a76": "aarch64"}
    with zipfile.ZipFile(path) as archive:
        assert archive.read("lib/arm64-cortex-a72.so")[18] == 183  # ELF e_machine: EM_AARCH64
    x86 = runtime.load(path)
    assert x86.target == "x86_64"
    sample = dict(np.load(sorted((tmp_path / "cnn" / "samples").glob("*.npz"))[0]))
    expected = x86.run(sample)
    for target in ("arm64-cortex-a72", "arm64-cortex-a76"):
        compare(run_on_arm(arm_host, path, sample, tmp_path / target, target), expected,
                f"cnn {target}")
    # Without --target the host picks the first library for its own arch (qemu reports aarch64).
    picked = run_on_arm(arm_host, path, sample, tmp_path / "picked", None)
    a72 = {p.stem: np.load(p) for p in (tmp_path / "arm64-cortex-a72" / "out").glob("*.npy")}
    assert all(np.array_equal(picked[name], a72[name]) for name in a72)


def test_runtime_extra_kernel_under_qemu(arm_host, tmp_path):
    path = build_artifact(topk_model(), "topk", topk_samples(), ["x86_64", "arm64-cortex-a72"],
                          tmp_path)
    x86 = runtime.load(path)
    for index, sample in enumerate(topk_samples(1)):
        got = run_on_arm(arm_host, path, sample, tmp_path / str(index), "arm64-cortex-a72")
        compare(got, x86.run(sample), "topk arm64-cortex-a72")


@pytest.mark.parametrize("name", ["transformer", "early_exit", "scan_rnn", "greedy_decoder"])
def test_dynamic_zoo_models_match_x86_under_qemu(arm_host, tmp_path, name):
    path, samples = zoo_artifact(name, ["x86_64", "arm64-cortex-a72"], tmp_path)
    specializations = Artifact.load(path).manifest["plan"]["regions"][0]["specializations"]
    if name == "transformer":
        rng = np.random.default_rng(5)
        shapes = [(s["batch"], s["seq"]) for s in specializations[:1]] + [(2, 5)]  # + fallback
        samples = [{"input_ids": rng.integers(0, 100, shape).astype(np.int64),
                    "attention_mask": np.ones(shape, np.float32)} for shape in shapes]
    elif name == "early_exit":
        batch_two = [s for s in samples if s["image"].shape[0] == 2][:1]
        samples = samples[:3] + batch_two + [{"image": np.concatenate([samples[0]["image"]] * 3)}]
    else:  # a Scan and a Loop: their outputs stacked by the native row kernels on both
        samples = samples[:3]
    x86 = runtime.load(path)
    for index, sample in enumerate(samples):
        got = run_on_arm(arm_host, path, sample, tmp_path / str(index), "arm64-cortex-a72")
        compare(got, x86.run(sample), f"{name} arm64-cortex-a72")


@pytest.mark.parametrize("name", ["cnn", "squeezenet_rand"])
def test_xnnpack_zoo_cnn_matches_onnxruntime_under_qemu(arm_host, tmp_path, name):
    """A zoo CNN built for the Cortex-A72 alone: its convolutions and matmuls in XNNPACK (NHWC
    between them), run under qemu, give onnxruntime's outputs."""
    path, samples = zoo_artifact(name, [ARM.name], tmp_path)
    check_xnnpack_library(path)
    proto = zoo.get(name).make_model(0)
    for index, sample in enumerate(samples[:2]):
        got = run_on_arm(arm_host, path, sample, tmp_path / str(index), ARM.name)
        compare(got, onnxruntime_outputs(proto, sample), f"{name} {ARM.name} xnnpack",
                "onnxruntime")


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_xnnpack_conv_patterns_match_onnxruntime_under_qemu(arm_host, tmp_path, monkeypatch,
                                                            layout):
    """Every pattern of the dispatch (BN folded, residual add + relu, grouped, depthwise strided,
    channel shuffle, a 40-channel concat, Gemm) in XNNPACK, at the profiled batch and through the
    symbolic fallback; NHWC between library calls, or NCHW transposed inside the shim."""
    from compiler.transform.test_library_offload_build import cnn_model

    if layout == "nchw":
        monkeypatch.setattr(codegen, "xnnpack_rules",
                            lambda target: DispatchRules(library="xnn", block=0))
    proto = cnn_model()
    rng = np.random.default_rng(7)
    samples = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(3)]
    path = build_artifact(proto, "cnn_ops", samples, [ARM.name], tmp_path)
    check_xnnpack_library(path)
    for batch in (1, 3):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        got = run_on_arm(arm_host, path, {"x": x}, tmp_path / str(batch), ARM.name)
        compare(got, onnxruntime_outputs(proto, {"x": x}), f"cnn_ops[{layout}] batch {batch}",
                "onnxruntime")


def test_int8_weight_on_xnnpack_keeps_weights_int8_and_its_accuracy_under_qemu(arm_host, tmp_path):
    """--quantize int8-weight for the Cortex-A72 alone: the convolutions (batch norm folded,
    residual add + relu, grouped, depthwise) and the Gemm call XNNPACK's weight-only functions,
    whose weights the library stores as int8 (dequantized once, when the operator is made); the
    accuracy guard measures the artifact under qemu; its outputs are fp32's within int8's
    rounding. The integer modes are refused with a one-line error: XNNPACK's int8 here has no
    per-channel scales."""
    from compiler.transform.test_library_offload_build import cnn_model
    import onnx

    proto = cnn_model()
    onnx.save(proto, tmp_path / "model.onnx")
    rng = np.random.default_rng(11)
    (tmp_path / "samples").mkdir()
    for index in range(4):
        np.savez(tmp_path / "samples" / f"sample_{index:03d}.npz",
                 x=rng.standard_normal((1, 3, 16, 16)).astype(np.float32))

    def compile_(out: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "edgec", "compile", str(tmp_path / "model.onnx"),
                               "--samples", str(tmp_path / "samples"), "--target", ARM.name,
                               "-o", str(tmp_path / out), *extra], capture_output=True, text=True)

    assert compile_("fp32.edgec").returncode == 0
    result = compile_("int8.edgec", "--quantize", "int8-weight")
    assert result.returncode == 0, result.stderr[-2000:]
    manifest = Artifact.load(tmp_path / "int8.edgec").manifest
    quantization = manifest["quantization"]
    assert {layer["precision"] for layer in quantization["layers"]} == {"int8-weight"}
    assert quantization["accuracy"]["measured"]["drop"] <= 0.01
    linked = manifest["libraries"][ARM.name]["linked_functions"]
    assert {"edgec_xnn_q8_conv2d_w8", "edgec_xnn_q8_conv2d_add_w8", "edgec_xnn_q8_dense_w8"} <= set(linked)
    assert not {"edgec_xnn_conv2d", "edgec_xnn_conv2d_add", "edgec_xnn_dense"} & set(linked)
    assert (tmp_path / "int8.edgec").stat().st_size < (tmp_path / "fp32.edgec").stat().st_size

    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    got = run_on_arm(arm_host, tmp_path / "int8.edgec", {"x": x}, tmp_path / "run", ARM.name)
    for name, want in onnxruntime_outputs(proto, {"x": x}).items():
        cosine = float(np.dot(got[name].ravel(), want.ravel()) /
                       (np.linalg.norm(got[name]) * np.linalg.norm(want)))
        assert cosine > 0.999, (name, cosine)

    refused = compile_("static.edgec", "--quantize", "int8-static")
    assert refused.returncode != 0 and "int8-weight" in refused.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "static.edgec").exists()


def odd_conv_model(seed: int = 0):
    """x[batch, 8, 13, 11] -> two outputs through convolutions the other models lack: asymmetric
    padding with dilation 2 and strides (1, 2) and a bias, no activation; a depthwise conv with
    channel multiplier 2 whose output feeds a 1x1 conv and its residual add, no relu."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {"wa": (16, 8, 3, 3), "ba": (16,), "wm": (16, 1, 3, 3), "wc": (16, 16, 1, 1)}
    inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n)
             for n, s in weights.items()]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "wa", "ba"], ["y1"], pads=[0, 1, 2, 1],
                          dilations=[2, 2], strides=[1, 2]),
         helper.make_node("Conv", ["x", "wm"], ["m"], group=8, pads=[1, 1, 1, 1]),
         helper.make_node("Conv", ["m", "wc"], ["c"]),
         helper.make_node("Add", ["c", "m"], ["y2"])],
        "odd_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8, 13, 11])],
        [helper.make_tensor_value_info("y1", TensorProto.FLOAT, ["batch", 16, 11, 5]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, ["batch", 16, 13, 11])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_xnnpack_odd_convolutions_match_onnxruntime_under_qemu(arm_host, tmp_path):
    proto = odd_conv_model()
    rng = np.random.default_rng(9)
    samples = [{"x": rng.standard_normal((2, 8, 13, 11)).astype(np.float32)} for _ in range(2)]
    path = build_artifact(proto, "odd_convs", samples, [ARM.name], tmp_path)
    check_xnnpack_library(path)
    for index, sample in enumerate(samples[:1] + [{"x": samples[0]["x"][:1]}]):
        got = run_on_arm(arm_host, path, sample, tmp_path / str(index), ARM.name)
        compare(got, onnxruntime_outputs(proto, sample), "odd_convs", "onnxruntime")


def test_xnnpack_shim_copies_inputs_that_end_at_an_unreadable_page(tmp_path):
    """XNNPACK reads up to XNN_EXTRA_BYTES past an input: tests/native/xnnpack_slack.cc calls the
    shim's dense, conv and depthwise conv on inputs that end where a PROT_NONE page begins.
    Without the shim's padded copy the depthwise conv faults there (measured); with it, all
    three match plain loops."""
    import tvm_ffi.libinfo

    shim = native.xnnpack_shim(ARM.cross_compiler)
    ffi_dir = aarch64_runtime_libraries()[1]
    program = tmp_path / "xnnpack_slack"
    source = Path(__file__).resolve().parents[1] / "native" / "xnnpack_slack.cc"
    include = tvm_ffi.libinfo.find_include_path()
    subprocess.run([ARM.cross_compiler, "-std=c++17", "-O1", f"-I{include}",
                    str(source), *shim.objects, f"-L{ffi_dir}", f"-Wl,-rpath,{ffi_dir}",
                    "-ltvm_ffi", *shim.link_args, "-o", str(program)],
                   check=True, capture_output=True)
    result = subprocess.run([*remote.qemu_prefix(ARM), str(program)], capture_output=True,
                            text=True, timeout=120)
    print(result.stdout.strip())
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
