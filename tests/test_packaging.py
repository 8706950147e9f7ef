"""The ``edgec`` wheel holds everything edgec reads at run time, not only its Python modules: an
installed edgec has no checkout beside it (``edgec.core.locations``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edgec.core import locations

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_wheel_ships_targets_autotune_data_and_native_sources(tmp_path):
    # Built from a copy: pip leaves build/ and *.egg-info in the source folder, and a stale
    # build/ there could put files that no longer exist into the wheel.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "edgec", source / "edgec",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    isolation: list[str] = []
    try:
        import setuptools  # noqa: F401 - present: build with it, without PyPI
        isolation = ["--no-build-isolation"]
    except ImportError:
        pass
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
                             "-w", str(tmp_path / "dist"), str(source)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("edgec-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}

    package = source / "edgec"
    data = {
        "targets": sorted((package / "targets").glob("*.toml")),
        "autotune": sorted(p for p in (package / "autotune").rglob("*") if p.is_file()),
        "native": sorted(p for p in (package / "native").iterdir() if p.suffix in (".cc", ".h")),
        # The C++ host's sources and Makefile; its .clang-format is for its developers.
        "runtime/cpp": sorted(p for p in (package / "runtime" / "cpp").iterdir()
                              if p.is_file() and not p.name.startswith(".")),
    }
    # What edgec.core.locations reads is what this test expects the wheel to hold.
    for folder, directory in (("targets", locations.TARGETS_DIR),
                              ("autotune", locations.SHIPPED_AUTOTUNE_DIR),
                              ("native", locations.NATIVE_DIR),
                              ("runtime/cpp", locations.CPP_RUNTIME_DIR)):
        assert directory == locations.PACKAGE_DIR / folder
        assert data[folder], folder
    assert package / "targets" / "x86_64.toml" in data["targets"]
    assert package / "autotune" / "x86_64" / "costmodel.json" in data["autotune"]
    assert package / "native" / "dnnl_shim.cc" in data["native"]
    for path in (p for paths in data.values() for p in paths):
        name = path.relative_to(source).as_posix()
        assert members.get(name) == path.read_bytes(), f"{name} is not in the wheel as it is here"
