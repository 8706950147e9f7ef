"""``edgec costmodel collect``: measure the zoo's regions under each option into the store."""

from __future__ import annotations

from typing import Any, Callable

from edgec import zoo
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.core.targets import Target
from edgec.costmodel.store import append_measurements
from edgec.errors import EdgecError
from edgec.stages.measure import Measured, measure_model
from edgec.stages.profile import Profile, profile

# The zoo's models whose shapes vary (the others have one option, static), small enough to
# compile with every option in well under a minute each, and the calibration suite (training
# data only: ``costmodel eval`` holds out the others).
HELD_OUT_MODELS = ("early_exit", "greedy_decoder", "moe", "scan_rnn", "transformer", "cnn_batch",
                   "token_tagger", "prompt_encoder", "speech_lstm", "digits")
COLLECT_MODELS = HELD_OUT_MODELS + tuple(zoo.calibration_names())


# Samples per model, as a multiple of the zoo's default count: more distinct shapes to learn from.
SAMPLE_FACTOR = 2


def zoo_case(name: str, seed: int = 0) -> tuple[Any, list[Sample], Profile]:
    """A zoo model, ``SAMPLE_FACTOR`` times its default number of samples, and their profile
    (``collect`` measures on them, ``eval`` weighs plans by their shape distribution)."""
    entry = zoo.get(name)
    model = from_proto(entry.make_model(seed), name)
    samples = [Sample(f"sample_{i:03d}", arrays) for i, arrays in
               enumerate(entry.make_samples(entry.default_samples * SAMPLE_FACTOR, seed))]
    return model, samples, profile(model, samples)


def collect(target: Target, names: list[str] | None = None, passes: int = 3,
            max_specializations: int = 3, runs: int = 5, batches: int = 3, threads: int = 1,
            progress: Callable[[str], None] = lambda line: None) -> list[Measured]:
    """Measure each named zoo model ``passes`` times; append every row and build to the store.

    Each pass builds and times anew, so the passes differ only by machine noise: their spread is
    the run-to-run noise ``costmodel eval`` reports.
    """
    names = list(names or COLLECT_MODELS)
    unknown = [n for n in names if n not in zoo.names()]
    if unknown:
        raise EdgecError(f"unknown zoo model(s) {', '.join(unknown)}; see `edgec zoo list`")
    results = []
    for name in names:
        model, samples, prof = zoo_case(name)
        for index in range(passes):
            measured = measure_model(model, prof, samples, target, max_specializations, runs=runs,
                                     batches=batches, threads=threads, pass_index=index)
            mains = [{"kind": "main", "model": model.name, "model_sha256": model.sha256,
                      "target": target.name, "shape": key, "ms": ms, "source": "collect",
                      "pass": index} for key, ms in measured.main_ms.items()]
            append_measurements(target, measured.rows + [measured.build] + mains)
            results.append(measured)
            progress(f"{name} pass {index}: {len(measured.rows)} region timings, build "
                     f"{measured.build['compile_s']:.1f} s")
    return results
