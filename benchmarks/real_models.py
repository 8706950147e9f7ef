"""edgec on real model architectures exported by real exporters: reports/real_models.json and .md.

The suite (benchmarks/real_models/: torchvision, timm and transformers models through both
torch.onnx exporters, Keras applications through tf2onnx, paddle models through paddle2onnx;
seeded random weights) is built into a cache outside the checkout by the exporters' own venvs
(benchmarks/real_models/setup_export_env.sh). Then, per model, in subprocesses with a timeout:

1. ``edgec.compile`` of the model on its samples with edgec's defaults (no target, no policy
   given), in a worker process so that a crash or a timeout costs only that model;
2. every sample through edgec's runtime and through onnxruntime: ``max_rel_error`` is, per output,
   max |edgec - ort| / max |ort|, the max over outputs and samples;
3. ``edgec bench A --samples S``: ``ratio_p50`` = edgec's p50 over onnxruntime's.

"matched" counts models that compiled with max_rel_error <= 1e-3.

    python benchmarks/real_models.py                      # build what is missing, run everything
    python benchmarks/real_models.py --small              # a few small models (CI)
    python benchmarks/real_models.py --only tv_resnet18,hf_bert --timeout 300
    python benchmarks/real_models.py --build-only         # just export the suite

Run with edgec's venv python; this checkout's edgec is used (PYTHONPATH). Caches:
$EDGEC_REAL_MODELS (default ~/.cache/edgec/real_models), exporter venvs under $EDGEC_EXPORT_VENV
(default ~/.cache/edgec/export-venv).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
SUITE = Path(__file__).resolve().parent / "real_models"
sys.path.insert(0, str(SUITE))

DEFAULT_CACHE = Path(os.environ.get("EDGEC_REAL_MODELS",
                                    Path.home() / ".cache" / "edgec" / "real_models"))
DEFAULT_VENVS = Path(os.environ.get("EDGEC_EXPORT_VENV",
                                    Path.home() / ".cache" / "edgec" / "export-venv"))
# exporter module -> the export venv it runs in
MODULES = {"torch_export": "torch", "keras_export": "tf", "paddle_export": "tf"}
# CI's check: models whose exporters need only torch and transformers, so that edgec's own venv
# exports them (`--export-python`), without the export venvs' torchvision, TensorFlow or paddle.
SMALL = ["hf_vit_dynamo", "hf_whisper_tiny_encoder", "hf_bert"]
MATCH_TOLERANCE = 1e-3


def suite() -> list[dict]:
    """Every entry of the suite: name, exporter, source and the module that builds it."""
    import importlib

    entries = []
    for module in MODULES:
        for spec in importlib.import_module(module).SPECS:
            entries.append({"name": spec.name, "exporter": spec.exporter, "source": spec.source,
                            "module": module})
    return entries


def build_suite(entries: list[dict], cache: Path, venvs: Path, rebuild: bool,
                export_python: Path | None = None) -> float:
    """Export the entries' models into the cache (each exporter module in its own venv, or all
    with ``export_python``)."""
    start = time.time()
    for module, venv in MODULES.items():
        names = [e["name"] for e in entries if e["module"] == module]
        if not names:
            continue
        python = export_python or venvs / venv / "bin" / "python"
        if not python.exists():
            print(f"real_models: no export venv at {python.parent.parent}; run "
                  "benchmarks/real_models/setup_export_env.sh", file=sys.stderr)
            continue
        cmd = [str(python), str(SUITE / f"{module}.py"), "--cache", str(cache), "--only",
               ",".join(names)] + (["--rebuild"] if rebuild else [])
        result = subprocess.run(cmd, capture_output=True, text=True)
        for line in result.stdout.splitlines():
            if line.startswith(("[ok]", "[skip]", "[export failed]")):
                print(f"  {line}", flush=True)
    return time.time() - start


def _edgec(*args: str) -> list[str]:
    return [sys.executable, "-m", "edgec", *args]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # bench adds its timings to the cost-model store: a benchmark run keeps them out of the
    # checkout's committed one.
    env.setdefault("EDGEC_MEASUREMENTS_DIR", str(DEFAULT_CACHE / "measurements"))
    return env


def first_error_line(text: str) -> str:
    """The line that says what went wrong: edgec's one-line 'error: ...', else a traceback's
    exception line, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("edgec: error:"):
            return line
    lines = [line for line in lines if "Warning:" not in line]
    for line in lines:
        if line.lower().startswith("error:"):
            return line
    for line in reversed(lines):
        if not line.startswith(("File ", "^", "~")) and ":" in line and not line.startswith(" "):
            if "Error" in line.split(":")[0] or "Exception" in line.split(":")[0]:
                return line
    return lines[-1] if lines else "(no output)"


def compile_worker(model: Path, samples: Path, artifact: Path) -> int:
    """In a subprocess: ``edgec.compile`` with the defaults; the artifact written, notes (a
    fallback taken) on stdout, an error as edgec's one line on stderr."""
    import edgec
    from edgec.core.samples import load_samples
    from edgec.errors import EdgecError

    try:
        loaded = edgec.load_model(model)
        compiled = edgec.compile(loaded, load_samples(samples, loaded))
    except EdgecError as exc:
        print(f"edgec: error: {exc}", file=sys.stderr)
        return exc.exit_code
    compiled.artifact.save(artifact)
    for note in compiled.notes:
        print(f"note: {note}")
    return 0


def compile_model(model: Path, samples: Path, artifact: Path, timeout: float) -> dict:
    """Compile one model with edgec's defaults in a worker process (``compile_worker``). The one
    place the harness compiles: returns {"compiled", "error", "compile_s", "log"}."""
    start = time.time()
    try:
        result = subprocess.run([sys.executable, __file__, "--compile-worker", str(model),
                                 str(samples), str(artifact)], env=_env(), capture_output=True,
                                text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"compiled": False, "error": f"timeout: compile ran past {timeout:.0f} s",
                "compile_s": round(time.time() - start, 1), "log": ""}
    seconds = round(time.time() - start, 1)
    log = result.stdout + result.stderr
    if result.returncode != 0 or not artifact.is_file():
        return {"compiled": False, "error": first_error_line(result.stderr or result.stdout),
                "compile_s": seconds, "log": log}
    notes = [line[len("note: "):] for line in result.stdout.splitlines() if line.startswith("note: ")]
    return {"compiled": True, "error": None, "compile_s": seconds, "log": log,
            "note": "; ".join(notes) or None}


def accuracy_worker(artifact: Path, model: Path, samples: Path, output: Path) -> None:
    """In a subprocess: every sample through edgec's runtime and onnxruntime; writes the max
    relative error (and per sample/output detail) as JSON."""
    import onnxruntime as ort

    from edgec import runtime
    from edgec.core.samples import read_npz, sample_files

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    compiled = runtime.load(artifact, threads=2)
    worst = 0.0
    detail = []
    for file in sample_files(samples):
        inputs = read_npz(file)
        ref = dict(zip(names, session.run(names, inputs)))
        got = compiled.run(inputs)
        for name in names:
            r = np.asarray(ref[name])
            g = np.asarray(got[name])
            if r.shape != g.shape:
                err = float("inf")
                detail.append({"sample": file.stem, "output": name, "rel": None,
                               "shape": [list(r.shape), list(g.shape)]})
            else:
                scale = float(np.max(np.abs(r.astype(np.float64)))) if r.size else 0.0
                diff = float(np.max(np.abs(r.astype(np.float64) - g.astype(np.float64)))) if r.size else 0.0
                err = diff / scale if scale > 0 else diff
                detail.append({"sample": file.stem, "output": name, "rel": err, "scale": scale})
            worst = max(worst, err)
    output.write_text(json.dumps({"max_rel_error": worst, "detail": detail}))


def check_accuracy(artifact: Path, model: Path, samples: Path, timeout: float) -> dict:
    out = artifact.with_name("accuracy.json")
    out.unlink(missing_ok=True)
    try:
        result = subprocess.run([sys.executable, __file__, "--accuracy-worker", str(artifact),
                                 str(model), str(samples), str(out)], env=_env(),
                                capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"max_rel_error": None, "run_error": f"timeout: run ran past {timeout:.0f} s"}
    if result.returncode != 0 or not out.is_file():
        return {"max_rel_error": None, "run_error": first_error_line(result.stderr)}
    value = json.loads(out.read_text())["max_rel_error"]
    return {"max_rel_error": None if value == float("inf") else value,
            "run_error": "output shape differs from onnxruntime's" if value == float("inf") else None}


def bench_model(artifact: Path, model: Path, samples: Path, runs: int, timeout: float) -> dict:
    out = artifact.with_name("bench.json")
    try:
        result = subprocess.run(_edgec("bench", str(artifact), "--samples", str(samples), "--model",
                                       str(model), "--runs", str(runs), "--warmup", "1",
                                       "--baselines", "onnxruntime", "-o", str(out)),
                                env=_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ratio_p50": None, "bench_error": f"timeout: bench ran past {timeout:.0f} s"}
    if result.returncode != 0 or not out.is_file():
        return {"ratio_p50": None, "bench_error": first_error_line(result.stderr)}
    data = json.loads(out.read_text())
    return {"ratio_p50": data.get("ratio_p50"), "edgec_p50_ms": data["edgec"]["p50_ms"],
            "ort_p50_ms": data["onnxruntime"]["p50_ms"]}


def run_one(entry: dict, cache: Path, timeout: float, runs: int) -> dict:
    folder = cache / entry["name"]
    row = {"name": entry["name"], "exporter": entry["exporter"], "source": entry["source"],
           "compiled": False, "error": None, "compile_s": None, "max_rel_error": None,
           "ratio_p50": None, "artifact_bytes": None}
    model, samples = folder / "model.onnx", folder / "samples"
    if not model.is_file():
        err = folder / "export_error.txt"
        lines = err.read_text().strip().splitlines() if err.is_file() else []
        row["error"] = "export failed: " + (lines[-1] if lines else "not built")
        row["stage"] = "export"
        return row
    work = folder / "edgec"
    work.mkdir(exist_ok=True)
    artifact = work / "model.edgec"
    artifact.unlink(missing_ok=True)
    result = compile_model(model, samples, artifact, timeout)
    (work / "compile.log").write_text(result.pop("log"))
    row.update(result)
    if not row["compiled"]:
        row["stage"] = "compile"
        return row
    row["artifact_bytes"] = artifact.stat().st_size
    acc = check_accuracy(artifact, model, samples, timeout)
    row["max_rel_error"] = acc["max_rel_error"]
    if acc["run_error"]:
        row["error"] = "run: " + acc["run_error"]
        row["stage"] = "run"
        return row
    bench = bench_model(artifact, model, samples, runs, timeout)
    row["ratio_p50"] = bench.pop("ratio_p50")
    row.update(bench)
    return row


def _fmt(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def write_reports(rows: list[dict], out_dir: Path, meta: dict) -> dict:
    compiled = sum(1 for r in rows if r["compiled"])
    matched = sum(1 for r in rows if r["compiled"] and r["max_rel_error"] is not None
                  and r["max_rel_error"] <= MATCH_TOLERANCE)
    report = {"models": rows, "compiled": compiled, "matched": matched, "total": len(rows), **meta}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "real_models.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["# edgec on real exported models", "",
             f"{compiled}/{len(rows)} compiled, {matched}/{len(rows)} matched onnxruntime "
             f"(max relative error <= {MATCH_TOLERANCE:g}). Default `edgec compile` settings; "
             "`python benchmarks/real_models.py` rebuilds this.", "",
             "| model | exporter | source | compiled | compile s | max rel error | ratio p50 | "
             "artifact KB | error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        error = (r["error"] or (f"note: {r['note']}" if r.get("note") else "")).replace("|", "\\|")
        if len(error) > 200:
            error = error[:200] + "..."
        lines.append(f"| {r['name']} | {r['exporter']} | {r['source']} | "
                     f"{'yes' if r['compiled'] else 'no'} | {_fmt(r['compile_s'], '.1f')} | "
                     f"{_fmt(r['max_rel_error'], '.2e')} | {_fmt(r['ratio_p50'], '.3f')} | "
                     f"{_fmt(r['artifact_bytes'] and r['artifact_bytes'] / 1024, '.0f')} | {error} |")
    (out_dir / "real_models.md").write_text("\n".join(lines) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Comma-separated model names.")
    parser.add_argument("--small", action="store_true", help=f"Only {', '.join(SMALL)}.")
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds per step per model.")
    parser.add_argument("--runs", type=int, default=5, help="Bench calls per sample.")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--export-venvs", type=Path, default=DEFAULT_VENVS)
    parser.add_argument("--rebuild", action="store_true", help="Re-export models already built.")
    parser.add_argument("--export-python", type=Path, default=None,
                        help="Export every model with this Python (one that has the exporters).")
    parser.add_argument("--check", action="store_true",
                        help="Exit 1 unless every model run compiled and matched onnxruntime.")
    parser.add_argument("--build-only", action="store_true")
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--reports", type=Path, default=REPO / "reports")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--merge", action="store_true",
                        help="With --only: keep the other models' rows of the existing report.")
    args = parser.parse_args(argv)

    entries = suite()
    wanted = set(SMALL) if args.small else {n for n in args.only.split(",") if n}
    if wanted:
        unknown = wanted - {e["name"] for e in entries}
        if unknown:
            parser.error(f"unknown models: {', '.join(sorted(unknown))}")
        entries = [e for e in entries if e["name"] in wanted]
    if args.list:
        for e in entries:
            print(f"{e['name']:32} {e['exporter']:13} {e['source']}")
        return 0
    build_s = 0.0
    if not args.skip_build:
        print(f"building {len(entries)} models into {args.cache}", flush=True)
        build_s = build_suite(entries, args.cache, args.export_venvs, args.rebuild,
                              args.export_python)
    if args.build_only:
        return 0
    start = time.time()
    rows: list[dict] = []
    kept: list[dict] = []
    previous = args.reports / "real_models.json"
    if wanted and args.merge and previous.is_file():
        # --only/--small with --merge: the other models' rows of the last report stay
        kept = [r for r in json.loads(previous.read_text())["models"] if r["name"] not in wanted]
    order = {e["name"]: k for k, e in enumerate(suite())}

    def merged() -> list[dict]:
        return sorted(kept + rows, key=lambda r: order.get(r["name"], len(order)))

    for entry in entries:
        row = run_one(entry, args.cache, args.timeout, args.runs)
        rows.append(row)
        status = "ok" if row["compiled"] and not row["error"] else "FAIL"
        print(f"[{status}] {row['name']}: compile {row['compile_s']} s, rel err "
              f"{_fmt(row['max_rel_error'], '.2e')}, ratio {_fmt(row['ratio_p50'], '.3f')}"
              + (f" -- {row['error']}" if row["error"] else ""), flush=True)
        # the report is rewritten after each model, so an interrupted run leaves a partial one
        write_reports(merged(), args.reports, {"build_s": round(build_s, 1),
                                               "run_s": round(time.time() - start, 1)})
    report = write_reports(merged(), args.reports, {"build_s": round(build_s, 1),
                                                "run_s": round(time.time() - start, 1)})
    print(f"{report['compiled']}/{report['total']} compiled, {report['matched']} matched; "
          f"wrote {args.reports / 'real_models.json'}")
    failed = [r["name"] for r in rows if not (r["compiled"] and r["max_rel_error"] is not None
                                              and r["max_rel_error"] <= MATCH_TOLERANCE)]
    if args.check and failed:
        print(f"real_models: not compiled or not matching: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--accuracy-worker":
        accuracy_worker(*(Path(a) for a in sys.argv[2:]))
        sys.exit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "--compile-worker":
        sys.exit(compile_worker(*(Path(a) for a in sys.argv[2:])))
    sys.exit(main())
