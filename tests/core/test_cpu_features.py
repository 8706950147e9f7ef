"""A library built for CPU features this machine lacks is refused, not run into SIGILL."""

import pytest

from edgec.errors import ArtifactError
from edgec.runtime import host_arch, host_cpu_features, select_target

MANIFEST = {"libraries": {
    "fancy": {"arch": host_arch(), "device": "cpu", "cpu_features": ["no-such-feature-xyz"]},
    "plain": {"arch": host_arch(), "device": "cpu", "cpu_features": sorted(host_cpu_features())[:2]},
    "other": {"arch": "riscv64", "device": "cpu", "cpu_features": ["v"]},
}}


def test_automatic_choice_skips_libraries_this_cpu_cannot_run():
    assert select_target(MANIFEST, None, "a.edgec") == "plain"


def test_naming_a_library_this_cpu_cannot_run_is_refused():
    with pytest.raises(ArtifactError, match="needs CPU features this CPU lacks: no-such-feature-xyz"):
        select_target(MANIFEST, "fancy", "a.edgec")
    assert select_target(MANIFEST, "other", "a.edgec") == "other", "other arches are not checked here"


def test_no_runnable_library_names_the_arch():
    only_fancy = {"libraries": {"fancy": MANIFEST["libraries"]["fancy"]}}
    with pytest.raises(ArtifactError, match="no library for this machine"):
        select_target(only_fancy, None, "a.edgec")
