"""The CLI contract: command names, outputs, and one-line errors with no partial files."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from conftest import mlp_model

from edgec.cli import main
from edgec.errors import (ArtifactError, InputFileError, ModelError, OutputFileError, SamplesError,
                          TargetError)
from edgec.runtime.artifact import Artifact


def _edgec(*args):
    return subprocess.run([sys.executable, "-m", "edgec", *map(str, args)], capture_output=True, text=True)


def test_stage_by_stage_matches_compile(mlp_dir, tmp_path, capsys):
    model, samples = mlp_dir / "model.onnx", mlp_dir / "samples"
    assert main(["profile", str(model), "--samples", str(samples), "-o", str(tmp_path / "p.json")]) == 0
    assert main(["plan", str(model), "--profile", str(tmp_path / "p.json"), "--target", "x86_64",
                 "-o", str(tmp_path / "plan.json")]) == 0
    assert main(["build", str(model), "--plan", str(tmp_path / "plan.json"), "--target", "x86_64",
                 "--name", "tagger", "-o", str(tmp_path / "a.edgec")]) == 0
    assert main(["compile", str(model), "--samples", str(samples), "--target", "x86_64",
                 "--save-stages", str(tmp_path / "stages"), "-o", str(tmp_path / "b.edgec")]) == 0
    assert (tmp_path / "stages" / "plan.json").is_file()
    staged, chained = (Artifact.load(tmp_path / n).manifest for n in ("a.edgec", "b.edgec"))
    assert staged["plan"] == chained["plan"]
    assert (staged["model"]["name"], chained["model"]["name"]) == ("tagger", "mlp")  # --name; graph's
    assert staged["libraries"]["x86_64"]["functions"] == chained["libraries"]["x86_64"]["functions"]

    assert main(["run", str(tmp_path / "a.edgec"), "--inputs", str(samples / "sample_009.npz"),
                 "-o", str(tmp_path / "y.npz")]) == 0
    with np.load(tmp_path / "y.npz") as out:
        assert list(out.keys()) == ["y"] and out["y"].shape == (3, 5, 8)

    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "a.edgec")]) == 0
    shown = capsys.readouterr().out
    assert "spec_0     specialized [batch=1, seq=8" in shown and "generic    symbolic fallback" in shown

    assert main(["bench", str(tmp_path / "a.edgec"), "--samples", str(samples), "--runs", "2",
                 "-o", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["model"] == "tagger"
    assert main(["report", str(tmp_path / "r.json"), "-o", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# edgec benchmark report")


def test_targets_and_version(capsys):
    from edgec.core.targets import default_target

    assert main(["targets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "ARCH", "RUN", "DESCRIPTION"]
    marked = [line.split()[1] for line in lines[1:-1] if line.startswith("* ")]
    assert marked == [default_target().name] and lines[-1] == "* this machine's default target"
    assert main(["--version"]) == 0


@pytest.mark.parametrize("make_args, error", [
    (lambda d, t: ["profile", t / "missing.onnx", "--samples", d / "samples", "-o", t / "out.json"], InputFileError),
    (lambda d, t: ["profile", d / "samples" / "sample_000.npz", "--samples", d / "samples", "-o", t / "out.json"], ModelError),
    (lambda d, t: ["profile", d / "model.onnx", "--samples", t / "bad.npz", "-o", t / "out.json"], SamplesError),
    (lambda d, t: ["compile", d / "model.onnx", "--samples", d / "samples", "--target", "nope", "-o", t / "out.json"], TargetError),
    (lambda d, t: ["run", t / "bad.npz", "--inputs", d / "samples", "-o", t / "out.json"], ArtifactError),
])
def test_user_errors_print_one_line_exit_with_their_code_and_write_nothing(mlp_dir, tmp_path, make_args, error):
    np.savez(tmp_path / "bad.npz", x=np.zeros((1, 2, 3), np.int32))
    result = _edgec(*make_args(mlp_dir, tmp_path))
    assert result.returncode == error.exit_code, result.stderr
    assert result.stderr.startswith("edgec: error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_before_or_after_the_subcommand(tmp_path, where):
    args = ["profile", tmp_path / "missing.onnx", "--samples", tmp_path, "-o", tmp_path / "o"]
    result = _edgec(*(["--debug", *args] if where == "before" else [*args, "--debug"]))
    assert result.returncode == InputFileError.exit_code and "Traceback" in result.stderr


def test_every_command_accepts_debug():
    from click.testing import CliRunner

    from edgec.cli import cli

    for path, _command in _commands(cli):
        result = CliRunner().invoke(cli, [*path, "--debug", "--help"])
        assert result.exit_code == 0 and "--debug" in result.output, (path, result.output)


def _commands(group, path=()):
    """(path, command) for every command below a click group, subgroups included."""
    for name, command in group.commands.items():
        yield (*path, name), command
        if hasattr(command, "commands"):
            yield from _commands(command, (*path, name))


def test_usage_errors_exit_2_without_traceback():
    result = _edgec("compile")
    assert result.returncode == 2 and "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["compile", "--samples", "s"], ["profile", "--samples", "s"],
                                     ["run", "--inputs", "s"]])
@pytest.mark.parametrize("where", ["folder", "under_a_file"])
def test_an_unusable_output_path_is_refused_before_any_work(tmp_path, command, where):
    """-o an existing folder, or a path under a file: one line naming it, OutputFileError's code,
    before the command reads its (here missing) inputs, let alone compiles for minutes."""
    (tmp_path / "plain").write_text("")
    output = tmp_path if where == "folder" else tmp_path / "plain" / "out.bin"
    result = _edgec(command[0], tmp_path / "missing.onnx", *command[1:], "-o", output)
    assert result.returncode == OutputFileError.exit_code, result.stderr
    assert result.stderr.startswith(f"edgec: error: cannot write '{output}'")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_random_inputs_for_a_static_model_and_for_given_shapes(mlp_dir, tmp_path, capsys):
    """No --samples: a static model compiles on random inputs, a dynamic one on --shapes (trtexec
    style, several shape sets), and bench measures on them; each says the inputs were random."""
    static = mlp_model()
    for dim, size in zip(static.graph.input[0].type.tensor_type.shape.dim, (1, 4)):
        dim.dim_value = size
    for dim, size in zip(static.graph.output[0].type.tensor_type.shape.dim, (1, 4)):
        dim.dim_value = size
    onnx.save(static, str(tmp_path / "static.onnx"))
    assert main(["compile", str(tmp_path / "static.onnx"), "--target", "x86_64",
                 "-o", str(tmp_path / "s.edgec")]) == 0
    assert "random inputs (seed 0)" in capsys.readouterr().err

    model = mlp_dir / "model.onnx"
    assert main(["compile", str(model), "--shapes", "batch=1,seq=8", "--shapes", "x:2x4x16",
                 "--count", "3", "--target", "x86_64", "-o", str(tmp_path / "d.edgec")]) == 0
    captured = capsys.readouterr()
    assert "6 random inputs" in captured.err
    functions = Artifact.load(tmp_path / "d.edgec").manifest["libraries"]["x86_64"]["functions"]
    assert sorted(f.get("dims", {}).get("seq", 0) for f in functions if f.get("dims")) == [4, 8]
    assert main(["bench", str(tmp_path / "d.edgec"), "--shapes", "batch=3,seq=5", "--runs", "2",
                 "--baselines", "onnxruntime", "-o", str(tmp_path / "r.json")]) == 0


@pytest.mark.parametrize("args, message", [
    ([], "has symbolic dims batch, seq with no value: pass --shapes batch=N,seq=N"),
    (["--shapes", "x:1x2"], "--shapes gives input 'x' rank 2 (1x2), the model expects rank 3"),
    (["--shapes", "batch=1,seq=2", "--samples", "{samples}"], "pass either --samples or --shapes"),
])
def test_random_input_errors_are_one_line(mlp_dir, tmp_path, args, message):
    args = [a.format(samples=mlp_dir / "samples") for a in args]
    result = _edgec("compile", mlp_dir / "model.onnx", *args, "-o", tmp_path / "a.edgec")
    assert result.returncode in (SamplesError.exit_code, 2), result.stderr
    assert message in result.stderr and result.stderr.strip().count("\n") <= 1, result.stderr
    assert not (tmp_path / "a.edgec").exists()


@pytest.mark.parametrize("value", ["x:1xAx3", "seq=-1", "x:"])
def test_malformed_shapes_are_usage_errors(mlp_dir, tmp_path, value):
    result = _edgec("compile", mlp_dir / "model.onnx", "--shapes", value, "-o", tmp_path / "a.edgec")
    assert result.returncode == 2 and "is not NAME:1x3x224x224 or DIM=N" in result.stderr
    assert "Traceback" not in result.stderr


def test_run_without_output_prints_each_output(mlp_artifact, tmp_path, capsys):
    """`edgec run` without -o prints every output's name, dtype, shape and a few values; it writes
    no file."""
    inputs = tmp_path / "in.npz"
    x = np.arange(2 * 3 * 16, dtype=np.float32).reshape(2, 3, 16) / 100
    np.savez(inputs, x=x)
    capsys.readouterr()
    assert main(["run", str(mlp_artifact), "--inputs", str(inputs)]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 1 and shown[0].startswith("y: float32 [2, 3, 8] [")
    assert "..." in shown[0] and " min " in shown[0] and " max " in shown[0]
    assert list(tmp_path.iterdir()) == [inputs]


def test_no_command_requires_target():
    """--target defaults to this machine's best target wherever a command takes one."""
    from edgec.cli import cli

    for path, command in _commands(cli):
        for param in command.params:
            assert not ("--target" in param.opts and param.required), path


def test_debug_defaults_to_this_machines_target(mlp_dir, capsys):
    from edgec.core.targets import default_target

    assert main(["debug", str(mlp_dir / "model.onnx"), "--samples", str(mlp_dir / "samples")]) == 0
    captured = capsys.readouterr()
    assert f"target: {default_target().name} (default" in captured.err
    assert "no divergence" in captured.out


def test_every_option_has_help():
    """`edgec X --help` explains every option (arguments are named in the command's docstring)."""
    import click

    from edgec.cli import cli

    missing = [(path, param.opts) for path, command in [((), cli), *_commands(cli)]
               for param in command.params
               if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert not missing, missing
