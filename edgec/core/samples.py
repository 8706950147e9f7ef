"""Sample inputs: reading them from ``.npz`` files and checking them against a model's inputs."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgec.core.model import Model
from edgec.errors import InputFileError, SamplesError
from edgec.runtime.signature import bind_inputs


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
