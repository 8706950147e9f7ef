"""The GitHub Actions template in ci/ stays consistent with the CLI and the repo it refers to."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "ci" / "github-actions-devices.yml"


def _runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_device_matrix_jobs_report_and_gate():
    workflow = yaml.safe_load(TEMPLATE.read_text())
    jobs = workflow["jobs"]
    assert {"x86", "arm-qemu", "pi4", "jetson"} <= set(jobs)
    assert "raspberry-pi-4" in jobs["pi4"]["runs-on"] and "jetson-orin" in jobs["jetson"]["runs-on"]
    for name in ("x86", "pi4", "jetson"):
        script = _runs(jobs[name])
        assert "edgec report" in script and "--compare" in script and "GITHUB_STEP_SUMMARY" in script
    assert "qemu" in _runs(jobs["arm-qemu"])


def test_template_refers_to_scripts_and_targets_that_exist():
    text = TEMPLATE.read_text()
    for script in set(re.findall(r"scripts/[\w.-]+\.sh", text)):
        assert (ROOT / script).is_file(), script
    for target in ("x86_64", "arm64-cortex-a72"):
        assert f"--target {target}" in text and (ROOT / "edgec" / "targets" / f"{target}.toml").is_file()


def test_jobs_that_install_arm64_packages_run_on_debian():
    """The cross group installs Debian's arm64 XNNPACK (dpkg --add-architecture arm64): a plain
    Ubuntu runner's archive has no arm64 packages, so those jobs run in a Debian 12 container."""
    jobs = yaml.safe_load(TEMPLATE.read_text())["jobs"]
    crossing = [name for name, job in jobs.items()
                if re.search(r"install-system-deps\.sh[^\n]*\bcross\b", _runs(job))]
    assert crossing
    for name in crossing:
        assert str(jobs[name].get("container", "")).startswith("debian:12"), name
        assert "sudo " not in _runs(jobs[name]), name  # the container runs as root, without sudo
