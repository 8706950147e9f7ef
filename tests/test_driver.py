"""edgec.compile: the stages chained, and the fallback to a simpler plan."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import edgec
from conftest import MLP_SHAPES, mlp_model, mlp_samples
from edgec import driver, runtime
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.core.targets import load_target
from edgec.errors import CompileError

TARGET = load_target("x86_64")


def _samples():
    return [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))]


def test_compile_returns_every_stage_and_runs_like_the_reference(tmp_path):
    compiled = edgec.compile(from_proto(mlp_model()), _samples(), [TARGET])
    assert compiled.plan.regions[0].specializations and not compiled.notes
    assert compiled.profile.sample_count == len(MLP_SHAPES)
    x = mlp_samples([(1, 8)])[0]["x"]
    got = runtime.load(compiled.artifact.save(tmp_path / "m.edgec")).run({"x": x})["y"]
    np.testing.assert_allclose(got, np.maximum(x @ _weight(), 0), rtol=1e-5, atol=1e-5)


def _weight():
    from onnx import numpy_helper

    return numpy_helper.to_array(mlp_model().graph.initializer[0])


def _refuse_specializations(monkeypatch):
    real = driver.build

    def build(model, the_plan, *args, **kwargs):
        if any(r.specializations for r in the_plan.regions):
            raise CompileError("compiling for 'x86_64' failed: a specialization broke")
        return real(model, the_plan, *args, **kwargs)

    monkeypatch.setattr(driver, "build", build)


def test_a_plan_that_does_not_build_falls_back_to_the_symbolic_one_and_says_so(monkeypatch):
    _refuse_specializations(monkeypatch)
    settings = dataclasses.replace(edgec.CompileSettings(), fallback=True)
    compiled = edgec.compile(from_proto(mlp_model()), _samples(), [TARGET], settings)
    assert compiled.plan.settings.policy == "symbolic"
    (note,) = compiled.notes
    assert "specialize-seen plan did not build" in note and "a specialization broke" in note
    assert compiled.artifact.manifest["fallback"]["reason"].endswith("a specialization broke")


def test_without_the_fallback_the_failure_is_the_error(monkeypatch):
    _refuse_specializations(monkeypatch)
    settings = dataclasses.replace(edgec.CompileSettings(), fallback=False)
    with pytest.raises(CompileError, match="a specialization broke"):
        edgec.compile(from_proto(mlp_model()), _samples(), [TARGET], settings)


def test_the_test_suite_runs_without_the_fallback():
    assert edgec.CompileSettings().fallback is False
