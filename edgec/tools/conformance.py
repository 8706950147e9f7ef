"""ONNX operator conformance: run ONNX's own node test cases through the whole edgec pipeline.

``run(model, inputs)`` compiles one model as a user's would be (profile on the inputs, plan, build
for the host target, load with the runtime) and returns its outputs. ``run_suite`` runs many of
``onnx.backend.test.case.node.collect_testcases`` cases in a worker process that is restarted when
a case crashes it or runs past its time limit, and returns one row per case.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from edgec import runtime
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.core.targets import load_target
from edgec.driver import compile as compile_model
from edgec.errors import EdgecError, SamplesError, describe
from edgec.fileio import write_text

STATUSES = ("pass", "fail", "error", "crash", "timeout")


def run(model: onnx.ModelProto, inputs: list, target: str = "x86_64") -> list:
    """Compile ``model`` through the normal pipeline and run it on ``inputs`` (graph input order;
    a list for a sequence, None for an absent optional).

    Raises EdgecError subclasses for what edgec cannot handle (an unsupported op, say).
    """
    loaded = from_proto(model, "conformance")
    if len(inputs) != len(loaded.inputs):
        raise SamplesError(f"{len(inputs)} inputs given, the model takes {len(loaded.inputs)}")
    arrays = {spec.name: value for spec, value in zip(loaded.inputs, inputs)}
    sample = Sample("inputs", arrays)
    the_target = load_target(target)
    artifact = compile_model(loaded, [sample], [the_target]).artifact
    with tempfile.TemporaryDirectory(prefix="edgec-conformance-") as tmp:
        path = artifact.save(Path(tmp) / "case.edgec")
        outputs = runtime.load(path).run(arrays)
    return [_output(outputs[spec.name]) for spec in loaded.outputs]


def _output(value):
    return [np.array(v) for v in value] if isinstance(value, list) else (
        None if value is None else np.array(value))


@dataclass(frozen=True)
class CaseResult:
    """One case's outcome: status (one of STATUSES), a one-line detail, and the seconds it took."""

    name: str
    status: str
    detail: str
    seconds: float

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail,
                "seconds": round(self.seconds, 2)}


def _to_array(value):
    """A case's value as numpy: an array, a list of them for a sequence, None for an empty optional."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [_to_array(v) for v in value]
    if value is None:
        return None
    if isinstance(value, dict):
        raise EdgecError("input of type dict (map) is not supported")
    return np.asarray(value)


def _is_float(dtype: np.dtype) -> bool:
    """numpy floats and ml_dtypes' (bfloat16, float8...), compared with NaN equal to NaN."""
    return dtype.kind in "fc" or "float" in dtype.name


def _compare(got: list, expected: list, rtol: float, atol: float, what: str = "output") -> str:
    """Empty when every output matches within the case's tolerances, else what differs."""
    if len(got) != len(expected):
        return f"{len(got)} {what}s, expected {len(expected)}"
    for index, (actual, reference) in enumerate(zip(got, expected)):
        if isinstance(reference, list) or isinstance(actual, list) or reference is None or actual is None:
            if type(actual) is not type(reference):
                return f"{what} {index} is {type(actual).__name__}, expected {type(reference).__name__}"
            problem = _compare(actual, reference, rtol, atol, f"{what} {index} element") if actual else ""
            if problem:
                return problem
            continue
        if actual.shape != reference.shape:
            return f"{what} {index} shape {list(actual.shape)}, expected {list(reference.shape)}"
        if _is_float(reference.dtype) or _is_float(actual.dtype):
            try:
                np.testing.assert_allclose(actual.astype(np.float64), reference.astype(np.float64),
                                           rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError:
                diff = np.nanmax(np.abs(actual.astype(np.float64) - reference.astype(np.float64)))
                return f"{what} {index} differs (max abs {diff:.3g}, rtol {rtol}, atol {atol})"
        elif not np.array_equal(actual, reference):
            return f"{what} {index} differs"
    return ""


def run_case(case) -> CaseResult:
    """Run every data set of one ONNX test case in this process."""
    start = time.perf_counter()
    try:
        for inputs, expected in case.data_sets:
            arrays = [_to_array(v) for v in inputs]
            want = [_to_array(v) for v in expected]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = run(case.model, arrays)
            problem = _compare(got, want, case.rtol, case.atol)
            if problem:
                return CaseResult(case.name, "fail", problem, time.perf_counter() - start)
    except EdgecError as exc:
        return CaseResult(case.name, "error", str(exc)[:300], time.perf_counter() - start)
    except Exception as exc:  # anything else is an edgec/TVM bug on this case: record, go on
        return CaseResult(case.name, "error", f"{type(exc).__name__}: {describe(exc)}",
                          time.perf_counter() - start)
    return CaseResult(case.name, "pass", "", time.perf_counter() - start)


def node_cases() -> dict:
    """ONNX's node test cases by name."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {case.name: case for case in collect_testcases("")}


def _worker() -> None:
    """Read case names on stdin, write one JSON result per line on stdout."""
    cases = node_cases()
    out = sys.stdout
    sys.stdout = sys.stderr  # TVM and onnxruntime print; keep the protocol channel clean
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        out.write(json.dumps(run_case(cases[name]).to_json()) + "\n")
        out.flush()


class _Worker:
    """A child process running cases; replaced when it dies or hangs."""

    def __init__(self) -> None:
        env = dict(os.environ, TVM_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from edgec.tools.conformance import _worker; _worker()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, env=env,
        )

    def run(self, name: str, timeout_s: float) -> CaseResult | None:
        """The case's result, or None when the worker died or ran out of time (then it is gone)."""
        start = time.perf_counter()
        try:
            self.process.stdin.write(name + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return None
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            return CaseResult(name, "timeout" if not ready else "crash",
                              f"worker {'timed out' if not ready else 'died'}",
                              time.perf_counter() - start)
        doc = json.loads(line)
        return CaseResult(doc["name"], doc["status"], doc["detail"], doc["seconds"])

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def run_suite(names: Iterable[str], timeout_s: float = 300.0) -> Iterator[CaseResult]:
    """Run the named cases one by one in a worker process, yielding each result as it comes."""
    worker: _Worker | None = None
    try:
        for name in names:
            worker = worker or _Worker()
            result = worker.run(name, timeout_s)
            if result is None or result.status in ("crash", "timeout"):
                worker = None
                if result is None:
                    result = CaseResult(name, "crash", "worker died", 0.0)
            yield result
    finally:
        if worker is not None:
            worker.close()


def run_suite_parallel(names: Iterable[str], jobs: int, timeout_s: float = 300.0) -> Iterator[CaseResult]:
    """``run_suite`` over ``jobs`` worker processes at once; results come in completion order."""
    import queue
    import threading

    names = list(names)
    if jobs <= 1:
        yield from run_suite(names, timeout_s)
        return
    results: queue.Queue = queue.Queue()
    todo: queue.Queue = queue.Queue()
    for name in names:
        todo.put(name)

    def drain() -> Iterator[str]:
        while True:
            try:
                yield todo.get_nowait()
            except queue.Empty:
                return

    def work() -> None:
        try:
            for result in run_suite(drain(), timeout_s):
                results.put(result)
        finally:
            results.put(None)

    threads = [threading.Thread(target=work, daemon=True) for _ in range(jobs)]
    for thread in threads:
        thread.start()
    finished = 0
    while finished < len(threads):
        result = results.get()
        if result is None:
            finished += 1
        else:
            yield result


def ci_subset(all_names: list[str], every: int = 10) -> list[str]:
    """A fixed, CI-sized subset: every control-flow case and every ``every``-th other case by name."""
    control = [n for n in all_names if n.startswith(("test_if", "test_loop", "test_scan"))]
    others = [n for n in sorted(all_names) if n not in control]
    return sorted(set(control) | set(others[::every]))


def summarize(results: list[CaseResult]) -> dict:
    """Counts per status, overall and for the control-flow cases."""
    counts = {status: 0 for status in STATUSES}
    control = {status: 0 for status in STATUSES}
    for result in results:
        counts[result.status] += 1
        if result.name.startswith(("test_if", "test_loop", "test_scan")):
            control[result.status] += 1
    return {"cases": len(results), **counts, "control_flow": control}


def write_results(results: list[CaseResult], directory: str | Path) -> None:
    """Write ``cases.csv`` (one row per case) and ``summary.json`` into ``directory``."""
    import csv
    import io


    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["case", "status", "seconds", "detail"])
    for result in sorted(results, key=lambda r: r.name):
        writer.writerow([result.name, result.status, f"{result.seconds:.2f}", result.detail])
    directory = Path(directory)
    write_text(directory / "cases.csv", buffer.getvalue())
    write_text(directory / "summary.json", json.dumps(summarize(results), indent=1) + "\n")
