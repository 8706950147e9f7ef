"""Small models built in code, shared by the tests that do not need the zoo's larger ones."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


# A plan that does not build is a bug the tests must see, not hide behind the driver's fallback
# to a simpler plan (set here so that the CLI's subprocesses inherit it).
os.environ.setdefault("EDGEC_NO_FALLBACK", "1")


def mlp_model(seed: int = 0) -> onnx.ModelProto:
    """x[batch, seq, 16] -> MatMul -> Relu -> y[batch, seq, 8]: dynamic dims, compiles in a second."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
         helper.make_node("Relu", ["h"], ["y"], name="relu")],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        [numpy_helper.from_array(weight, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def mlp_samples(shapes: list[tuple[int, int]], seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((b, s, 16)).astype(np.float32)} for b, s in shapes]


MLP_SHAPES = [(1, 8)] * 5 + [(2, 4)] * 3 + [(1, 3), (3, 5)]


def write_samples(directory, samples: list[dict[str, np.ndarray]]):
    directory.mkdir(parents=True, exist_ok=True)
    for index, arrays in enumerate(samples):
        np.savez(directory / f"sample_{index:03d}.npz", **arrays)
    return directory


@pytest.fixture
def mlp_dir(tmp_path):
    """A folder with model.onnx and samples/ for the dynamic MLP."""
    onnx.save(mlp_model(), str(tmp_path / "model.onnx"))
    write_samples(tmp_path / "samples", mlp_samples(MLP_SHAPES))
    return tmp_path


@pytest.fixture(scope="session")
def mlp_artifact(tmp_path_factory):
    """The dynamic MLP compiled for the host, shared by runtime and bench tests."""
    import edgec
    from edgec.core.model import from_proto
    from edgec.core.samples import Sample
    from edgec.core.targets import load_target

    root = tmp_path_factory.mktemp("mlp")
    onnx.save(mlp_model(), str(root / "model.onnx"))
    write_samples(root / "samples", mlp_samples(MLP_SHAPES))
    model = from_proto(mlp_model(), "mlp", str(root / "model.onnx"))
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples(MLP_SHAPES))]
    target = load_target("x86_64")
    artifact = edgec.compile(model, samples, [target]).artifact
    path = root / "mlp.edgec"
    artifact.save(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def _user_state_in_tmp(tmp_path_factory):
    """What edgec learns while the suite runs (tune records, measurements, fitted cost models)
    goes to a folder of this session: never into the package's shipped data (tracked files in a
    checkout) nor the user's own autotune folder. Set in the environment for the CLI's
    subprocesses too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EDGEC_AUTOTUNE_DIR", str(tmp_path_factory.mktemp("autotune")))
        yield


@pytest.fixture(autouse=True)
def _measurements_in_tmp(tmp_path_factory, monkeypatch):
    """Benchmarks run by tests append to a temporary measurement store, not the committed one."""
    monkeypatch.setenv("EDGEC_MEASUREMENTS_DIR", str(tmp_path_factory.mktemp("measurements")))
