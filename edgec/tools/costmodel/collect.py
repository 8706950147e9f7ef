"""``edgec costmodel collect``: measure the zoo's regions under each option into the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from edgec import zoo
from edgec.core.model import from_proto, load_model
from edgec.core.samples import Sample, load_samples
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


def execution_cases(names: list[str] | None,
                    model_dirs: list[Path]) -> list[tuple[str, Any, list[Sample]]]:
    """What ``collect --execution`` times: the named zoo models (default: ``COLLECT_MODELS``,
    none when only folders are given) with their collect samples, and each folder's
    ``model.onnx`` with its ``samples/``, named after the folder."""
    if names is None and not model_dirs:
        names = list(COLLECT_MODELS)
    unknown = [n for n in names or [] if n not in zoo.names()]
    if unknown:
        raise EdgecError(f"unknown zoo model(s) {', '.join(unknown)}; see `edgec zoo list`")
    cases = []
    for name in names or []:
        model, samples, _ = zoo_case(name)
        cases.append((name, model, samples))
    for folder in model_dirs:
        if not (folder / "model.onnx").is_file() or not (folder / "samples").is_dir():
            raise EdgecError(f"'{folder}' must hold model.onnx and a samples/ folder of .npz files")
        model = load_model(folder / "model.onnx", folder.name)
        cases.append((folder.name, model, load_samples(folder / "samples", model)))
    return cases
