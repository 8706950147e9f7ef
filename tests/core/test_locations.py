"""Where edgec reads and writes (``edgec.core.locations``): shipped data found through the package
alone, user state in the user's folder layered over it, and nothing written into the package."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import edgec
from edgec.compiler import native
from edgec.core import locations
from edgec.costmodel.model import default_path, save_path
from edgec.costmodel.store import append_measurements, load_measurements, measurements_path

PACKAGE = Path(edgec.__file__).resolve().parent


def test_shipped_data_resolves_through_the_package_alone(tmp_path):
    """A copy of the ``edgec`` package with nothing of the checkout around it (as a wheel installs
    it) finds its targets, cost models, native sources and C++ host."""
    site = tmp_path / "site"
    shutil.copytree(PACKAGE, site / "edgec", ignore=shutil.ignore_patterns("__pycache__"))
    probe = """
import json
import edgec
from edgec.core import locations
from edgec.core.targets import list_targets, load_target
print(json.dumps({
    "package": edgec.__file__,
    "targets": [t.name for t in list_targets()],
    "x86_64": load_target("x86_64").source,
    "costmodel": str(locations.read_file("x86_64", locations.COSTMODEL_FILE)),
    "native": str(locations.NATIVE_DIR / "dnnl_shim.cc"),
    "cpp": str(locations.CPP_RUNTIME_DIR / "edgec.h"),
}))
"""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path),
           "EDGEC_AUTOTUNE_DIR": str(tmp_path / "user")}
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout)
    copy = site / "edgec"
    assert Path(found["package"]).parent == copy
    assert {"x86_64", "x86_64-avx512", "arm64-cortex-a72"} <= set(found["targets"])
    for key in ("x86_64", "costmodel", "native", "cpp"):
        assert Path(found[key]).is_relative_to(copy) and Path(found[key]).is_file(), key
    assert native.NATIVE_DIR == locations.NATIVE_DIR  # the shims' reader asks the same module


def test_the_user_folder_is_the_variable_else_xdg_else_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("EDGEC_AUTOTUNE_DIR")
    assert locations.user_autotune_root() == tmp_path / "home/.local/share/edgec/autotune"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert locations.user_autotune_root() == tmp_path / "xdg/edgec/autotune"
    monkeypatch.setenv("EDGEC_AUTOTUNE_DIR", str(tmp_path / "mine"))
    assert locations.user_file("x86_64", "a.json") == tmp_path / "mine/x86_64/a.json"


@pytest.fixture
def layers(tmp_path, monkeypatch):
    """A shipped autotune folder and a user one, both temporary."""
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    monkeypatch.setattr(locations, "SHIPPED_AUTOTUNE_DIR", shipped)
    monkeypatch.setenv("EDGEC_AUTOTUNE_DIR", str(user))
    monkeypatch.delenv("EDGEC_MEASUREMENTS_DIR")
    return shipped, user


def test_a_cost_model_is_read_from_the_user_first_and_saved_there(layers):
    shipped, user = layers
    assert default_path("t") == save_path("t") == user / "t" / "costmodel.json"  # neither exists
    (shipped / "t").mkdir(parents=True)
    (shipped / "t" / "costmodel.json").write_text("{}")
    assert default_path("t") == shipped / "t" / "costmodel.json"
    save_path("t").parent.mkdir(parents=True)
    save_path("t").write_text("{}")
    assert default_path("t") == user / "t" / "costmodel.json"


def test_measurements_merge_the_shipped_rows_and_append_to_the_users(layers, monkeypatch):
    shipped, user = layers
    (shipped / "t").mkdir(parents=True)
    (shipped / "t" / "measurements.jsonl").write_text('{"shipped": 1}\n')
    before = (shipped / "t" / "measurements.jsonl").read_bytes()
    assert append_measurements("t", [{"mine": 2}]) == user / "t" / "measurements.jsonl"
    assert load_measurements("t") == [{"shipped": 1}, {"mine": 2}]
    assert (shipped / "t" / "measurements.jsonl").read_bytes() == before
    # A store of its own (EDGEC_MEASUREMENTS_DIR) is read and written alone.
    monkeypatch.setenv("EDGEC_MEASUREMENTS_DIR", str(user / "own"))
    append_measurements("t", [{"own": 3}])
    assert measurements_path("t") == user / "own" / "t" / "measurements.jsonl"
    assert load_measurements("t") == [{"own": 3}]
