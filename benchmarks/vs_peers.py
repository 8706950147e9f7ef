"""edgec, onnxruntime and OpenVINO (fp32) side by side: reports/vs_peers.json and .md.

Two suites: ``zoo`` (the zoo models of benchmarks/vs_ort.py, exported seeded) and ``real`` (the
real-model suite of benchmarks/real_models.py, as far as this machine exports it: models the venvs
here cannot export are listed as not built, never faked). Per model:

1. ``edgec.compile`` with edgec's defaults, in a worker process (real_models.compile_model);
2. one timing process loads all three systems with the same thread count (2 by default) and
   times them in alternating rounds: round r runs each system's calls in turn, the order rotated
   by one per round, so that a machine whose speed drifts slows all three alike. A system's time
   is the median over the rounds of each round's median call (``edgec.stages.bench.time_calls``:
   ``--runs`` calls per sample after a warm-up);
3. the outputs of edgec and OpenVINO are checked against onnxruntime's: ``*_error`` is, per output,
   max |x - ort| / max |ort|, the max over outputs and samples.

OpenVINO reads the same ONNX file, dynamic dims left dynamic, and compiles it for its CPU plugin in
fp32 (its default on a CPU with bf16 is bf16) with one stream of ``--threads`` threads, not pinned
to cores (neither are onnxruntime's). ``--busy N`` runs N CPU-bound background processes
(``edgec.core.busy``) while the systems are timed. A model that fails in one system gets null there
and the error text (in ``failures``) and the run goes on.

    python benchmarks/vs_peers.py                  # both suites (about an hour; a quiet machine)
    python benchmarks/vs_peers.py --small          # two models per suite, few rounds (CI)
    python benchmarks/vs_peers.py --only hf_bert,moe --rounds 3
    python benchmarks/vs_peers.py --busy 2 --out reports/busy2

Needs the ``bench`` extra (openvino); without it OpenVINO's column is null with the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's edgec, also when another is installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models  # noqa: E402
import vs_ort  # noqa: E402

SYSTEMS = ("edgec", "onnxruntime", "openvino")
SMALL = {"zoo": vs_ort.SMALL, "real": ["hf_bert", "hf_vit_dynamo"]}
MATCH_TOLERANCE = real_models.MATCH_TOLERANCE
GEOMEANS = {  # key -> (suite, kind or None for every kind, the peer edgec's time is divided by)
    "real_vs_ort": ("real", None, "onnxruntime"),
    "real_vs_openvino": ("real", None, "openvino"),
    "zoo_static_vs_ort": ("zoo", "static", "onnxruntime"),
    "zoo_dynamic_vs_ort": ("zoo", "dynamic", "onnxruntime"),
}


def openvino_config(threads: int) -> dict[str, Any]:
    """OpenVINO CPU plugin properties: fp32, one stream of ``threads`` threads, latency first."""
    return {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads,
            "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "ENABLE_HYPER_THREADING": False,
            "ENABLE_CPU_PINNING": False}


class OpenVinoSession:
    """An OpenVINO CPU infer request over an ONNX file; ``run`` returns outputs by ONNX name."""

    def __init__(self, path: Path, output_names: list[str], threads: int) -> None:
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(core.read_model(str(path)), "CPU", openvino_config(threads))
        ports = [set(port.get_names()) for port in compiled.outputs]
        missing = [name for name in output_names if not any(name in p for p in ports)]
        if missing:
            raise RuntimeError(f"OpenVINO's model has no output named {', '.join(missing)}")
        self.index = {name: next(i for i, p in enumerate(ports) if name in p)
                      for name in output_names}
        self.request = compiled.create_infer_request()

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        result = self.request.infer(arrays)
        # copies: the request reuses its output buffers on the next call
        return {name: np.array(result[i]) for name, i in self.index.items()}


def _error_text(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _load_systems(spec: dict, model) -> tuple[dict[str, Callable], dict[str, str]]:
    """Each system's call on this model, or its error text."""
    from edgec import runtime
    from edgec.core.reference import reference_session

    loaders = {
        "edgec": lambda: runtime.load(spec["artifact"], threads=spec["threads"]).run,
        "onnxruntime": lambda: reference_session(model.proto, threads=spec["threads"],
                                                 spinning=True).run,
        "openvino": lambda: OpenVinoSession(Path(spec["model"]),
                                            [o.name for o in model.outputs], spec["threads"]).run,
    }
    calls, errors = {}, {}
    for system in SYSTEMS:
        if spec["errors"].get(system):
            errors[system] = spec["errors"][system]
            continue
        try:
            calls[system] = loaders[system]()
        except Exception as exc:  # noqa: BLE001 - one system's failure must not stop the others
            errors[system] = "load: " + _error_text(exc)
    return calls, errors


def _max_error(outputs: dict, system: str, group: list, errors: dict[str, str]) -> float | None:
    """``system``'s max relative error against onnxruntime over ``group``'s samples (3 significant
    digits), or None where either did not run or where shapes, NaN or Inf differ (then noted in
    ``errors``)."""
    from edgec.stages.bench import compare_outputs

    if system in errors or "onnxruntime" in errors:
        return None
    worst = 0.0
    for sample in group:
        reference, got = outputs["onnxruntime"][sample.name], outputs[system][sample.name]
        missing = sorted(set(reference) - set(got))
        if missing:
            errors[system] = f"outputs: no output {', '.join(missing)} to compare"
            return None
        worst = max(worst, compare_outputs(got, reference)["max_rel"])
    if not math.isfinite(worst):
        errors[system] = "outputs: shapes, NaN or Inf differ from onnxruntime's"
        return None
    return float(f"{worst:.3g}")


def worker(spec_path: Path) -> None:
    """In a process of its own: time the three systems on one model in alternating rounds and
    compare outputs; writes ``spec["output"]`` (JSON) with per-row per-round medians, errors
    against onnxruntime and each failed system's error text."""
    from edgec.core.busy import busy_processes
    from edgec.core.model import load_model
    from edgec.core.samples import load_samples, sample_dims
    from edgec.stages.bench import BenchSettings, time_calls

    spec = json.loads(spec_path.read_text())
    model = load_model(spec["model"])
    samples = load_samples(spec["samples"], model)
    settings = BenchSettings(runs=spec["runs"], warmup=spec["warmup"], threads=spec["threads"])
    groups: dict[str, list] = defaultdict(list)
    for sample in samples:
        split = spec.get("split")
        groups[f"{split}={sample_dims(model, sample)[split]}" if split else ""].append(sample)
    calls, errors = _load_systems(spec, model)
    rounds: dict[str, dict[str, list[float]]] = {s: defaultdict(list) for s in calls}
    outputs: dict[str, dict[str, dict[str, np.ndarray]]] = {s: {} for s in calls}
    with busy_processes(spec["busy"]):
        for index in range(spec["rounds"]):
            order = SYSTEMS[index % 3:] + SYSTEMS[:index % 3]
            for system in (s for s in order if s in calls and s not in errors):
                try:
                    for key, group in groups.items():
                        stats, outs = time_calls(calls[system], model, group, settings, system)
                        rounds[system][key].append(stats["p50_ms"])
                        if index == 0:
                            outputs[system].update((x.name, o) for x, o in zip(group, outs))
                except Exception as exc:  # noqa: BLE001
                    errors[system] = "run: " + _error_text(exc)
    failed = set(errors)  # these systems' times are void; an output mismatch only is reported
    accuracy = {key: {system: _max_error(outputs, system, group, errors) for system in
                      ("edgec", "openvino")} for key, group in groups.items()}
    result = {"rows": {key: {s: (None if s in failed else rounds[s][key]) for s in SYSTEMS}
                       for key in groups},
              "error": accuracy, "failures": errors}
    Path(spec["output"]).write_text(json.dumps(result))


def median_of_rounds(per_round: list[float] | None) -> float | None:
    """The median over rounds of each round's median call, rounded to 0.1 us."""
    return round(statistics.median(per_round), 4) if per_round else None


def spread(per_round: list[float] | None) -> float | None:
    """How far a system's rounds disagree: (max - min) / median of its per-round medians."""
    if not per_round:
        return None
    middle = statistics.median(per_round)
    return round((max(per_round) - min(per_round)) / middle, 4) if middle > 0 else None


def geomeans(rows: list[dict]) -> dict[str, float | None]:
    """The report's four geometric means of edgec's time over a peer's, over the rows of a suite
    (and kind) where both were measured; None where no row was."""
    result = {}
    for key, (suite, kind, peer) in GEOMEANS.items():
        ratios = [r["edgec_ms"] / r[f"{peer}_ms"] for r in rows
                  if r["suite"] == suite and (kind is None or r["kind"] == kind)
                  and r["edgec_ms"] and r[f"{peer}_ms"]]
        result[key] = vs_ort.geomean(ratios)
    return result


def make_row(name: str, suite: str, kind: str, per_round: dict[str, list[float] | None],
             error: dict[str, float | None]) -> dict:
    """One model row of the report (exactly the keys the issue names)."""
    return {"name": name, "suite": suite, "kind": kind,
            **{f"{s}_ms": median_of_rounds(per_round.get(s)) for s in SYSTEMS},
            "edgec_error": error.get("edgec"), "openvino_error": error.get("openvino")}


def build_report(measured: list[dict], failures: list[dict], not_built: list[dict],
                 setup: dict) -> dict:
    """The JSON document from measured rows: ``{"name", "suite", "kind", "per_round":
    {system: [ms] | None}, "error": {system: float | None}}`` each."""
    rows = [make_row(m["name"], m["suite"], m["kind"], m["per_round"], m["error"])
            for m in measured]
    return {"models": rows, "geomean": geomeans(rows), "failures": failures,
            "not_built": not_built,
            "per_round_ms": {m["name"]: m["per_round"] for m in measured}, "setup": setup}


def merge_reports(old: dict, new: dict) -> dict:
    """``old`` with the models ``new`` measured replaced by ``new``'s rows (and failures), the
    rest kept, the geomeans recomputed; ``setup["updates"]`` lists each later run's models and
    settings, so the Markdown can say which rows came from it."""
    names = {row["name"] for row in new["models"]} | {f["name"] for f in new["failures"]}
    replaced = [r for r in old["models"] if r["name"] not in names]
    rows = replaced + new["models"]
    order = {row["name"]: k for k, row in enumerate(old["models"])}
    rows.sort(key=lambda r: order.get(r["name"], len(order)))
    per_round = {k: v for k, v in old["per_round_ms"].items() if k not in names}
    setup = dict(old["setup"])
    update = {k: v for k, v in new["setup"].items() if k != "updates"}
    setup["updates"] = [*old["setup"].get("updates", []), {**update, "models": sorted(names)}]
    return {"models": rows, "geomean": geomeans(rows),
            "failures": [f for f in old["failures"] if f["name"] not in names] + new["failures"],
            "not_built": old["not_built"], "per_round_ms": {**per_round, **new["per_round_ms"]},
            "setup": setup}


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "" if value is None else format(value, spec)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def markdown(report: dict) -> str:
    """The report as Markdown: the table, the geomeans, the noise note, failures, models not
    built."""
    setup = report["setup"]
    lines = ["# edgec, onnxruntime and OpenVINO (fp32)", "",
             "| model | suite | kind | edgec ms | onnxruntime ms | OpenVINO ms | edgec / ort | "
             "edgec / OpenVINO | edgec error | OpenVINO error | spread |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    spreads = {}
    for row in report["models"]:
        per_round = report["per_round_ms"].get(row["name"], {})
        found = [s for s in (spread(per_round.get(x)) for x in SYSTEMS) if s is not None]
        spreads[row["name"]] = max(found) if found else None
        lines.append(
            f"| {row['name']} | {row['suite']} | {row['kind']} | {_fmt(row['edgec_ms'])} | "
            f"{_fmt(row['onnxruntime_ms'])} | {_fmt(row['openvino_ms'])} | "
            f"{_fmt(_ratio(row['edgec_ms'], row['onnxruntime_ms']))} | "
            f"{_fmt(_ratio(row['edgec_ms'], row['openvino_ms']))} | "
            f"{_fmt(row['edgec_error'], '.1e')} | {_fmt(row['openvino_error'], '.1e')} | "
            f"{_fmt(spreads[row['name']], '.0%')} |")
    lines.append("")
    for key, value in report["geomean"].items():
        lines.append(f"- geomean {key.replace('_', ' ')}: {_fmt(value)}")
    measured = [s for s in spreads.values() if s is not None]
    busy = f", beside {setup['busy']} busy background processes" if setup["busy"] else ""
    noise = (f"; median spread {statistics.median(measured):.0%}, largest {max(measured):.0%}"
             if measured else "")
    lines += ["", f"{setup['threads']} threads each{busy}; {setup['rounds']} round(s) in one "
              f"process per model, the three systems in turn (order rotated per round), "
              f"{setup['runs']} calls per sample after {setup['warmup']} warm-up per round; "
              "each time is the median over rounds of a round's median call. Noise: spread = "
              "(max - min) / median of a system's per-round medians, the largest of the three "
              f"per model{noise}. Errors: max |x - ort| / max |ort| over outputs and samples "
              f"(a match: <= {MATCH_TOLERANCE:g}). Machine: {setup['machine']}; OpenVINO "
              f"{setup['versions'].get('openvino') or 'not installed'}, onnxruntime "
              f"{setup['versions'].get('onnxruntime')}."]
    for update in setup.get("updates", []):
        lines += ["", f"Re-measured later ({update.get('date', 'date not recorded')}, "
                      f"{update['threads']} threads, {update['rounds']} round(s), busy "
                      f"{update['busy']}): {', '.join(update['models'])}."]
    if report["failures"]:
        lines += ["", "Failures:", ""] + [f"- {f['name']} ({f['system']}): {f['error']}"
                                          for f in report["failures"]]
    if report["not_built"]:
        lines += ["", "Real models not built here (their exporters are not installed on this "
                      "machine):", ""]
        lines += [f"- {n['name']}: {n['reason']}" for n in report["not_built"]]
    return "\n".join(lines) + "\n"


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    found = {}
    for package in ("openvino", "onnxruntime", "apache-tvm"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def _machine() -> str:
    from edgec.stages.bench import machine_info

    info = machine_info()
    return f"{info['cpu'] or platform.machine()}, {info['cores']} cores"


def zoo_models(names: list[str], tmp: Path, samples: int | None) -> list[dict]:
    """Export the zoo models (seeded) into ``tmp``: one entry per model to measure."""
    from edgec import zoo

    entries = []
    for name in names:
        folder = zoo.export(name, tmp / name, seed=0, count=samples)
        entries.append({"name": name, "suite": "zoo", "kind": zoo.get(name).kind,
                        "folder": folder, "split": vs_ort.SPLIT_BY.get(name)})
    return entries


def real_models_here(names: list[str] | None, cache: Path) -> tuple[list[dict], list[dict]]:
    """Export the real suite's models that this machine can (into ``cache``, skipping those
    built), and return (entries to measure, [{"name", "reason"}] for those not built). The torch
    exporter runs in its export venv if there is one, else in this Python (which has torch and,
    with the ``export`` extra, transformers); the others only in their venvs."""
    from edgec.core.model import load_model

    suite = [e for e in real_models.suite() if names is None or e["name"] in names]
    torch_venv = real_models.DEFAULT_VENVS / real_models.MODULES["torch_export"]
    here = None if (torch_venv / "bin" / "python").exists() else Path(sys.executable)
    torch_entries = [e for e in suite if e["module"] == "torch_export"]
    real_models.build_suite(torch_entries, cache, real_models.DEFAULT_VENVS, False, here)
    real_models.build_suite([e for e in suite if e["module"] != "torch_export"], cache,
                            real_models.DEFAULT_VENVS, False)
    entries, not_built = [], []
    for entry in suite:
        folder = cache / entry["name"]
        if not (folder / "model.onnx").is_file():
            error = folder / "export_error.txt"
            lines = error.read_text().strip().splitlines() if error.is_file() else []
            reason = lines[-1] if lines else (
                f"no export venv for {entry['exporter']} "
                "(benchmarks/real_models/setup_export_env.sh)")
            not_built.append({"name": entry["name"], "reason": reason})
            continue
        kind = "dynamic" if load_model(folder / "model.onnx").dynamic_dims else "static"
        entries.append({"name": entry["name"], "suite": "real", "kind": kind, "folder": folder,
                        "split": None})
    return entries, not_built


def measure(entry: dict, tmp: Path, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Compile and time one model: its measured rows and its failures."""
    folder, name = entry["folder"], entry["name"]
    artifact = tmp / f"{name}.edgec"
    print(f"vs_peers: compiling {name}", file=sys.stderr, flush=True)
    compiled = real_models.compile_model(folder / "model.onnx", folder / "samples", artifact,
                                         args.timeout)
    errors = {} if compiled["compiled"] else {"edgec": "compile: " + compiled["error"]}
    try:
        import openvino  # noqa: F401
    except ImportError:
        errors["openvino"] = "openvino is not installed (pip install edgec[bench])"
    output = tmp / f"{name}.timing.json"
    spec = {"model": str(folder / "model.onnx"), "samples": str(folder / "samples"),
            "artifact": str(artifact), "split": entry["split"], "threads": args.threads,
            "rounds": args.rounds, "runs": args.runs, "warmup": args.warmup, "busy": args.busy,
            "errors": errors, "output": str(output)}
    spec_path = tmp / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    print(f"vs_peers: timing {name}", file=sys.stderr, flush=True)
    try:
        run = subprocess.run([sys.executable, __file__, "--worker", str(spec_path)],
                             env=real_models._env(), capture_output=True, text=True,
                             timeout=args.timeout * max(args.rounds, 1))
        failed = None if run.returncode == 0 and output.is_file() else \
            real_models.first_error_line(run.stderr or run.stdout)
    except subprocess.TimeoutExpired:
        failed = f"timeout: timing ran past {args.timeout * max(args.rounds, 1):.0f} s"
    if failed:
        result = {"rows": {"": {s: None for s in SYSTEMS}}, "error": {},
                  "failures": {s: errors.get(s, failed) for s in SYSTEMS}}
    else:
        result = json.loads(output.read_text())
    rows = [{"name": f"{name} {key}".strip(), "suite": entry["suite"], "kind": entry["kind"],
             "per_round": per_round, "error": result["error"].get(key, {})}
            for key, per_round in result["rows"].items()]
    failures = [{"name": name, "system": s, "error": e} for s, e in result["failures"].items()]
    for row in rows:
        print(f"vs_peers: {row['name']}: " + ", ".join(
            f"{s} {_fmt(median_of_rounds(row['per_round'][s]))} ms" for s in SYSTEMS)
            + "".join(f"; {f['system']} failed: {f['error']}" for f in failures),
            file=sys.stderr, flush=True)
    return rows, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="Comma-separated model names (zoo or real).")
    parser.add_argument("--small", action="store_true",
                        help="Two models per suite, few rounds and calls (CI).")
    parser.add_argument("--rounds", type=int, default=None, help="Default 5 (2 with --small).")
    parser.add_argument("--runs", type=int, default=None,
                        help="Measured calls per sample per round (default 10; 3 with --small).")
    parser.add_argument("--warmup", type=int, default=None,
                        help="Unmeasured calls per sample per round (default 2; 1 with --small).")
    parser.add_argument("--threads", type=int, default=2, help="Threads for every system.")
    parser.add_argument("--busy", type=int, default=0,
                        help="CPU-bound background processes while the systems are timed.")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="Seconds for a model's compile, and per round for its timing.")
    parser.add_argument("--cache", type=Path, default=real_models.DEFAULT_CACHE,
                        help="Where the real suite's exports are kept.")
    parser.add_argument("--out", type=Path, default=REPO / "reports", help="Folder to write.")
    parser.add_argument("--update", action="store_true",
                        help="Replace only the measured models' rows in the report already in "
                             "--out (geomeans recomputed; the Markdown names them).")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    args.rounds = args.rounds or (2 if args.small else 5)
    args.runs = args.runs or (3 if args.small else 10)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.small else 2)
    if args.busy < 0 or args.threads < 1 or args.rounds < 1:
        parser.error("--busy must be at least 0, --threads and --rounds at least 1")

    from edgec.fileio import write_text

    only = [n for n in args.only.split(",") if n]
    zoo_names = SMALL["zoo"] if args.small else vs_ort.STATIC + vs_ort.DYNAMIC
    real_names = SMALL["real"] if args.small else None
    if only:
        from edgec import zoo

        known_real = {e["name"] for e in real_models.suite()}
        unknown = set(only) - known_real - set(zoo.names())
        if unknown:
            parser.error(f"unknown models: {', '.join(sorted(unknown))}")
        zoo_names = [n for n in only if n not in known_real]
        real_names = [n for n in only if n in known_real]
    began = time.time()
    measured, failures = [], []
    with tempfile.TemporaryDirectory(prefix="edgec-vs-peers-") as tmp_name:
        tmp = Path(tmp_name)
        real, not_built = ([], []) if real_names == [] else real_models_here(real_names,
                                                                              args.cache)
        entries = zoo_models(zoo_names, tmp, 2 if args.small else None) + real
        for entry in entries:
            rows, failed = measure(entry, tmp, args)
            measured += rows
            failures += failed
    setup = {"threads": args.threads, "rounds": args.rounds, "runs": args.runs,
             "warmup": args.warmup, "busy": args.busy, "machine": _machine(),
             "versions": _versions(), "run_s": round(time.time() - began, 1),
             "date": time.strftime("%Y-%m-%d")}
    report = build_report(measured, failures, not_built, setup)
    if args.update:
        previous = args.out / "vs_peers.json"
        if not previous.is_file():
            parser.error(f"--update: no report at {previous} to update")
        report = merge_reports(json.loads(previous.read_text(encoding="utf-8")), report)
    write_text(args.out / "vs_peers.json", json.dumps(report, indent=1) + "\n")
    write_text(args.out / "vs_peers.md", markdown(report))
    print(markdown(report), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
