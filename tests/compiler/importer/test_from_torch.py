"""PyTorch programs (torch.export) through the normal pipeline: profile, plan, build, runtime."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the torch extra is not installed (pip install 'edgec[torch]')")

from torch.export import Dim, export  # noqa: E402
from torch._higher_order_ops import while_loop  # noqa: E402

from edgec import runtime  # noqa: E402
from edgec.stages.build import build  # noqa: E402
from edgec.cli import main  # noqa: E402
from edgec.errors import InputFileError, ModelError, StageInputError  # noqa: E402
from edgec.stages.bench import BenchResult  # noqa: E402
from edgec.core.model import load_model  # noqa: E402
from edgec.stages.plan import plan  # noqa: E402
from edgec.stages.profile import profile  # noqa: E402
from edgec.core.samples import Sample  # noqa: E402
from edgec.core.targets import load_target  # noqa: E402
from edgec.core.torch_program import from_program  # noqa: E402

from conftest import write_samples  # noqa: E402


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = torch.nn.Linear(8, 32)
        self.second = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.second(torch.nn.functional.gelu(self.first(x)))


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.norm(self.conv(x))), 2)
        return torch.softmax(self.head(y.mean(dim=(2, 3))), dim=-1)


class Gate(torch.nn.Module):
    """A data-dependent branch: scale through a layer when the input's mean is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.cond(x.mean() > 0, lambda x: torch.tanh(self.layer(x)) * 2,
                          lambda x: x.abs() - 1, (x,))


class Accumulate(torch.nn.Module):
    """A data-dependent trip count: add |x| @ W until the total passes a limit (reads x and W from
    outside the loop), counting the steps."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(8, 8) * 0.1)

    def forward(self, x):
        step = x.abs() @ self.weight + 0.01

        def cond_fn(count, total):
            return total.sum() < 50.0

        def body_fn(count, total):
            return count + 1, total + step

        return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), torch.zeros_like(x)))


def _exported(module: torch.nn.Module, example: torch.Tensor, **dims) -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    module = module.eval()
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn_like(param) * 0.5)
    shapes = ({axis: Dim(name, min=1, max=256) for name, axis in dims.items()},)
    return export(module, (example,), dynamic_shapes=shapes)


def _eager(program, array: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        result = program.module()(torch.from_numpy(array.copy()))
    return [value.numpy() for value in torch.utils._pytree.tree_leaves(result)]


def _compile(program, samples: list[np.ndarray], tmp_path, name: str):
    model = from_program(program, name)
    prof = profile(model, [Sample(f"s{i}", {"x": a}) for i, a in enumerate(samples)])
    assert prof.reference_error == ""
    target = load_target("x86_64")
    artifact = build(model, plan(model, prof, target), [target])
    return model, prof, runtime.load(artifact.save(tmp_path / f"{name}.edgec"))


def _check(program, compiled, arrays: list[np.ndarray]) -> None:
    for array in arrays:
        got = compiled.run({"x": array})
        expected = _eager(program, array)
        assert list(got) == [f"output_{k}" for k in range(len(expected))]
        for value, reference in zip(got.values(), expected):
            assert value.shape == reference.shape and value.dtype == reference.dtype
            np.testing.assert_allclose(value, reference, rtol=1e-4, atol=1e-5)


def _normal(shape, seed: int, shift: float = 0.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) + shift).astype(np.float32)


@pytest.fixture(scope="module")
def mlp_program():
    return _exported(MLP(), torch.randn(4, 8), batch=0)


def test_mlp_dynamic_batch_matches_eager_on_seen_and_unseen_batches(mlp_program, tmp_path):
    samples = [_normal((4, 8), i) for i in range(3)] + [_normal((2, 8), 9)]
    model, _, compiled = _compile(mlp_program, samples, tmp_path, "mlp")
    (batch,) = model.dynamic_dims
    assert [(s.name, s.dtype, s.dims) for s in model.inputs] == [("x", "float32", (batch, 8))]
    assert [(s.name, s.dims) for s in model.outputs] == [("output_0", (batch, 4))]
    assert [f["kind"] for f in compiled.manifest["libraries"]["x86_64"]["functions"]][:2] == [
        "dispatch", "specialized"]
    _check(mlp_program, compiled, [_normal((4, 8), 20), _normal((2, 8), 21), _normal((1, 8), 22),
                                   _normal((37, 8), 23)])


def test_conv_net_with_dynamic_batch_matches_eager(tmp_path):
    program = _exported(ConvNet(), torch.randn(2, 3, 16, 16), batch=0)
    _, _, compiled = _compile(program, [_normal((2, 3, 16, 16), i) for i in range(2)], tmp_path, "conv")
    _check(program, compiled, [_normal((2, 3, 16, 16), 5), _normal((5, 3, 16, 16), 6)])


def test_cond_runs_the_branch_the_data_picks(tmp_path):
    program = _exported(Gate(), torch.randn(4, 8), batch=0)
    samples = [_normal((4, 8), i, shift=1.0 if i % 2 else -1.0) for i in range(5)]
    model, prof, compiled = _compile(program, samples, tmp_path, "gate")
    (name,) = [node for node, op in model.control_flow if op == "cond"]
    assert prof.control_flow[name] == {"op": "cond", "branches": {"then": 2, "else": 3}}
    positive, negative = _normal((6, 8), 30, shift=1.0), _normal((3, 8), 31, shift=-1.0)
    assert _eager(program, positive)[0].max() <= 2 and _eager(program, negative)[0].min() >= -1
    _check(program, compiled, [positive, negative, samples[0], samples[1]])


def test_while_loop_with_data_dependent_trips_matches_eager(tmp_path):
    program = _exported(Accumulate(), torch.randn(4, 8), batch=0)
    samples = [_normal((4, 8), i) for i in range(2)] + [_normal((2, 8), 3) * 0.01]
    model, prof, compiled = _compile(program, samples, tmp_path, "accumulate")
    (name,) = [node for node, op in model.control_flow if op == "while_loop"]
    trips = prof.control_flow[name]
    assert trips["op"] == "while_loop" and trips["trip_min"] < trips["trip_max"]
    # Unseen shapes and trip counts, from one iteration to several hundred (past the loop's
    # 64-iteration chunks).
    arrays = [_normal((3, 8), 40) * 100, _normal((4, 8), 41), _normal((1, 8), 42) * 0.001,
              _normal((7, 8), 43) * 0.05]
    counts = [int(_eager(program, a)[0]) for a in arrays]
    assert counts[0] == 1 and counts[2] > 64
    _check(program, compiled, arrays)


def test_artifact_runs_without_torch(mlp_program, tmp_path):
    _, _, compiled = _compile(mlp_program, [_normal((4, 8), 0)], tmp_path, "mlp")
    x = _normal((3, 8), 50)
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import sys, numpy as np
        sys.modules["torch"] = None  # any import of torch now fails
        import edgec.runtime as rt
        x = np.load({str(tmp_path / "x.npy")!r})
        y = rt.load({str(compiled.path)!r}).run({{"x": x}})["output_0"]
        np.save({str(tmp_path / "y.npy")!r}, y)
    """)
    subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), _eager(mlp_program, x)[0],
                               rtol=1e-4, atol=1e-5)


def test_cli_compiles_a_pt2_file(mlp_program, tmp_path):
    path = tmp_path / "mlp.pt2"
    torch.export.save(mlp_program, path)
    samples = write_samples(tmp_path / "samples", [{"x": _normal((b, 8), b)} for b in (4, 4, 2)])
    assert load_model(path).sha256 == load_model(path).sha256
    assert main(["compile", str(path), "--samples", str(samples), "--target", "x86_64",
                 "-o", str(tmp_path / "a.edgec")]) == 0
    x = _normal((5, 8), 60)
    y = runtime.load(tmp_path / "a.edgec").run({"x": x})["output_0"]
    np.testing.assert_allclose(y, _eager(mlp_program, x)[0], rtol=1e-4, atol=1e-5)
    # bench's reference is the program run eagerly by torch (no ONNX model for onnxruntime)
    assert main(["bench", str(tmp_path / "a.edgec"), "--samples", str(samples), "--runs", "2",
                 "--baselines", "onnxruntime,tvm-plain", "-o", str(tmp_path / "r.json")]) == 0
    result = BenchResult.load(tmp_path / "r.json")
    assert result["reference"] == "torch" and list(result["baselines"]) == ["torch", "tvm-plain"]
    assert result["accuracy"]["max_abs"] < 1e-4 and "onnxruntime" not in result.data
    assert "not run, for want of an ONNX model: onnxruntime" in result["notes"][0]
    # report's tables are against onnxruntime: one line, not a KeyError
    assert main(["report", str(tmp_path / "r.json"), "-o", str(tmp_path / "rep")]) == \
        StageInputError.exit_code


def test_debug_compares_every_node_with_torch_and_leaves_the_program_as_it_was(mlp_program):
    from edgec.core.torch_program import serialized
    from edgec.tools.debug import debug

    before = serialized(mlp_program)
    samples = [Sample(f"s{i}", {"x": _normal((b, 8), b)}) for i, b in enumerate((4, 4, 2))]
    result = debug(from_program(mlp_program, "mlp"), samples, load_target("x86_64"))
    assert result.first is None
    assert [row["node"] for row in result.nodes] == ["linear", "gelu", "linear_1"]
    assert all(row["region"] == "main" and row["max_rel"] < 1e-4 for row in result.nodes)
    assert serialized(mlp_program) == before
    assert len(from_program(mlp_program, "mlp").outputs) == 1


def test_unsupported_op_names_node_and_op():
    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()

    model = from_program(export(Spectrum(), (torch.randn(4, 8),)), "spectrum")
    target = load_target("x86_64")
    prof = profile(model, [Sample("s", {"x": _normal((4, 8), 0)})])
    with pytest.raises(ModelError, match=r"node '_fft_r2c' calls aten\._fft_r2c\.default, which"):
        build(model, plan(model, prof, target), [target])


def test_bad_program_files(tmp_path):
    with pytest.raises(InputFileError, match="does not exist"):
        load_model(tmp_path / "missing.pt2")
    (tmp_path / "junk.pt2").write_bytes(b"not a zip archive")
    with pytest.raises(ModelError, match="not a torch.export program"):
        load_model(tmp_path / "junk.pt2")
    with pytest.raises(ModelError, match="not a torch.export.ExportedProgram"):
        from_program(MLP(), "mlp")


class CondInLoop(torch.nn.Module):
    """Ten steps, each moving x towards zero by a branch chosen on its current sum."""

    def forward(self, x):
        def cond_fn(count, value):
            return count < 10

        def body_fn(count, value):
            moved = torch.cond(value.sum() > 0, lambda v: v - 1.5, lambda v: v + 2.0, (value,))
            return count + 1, moved

        return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))


class LoopInCond(torch.nn.Module):
    """Grow x by doubling until it is large, only when its mean is positive."""

    def forward(self, x):
        def grow(value):
            return while_loop(lambda v: v.abs().sum() < 100, lambda v: (v * 2 + 0.1,), (value,))[0]

        return torch.cond(x.mean() > 0, grow, lambda value: -value, (x,))


@pytest.mark.parametrize("module", [CondInLoop, LoopInCond], ids=lambda m: m.__name__)
def test_nested_cond_and_while_loop_match_eager(module, tmp_path):
    program = _exported(module(), torch.randn(4, 8), batch=0)
    samples = [_normal((4, 8), 1, shift=1.0), _normal((4, 8), 2, shift=-1.0)]
    _, _, compiled = _compile(program, samples, tmp_path, module.__name__)
    _check(program, compiled, [_normal((3, 8), 5, shift=1.0), _normal((6, 8), 6, shift=-1.0),
                               _normal((2, 8), 7)])


class Masked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 8)

    def forward(self, x, mask):
        return self.layer(x) * mask.unsqueeze(-1), x.sum(-1)


def test_inputs_sharing_a_dynamic_dim_and_several_outputs(tmp_path):
    batch = Dim("batch", min=1, max=128)
    program = export(Masked().eval(), (torch.randn(4, 8), torch.ones(4)),
                     dynamic_shapes=({0: batch}, {0: batch}))
    model = from_program(program, "masked")
    (dim,) = model.dynamic_dims
    assert [(s.name, s.dims) for s in model.inputs] == [("x", (dim, 8)), ("mask", (dim,))]
    assert [(s.name, s.dims) for s in model.outputs] == [("output_0", (dim, 8)), ("output_1", (dim,))]
    rng = np.random.default_rng(0)
    sample = {"x": _normal((4, 8), 1), "mask": np.ones(4, np.float32)}
    target = load_target("x86_64")
    artifact = build(model, plan(model, profile(model, [Sample("s", sample)]), target), [target])
    compiled = runtime.load(artifact.save(tmp_path / "masked.edgec"))
    x, mask = _normal((6, 8), 2), (rng.random(6) > 0.5).astype(np.float32)
    got = compiled.run({"x": x, "mask": mask})
    with torch.no_grad():
        expected = program.module()(torch.from_numpy(x), torch.from_numpy(mask))
    for value, reference in zip(got.values(), expected):
        np.testing.assert_allclose(value, reference.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # a fresh process importing torch and TVM: about half a minute
def test_import_after_the_runtime_loaded_tvm_ffi_without_torch(tmp_path):
    # The runtime imports tvm_ffi with torch blocked; the importer's weight conversion (DLPack
    # from torch tensors) must still work when torch is imported afterwards, in the same process.
    script = textwrap.dedent(f"""
        import sys, numpy as np
        import edgec.runtime as rt
        rt._import_tvm_ffi()
        assert "torch" not in sys.modules and "tvm_ffi" in sys.modules
        import torch
        from torch.export import Dim, export
        from edgec.stages.build import build
        from edgec.stages.plan import plan
        from edgec.stages.profile import profile
        from edgec.core.samples import Sample
        from edgec.core.targets import load_target
        from edgec.core.torch_program import from_program
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh()).eval()
        program = export(net, (torch.randn(4, 8),), dynamic_shapes=({{0: Dim("b", min=1, max=64)}},))
        model = from_program(program, "seq")
        x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
        target = load_target("x86_64")
        artifact = build(model, plan(model, profile(model, [Sample("s", {{"input": x}})]), target),
                         [target])
        got = rt.load(artifact.save({str(tmp_path / "seq.edgec")!r})).run({{"input": x}})["output_0"]
        with torch.no_grad():
            expected = net(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def _readme_torch_example() -> tuple[str, list[str]]:
    """The README's torch example: the script (its python block) and the commands after it."""
    text = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    script = text.split("```python\n# torch_example.py", 1)[1].split("```", 1)[0]
    commands = text.split("```sh\npython torch_example.py\n", 1)[1].split("```", 1)[0]
    return "# torch_example.py" + script, [line.split("#")[0].split() for line in
                                           commands.splitlines() if line.strip()]


@pytest.mark.slow  # fresh processes importing torch and TVM
def test_the_readme_torch_example_runs_as_written(tmp_path):
    """The README's example script, then its compile, bench and debug of the .pt2 it saved."""
    script, commands = _readme_torch_example()
    (tmp_path / "torch_example.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    run = subprocess.run([sys.executable, "torch_example.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "output_0" in run.stdout and (tmp_path / "net.pt2").is_file()
    assert [c[:2] for c in commands] == [["edgec", "compile"], ["edgec", "bench"],
                                        ["edgec", "debug"]]
    for command in commands:
        run = subprocess.run([sys.executable, "-m", "edgec", *command[1:]], cwd=tmp_path, env=env,
                             capture_output=True, text=True)
        assert run.returncode == 0, (command, run.stderr[-2000:])
    assert "no divergence" in run.stdout
