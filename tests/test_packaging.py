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
    # Every file of the package that is not Python is data edgec reads (dot files are for its
    # developers: runtime/cpp/.clang-format).
    data = sorted(p for p in package.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc")
                  and not p.name.startswith(".") and "__pycache__" not in p.parts)
    for path in data:
        name = path.relative_to(source).as_posix()
        assert members.get(name) == path.read_bytes(), f"{name} is not in the wheel as it is here"
    # Among them, everything edgec.core.locations names.
    names = {p.relative_to(source).as_posix() for p in data}
    for directory, example in ((locations.TARGETS_DIR, "x86_64.toml"),
                               (locations.SHIPPED_AUTOTUNE_DIR, "x86_64/costmodel.json"),
                               (locations.SHIPPED_AUTOTUNE_DIR, "x86_64/measurements.jsonl"),
                               (locations.NATIVE_DIR, "dnnl_shim.cc"),
                               (locations.CPP_RUNTIME_DIR, "edgec.h")):
        relative = (directory / example).relative_to(locations.PACKAGE_DIR.parent).as_posix()
        assert relative in names, relative
