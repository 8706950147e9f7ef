"""edgec against onnxruntime on the zoo's CNNs and dynamic models: reports/vs_ort.json and .md.

Each model is exported from the zoo (seeded), compiled with ``edgec.compile`` (the target given, or
edgec's default for this machine), then timed in rounds, each runtime in a process of its own with
``edgec.stages.bench``'s timer: edgec's artifact, then onnxruntime (2 threads by default), alternating,
so that a machine whose speed drifts slows both alike. Rows hold, per runtime, the median over the
rounds of the median (p50) of a round's calls; ``ratio`` is edgec's over onnxruntime's, and the
geometric means are over the static and the dynamic rows. The transformer gets one row per sequence length
its samples have. Outputs are compared with onnxruntime's; a model whose outputs differ beyond
``--tolerance`` (relative to the output's scale) makes the run fail after writing the report.

    python benchmarks/vs_ort.py                 # the full comparison (minutes per model)
    python benchmarks/vs_ort.py --small         # two small models, few runs: CI's check

Timings need a quiet machine: run the full comparison once, not beside other heavy jobs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's edgec, also when another is installed

STATIC = ["resnet50_rand", "squeezenet_rand", "shufflenet_rand", "inception_v1_rand",
          "densenet121_rand"]
DYNAMIC = ["transformer", "early_exit", "moe", "speech_lstm", "scan_rnn", "greedy_decoder",
           "cnn_batch", "token_tagger", "prompt_encoder", "digits"]
SMALL = ["cnn", "transformer"]
# Models whose rows are split by this input dim (one row per value seen in the samples).
SPLIT_BY = {"transformer": "seq"}


def compile_zoo_model(model_dir: Path, target: str | None):
    """``edgec.compile`` of an exported zoo model on its samples, with edgec's defaults."""
    import edgec
    from edgec.core.samples import load_samples
    from edgec.core.targets import load_target

    model = edgec.load_model(model_dir / "model.onnx")
    return edgec.compile(model, load_samples(model_dir / "samples", model),
                         [load_target(target)] if target else None)


def _python_cmd(*args: str) -> list[str]:
    return [sys.executable, *args]


def _run(cmd: list[str], env: dict[str, str]) -> str:
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"vs_ort: {' '.join(cmd[:4])} ... failed:\n{result.stderr[-3000:]}")
    return result.stdout


def worker(system: str, name: str, model_dir: Path, artifact: Path, runs: int, warmup: int,
           threads: int, output: Path) -> None:
    """Time one system on every sample in this process; write stats per row group and outputs."""
    from edgec import runtime
    from edgec.stages.bench import BenchSettings, time_calls
    from edgec.core.model import load_model
    from edgec.core.reference import reference_session
    from edgec.core.samples import load_samples, sample_dims

    model = load_model(model_dir / "model.onnx")
    samples = load_samples(model_dir / "samples", model)
    settings = BenchSettings(runs=runs, warmup=warmup, threads=threads)
    if system == "edgec":
        call = runtime.load(artifact, threads=threads).run
    else:
        call = reference_session(model.proto, threads=threads, spinning=True).run
    split = SPLIT_BY.get(name)
    groups: dict[str, list] = defaultdict(list)
    for sample in samples:
        key = f"{split}={sample_dims(model, sample)[split]}" if split else ""
        groups[key].append(sample)
    rows = {}
    outputs = {}
    for key, group in groups.items():
        stats, outs = time_calls(call, model, group, settings, system)
        rows[key] = stats["p50_ms"]
        for sample, out in zip(group, outs):
            for name, value in out.items():
                outputs[f"{sample.name}/{name}"] = value
    np.savez(output.with_suffix(".npz"), **outputs)
    output.write_text(json.dumps(rows))


def _max_rel_diff(edgec_npz: Path, ort_npz: Path) -> float:
    from edgec.stages.bench import compare_outputs

    got, want = np.load(edgec_npz), np.load(ort_npz)
    got_all = {k: got[k] for k in want.files}
    return compare_outputs(got_all, {k: want[k] for k in want.files})["max_rel"]


def geomean(values: list[float]) -> float | None:
    return round(math.exp(sum(math.log(v) for v in values) / len(values)), 4) if values else None


def markdown(report: dict, setup: dict | None = None) -> str:
    lines = ["| model | kind | edgec ms | onnxruntime ms | edgec / onnxruntime |",
             "| --- | --- | ---: | ---: | ---: |"]
    for row in report["models"]:
        lines.append(f"| {row['name']} | {row['kind']} | {row['edgec_ms']:.3f} | "
                     f"{row['onnxruntime_ms']:.3f} | {row['ratio']:.3f} |")
    for kind in ("static", "dynamic"):
        value = report[f"geomean_{kind}"]
        if value is not None:
            lines.append(f"| geomean {kind} | | | | {value:.3f} |")
    if setup:
        lines += ["", f"Target {setup['target']}, {setup['threads']} threads each, medians of "
                      f"{setup['runs']} runs per sample after {setup['warmup']} warm-up; each "
                      f"runtime in its own process, the two alternating over "
                      f"{setup.get('rounds', 1)} round(s), the median round kept."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="Two small models, few runs (CI).")
    parser.add_argument("--models", default=None, help="Comma-separated zoo names to run instead.")
    parser.add_argument("--target", default=None, help="edgec target (default: edgec's choice).")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=None, help="Measured calls per sample.")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None,
                        help="Alternating timings of both runtimes per model (default 3; 1 small).")
    parser.add_argument("--samples", type=int, default=None, help="Samples per model.")
    parser.add_argument("--tolerance", type=float, default=1e-3,
                        help="Max output difference relative to onnxruntime's output scale.")
    parser.add_argument("-o", "--output", type=Path, default=REPO / "reports" / "vs_ort.json")
    parser.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        system, name, model_dir, artifact, runs, warmup, output = args.worker
        worker(system, name, Path(model_dir), Path(artifact), int(runs), int(warmup), args.threads,
               Path(output))
        return 0

    from edgec import zoo
    from edgec.fileio import write_text

    names = (args.models.split(",") if args.models else SMALL if args.small else STATIC + DYNAMIC)
    runs = args.runs or (5 if args.small else 20)
    rounds = args.rounds or (1 if args.small else 3)
    warmup = args.warmup if args.warmup is not None else (2 if args.small else 3)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rows, failures, target_used = [], [], args.target
    with tempfile.TemporaryDirectory(prefix="edgec-vs-ort-") as tmp:
        for name in names:
            entry = zoo.get(name)
            model_dir = zoo.export(name, Path(tmp) / name, seed=0,
                                   count=args.samples or (2 if args.small else None))
            artifact = Path(tmp) / f"{name}.edgec"
            print(f"vs_ort: compiling {name}", file=sys.stderr, flush=True)
            compiled = compile_zoo_model(model_dir, args.target)
            compiled.artifact.save(artifact)
            target_used = target_used or next(iter(compiled.artifact.manifest["libraries"]))
            timings: dict[str, list[dict[str, float]]] = {"edgec": [], "onnxruntime": []}
            for _ in range(rounds):
                for system in timings:
                    out = Path(tmp) / f"{name}.{system}.json"
                    _run(_python_cmd(__file__, "--threads", str(args.threads), "--worker", system,
                                     name, str(model_dir), str(artifact), str(runs), str(warmup),
                                     str(out)), env)
                    timings[system].append(json.loads(out.read_text()))
            measured = {system: {key: round(statistics.median(t[key] for t in per_round), 4)
                                 for key in per_round[0]}
                        for system, per_round in timings.items()}
            diff = _max_rel_diff(Path(tmp) / f"{name}.edgec.npz",
                                 Path(tmp) / f"{name}.onnxruntime.npz")
            if not diff <= args.tolerance:
                failures.append(f"{name}: outputs differ from onnxruntime by {diff:.3g} (relative)")
            for key, edgec_ms in measured["edgec"].items():
                ort_ms = measured["onnxruntime"][key]
                row = {"name": f"{name} {key}".strip(), "kind": entry.kind,
                       "edgec_ms": edgec_ms, "onnxruntime_ms": ort_ms,
                       "ratio": round(edgec_ms / ort_ms, 4)}
                rows.append(row)
                print(f"vs_ort: {row['name']}: edgec {edgec_ms:.3f} ms, onnxruntime {ort_ms:.3f} ms,"
                      f" ratio {row['ratio']:.3f}, max rel diff {diff:.2g}", file=sys.stderr,
                      flush=True)
    report = {
        "models": rows,
        "geomean_static": geomean([r["ratio"] for r in rows if r["kind"] == "static"]),
        "geomean_dynamic": geomean([r["ratio"] for r in rows if r["kind"] == "dynamic"]),
    }
    setup = {"target": target_used, "threads": args.threads, "runs": runs, "warmup": warmup,
             "rounds": rounds}
    write_text(args.output, json.dumps(report, indent=1) + "\n")
    write_text(args.output.with_suffix(".md"), markdown(report, setup))
    print(markdown(report, setup), end="")
    if failures:
        print("vs_ort: " + "; ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
