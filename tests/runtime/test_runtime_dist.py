"""The runtime-only distribution (``runtime-dist/``): build the ``edgec-runtime`` wheel, install it
into a fresh venv without apache-tvm, run a zoo artifact there and compare with this environment.

Also measures, and prints (``pytest -s``), what a device pays: installed size, cold load time of
``edgec.runtime.load`` in a fresh process, and per-call overhead of ``Model.run`` over a raw VM
call.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import numpy as np
import pytest

from edgec import runtime
from runtime.test_cpp_host import CPP_DIR, missing_tools, zoo_artifact

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

# Runs inside the fresh venv: load, run, time; prints one JSON line.
PROBE = textwrap.dedent("""
    import importlib.util, json, statistics, sys, time
    start = time.perf_counter()
    import numpy as np
    numpy_done = time.perf_counter()
    import edgec.runtime as rt
    import_done = time.perf_counter()
    model = rt.load(sys.argv[1])
    load_done = time.perf_counter()
    inputs = dict(np.load(sys.argv[2]))
    np.savez(sys.argv[3], **model.run(inputs))
    args = model.to_device_args(inputs)
    runs, raws = [], []
    for i in range(int(sys.argv[4])):
        t0 = time.perf_counter()
        model.run(inputs)
        t1 = time.perf_counter()
        model.raw_call(args)
        t2 = time.perf_counter()
        if i >= 10:
            runs.append(t1 - t0)
            raws.append(t2 - t1)
    print(json.dumps({
        "tvm_importable": importlib.util.find_spec("tvm") is not None,
        "compiler_loaded": "libtvm_compiler" in open("/proc/self/maps").read(),
        "runtime_file": rt._runtime_library().as_posix(),
        "import_numpy_s": numpy_done - start, "import_runtime_s": import_done - numpy_done,
        "load_s": load_done - import_done,
        "run_us": statistics.median(runs) * 1e6, "raw_us": statistics.median(raws) * 1e6,
    }))
""")


def _tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _site_packages_sizes(env: Path) -> dict[str, int]:
    """Bytes per top-level entry of the venv's site-packages, dist-info folded into its package."""
    (site,) = env.glob("lib/python*/site-packages")
    sizes: dict[str, int] = {}
    for entry in site.iterdir():
        name = entry.name.split("-")[0].lower().removesuffix(".libs").removesuffix(".pth")
        name = {"_distutils_hack": "setuptools", "distutils": "setuptools"}.get(name, name)
        sizes[name] = sizes.get(name, 0) + _tree_bytes(entry)
    return sizes


def _device_environ() -> dict[str, str]:
    """This process's environment without what would point the device venv at this checkout."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "EDGEC_TVM_RUNTIME", "TVM_NUM_THREADS")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy beside a link to edgec/, so the build's staging stays out of the checkout.
    root = tmp_path_factory.mktemp("dist")
    shutil.copytree(REPO / "runtime-dist", root / "runtime-dist",
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "dist"))
    (root / "edgec").symlink_to(REPO / "edgec", target_is_directory=True)
    out = root / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out),
         str(root / "runtime-dist")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    (path,) = out.glob("edgec_runtime-*.whl")
    return path


@pytest.fixture(scope="module")
def device_env(wheel, tmp_path_factory) -> Path:
    """A fresh venv with only the runtime wheel and its dependencies."""
    env = tmp_path_factory.mktemp("device") / "venv"
    venv.EnvBuilder(with_pip=True, symlinks=True).create(env)
    result = subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet",
                             str(wheel)], capture_output=True, text=True)
    if result.returncode != 0 and "No matching distribution" in result.stderr:
        pytest.skip(f"cannot install the wheel's dependencies here: {result.stderr[-300:]}")
    assert result.returncode == 0, result.stderr[-2000:]
    return env


def test_wheel_holds_the_runtime_and_libtvm_runtime_only(wheel):
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("/METADATA"))).decode()
    assert "edgec/runtime/lib/libtvm_runtime.so" in names
    assert "edgec/runtime/lib/libtvm_runtime_extra.so" in names
    assert "edgec/runtime/cpp/edgec.h" in names and "edgec/runtime/cpp/Makefile" in names
    assert not [n for n in names if "libtvm_compiler" in n or n.startswith("edgec/compiler")]
    requires = sorted(line.split(": ", 1)[1] for line in metadata.splitlines()
                      if line.startswith("Requires-Dist: "))
    assert requires == ["apache-tvm-ffi==0.1.14.post1", 'cryptography==50.0.2; extra == "signing"',
                        "numpy<3,>=2.0"]
    assert "edgec/signing.py" in names  # signature checks, with the optional 'signing' extra


def test_fresh_env_runs_an_artifact_like_this_env(device_env, tmp_path):
    path, samples = zoo_artifact("cnn", ["x86_64"], tmp_path)
    np.savez(tmp_path / "in.npz", **samples[0])
    python = str(device_env / "bin" / "python")
    clean_env = _device_environ()
    clean_env["TVM_NUM_THREADS"] = "1"  # the same pool size for run and raw call in every probe
    probes = []
    for index in range(3):  # fresh processes: import and load are cold each time
        result = subprocess.run(
            [python, "-c", PROBE, str(path), str(tmp_path / "in.npz"),
             str(tmp_path / f"out{index}.npz"), "200" if index == 0 else "11"],
            capture_output=True, text=True, env=clean_env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        probes.append(json.loads(result.stdout.strip().splitlines()[-1]))
    probe = probes[0]
    assert not probe["tvm_importable"] and not probe["compiler_loaded"]
    assert str(device_env) in probe["runtime_file"]

    expected = runtime.load(path).run(samples[0])
    with np.load(tmp_path / "out0.npz") as got:
        assert sorted(got.files) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-6)

    sizes = _site_packages_sizes(device_env)
    venv_tools = sum(sizes.get(k, 0) for k in ("pip", "setuptools", "pkg_resources"))
    runtime_bytes = sum(sizes.values()) - sizes.get("numpy", 0) - venv_tools
    median = lambda key: sorted(p[key] for p in probes)[1]  # noqa: E731
    figures = {
        "installed_mb_without_numpy_and_pip": round(runtime_bytes / 1e6, 2),
        "installed_mb_by_package": {k: round(v / 1e6, 2) for k, v in sorted(sizes.items())},
        "cold_import_numpy_ms": round(median("import_numpy_s") * 1e3, 1),
        "cold_import_edgec_runtime_ms": round(median("import_runtime_s") * 1e3, 1),
        "cold_load_ms": round(median("load_s") * 1e3, 1),
        "run_us": round(probe["run_us"], 1), "raw_call_us": round(probe["raw_us"], 1),
        "run_overhead_us": round(probe["run_us"] - probe["raw_us"], 1),
    }
    print("\nruntime-dist figures:", json.dumps(figures, indent=1))
    assert runtime_bytes < 25e6, figures  # runtime + tvm_ffi + libtvm_runtime: a few MB
    assert figures["cold_load_ms"] < 5000, figures


def test_signatures_on_a_device_without_and_with_the_signing_extra(device_env, wheel, mlp_artifact, tmp_path):
    """Without the 'signing' extra, requiring a signature names the extra to install (unsigned
    loads never need it); after installing cryptography, the same load checks the signature."""
    from edgec.signing import generate_keypair, load_private_key, sign_artifact
    from edgec.runtime.artifact import Artifact

    private, public = generate_keypair(tmp_path / "key")
    signed = sign_artifact(Artifact.load(mlp_artifact), load_private_key(private)).save(tmp_path / "s.edgec")
    script = ("import sys, edgec.runtime as rt\n"
              "try:\n    rt.load(sys.argv[1], require_signature=sys.argv[2]); print('verified')\n"
              "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    python = str(device_env / "bin" / "python")

    def probe() -> str:
        result = subprocess.run([python, "-c", script, str(signed), str(public)], capture_output=True,
                                text=True, env=_device_environ(), cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout.strip()

    has_crypto = subprocess.run([python, "-c", "import cryptography"], capture_output=True).returncode == 0
    if not has_crypto:
        assert probe().startswith("ToolchainError") and "edgec-runtime[signing]" in probe()
        result = subprocess.run([python, "-m", "pip", "install", "--quiet", "cryptography==50.0.2"],
                                capture_output=True, text=True)
        if result.returncode != 0:
            pytest.skip(f"cannot install cryptography here: {result.stderr[-300:]}")
    assert probe() == "verified"


@pytest.mark.skipif(bool(missing_tools("g++", "make")), reason="needs g++ and make")
def test_cpp_host_builds_against_the_runtime_wheel(device_env, tmp_path):
    """The C++ embedding needs nothing from the compiler either: the Makefile finds the wheel's
    bundled libtvm_runtime.so and tvm_ffi's headers and library in the device venv."""
    build = tmp_path / "build"
    (cpp_dir,) = device_env.glob("lib/python*/site-packages/edgec/runtime/cpp")
    shipped = sorted(p.name for p in CPP_DIR.iterdir() if p.is_file() and p.name[0] != ".")
    assert sorted(p.name for p in cpp_dir.iterdir()) == shipped
    result = subprocess.run(["make", "-s", "-C", str(cpp_dir), f"BUILD_DIR={build}",
                             f"PYTHON={device_env / 'bin' / 'python'}"],
                            capture_output=True, text=True, env=_device_environ())
    assert result.returncode == 0, result.stderr[-2000:]
    needed = subprocess.run(["ldd", str(build / "edgec_run")], capture_output=True,
                            text=True).stdout
    runtime_line = next(line for line in needed.splitlines() if "libtvm_runtime.so" in line)
    assert str(device_env) in runtime_line and "not found" not in needed
    shutil.rmtree(build)
