"""CUDA libraries on a real GPU: the artifact's CUDA library gives the CPU library's outputs, and
the runtime reports how long each takes (printed; no timed assertions).

Skipped, with the reason, on a machine without an NVIDIA GPU and driver, or without ``nvcc`` to
build the CUDA library. ``scripts/gpu-check.sh`` runs this file on a GPU machine.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from edgec import runtime
from edgec.errors import ToolchainError
from edgec.core.targets import list_targets
from runtime.test_cpp_host import zoo_artifact

# float32 kernels on the GPU (other reduction orders, fast intrinsics) vs LLVM's on the CPU.
TOLERANCE = 1e-4
RUNS = 50

_capability = runtime._cuda_capability()


def gpu_target() -> str | None:
    """The CUDA target for this host whose arch is the highest this GPU can run."""
    if isinstance(_capability, str):
        return None
    have = _capability[0] * 10 + _capability[1]
    fitting = [(int(t.tvm["arch"][3:]), t.name) for t in list_targets()
               if t.kind == "cuda" and t.arch == runtime.host_arch() and int(t.tvm["arch"][3:]) <= have]
    return max(fitting)[1] if fitting else None


def _skip_reason() -> str:
    if isinstance(_capability, str):
        return f"no GPU: {_capability}"
    if gpu_target() is None:
        return f"no target in edgec/targets/ for this {runtime.host_arch()} host and sm_{_capability[0]}{_capability[1]}"
    try:
        from edgec.compiler.backends.cuda import find_nvcc

        find_nvcc()
    except ToolchainError as exc:
        return str(exc)
    return ""


pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(_skip_reason()), reason=_skip_reason())]


def p50_ms(model: runtime.Model, inputs: dict[str, np.ndarray]) -> float:
    for _ in range(5):
        model.run(inputs)
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        model.run(inputs)
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


@pytest.mark.parametrize("name", ["cnn", "early_exit"])
def test_gpu_matches_cpu(tmp_path, name):
    target = gpu_target()
    path, samples = zoo_artifact(name, ["x86_64" if runtime.host_arch() == "x86_64"
                                        else "arm64-cortex-a72", target], tmp_path)
    cpu = runtime.load(path)
    gpu = runtime.load(path, target=target)
    assert (cpu.device, gpu.device) == ("cpu", "cuda")
    if name == "early_exit":  # both branches and the symbolic fallback (batch 3)
        samples = samples[:4] + [{"image": np.concatenate([samples[0]["image"]] * 3)}]
    for sample in samples:
        expected, got = cpu.run(sample), gpu.run(sample)
        for key, value in expected.items():
            assert got[key].shape == value.shape and got[key].dtype == value.dtype
            scale = max(1.0, float(np.abs(value).max()))
            assert float(np.abs(got[key] - value).max()) <= TOLERANCE * scale, (name, key)
    cpu_ms, gpu_ms = p50_ms(cpu, samples[0]), p50_ms(gpu, samples[0])
    diff = max(float(np.abs(gpu.run(s)[k] - v).max()) for s in samples for k, v in cpu.run(s).items())
    print(f"\n{name} on {target}: p50 per call (runtime.run, with copies) gpu {gpu_ms:.3f} ms, "
          f"cpu {cpu_ms:.3f} ms ({runtime.default_threads()} threads), ratio gpu/cpu "
          f"{gpu_ms / cpu_ms:.3f}; max abs diff {diff:.3g} over {len(samples)} samples")


def test_fp16_artifact_runs_on_the_gpu_close_to_fp32(tmp_path):
    """`--quantize fp16`: the GPU library in half precision; its outputs within fp16's error of
    the CPU library's (fp32), and the manifest holds the accuracy measured on this GPU."""
    from edgec import zoo
    from edgec.cli import main

    target = gpu_target()
    cpu_target = "x86_64" if runtime.host_arch() == "x86_64" else "arm64-cortex-a72"
    entry = zoo.get("cnn")
    zoo.export("cnn", tmp_path / "cnn")
    zoo.export("cnn", tmp_path / "held_out", seed=1)
    out = tmp_path / "cnn_fp16.edgec"
    assert main(["compile", str(tmp_path / "cnn" / "model.onnx"), "--samples",
                 str(tmp_path / "cnn" / "samples"), "--held-out-samples",
                 str(tmp_path / "held_out" / "samples"), "--target", target, "--target",
                 cpu_target, "--quantize", "fp16", "-o", str(out)]) == 0
    cpu, gpu = runtime.load(out, target=cpu_target), runtime.load(out, target=target)
    quantization = gpu.manifest["quantization"]
    assert quantization["mode"] == "fp16" and quantization["accuracy"]["measured"] is not None
    for sample in entry.make_samples(entry.default_samples, 0):
        expected, got = cpu.run(sample), gpu.run(sample)
        for key, value in expected.items():
            scale = max(1.0, float(np.abs(value).max()))
            assert float(np.abs(got[key] - value).max()) <= 1e-2 * scale, key
