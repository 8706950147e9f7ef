"""The package's imports run one way: read from the source, every edgec module's imports of other
edgec modules go to its own layer or one below, and no chain of imports comes back to where it
started. Function-level imports count the same (they only defer the cost), so a layer cannot be
crossed by hiding an import inside a function; they are kept for optional extras (torch,
cryptography) and the CLI, which loads each command's library when that command runs so that
``edgec --help`` does not load TVM."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "edgec"

# From the bottom up; a module belongs to the first entry its name starts with. The runtime and
# the error types are what a device installs; the stages follow the data (profile -> report).
LAYERS = [
    ("edgec.errors", "edgec.fileio", "edgec.signing", "edgec.runtime"),
    ("edgec.core", "edgec.zoo"),
    ("edgec.compiler.native", "edgec.compiler.ir", "edgec.compiler.tuning_database"),
    ("edgec.compiler.importer",),
    ("edgec.compiler.transform",),
    ("edgec.compiler.backends",),
    ("edgec.compiler.pipeline",),
    ("edgec.costmodel",),
    ("edgec.stages.profile",),
    ("edgec.stages.plan",),
    ("edgec.stages.quantize",),
    ("edgec.stages.build",),
    ("edgec.stages.bench", "edgec.stages.measure"),
    ("edgec.stages.report",),
    ("edgec.driver",),
    ("edgec.tools",),
    ("edgec.cli", "edgec.__main__"),
]


# Modules that need an optional extra: imported inside the function that needs them, and not
# counted in the cycle check (a module without the extra never reaches them).
OPTIONAL_EXTRAS = {"edgec.core.torch_program": "torch", "edgec.compiler.importer.from_torch": "torch",
                   "edgec.signing": "cryptography"}
LAZY_IMPORTERS = ("edgec.cli",)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(name: str) -> int:
    for rank, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return rank
    raise AssertionError(f"module {name} is in no layer of tests/test_layers.py: add it")


def edgec_imports(path: Path, only_nested: bool = False) -> set[str]:
    """The edgec modules ``path`` imports, anywhere in it (``from edgec.x import y`` counts as
    ``edgec.x.y`` when that is a module, else ``edgec.x``); ``only_nested``: only the imports
    inside functions."""
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = ast.walk(tree)
    if only_nested:
        nodes = (n for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules
                     else node.module for alias in node.names]
        else:
            continue
        found |= {name for name in names if name == "edgec" or name.startswith("edgec.")}
    return found - {"edgec"}


def import_graph() -> dict[str, set[str]]:
    return {module_name(p): edgec_imports(p) for p in PACKAGE.rglob("*.py")}


def test_function_level_imports_are_for_optional_extras_or_the_cli():
    nested = [f"{module_name(p)} imports {target} inside a function"
              for p in PACKAGE.rglob("*.py") if module_name(p) not in LAZY_IMPORTERS
              for target in sorted(edgec_imports(p, only_nested=True))
              if target not in OPTIONAL_EXTRAS]
    assert not nested, "\n".join(nested)


def test_no_relative_imports():
    relative = [f"{p.relative_to(PACKAGE.parent)}:{n.lineno}" for p in PACKAGE.rglob("*.py")
                for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert not relative, relative


def test_every_import_goes_to_the_same_layer_or_below():
    upward = [f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
              for module, targets in import_graph().items() for target in sorted(targets)
              if layer_of(target) > layer_of(module)]
    assert not upward, "\n".join(upward)


def test_there_is_no_import_cycle():
    graph = {module: {t for t in targets if t not in OPTIONAL_EXTRAS}
             for module, targets in import_graph().items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_runtime_imports_nothing_of_the_compiler():
    for module, targets in import_graph().items():
        if module.startswith("edgec.runtime"):
            assert all(layer_of(t) == 0 for t in targets), (module, targets)


def test_the_runtime_needs_neither_pandas_nor_matplotlib():
    """What a device installs (the runtime wheel) declares numpy and tvm_ffi only: the table and
    plotting libraries the bench and report stages use stay on the compiler's side."""
    runtime_files = [*PACKAGE.glob("runtime/**/*.py"), PACKAGE / "errors.py", PACKAGE / "fileio.py",
                     PACKAGE / "signing.py"]
    for path in runtime_files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] in ("pandas", "matplotlib") for n in names), path


def test_the_checker_sees_an_upward_import(tmp_path):
    # The rule is not vacuous: a stage importing a later one is caught.
    assert layer_of("edgec.stages.plan") < layer_of("edgec.stages.build")
    assert "edgec.stages.build" in import_graph()["edgec.driver"]
