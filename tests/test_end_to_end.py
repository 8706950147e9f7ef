"""The whole pipeline on the zoo: profile, plan, build, load with the runtime, compare with onnxruntime.

Every sample must match, and so must samples drawn with another seed. The plan specializes only the
most frequent shape, so other samples exercise the symbolic fallback.
"""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from edgec import runtime, zoo
from edgec.stages.bench import compare_outputs
from edgec.stages.build import build
from edgec.core.model import from_proto
from edgec.stages.plan import PlanSettings, plan
from edgec.stages.profile import profile
from edgec.core.reference import reference_session
from edgec.core.samples import Sample, sample_dims
from edgec.core.targets import load_target

TOLERANCE = 1e-4  # max abs difference relative to the output's scale


@pytest.mark.parametrize("name", ["cnn", "transformer", "early_exit", "moe", "greedy_decoder", "scan_rnn"])
def test_compiled_zoo_model_matches_onnxruntime_on_seen_and_unseen_shapes(name, tmp_path):
    entry = zoo.get(name)
    model = from_proto(entry.make_model(0), name)
    samples = [Sample(f"s{i}", a) for i, a in enumerate(entry.make_samples(entry.default_samples, 0))]
    target = load_target("x86_64")
    the_plan = plan(model, profile(model, samples), target, PlanSettings(max_specializations=1))
    assert the_plan.regions[0].mode == ("specialized" if model.dynamic_dims else "static")
    path = build(model, the_plan, [target]).save(tmp_path / f"{name}.edgec")

    compiled = runtime.load(path)
    reference = reference_session(model.proto)
    unseen = [Sample(f"u{i}", a) for i, a in enumerate(entry.make_samples(8, 1))]
    specialized = [s["dims"] for s in the_plan.regions[0].specializations]
    fallback_runs = 0
    for sample in samples + unseen:
        got = compiled.run(sample.arrays)
        expected = reference.run(sample.arrays)
        diff = compare_outputs(got, expected)
        assert diff["max_rel"] <= TOLERANCE, (sample.name, diff)
        fallback_runs += model.dynamic_dims != [] and sample_dims(model, sample) not in specialized
    if model.dynamic_dims:
        assert fallback_runs > 0, "no sample exercised the symbolic fallback"

    # The same artifact in a process that has only the runtime: no compiler, no Python kernels.
    sample = samples[-1]
    np.savez(tmp_path / "inputs.npz", **sample.arrays)
    script = textwrap.dedent(f"""
        import sys, numpy as np, edgec.runtime as rt
        out = rt.load({str(path)!r}).run(dict(np.load({str(tmp_path / "inputs.npz")!r})))
        np.savez({str(tmp_path / "outputs.npz")!r}, **out)
        assert "tvm" not in sys.modules
    """)
    subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    with np.load(tmp_path / "outputs.npz") as alone:
        diff = compare_outputs(dict(alone), reference.run(sample.arrays))
    assert diff["max_rel"] <= TOLERANCE, diff
