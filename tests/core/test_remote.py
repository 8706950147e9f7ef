"""``edgec.core.remote``: where a target's library runs. ``edgec run`` / ``edgec bench`` for a qemu
target run its aarch64 library under qemu in the cross-compiled C++ host (numerics compared with
the x86 library; timings marked as not meaningful). RPC targets are in ``test_rpc.py``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgec import runtime, zoo
from edgec.core import remote
from edgec.core.targets import load_target

ARM = load_target("arm64-cortex-a72")


def test_run_mode_comes_from_the_target_file(tmp_path):
    assert remote.run_mode(None) == "local"
    assert remote.run_mode("x86_64") == "local"
    assert remote.run_mode("arm64-cortex-a72") == "qemu"
    assert remote.run_mode("no-such-target") == "local"  # a library name without a file
    assert set(remote.TIMING) == {"local", "rpc", "qemu"}


def test_output_file_names_follow_the_cpp_host():
    assert remote._file_name("logits") == "logits"
    assert remote._file_name("out/0:x") == "out_0_x"
    assert remote._file_name(".hidden") == "_.hidden"


_missing = [t for t in (ARM.cross_compiler, ARM.run["qemu"], "make") if shutil.which(t) is None]


def test_qemu_prefix_takes_the_c_library_from_the_sysroot():
    if shutil.which(ARM.run["qemu"]) is None or not Path(ARM.run["sysroot"]).is_dir():
        pytest.skip("needs qemu-aarch64 and the aarch64 sysroot "
                    "(scripts/install-system-deps.sh cross)")
    sysroot = ARM.run["sysroot"]
    assert remote.qemu_prefix(ARM) == [ARM.run["qemu"], "-L", sysroot,
                                       "-E", f"LD_LIBRARY_PATH={sysroot}/lib"]


@pytest.mark.slow
@pytest.mark.skipif(bool(_missing) or not Path(ARM.run["sysroot"]).is_dir(),
                    reason=f"needs {', '.join(_missing) or ARM.run['sysroot']} "
                           f"(scripts/install-system-deps.sh cross)")
def test_qemu_run_and_bench_cli_match_x86(tmp_path):
    from edgec.compiler import native
    from edgec.errors import ToolchainError

    try:  # the arm64 targets' convolutions go to XNNPACK
        native.xnnpack_shim(ARM.cross_compiler)
    except ToolchainError as exc:
        pytest.skip(str(exc))
    zoo.export("cnn", tmp_path / "cnn")
    model, samples = tmp_path / "cnn" / "model.onnx", tmp_path / "cnn" / "samples"
    artifact = tmp_path / "cnn.edgec"
    edgec = [sys.executable, "-m", "edgec"]
    subprocess.run([*edgec, "compile", str(model), "--samples", str(samples), "--target", "x86_64",
                    "--target", ARM.name, "-o", str(artifact)], check=True, capture_output=True)
    first, out = sorted(samples.glob("*.npz"))[0], tmp_path / "out.npz"
    result = subprocess.run([*edgec, "run", str(artifact), "--inputs", str(first), "--target",
                             ARM.name, "-o", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    expected = runtime.load(artifact).run(dict(np.load(first)))
    with np.load(out) as written:
        assert sorted(written.files) == sorted(expected)
        for name, value in expected.items():
            assert np.abs(written[name] - value).max() <= 1e-4 * max(1.0, np.abs(value).max())

    result = subprocess.run([*edgec, "bench", str(artifact), "--samples", str(samples), "--target",
                             ARM.name, "--runs", "1", "--warmup", "0",
                             "-o", str(tmp_path / "bench.json")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["target"] == ARM.name and bench["run"]["mode"] == "qemu"
    assert bench["run"]["timing"].startswith("not meaningful")
    assert bench["accuracy"]["max_rel"] < 1e-4
