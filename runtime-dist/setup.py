"""Build the ``edgec-runtime`` wheel: edgec's runtime package and TVM's runtime, no compiler.

At build time this copies, from the checkout around this folder, ``edgec/__init__.py``,
``edgec/errors.py``, ``edgec/fileio.py``, ``edgec/signing.py`` (signature checks; needs the ``signing`` extra) and the
``edgec/runtime`` package (Python modules and the C++ header, sources
and Makefile) into ``build/src``, and ``libtvm_runtime.so`` with ``libtvm_runtime_extra.so``
(sort/top-k and random kernels) into ``edgec/runtime/lib/``, where the loader looks first. The
libraries come from the apache-tvm wheel pinned in ``pyproject.toml``'s build requirements (found
without importing tvm), or from the wheel file ``EDGEC_TVM_WHEEL`` names (another architecture's,
to build a device's runtime on this machine). The wheel is tagged ``py3-none-<platform of that
apache-tvm wheel>``: the libraries are its only native code.

Only wheels are supported: an sdist would lack the checkout's ``edgec/``.
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from importlib import metadata
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "edgec"
STAGE = HERE / "build" / "src"
TVM_VERSION = "0.27.0.post1"
LIBRARIES = ("libtvm_runtime.so", "libtvm_runtime_extra.so")


def _version() -> str:
    match = re.search(r'__version__ = "([^"]+)"', (PACKAGE / "__init__.py").read_text())
    if not match:
        raise SystemExit(f"no __version__ in {PACKAGE / '__init__.py'}")
    return match.group(1)


def _libraries_from_wheel(wheel: Path) -> tuple[dict[str, bytes], str]:
    """The runtime libraries of an apache-tvm wheel file and that wheel's platform tag."""
    name, version, _python, _abi, platform = wheel.name[: -len(".whl")].split("-")
    if name != "apache_tvm" or version != TVM_VERSION:
        raise SystemExit(f"EDGEC_TVM_WHEEL={wheel} is not apache-tvm {TVM_VERSION}")
    with zipfile.ZipFile(wheel) as archive:
        return {lib: archive.read(f"tvm/lib/{lib}") for lib in LIBRARIES}, platform


def _installed_libraries() -> tuple[dict[str, bytes], str]:
    """The runtime libraries of the installed apache-tvm and the platform tag its wheel carried."""
    try:
        dist = metadata.distribution("apache-tvm")
    except metadata.PackageNotFoundError:
        raise SystemExit(f"apache-tvm=={TVM_VERSION} is not installed in the build environment "
                         f"(keep build isolation on, or set EDGEC_TVM_WHEEL)") from None
    if dist.version != TVM_VERSION:
        raise SystemExit(f"the build environment has apache-tvm {dist.version}, need {TVM_VERSION}")
    paths = {lib: Path(dist.locate_file(f"tvm/lib/{lib}")) for lib in LIBRARIES}
    tags = re.findall(r"^Tag: (\S+)$", dist.read_text("WHEEL") or "", re.MULTILINE)
    platform = ".".join(sorted({tag.split("-")[2] for tag in tags}))
    missing = [str(path) for path in paths.values() if not path.is_file()]
    if missing or not platform:
        raise SystemExit(f"apache-tvm in the build environment lacks {missing or 'a platform tag'}")
    return {lib: path.read_bytes() for lib, path in paths.items()}, platform


def _stage() -> str:
    """Copy the runtime's sources and libraries into ``build/src``; return the platform tag."""
    if not (PACKAGE / "runtime" / "__init__.py").is_file():
        raise SystemExit(f"{PACKAGE} not found: build edgec-runtime from an edgec checkout")
    shutil.rmtree(STAGE, ignore_errors=True)
    runtime = STAGE / "edgec" / "runtime"
    (runtime / "cpp").mkdir(parents=True)
    (runtime / "lib").mkdir()
    for name in ("__init__.py", "errors.py", "fileio.py", "signing.py"):
        shutil.copy2(PACKAGE / name, STAGE / "edgec" / name)
    for path in (PACKAGE / "runtime").glob("*.py"):
        shutil.copy2(path, runtime / path.name)
    for path in (PACKAGE / "runtime" / "cpp").iterdir():
        if path.is_file() and not path.name.startswith("."):
            shutil.copy2(path, runtime / "cpp" / path.name)
    wheel = os.environ.get("EDGEC_TVM_WHEEL")
    libraries, platform = _libraries_from_wheel(Path(wheel)) if wheel else _installed_libraries()
    for lib, data in libraries.items():
        (runtime / "lib" / lib).write_bytes(data)
        (runtime / "lib" / lib).chmod(0o755)
    return platform


PLATFORM = _stage()


class NativeDistribution(Distribution):
    """Not pure: it carries TVM's runtime libraries for one platform (installed to platlib)."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """Tagged for any Python 3: the libraries are not Python extensions."""

    def get_tag(self):
        return "py3", "none", PLATFORM


setup(
    version=_version(),
    packages=["edgec", "edgec.runtime"],
    package_dir={"": os.path.relpath(STAGE, HERE)},
    package_data={"edgec.runtime": [f"lib/{lib}" for lib in LIBRARIES] + ["cpp/*"]},
    include_package_data=False,
    distclass=NativeDistribution,
    cmdclass={"bdist_wheel": PlatformWheel},
    zip_safe=False,
)
