"""Normal use writes what edgec learns into the user's data folder, never into the package's
shipped data (tracked files in a checkout, maybe a read-only folder when installed)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgec.core import locations
from tools.test_tune import pool_model

REPO = Path(__file__).resolve().parent.parent


def _shipped_hashes() -> dict[str, str]:
    folders = (locations.TARGETS_DIR, locations.SHIPPED_AUTOTUNE_DIR, locations.NATIVE_DIR,
               locations.CPP_RUNTIME_DIR)
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in folders for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _git_status() -> str | None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return None
    return subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.slow
def test_compile_bench_tune_train_and_report_write_only_the_users_folder(tmp_path):
    work = tmp_path / "work"
    (work / "samples").mkdir(parents=True)
    onnx.save(pool_model(), str(work / "pool.onnx"))
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.savez(work / "samples" / "sample_000.npz", x=x)
    # The default user folder: $XDG_DATA_HOME/edgec/autotune, nothing set by the suite.
    env = {k: v for k, v in os.environ.items()
           if k not in ("EDGEC_AUTOTUNE_DIR", "EDGEC_MEASUREMENTS_DIR", "EDGEC_DEBUG")}
    env.update(XDG_DATA_HOME=str(tmp_path / "data"), PYTHONPATH=str(REPO))
    shipped, status = _shipped_hashes(), _git_status()

    def edgec(*args: str) -> str:
        result = subprocess.run([sys.executable, "-m", "edgec", *args], cwd=work, env=env,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"edgec {' '.join(args)}: {result.stderr[-2000:]}"
        return result.stdout

    edgec("compile", "pool.onnx", "--samples", "samples", "--target", "x86_64", "-o", "pool.edgec")
    edgec("bench", "pool.edgec", "--samples", "samples", "--runs", "2", "--warmup", "1",
          "--baselines", "onnxruntime", "-o", "bench.json")
    edgec("tune", "pool.onnx", "--target", "x86_64", "--trials", "2")
    edgec("costmodel", "train", "--target", "x86_64")
    edgec("report", "bench.json", "-o", "report")

    user = tmp_path / "data" / "edgec" / "autotune" / "x86_64"
    rows = [json.loads(line) for line in (user / "measurements.jsonl").read_text().splitlines()]
    assert rows and all(r["source"] == "bench" for r in rows)
    records = (user / "tuning_records.jsonl").read_text().splitlines()
    assert sum('"record"' in line for line in records) >= 2
    fitted = json.loads((user / "costmodel.json").read_text())
    # Trained on the shipped rows and the ones bench just added.
    shipped_models = {r["model"] for r in map(json.loads, (
        locations.SHIPPED_AUTOTUNE_DIR / "x86_64" / "measurements.jsonl").read_text().splitlines())}
    assert rows[0]["model"] in fitted["training"]["models"]
    assert shipped_models & set(fitted["training"]["models"])
    assert _shipped_hashes() == shipped
    assert _git_status() == status
