"""What every exporter module shares: a model entry (`Spec`), seeded sample inputs, and writing
one model's folder (model.onnx, samples/sample_NNN.npz, meta.json).

This module imports only numpy and the standard library, so that the harness (edgec's venv) can
list the suite without importing any framework. Each exporter module (torch_export.py,
keras_export.py, paddle_export.py) defines ``SPECS`` and runs as a script in the export venv:

    python benchmarks/real_models/torch_export.py --cache DIR [--only a,b] [--rebuild]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

DEFAULT_CACHE = Path(os.environ.get("EDGEC_REAL_MODELS",
                                    Path.home() / ".cache" / "edgec" / "real_models"))
SEED = 0


@dataclass
class Input:
    """One model input. ``shape`` holds ints (fixed) and strings (a dynamic dim, named as the
    model's users name it). ``kind``: "image" (normalized, about N(0,1)), "tokens" (ints in
    [0, high)), "ones" (an attention mask), "audio" (a waveform in [-1, 1]), "normal"."""

    name: str
    shape: tuple
    dtype: str = "float32"
    kind: str = "normal"
    high: int = 0


@dataclass
class Spec:
    name: str
    exporter: str          # "torch-script", "torch-dynamo", "tf2onnx", "paddle2onnx"
    source: str            # what the architecture is, e.g. "torchvision mobilenet_v3_large"
    build: Callable        # () -> the framework's model object, seeded, in eval mode
    inputs: list[Input]
    samples: list[dict]    # one dict per sample: dynamic dim name -> value
    output_names: list[str] = field(default_factory=lambda: ["output"])
    opset: int = 17
    extra: dict = field(default_factory=dict)  # exporter-specific knobs

    @property
    def dynamic_dims(self) -> dict[str, list]:
        return {i.name: [d if isinstance(d, str) else None for d in i.shape] for i in self.inputs
                if any(isinstance(d, str) for d in i.shape)}

    def trace_dims(self) -> dict:
        """The dim values an export traces with: each dynamic dim's largest sampled value (a
        traced 1 is specialized by torch.export, so a user exports with a larger example)."""
        dims: dict = {}
        for sample in self.samples:
            for key, value in sample.items():
                dims[key] = max(dims.get(key, 0), value)
        return dims


def concrete_shape(inp: Input, dims: dict) -> tuple:
    return tuple(dims[d] if isinstance(d, str) else d for d in inp.shape)


def make_value(inp: Input, dims: dict, rng: np.random.Generator) -> np.ndarray:
    shape = concrete_shape(inp, dims)
    if inp.kind == "tokens":
        return rng.integers(0, inp.high, size=shape).astype(inp.dtype)
    if inp.kind == "ones":
        return np.ones(shape, dtype=inp.dtype)
    if inp.kind == "audio":
        return (0.5 * np.sin(np.linspace(0, 200, int(np.prod(shape)))).reshape(shape)
                + 0.1 * rng.standard_normal(shape)).clip(-1, 1).astype(inp.dtype)
    if inp.kind == "image":
        return rng.standard_normal(shape).clip(-2.5, 2.5).astype(inp.dtype)
    return rng.standard_normal(shape).astype(inp.dtype)


def make_inputs(spec: Spec, dims: dict, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [make_value(inp, dims, rng) for inp in spec.inputs]


def onnx_input_names(path: Path) -> list[str]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {init.name for init in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def write_samples(spec: Spec, folder: Path) -> None:
    """The spec's samples keyed by the ONNX model's input names (matched by position)."""
    names = onnx_input_names(folder / "model.onnx")
    if len(names) != len(spec.inputs):
        raise RuntimeError(f"{spec.name}: the ONNX model has inputs {names}, the spec "
                           f"{[i.name for i in spec.inputs]}")
    samples = folder / "samples"
    samples.mkdir(exist_ok=True)
    for k, dims in enumerate(spec.samples):
        values = make_inputs(spec, dims, seed=1000 + k)
        np.savez(samples / f"sample_{k:03d}.npz", **dict(zip(names, values)))


def write_meta(spec: Spec, folder: Path, seconds: float, versions: dict) -> None:
    meta = {"name": spec.name, "exporter": spec.exporter, "source": spec.source,
            "inputs": [{"name": i.name, "shape": list(i.shape), "dtype": i.dtype, "kind": i.kind}
                       for i in spec.inputs],
            "dynamic_dims": spec.dynamic_dims, "samples": spec.samples,
            "onnx_inputs": onnx_input_names(folder / "model.onnx"),
            "opset": spec.opset, "export_s": round(seconds, 2), "versions": versions}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def is_built(folder: Path) -> bool:
    return (folder / "meta.json").is_file() and (folder / "model.onnx").is_file()


def main(specs: list[Spec], export: Callable[[Spec, Path], None], versions: Callable[[], dict],
         argv: list[str] | None = None) -> int:
    """Build each spec into ``<cache>/<name>/``, skipping what exists unless --rebuild. An export
    that fails writes ``<cache>/<name>/export_error.txt`` and the run goes on."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--only", default="")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    only = {n for n in args.only.split(",") if n}
    failed = 0
    for spec in specs:
        if only and spec.name not in only:
            continue
        if args.list:
            print(spec.name, spec.exporter, spec.source)
            continue
        folder = args.cache / spec.name
        if is_built(folder) and not args.rebuild:
            print(f"[skip] {spec.name}: built", flush=True)
            continue
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        start = time.time()
        try:
            export(spec, folder)
            write_samples(spec, folder)
            write_meta(spec, folder, time.time() - start, versions())
            print(f"[ok] {spec.name} ({time.time() - start:.1f} s)", flush=True)
        except Exception as exc:  # noqa: BLE001 - one model's failure must not stop the suite
            failed += 1
            (folder / "export_error.txt").write_text(traceback.format_exc())
            (folder / "model.onnx").unlink(missing_ok=True)
            print(f"[export failed] {spec.name}: {type(exc).__name__}: "
                  f"{str(exc).splitlines()[0] if str(exc) else ''}", flush=True)
    return 1 if failed else 0


def seed_everything(seed: int = SEED) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)


if __name__ == "__main__":
    sys.exit("run an exporter module, e.g. torch_export.py")
