"""Quantized artifacts against the fp32 one of the same model: reports/quantize.json and .md.

Each zoo model is exported (seeded) and compiled with ``edgec compile`` once per ``--quantize``
mode (``none`` first: the fp32 reference). Then one worker process loads every artifact of the
model and times them interleaved, round by round (each round: every artifact on every sample),
so machine drift falls on all modes alike; a mode's latency is the median of its rounds' medians.
Per mode the report holds the artifact's bytes and their ratio to fp32's, the least cosine
similarity to fp32's outputs over every sample and output, the latency ratio to fp32, the layers
the accuracy guard kept fp32, and, for ``digits`` (trained weights), held-out accuracy.

    python benchmarks/quantize.py                    # the full comparison (minutes)
    python benchmarks/quantize.py --small            # one small model, few runs: CI's check
    python benchmarks/quantize.py --models tv_resnet18,hf_bert --modes bf16 \
        --target x86_64-avx512 --threads 2 -o reports/quantize_bf16.json
                                                     # real-suite models (built by real_models.py)

Timings need a quiet machine. Ratios come from one run, in one process: they are the numbers
that mean something, not the milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's edgec, also when another is installed
sys.path.insert(0, str(Path(__file__).resolve().parent))

import real_models  # noqa: E402

MODELS = ["transformer", "cnn", "squeezenet_rand", "digits", "resnet50_rand"]
MODES = ["none", "int8-weight", "int8-dynamic", "int8-static"]
SMALL = ["cnn"]


def _run(cmd: list[str], env: dict[str, str]) -> str:
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"quantize: {' '.join(cmd[2:5])} ... failed:\n{result.stderr[-3000:]}")
    return result.stdout


def worker(name: str, model_dir: Path, artifacts: dict[str, Path], rounds: int, runs: int, warmup: int,
           threads: int, output: Path) -> None:
    """Time every artifact on every sample, interleaved by round; compare outputs with fp32's;
    write per mode: latency (median of round medians), least cosine, digits accuracy."""
    from edgec import runtime
    from edgec.stages.bench import BenchSettings, compare_outputs, time_calls
    from edgec.core.model import load_model
    from edgec.core.samples import load_samples

    model = load_model(model_dir / "model.onnx")
    samples = load_samples(model_dir / "samples", model)
    models = {mode: runtime.load(path, threads=threads) for mode, path in artifacts.items()}
    settings = BenchSettings(runs=runs, warmup=warmup, threads=threads)
    medians: dict[str, list[float]] = {mode: [] for mode in models}
    outputs: dict[str, list[dict[str, np.ndarray]]] = {}
    for _ in range(rounds):
        for mode, loaded in models.items():
            stats, outputs[mode] = time_calls(loaded.run, model, samples, settings, mode)
            medians[mode].append(stats["p50_ms"])
    result = {}
    for mode in models:
        cosine = min(compare_outputs(got, want)["cosine_min"]
                     for got, want in zip(outputs[mode], outputs["none"]))
        result[mode] = {"latency_ms": float(np.median(medians[mode])), "cosine_min": cosine}
    if name == "digits":  # trained weights: accuracy on its held-out split means something
        from edgec.zoo import digits

        batches = digits.held_out_batches()
        labels = np.concatenate([labels for _, labels in batches])
        for mode, loaded in models.items():
            logits = np.concatenate([next(iter(loaded.run(inputs).values())) for inputs, _ in batches])
            result[mode]["held_out_accuracy"] = digits.accuracy(logits, labels)
    output.write_text(json.dumps(result))


def markdown(report: dict) -> str:
    lines = ["| model | mode | artifact bytes | size / fp32 | cosine min vs fp32 | guard's drop | "
             "latency ms | latency / fp32 | held-out accuracy | layers kept fp32 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in report["rows"]:
        accuracy = row.get("held_out_accuracy")
        drop = row.get("guard_drop")
        kept = ", ".join(row["fp32_layers"]) if row["fp32_layers"] else ""
        lines.append(
            f"| {row['model']} | {row['mode']} | {row['artifact_bytes']} | {row['size_ratio']:.3f} "
            f"| {row['cosine_min']:.6f} | {'' if drop is None else f'{drop:.2e}'} | "
            f"{row['latency_ms']:.3f} | {row['latency_ratio']:.3f} | "
            f"{'' if accuracy is None else f'{100 * accuracy:.2f}%'} | {kept} |")
    ratios: dict[str, list[float]] = {}
    for row in report["rows"]:
        if row["mode"] != "none":
            ratios.setdefault(row["mode"], []).append(row["latency_ratio"])
    lines += [""] + [f"Geomean latency / fp32, {mode}: {float(np.exp(np.mean(np.log(r)))):.3f} "
                     f"over {len(r)} model(s)." for mode, r in ratios.items()]
    setup = report["setup"]
    lines += ["", f"Target {setup['target']}, {setup['threads']} thread(s); every mode of a model "
                  f"timed in one process, interleaved over {setup['rounds']} rounds of "
                  f"{setup['runs']} runs per sample after {setup['warmup']} warm-up; latency is "
                  f"the median of the rounds' medians. Sizes are the .edgec files. The guard's "
                  f"drop is the compiled artifact's, measured on held-out samples at compile time."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="One small model, few runs (CI).")
    parser.add_argument("--models", default=None,
                        help="Comma-separated zoo names, or real-suite names already built by "
                             "benchmarks/real_models.py, to run instead.")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="Comma-separated --quantize modes; 'none' (the reference) is added.")
    parser.add_argument("--target", default="x86_64", help="edgec target (x86: int8 kernels).")
    parser.add_argument("--threads", type=int, default=1,
                        help="Threads per artifact (1: the kernels' own speed, no thread wake-ups).")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None, help="Measured calls per sample per round.")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--samples", type=int, default=None, help="Samples per model.")
    parser.add_argument("-o", "--output", type=Path, default=REPO / "reports" / "quantize.json")
    parser.add_argument("--worker", nargs=7, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        name, model_dir, artifacts, rounds, runs, warmup, output = args.worker
        worker(name, Path(model_dir), {k: Path(v) for k, v in json.loads(artifacts).items()},
               int(rounds), int(runs), int(warmup), args.threads, Path(output))
        return 0

    import edgec
    from edgec import zoo
    from edgec.core.samples import load_samples
    from edgec.core.targets import load_target
    from edgec.fileio import write_text
    from edgec.stages.quantize import QuantizeSettings, held_out_split

    names = args.models.split(",") if args.models else SMALL if args.small else MODELS
    modes = ["none"] + [m for m in args.modes.split(",") if m and m != "none"]
    rounds = args.rounds or (2 if args.small else 5)
    runs = args.runs or (3 if args.small else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.small else 3)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgec-quantize-") as tmp:
        for name in names:
            model_dir = real_models.DEFAULT_CACHE / name
            if not (model_dir / "model.onnx").is_file():
                model_dir = zoo.export(name, Path(tmp) / name, seed=0,
                                       count=args.samples or (4 if args.small else None))
            artifacts, manifests = {}, {}
            model = edgec.load_model(model_dir / "model.onnx")
            # Every mode, fp32 included, plans from the same samples: the guard's held-out ones
            # would otherwise change a dynamic model's specializations, not only its precision.
            profiling, held_out = held_out_split(load_samples(model_dir / "samples", model))
            for mode in modes:
                artifact = Path(tmp) / f"{name}.{mode}.edgec"
                print(f"quantize: compiling {name} --quantize {mode}", file=sys.stderr, flush=True)
                compiled = edgec.compile(
                    model, profiling, [load_target(args.target)],
                    edgec.CompileSettings(quantize=QuantizeSettings(mode)), held_out=held_out)
                compiled.artifact.save(artifact)
                artifacts[mode] = artifact
                manifests[mode] = compiled.artifact.manifest
            out = Path(tmp) / f"{name}.json"
            _run([sys.executable, __file__, "--threads", str(args.threads), "--worker", name,
                  str(model_dir), json.dumps({k: str(v) for k, v in artifacts.items()}),
                  str(rounds), str(runs), str(warmup), str(out)], env)
            measured = json.loads(out.read_text())
            fp32_bytes = artifacts["none"].stat().st_size
            for mode in modes:
                layers = (manifests[mode].get("quantization") or {}).get("layers", [])
                accuracy = (manifests[mode].get("quantization") or {}).get("accuracy") or {}
                row = {"model": name, "mode": mode, "artifact_bytes": artifacts[mode].stat().st_size,
                       **measured[mode],
                       "guard_drop": (accuracy.get("measured") or {}).get("drop"),
                       "fp32_layers": [layer["name"] for layer in layers
                                       if layer["precision"] == "fp32"]}
                row["size_ratio"] = round(row["artifact_bytes"] / fp32_bytes, 4)
                row["latency_ratio"] = round(row["latency_ms"] / measured["none"]["latency_ms"], 4)
                rows.append(row)
                print(f"quantize: {name} {mode}: size {row['size_ratio']:.3f}x, latency "
                      f"{row['latency_ratio']:.3f}x, cosine {row['cosine_min']:.6f}",
                      file=sys.stderr, flush=True)
    report = {"rows": rows, "setup": {"target": args.target, "threads": args.threads,
                                      "rounds": rounds, "runs": runs, "warmup": warmup}}
    write_text(args.output, json.dumps(report, indent=1) + "\n")
    write_text(args.output.with_suffix(".md"), markdown(report))
    print(markdown(report), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
