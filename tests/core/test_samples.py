import numpy as np
import pytest

from conftest import mlp_model, write_samples
from edgec.errors import InputFileError, SamplesError
from edgec.core.model import from_proto
from edgec.core.samples import load_samples, sample_dims

MODEL = from_proto(mlp_model())


def _write(tmp_path, **arrays):
    path = tmp_path / "s.npz"
    np.savez(path, **arrays)
    return path


def test_folder_of_samples_loads_in_name_order_with_dims(tmp_path):
    rng = np.random.default_rng(0)
    write_samples(tmp_path, [{"x": rng.standard_normal((b, 3, 16)).astype(np.float32)} for b in (2, 1)])
    samples = load_samples(tmp_path, MODEL)
    assert [s.name for s in samples] == ["sample_000", "sample_001"]
    assert [sample_dims(MODEL, s) for s in samples] == [{"batch": 2, "seq": 3}, {"batch": 1, "seq": 3}]


@pytest.mark.parametrize("arrays, message", [
    ({"y": np.zeros((1, 2, 16), np.float32)}, "missing x; unexpected y"),
    ({"x": np.zeros((1, 2, 16), np.float64)}, "is float64, the model expects float32"),
    ({"x": np.zeros((2, 16), np.float32)}, "has rank 2"),
    ({"x": np.zeros((1, 2, 15), np.float32)}, "has 15 at axis 2, the model fixes it to 16"),
])
def test_bad_samples_name_the_problem(tmp_path, arrays, message):
    with pytest.raises(SamplesError, match=message):
        load_samples(_write(tmp_path, **arrays), MODEL)


def test_unreadable_and_missing_samples(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(SamplesError, match="cannot read samples file"):
        load_samples(bad, MODEL)
    with pytest.raises(InputFileError):
        load_samples(tmp_path / "none", MODEL)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SamplesError, match="holds no .npz"):
        load_samples(empty, MODEL)


def test_pickled_object_arrays_are_refused(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, x=np.array([{"a": 1}], dtype=object))
    with pytest.raises(SamplesError, match="cannot read samples file"):
        load_samples(path, MODEL)
