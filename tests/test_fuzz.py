"""Fuzzing (hypothesis, derandomized: the same cases every run) of the three things a user hands
edgec: model bytes, artifact bytes and input arrays. Each may raise its edgec error class and
nothing else, and never crash the process.

- model bytes: a valid ONNX model mutated (bits flipped, bytes set, inserted, cut) -> the model
  loader and the compiler's importer: a Model and a Relax module, or an EdgecError.
- artifact bytes: a valid artifact mutated the same way -> the artifact reader: an Artifact or
  ArtifactError. Mutants the reader accepts (the changes fell on bytes no check covers, such as
  zip timestamps) are then loaded and run by the runtime in a child process, so that a crash in
  native code would show as the child's death rather than end the test run.
- input arrays: random dtypes, ranks, shapes (empty ones too) and values, NaN and Inf included,
  and wrong names -> Model.run: a result or SamplesError.

Each test checks how many cases it ran, so a change that makes hypothesis skip cases shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from conftest import mlp_model
from edgec import runtime
from edgec.errors import ArtifactError, EdgecError, SamplesError
from edgec.runtime.artifact import Artifact

REPO = Path(__file__).resolve().parent.parent
MODEL_CASES = 300
ARTIFACT_CASES = 400
INPUT_CASES = 300
HOST_CASES = 200  # each a process of the C++ host


def _fuzz_settings(examples: int):
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


@st.composite
def mutated(draw, original: bytes) -> bytes:
    """``original`` with 1-8 edits: bits flipped, bytes set, bytes inserted, or a cut."""
    data = bytearray(original)
    for _ in range(draw(st.integers(1, 8))):
        if not data:
            break
        kind = draw(st.sampled_from(["flip", "set", "insert", "cut"]))
        position = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[position] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0x01]))
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[position:]
    return bytes(data)


def test_mutated_model_bytes_give_edgec_errors_only(tmp_path):
    from edgec.compiler.pipeline import import_model
    from edgec.core.model import load_model

    original = mlp_model().SerializeToString()
    path = tmp_path / "m.onnx"
    outcomes = {"imported": 0, "refused": 0}

    @_fuzz_settings(MODEL_CASES)
    @given(mutated(original))
    def check(data: bytes) -> None:
        path.write_bytes(data)
        try:
            import_model(load_model(path))
            outcomes["imported"] += 1
        except EdgecError:
            outcomes["refused"] += 1

    check()
    print(f"model bytes fuzz: {outcomes}")
    assert sum(outcomes.values()) >= MODEL_CASES * 0.9, outcomes
    assert outcomes["refused"] > 0


# Loads each mutant the reader accepted and runs it; prints one outcome per artifact.
_LOAD_AND_RUN = textwrap.dedent("""
    import json, sys
    import numpy as np
    from edgec import runtime
    from edgec.errors import EdgecError
    outcomes = []
    for path in sys.argv[1:]:
        try:
            y = runtime.load(path).run({"x": np.ones((1, 8, 16), np.float32)})["y"]
            outcomes.append("ran" if y.shape == (1, 8, 8) else f"wrong shape {y.shape}")
        except EdgecError as exc:
            outcomes.append(type(exc).__name__)
    print(json.dumps(outcomes))
""")


def test_mutated_artifact_bytes_give_artifact_errors_only(mlp_artifact, tmp_path):
    original = mlp_artifact.read_bytes()
    accepted: list[bytes] = []
    outcomes = {"accepted": 0, "refused": 0}

    @_fuzz_settings(ARTIFACT_CASES)
    @given(mutated(original))
    def check(data: bytes) -> None:
        try:
            Artifact.from_bytes(data, "mutant")
        except ArtifactError:
            outcomes["refused"] += 1
            return
        outcomes["accepted"] += 1
        if data not in accepted and data != original:
            accepted.append(data)

    check()
    print(f"artifact bytes fuzz: {outcomes}, distinct accepted mutants {len(accepted)}")
    assert sum(outcomes.values()) >= ARTIFACT_CASES * 0.9, outcomes
    paths = []
    for index, data in enumerate(accepted[:40]):  # bounded: each load is a dlopen
        paths.append(tmp_path / f"mutant_{index}.edgec")
        paths[-1].write_bytes(data)
    if not paths:
        return
    child = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, *map(str, paths)], capture_output=True,
                           text=True, cwd=REPO, timeout=300)
    assert child.returncode == 0, f"the runtime died on an accepted mutant: {child.returncode} {child.stderr[-2000:]}"
    results = json.loads(child.stdout.strip().splitlines()[-1])
    print(f"accepted mutants loaded and run in a child: {len(results)}, outcomes {sorted(set(results))}")
    assert len(results) == len(paths) and set(results) <= {"ran", "ArtifactError"}, results


_DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "bool"]


@st.composite
def input_sets(draw) -> dict:
    """Mostly the right name, dtype and rank with random dims (to reach the compiled code), else
    anything: another dtype, rank or name, extra inputs, non-arrays."""
    if draw(st.booleans()):
        shape = (draw(st.integers(0, 4)), draw(st.integers(0, 9)), 16)
        dtype = np.dtype("float32")
    else:
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=4)))
        dtype = np.dtype(draw(st.sampled_from(_DTYPES)))
    values = hnp.arrays(dtype, shape, elements=hnp.from_dtype(dtype, allow_nan=True, allow_infinity=True)
                        if dtype.kind == "f" else None)
    inputs = {draw(st.sampled_from(["x", "x", "x", "X", "y"])): draw(values)}
    if draw(st.integers(0, 9)) == 0:
        inputs["extra"] = np.zeros(3, np.float32)
    if draw(st.integers(0, 9)) == 0:
        inputs = {name: value.tolist() for name, value in inputs.items()}
    return inputs


def test_random_inputs_give_a_result_or_samples_error(mlp_artifact):
    from edgec.core.reference import reference_session

    model = runtime.load(mlp_artifact)
    reference = reference_session(mlp_model())
    outcomes = {"ran": 0, "refused": 0, "empty": 0, "nonfinite": 0}

    # Explicit cases for the outcomes counted below, whatever the generator happens to draw.
    nan, inf = np.zeros((2, 3, 16), np.float32), np.ones((1, 2, 16), np.float32)
    nan[0, 1, 5], inf[0, 1, 0] = np.nan, -np.inf

    @_fuzz_settings(INPUT_CASES)
    @given(input_sets())
    @example({"x": nan})
    @example({"x": inf})
    @example({"x": np.zeros((0, 4, 16), np.float32)})
    @example({"x": np.zeros((2, 3, 16), np.float64)})
    def check(inputs: dict) -> None:
        try:
            y = model.run(inputs)["y"]
        except SamplesError:
            outcomes["refused"] += 1
            return
        x = inputs["x"]
        assert y.shape == (*x.shape[:2], 8) and y.dtype == np.float32
        outcomes["ran"] += 1
        outcomes["empty"] += x.size == 0
        if not np.isfinite(x).all():
            outcomes["nonfinite"] += 1  # Relu differs from onnxruntime on NaN: see test_hardening
            return
        if x.size and np.abs(x).max() > 1e4:
            return  # overflow to Inf depends on the order of the sums: no one right answer
        np.testing.assert_allclose(y, reference.run({"x": x})["y"], rtol=1e-4, atol=1e-4)

    check()
    print(f"input arrays fuzz: {outcomes}")
    assert outcomes["ran"] + outcomes["refused"] >= INPUT_CASES * 0.9, outcomes
    assert min(outcomes.values()) > 0, outcomes


def _drawn_mutants(original: bytes, cases: int) -> list[bytes]:
    """``cases`` mutants of ``original`` from ``mutated`` (derandomized: the same every run)."""
    drawn: list[bytes] = []

    @_fuzz_settings(cases)
    @given(mutated(original))
    def collect(data: bytes) -> None:
        drawn.append(data)

    collect()
    return drawn


def _host_reads_mutants_like_python(host: Path, original: bytes, directory: Path) -> dict:
    """Feed HOST_CASES mutants of ``original`` to ``host --info`` (reads and verifies every
    member, loads nothing). Each must give what the Python reader gives: accepted (exit 0), or
    refused with ArtifactError's exit code and the same one-line message; never a signal or a
    sanitizer report. Returns how many were accepted and refused."""
    mutants = _drawn_mutants(original, HOST_CASES)
    assert len(mutants) >= HOST_CASES * 0.9, len(mutants)
    # ASan: TVM's libraries keep global state to the end of the process; leaks are not the point.
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    outcomes = {"accepted": 0, "refused": 0}
    for index, data in enumerate(mutants):
        path = directory / f"mutant_{index}.edgec"
        path.write_bytes(data)
        try:
            Artifact.from_bytes(data, str(path))
            python_error = None
        except ArtifactError as exc:
            python_error = str(exc)
        result = subprocess.run([str(host), str(path), "--info"], capture_output=True, text=True,
                                env=env, timeout=60)
        label = f"mutant {index} ({path}): exit {result.returncode}, {result.stderr[-3000:]!r}"
        assert "Sanitizer" not in result.stderr and "runtime error:" not in result.stderr, label
        if python_error is None:
            assert result.returncode == 0, f"Python accepts, the host refuses: {label}"
            outcomes["accepted"] += 1
            continue
        assert (result.returncode, result.stderr) == (
            ArtifactError.exit_code, f"edgec_run: error: {python_error}\n"), label
        outcomes["refused"] += 1
    print(f"C++ host artifact fuzz: {outcomes}")
    return outcomes


def _cpp_host_or_skip() -> Path:
    from runtime.test_cpp_host import build_host, missing_tools

    if missing_tools("g++", "make"):
        pytest.skip("needs g++ and make (scripts/install-system-deps.sh cross)")
    return build_host()


def test_cpp_host_refuses_mutated_artifacts_like_the_python_reader(mlp_artifact, tmp_path):
    outcomes = _host_reads_mutants_like_python(_cpp_host_or_skip(), mlp_artifact.read_bytes(),
                                               tmp_path)
    assert outcomes["refused"] > 0


@pytest.mark.slow  # builds the host with sanitizers: about a minute of g++
def test_sanitized_cpp_host_refuses_mutated_artifacts_like_the_python_reader(mlp_artifact, tmp_path):
    """The same mutants through the host built with AddressSanitizer and UBSan, which turn an
    out-of-bounds read or undefined behaviour in the reader into a report and a failed run."""
    from runtime.test_cpp_host import CPP_DIR

    _cpp_host_or_skip()
    build = tmp_path / "asan"
    subprocess.run(["make", "-s", "-C", str(CPP_DIR), f"BUILD_DIR={build}",
                    f"PYTHON={sys.executable}", "SANITIZE=address,undefined"],
                   check=True, capture_output=True)
    (tmp_path / "mutants").mkdir()
    outcomes = _host_reads_mutants_like_python(build / "edgec_run", mlp_artifact.read_bytes(),
                                               tmp_path / "mutants")
    assert outcomes["refused"] > 0
