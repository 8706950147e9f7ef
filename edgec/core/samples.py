"""Sample inputs: reading them from ``.npz`` files and checking them against a model's inputs."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgec.core.model import Model
from edgec.errors import InputFileError, SamplesError
from edgec.runtime.dtypes import is_extended
from edgec.runtime.signature import TensorSpec, bind_inputs


@dataclass(frozen=True)
class Sample:
    """One set of model inputs, named after the file it came from."""

    name: str
    arrays: dict[str, np.ndarray]


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Read every array of an ``.npz`` file without pickle, with a one-line error when unreadable."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SamplesError(f"cannot read samples file '{path}': {reason}; pass .npz files") from None


def sample_files(path: str | Path) -> list[Path]:
    """The ``.npz`` files a SAMPLES argument names: one file, or every ``.npz`` in a folder."""
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"samples '{path}' do not exist; pass a .npz file or a folder of them")
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".npz" and p.is_file())
        if not files:
            raise SamplesError(f"samples folder '{path}' holds no .npz files")
        return files
    return [path]


def check_sample(model: Model, arrays: dict[str, np.ndarray], where: str) -> dict[str, int]:
    """Check one sample against the model's inputs and return the value of each symbolic dim."""
    return bind_inputs(model.inputs, arrays, where, SamplesError)


def load_samples(path: str | Path, model: Model) -> list[Sample]:
    """Read and check the samples at ``path`` (one ``.npz`` or a folder of them) for ``model``."""
    samples = []
    for file in sample_files(path):
        arrays = read_npz(file)
        check_sample(model, arrays, f"sample '{file.name}'")
        samples.append(Sample(file.stem, arrays))
    return samples


def sample_dims(model: Model, sample: Sample) -> dict[str, int]:
    """The value of each symbolic input dim in ``sample``."""
    return check_sample(model, sample.arrays, f"sample '{sample.name}'")


@dataclass(frozen=True)
class ShapeSet:
    """One set of input shapes for random inputs: whole input shapes and/or symbolic dim values.

    ``inputs`` maps an input name to its full shape (trtexec's ``name:1x3x224x224``; the name
    ``""`` stands for a model's only input); ``dims`` maps a symbolic dim name to its value
    (``seq=128``). Together they must fix every dim.
    """

    inputs: dict[str, tuple[int, ...]]
    dims: dict[str, int]


# Integer inputs with no known valid range (masks, flags, lengths) draw from [0, 2) unless told:
# 0/1 is valid for masks and flags, and an id input's range is found from its embedding table.
DEFAULT_INT_RANGE = (0, 2)


def random_samples(model: Model, shape_sets: list[ShapeSet], count: int, seed: int = 0,
                   int_range: tuple[int, int] | None = None) -> list[Sample]:
    """``count`` seeded random samples per shape set, for a model without representative data.

    Floats are standard normal; bools fair coins; integers uniform in ``int_range`` (default [0, 2)), narrowed to
    ``[0, n)`` for inputs that index an n-row table (``TensorSpec.bounds``), and the compiled
    value for a fixed shape-like input. A model with symbolic dims needs a shape set fixing each
    (a static model may pass none). Raises SamplesError naming what is missing or inconsistent.
    """
    tensors = [spec for spec in model.inputs if isinstance(spec, TensorSpec)]
    if len(tensors) != len(model.inputs):
        raise SamplesError(f"model '{model.name}' takes sequence or optional inputs; random inputs "
                           f"cover tensors only: pass --samples")
    rng = np.random.default_rng(seed)
    int_range = int_range or DEFAULT_INT_RANGE
    samples = []
    for number, shapes in enumerate(shape_sets or [ShapeSet({}, {})]):
        resolved = _input_shapes(model, tensors, shapes)
        for index in range(count):
            arrays = {spec.name: _random_array(rng, spec, resolved[spec.name], int_range)
                      for spec in tensors}
            name = f"random_{number:02d}_{index:03d}"
            check_sample(model, arrays, f"random sample for shapes {_describe(shapes)}")
            samples.append(Sample(name, arrays))
    return samples


def _input_shapes(model: Model, specs: list[TensorSpec], shapes: ShapeSet) -> dict[str, tuple]:
    """Every input's concrete shape from a shape set, or a one-line SamplesError."""
    by_name = {spec.name: spec for spec in specs}
    if "" in shapes.inputs:
        if len(specs) != 1:
            raise SamplesError(f"--shapes gives a shape without an input name, but model "
                               f"'{model.name}' has inputs {', '.join(by_name)}: write NAME:SHAPE")
        given = {specs[0].name: shapes.inputs[""]}
        shapes = ShapeSet({**given, **{n: s for n, s in shapes.inputs.items() if n}}, shapes.dims)
    unknown = sorted(set(shapes.inputs) - set(by_name))
    if unknown:
        raise SamplesError(f"--shapes names {', '.join(unknown)}, not an input of model "
                           f"'{model.name}'; its inputs are {', '.join(by_name)}")
    symbols = {d for spec in specs for d in spec.dims if isinstance(d, str)}
    stray = sorted(set(shapes.dims) - symbols)
    if stray:
        known = ", ".join(sorted(symbols)) or "none: every dim is fixed"
        raise SamplesError(f"--shapes sets dim {', '.join(stray)}, not a dim of model "
                           f"'{model.name}'; its symbolic dims are {known}")
    dims = dict(shapes.dims)
    for name, shape in shapes.inputs.items():
        spec = by_name[name]
        if len(shape) != spec.rank:
            raise SamplesError(f"--shapes gives input '{name}' rank {len(shape)} "
                               f"({'x'.join(map(str, shape))}), the model expects rank {spec.rank} "
                               f"{list(spec.dims)}")
        for dim, size in zip(spec.dims, shape):
            if isinstance(dim, str) and dims.setdefault(dim, size) != size:
                raise SamplesError(f"--shapes gives dim '{dim}' both {dims[dim]} and {size} "
                                   f"(input '{name}'); inputs sharing a dim must agree")
    missing = sorted(symbols - set(dims))
    if missing:
        example = ",".join(f"{d}=N" for d in missing)
        raise SamplesError(f"model '{model.name}' has symbolic dim{'s' * (len(missing) > 1)} "
                           f"{', '.join(missing)} with no "
                           f"value: pass --shapes {example} (or whole input shapes, "
                           f"name:1x128), or --samples")
    return {spec.name: shapes.inputs.get(spec.name) or
            tuple(d if isinstance(d, int) else dims[d] for d in spec.dims) for spec in specs}


def _random_array(rng: np.random.Generator, spec: TensorSpec, shape: tuple[int, ...],
                  int_range: tuple[int, int]) -> np.ndarray:
    fixed = spec.fixed_array()
    if fixed is not None:
        return fixed
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer) or (is_extended(dtype) and "int" in dtype.name):
        low, high = int_range
        if spec.bounds is not None:
            low, high = max(low, 0, spec.bounds[0]), min(high, spec.bounds[1])
            if low >= high:  # the asked range misses the table: ids must index it
                low, high = 0, spec.bounds[1]
        return rng.integers(low, high, size=shape).astype(dtype)
    if dtype.kind == "f" or is_extended(dtype):  # float16/32/64, bfloat16, float8...
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    raise SamplesError(f"input '{spec.name}' is {spec.dtype}: random inputs cover numbers and "
                       f"bools only; pass --samples")


def _describe(shapes: ShapeSet) -> str:
    parts = [f"{n}:{'x'.join(map(str, s))}" for n, s in shapes.inputs.items()]
    parts += [f"{d}={v}" for d, v in shapes.dims.items()]
    return ",".join(parts) or "(static)"
