"""Device descriptions: ``edgec/targets/*.toml`` files read into :class:`Target` values.

A target is data. The code for a *kind* of target (an LLVM CPU, CUDA) lives in
``edgec.compiler.backends.llvm`` and is picked by the ``kind`` field.
"""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgec.core.locations import TARGETS_DIR
from edgec.errors import TargetError
from edgec.runtime import best_for_host, host_arch

KNOWN_KINDS = ("llvm", "cuda")
KNOWN_RUN_MODES = ("local", "qemu", "rpc")
KNOWN_LIBRARIES = ("dnnl", "xnnpack")  # [libraries]: oneDNN (x86), XNNPACK (aarch64)


@dataclass(frozen=True)
class Target:
    """One device: the TVM target (JSON form), how to link for it and how to run there."""

    name: str
    description: str
    kind: str
    arch: str
    tvm: dict[str, Any]
    cross_compiler: str = ""
    run: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    # CPU features (as /proc/cpuinfo names them) the compiled code uses: the runtime refuses to
    # load the library on a CPU without them instead of dying on an illegal instruction.
    cpu_features: tuple[str, ...] = ()
    # Native libraries its kernels may call: {"dnnl": True} (x86) or {"xnnpack": True} (aarch64).
    libraries: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "description": self.description, "kind": self.kind,
            "arch": self.arch, "cpu_features": list(self.cpu_features), "tvm": self.tvm,
            "cross_compiler": self.cross_compiler, "run": self.run, "libraries": self.libraries,
        }


def _require(doc: dict, key: str, kind: type, where: str) -> Any:
    if key not in doc:
        raise TargetError(f"target file '{where}' lacks '{key}'; see edgec/targets/x86_64.toml")
    value = doc[key]
    if not isinstance(value, kind):
        raise TargetError(f"target file '{where}': '{key}' must be a {kind.__name__}")
    return value


def _check_keys(doc: dict, known: set[str], where: str, table: str) -> None:
    """Refuse keys not in ``known``, suggesting the closest known one (a typo is the usual cause)."""
    unknown = sorted(set(doc) - known)
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        hints.append(f"'{table}{key}'" + (f" (did you mean '{table}{close[0]}'?)" if close else ""))
    raise TargetError(
        f"target file '{where}' has unknown key(s) {', '.join(hints)}; "
        f"known keys: {', '.join(table + k for k in sorted(known))}"
    )


def parse_target(doc: dict[str, Any], where: str) -> Target:
    """Build a :class:`Target` from a parsed TOML document, naming the field that is wrong."""
    known = {"name", "description", "kind", "arch", "cpu_features", "tvm", "build", "run", "libraries"}
    _check_keys(doc, known, where, "")
    if isinstance(doc.get("build"), dict):
        # A misspelt cross_compiler would silently build for the host instead.
        _check_keys(doc["build"], {"cross_compiler"}, where, "build.")
    if isinstance(doc.get("libraries"), dict):
        # A misspelt library would silently leave its ops to TVM's untuned kernels.
        _check_keys(doc["libraries"], set(KNOWN_LIBRARIES), where, "libraries.")
    kind = _require(doc, "kind", str, where)
    if kind not in KNOWN_KINDS:
        raise TargetError(f"target file '{where}': kind '{kind}' unknown; known: {', '.join(KNOWN_KINDS)}")
    tvm_target = _require(doc, "tvm", dict, where)
    run = doc.get("run", {})
    mode = run.get("mode", "local")
    if mode not in KNOWN_RUN_MODES:
        raise TargetError(
            f"target file '{where}': run.mode '{mode}' unknown; known: {', '.join(KNOWN_RUN_MODES)}"
        )
    return Target(
        name=_require(doc, "name", str, where),
        description=doc.get("description", ""),
        kind=kind,
        arch=_require(doc, "arch", str, where),
        tvm=tvm_target,
        cross_compiler=doc.get("build", {}).get("cross_compiler", ""),
        run=run,
        source=where,
        cpu_features=tuple(doc.get("cpu_features", ())),
        libraries=dict(doc.get("libraries", {})),
    )


def list_targets(directory: Path = TARGETS_DIR) -> list[Target]:
    """Every target described in ``directory``, sorted by name."""
    return [load_target(p) for p in sorted(directory.glob("*.toml"))]


def load_target(name_or_path: str | Path, directory: Path = TARGETS_DIR) -> Target:
    """Load a target by name (a file in ``directory``) or by the path of a TOML file."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = directory / f"{name_or_path}.toml"
        if not path.is_file():
            known = sorted(p.stem for p in directory.glob("*.toml"))
            raise TargetError(f"unknown target '{name_or_path}'; known: {', '.join(known)}")
    elif not path.is_file():
        raise TargetError(f"target file '{path}' does not exist")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TargetError(f"target file '{path}' is not valid TOML: {exc}") from None
    target = parse_target(doc, str(path))
    if path.parent == directory and target.name != path.stem:
        raise TargetError(f"target file '{path}' names itself '{target.name}'; make name match the file")
    return target


def default_target(directory: Path = TARGETS_DIR) -> Target:
    """The target to compile for when none is given: the best one this machine runs.

    Same rule as the runtime's choice of library (``edgec.runtime.best_for_host``): this CPU's
    architecture, no CPU feature it lacks, the most features.
    """

    targets = {t.name: {**t.to_json(), "device": "cpu"} for t in list_targets(directory)
               if t.run.get("mode", "local") == "local"}
    name = best_for_host(targets)
    if name is None:
        raise TargetError(f"no target in '{directory}' runs on this machine ({host_arch()}); "
                          f"pass --target (see `edgec targets`)")
    return load_target(name, directory)
