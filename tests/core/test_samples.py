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
    ({"x": np.zeros((1, 2, 16), np.float64)}, "is float64, the model expects float32; convert it first"),
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


def _static_and_dynamic_ids():
    """A model with a symbolic (batch, seq) id input indexing a 50-row table, and a mask."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.arange(50 * 4, dtype=np.float32).reshape(50, 4), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"]),
         helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
         helper.make_node("Unsqueeze", ["maskf", "axes"], ["mask3"]),
         helper.make_node("Mul", ["emb", "mask3"], ["y"])],
        "ids", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
                helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        [table, numpy_helper.from_array(np.array([2], np.int64), "axes")])
    return from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_random_samples_of_a_static_model_need_no_shapes():
    from edgec.core.samples import random_samples
    from edgec.zoo.static import make_cnn

    model = from_proto(make_cnn(0))
    first, second = random_samples(model, [], count=2, seed=3)
    (spec,) = model.inputs
    assert first.arrays[spec.name].shape == spec.dims and first.arrays[spec.name].dtype == spec.dtype
    assert not np.array_equal(first.arrays[spec.name], second.arrays[spec.name])
    again = random_samples(model, [], count=2, seed=3)  # seeded: the same inputs every time
    assert np.array_equal(again[1].arrays[spec.name], second.arrays[spec.name])


def test_random_samples_take_dims_or_whole_shapes_and_keep_ids_in_their_table():
    from edgec.core.samples import ShapeSet, random_samples

    model = _static_and_dynamic_ids()
    sets = [ShapeSet({}, {"batch": 1, "seq": 7}), ShapeSet({"ids": (2, 300)}, {})]
    samples = random_samples(model, sets, count=3, seed=0, int_range=(0, 1000))
    assert [sample_dims(model, s) for s in samples] == [{"batch": 1, "seq": 7}] * 3 + [
        {"batch": 2, "seq": 300}] * 3
    ids = np.concatenate([s.arrays["ids"].ravel() for s in samples])
    assert ids.min() >= 0 and ids.max() < 50 and ids.max() > 25  # the table's rows, not 0..1000
    assert samples[-1].arrays["mask"].dtype == np.bool_


@pytest.mark.parametrize("shapes, message", [
    ({}, r"has symbolic dims batch, seq with no value: pass --shapes batch=N,seq=N"),
    ({"dims": {"batch": 1}}, r"has symbolic dim seq with no value"),
    ({"inputs": {"ids": (1, 4), "mask": (1, 5)}}, r"gives dim 'seq' both 4 and 5"),
    ({"inputs": {"ids": (4,)}}, r"gives input 'ids' rank 1 \(4\), the model expects rank 2"),
    ({"inputs": {"image": (1, 4)}}, r"names image, not an input of model '.*'; its inputs are ids, mask"),
    ({"dims": {"batch": 1, "seq": 2, "width": 3}}, r"sets dim width, not a dim of model"),
    ({"inputs": {"": (1, 4)}}, r"shape without an input name, but model '.*' has inputs ids, mask"),
])
def test_random_samples_name_what_the_shapes_miss(shapes, message):
    from edgec.core.samples import ShapeSet, random_samples

    shape_set = ShapeSet(shapes.get("inputs", {}), shapes.get("dims", {}))
    with pytest.raises(SamplesError, match=message):
        random_samples(_static_and_dynamic_ids(), [shape_set], count=1)
