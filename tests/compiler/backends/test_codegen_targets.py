"""Which target edgec compiles for when none is given, and which library the runtime runs: one rule
(``edgec.runtime.best_for_host``) for both."""

from __future__ import annotations

import json

import pytest

from edgec import runtime
from edgec.cli import main
from edgec.errors import TargetError
from edgec.core.targets import default_target, list_targets


def _entry(arch, features):
    return {"arch": arch, "cpu_features": features, "device": "cpu"}


def test_best_for_host_prefers_most_features_this_cpu_has(monkeypatch):
    monkeypatch.setattr(runtime, "host_arch", lambda: "x86_64")
    monkeypatch.setattr(runtime, "host_cpu_features", lambda: {"avx2", "fma", "avx512f"})
    entries = {
        "plain": _entry("x86_64", ["avx2"]),
        "wide": _entry("x86_64", ["avx2", "fma", "avx512f"]),
        "wider": _entry("x86_64", ["avx2", "fma", "avx512f", "amx_tile"]),  # lacks amx_tile
        "arm": _entry("aarch64", []),
    }
    assert runtime.best_for_host(entries) == "wide"
    assert runtime.best_for_host({"arm": entries["arm"]}) is None
    # The runtime picks an artifact's library by the same rule.
    assert runtime.select_target({"libraries": entries}, None, "a.edgec") == "wide"


def test_default_target_is_the_best_this_machine_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(runtime, "host_arch", lambda: "x86_64")
    monkeypatch.setattr(runtime, "host_cpu_features", lambda: {"avx2", "fma", "f16c"})
    assert default_target().name == "x86_64"
    features = set().union(*(t.cpu_features for t in list_targets()))
    monkeypatch.setattr(runtime, "host_cpu_features", lambda: features)
    assert default_target().name == "x86_64-avx512"
    monkeypatch.setattr(runtime, "host_arch", lambda: "riscv64")
    with pytest.raises(TargetError, match="pass --target"):
        default_target()


def test_compile_without_target_records_the_choice(mlp_dir, tmp_path, capsys):
    out = tmp_path / "m.edgec"
    assert main(["compile", str(mlp_dir / "model.onnx"), "--samples", str(mlp_dir / "samples"),
                 "-o", str(out)]) == 0
    chosen = default_target().name
    assert f"target: {chosen} (default" in capsys.readouterr().err
    assert main(["inspect", "--json", str(out)]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert list(manifest["libraries"]) == [chosen]
    assert manifest["targets_chosen"].startswith(f"default: {chosen}")
    assert main(["inspect", str(out)]) == 0
    assert f"targets: default: {chosen}" in capsys.readouterr().out
