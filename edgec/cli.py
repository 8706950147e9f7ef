"""The ``edgec`` command line. Each command parses its options, calls one library function and saves
the result; errors a user can cause print one line and exit with their class's code."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np

from edgec.errors import EdgecError, describe

_debug = False


def _model_arg(func):
    return click.argument("model", type=click.Path(path_type=Path))(func)


class _ShapesType(click.ParamType):
    """``NAME:1x3x224x224``, ``DIM=128`` or a bare ``1x3x224x224`` (a model's only input),
    comma-separated: one set of shapes for random inputs."""

    name = "shapes"

    def convert(self, value, param, ctx):
        from edgec.core.samples import ShapeSet

        if isinstance(value, ShapeSet):
            return value
        inputs: dict[str, tuple[int, ...]] = {}
        dims: dict[str, int] = {}
        for item in filter(None, (part.strip() for part in value.split(","))):
            try:
                if "=" in item:
                    dim, size = item.split("=", 1)
                    dims[dim.strip()] = self._size(size)
                else:
                    name, _, shape = item.rpartition(":")
                    inputs[name.strip()] = tuple(self._size(d) for d in shape.lower().split("x"))
            except ValueError:
                self.fail(f"'{item}' is not NAME:1x3x224x224 or DIM=N", param, ctx)
        return ShapeSet(inputs, dims)

    @staticmethod
    def _size(text: str) -> int:
        size = int(text)
        if size < 0:
            raise ValueError(text)
        return size


class _IntRangeType(click.ParamType):
    """``LO:HI``, a half-open range of integers."""

    name = "lo:hi"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            low, high = (int(part) for part in value.split(":"))
        except ValueError:
            self.fail(f"'{value}' is not LO:HI (e.g. 0:30522)", param, ctx)
        if low >= high:
            self.fail(f"'{value}' is empty: LO must be below HI", param, ctx)
        return low, high


@dataclass(frozen=True)
class _SampleSource:
    """Where a command's samples come from: --samples, or random inputs of --shapes."""

    path: Path | None
    shape_sets: tuple
    count: int
    int_range: tuple[int, int] | None
    seed: int

    def read(self, model):
        """The samples for ``model``: read and checked, or drawn (which is said on stderr)."""
        from edgec.core.samples import load_samples, random_samples

        if self.path is not None:
            if self.shape_sets:
                raise EdgecError("pass either --samples or --shapes, not both")
            return load_samples(self.path, model)
        samples = random_samples(model, list(self.shape_sets), self.count, self.seed,
                                 self.int_range)
        click.echo(f"note: no --samples: {len(samples)} random inputs (seed {self.seed}); a plan, "
                   f"calibration or timing made on them is only as good as they are like the "
                   f"real inputs", err=True)
        return samples


_SAMPLE_OPTIONS = ("samples_path", "shape_sets", "sample_count", "int_range", "input_seed")


def _samples_opt(func):
    """--samples, or random inputs (--shapes, --count, --int-range, --input-seed), given to the
    command as one ``samples`` argument, a _SampleSource."""
    @functools.wraps(func)
    def command(**kwargs):
        source = _SampleSource(*(kwargs.pop(key) for key in _SAMPLE_OPTIONS))
        return func(samples=source, **kwargs)

    command = click.option(
        "--samples", "samples_path", default=None, type=click.Path(path_type=Path),
        help="A .npz file or a folder of them; keys are the model's input names (default: "
             "random inputs, see --shapes).")(command)
    command = click.option(
        "--shapes", "shape_sets", multiple=True, type=_ShapesType(),
        help="Without --samples: shapes for random inputs, as NAME:1x3x224x224 or DIM=N, "
             "comma-separated; repeat for several shape sets. A static model needs none.")(command)
    command = click.option("--count", "sample_count", default=4, show_default=True,
                           type=click.IntRange(min=1),
                           help="Without --samples: random samples per shape set.")(command)
    command = click.option(
        "--int-range", default=None, type=_IntRangeType(),
        help="Without --samples: values of integer inputs, LO:HI (default 0:2; ids that index a "
             "table stay below its size).")(command)
    return click.option("--input-seed", default=0, show_default=True, type=int,
                        help="Without --samples: the random inputs' seed.")(command)


def _writable(_ctx, _param, path: Path | None) -> Path | None:
    from edgec.fileio import check_writable  # checked before the command's work, not after it

    return None if path is None else check_writable(path)


def _out_opt(help_text: str, required: bool = True):
    return click.option("-o", "--output", "output", required=required,
                        type=click.Path(path_type=Path), callback=_writable, help=help_text)


def _profile_opt(func):
    return click.option("--profile", "profile_path", required=True, type=click.Path(path_type=Path),
                        help="The profile from `edgec profile` (JSON).")(func)


def _plan_opts(func):
    func = click.option("--policy", default="specialize-seen", show_default=True,
                        type=click.Choice(["auto", "symbolic", "specialize-seen",
                                           "specialize-then-generalize", "oracle"]),
                        help="How to pick each region's specializations: auto = the target's "
                             "learned cost model; oracle = time every option (small models).")(func)
    func = click.option("--max-artifact-mb", default=0.0, show_default=True, type=float,
                        help="Predicted artifact size limit (0: none); needs a cost model.")(func)
    func = click.option("--compile-budget-s", default=0.0, show_default=True, type=float,
                        help="Predicted compile-time limit (0: none); needs a cost model.")(func)
    func = click.option("--max-runtime-mb", default=0.0, show_default=True, type=float,
                        help="Limit on the native libraries a device must hold to run the "
                             "artifact (TVM's runtime, oneDNN...; 0: none): a budget that "
                             "excludes the target's library runs every op as a TVM kernel.")(func)
    func = click.option("--busy", default=0, show_default=True, type=int,
                        help="CPU-bound processes expected beside the model on the device: "
                             "auto then prices the library route and thread count as measured "
                             "on a busy machine.")(func)
    func = click.option("--max-specializations", default=4, show_default=True, type=int,
                        help="At most this many shapes get a static function.")(func)
    func = click.option("--min-share", default=0.1, show_default=True, type=float,
                        help="A shape is specialized only if this share of samples has it.")(func)
    return func


def _dump_ir_opt(func):
    return click.option("--dump-ir", "dump_ir", type=click.Path(path_type=Path), default=None,
                        help="Write the program after each compiler phase into this folder "
                             "(NN_<phase>.py, TVMScript).")(func)


def _name_opt(func):
    return click.option("--name", "model_name", default=None,
                        help="The model's name in the manifest, bench results and reports "
                             "(`report --compare` matches rows by it; default: the ONNX graph's "
                             "name, or the file's when the graph has an exporter's default "
                             "name).")(func)


def _sign_opt(func):
    return click.option("--sign", "sign_key", type=click.Path(path_type=Path), default=None,
                        help="Sign the artifact with this Ed25519 private key (see `edgec keygen`).")(func)


def _require_signature_opt(func):
    return click.option("--require-signature", "public_key", type=click.Path(path_type=Path),
                        default=None, help="Refuse the artifact unless this Ed25519 public key "
                        "signed it.")(func)


def _signer(sign_key: Path | None):
    """A function that signs an artifact with ``sign_key`` (read now, before any long compile)."""
    if sign_key is None:
        return lambda artifact: artifact
    from edgec.signing import load_private_key, sign_artifact

    key = load_private_key(sign_key)
    return lambda artifact: sign_artifact(artifact, key)


def _quantize_opts(func):
    func = click.option("--quantize", "quantize_mode", default="none", show_default=True,
                        type=click.Choice(["none", "int8-weight", "int8-dynamic", "int8-static",
                                           "bf16", "fp16", "auto"]),
                        help="Quantize layers with constant weights (see `edgec.stages.quantize`).")(func)
    func = click.option("--max-accuracy-drop", default=0.01, show_default=True, type=float,
                        help="Budget vs fp32 on held-out samples: 1 - lowest cosine, or 1 - "
                             "top-1 agreement for classifiers.")(func)
    func = click.option("--calibration", default="percentile", show_default=True,
                        type=click.Choice(["percentile", "minmax", "entropy"]),
                        help="Activation range for int8-static: 99.9th percentile, min/max, or "
                             "the least-KL-divergence threshold over the profile's histogram.")(func)
    func = click.option("--quant-scheme", default="asymmetric", show_default=True,
                        type=click.Choice(["asymmetric", "symmetric"]),
                        help="Activations (and embedding rows): with a zero point, or symmetric.")(func)
    func = click.option("--held-out-samples", "held_out_path", default=None,
                        type=click.Path(path_type=Path),
                        help="Samples for the accuracy guard (default: every 4th of --samples, "
                             "which then neither profiles nor calibrates).")(func)
    return func


def _set_debug(_ctx, _param, value: bool) -> None:
    global _debug
    _debug = _debug or value


def _debug_flag() -> click.Option:
    """``--debug``, accepted before the subcommand and after it (every command gets its own copy, by
    ``_accept_debug_everywhere``), since the error line tells the user to rerun with it."""
    return click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True,
                        callback=_set_debug,
                        help="Show the full traceback on errors (or set EDGEC_DEBUG=1).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, params=[_debug_flag()])
@click.version_option(package_name="edgec", prog_name="edgec")
def cli() -> None:
    """Profile, split, compile and benchmark dynamic ONNX models (or torch.export .pt2 programs)
    for edge devices."""


@cli.group()
def zoo() -> None:
    """Models generated in code (seeded) with sample inputs."""


@zoo.command("list")
def zoo_list() -> None:
    """List the zoo's models."""
    from edgec import zoo as zoo_lib

    for name in zoo_lib.names():
        entry = zoo_lib.get(name)
        click.echo(f"{name:24s} {entry.kind:8s} {entry.description}")


@zoo.command("export")
@click.argument("name")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Folder to write.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed of the model's weights and its samples (same seed, same files).")
@click.option("--count", default=None, type=int, help="Number of samples (default: the model's).")
def zoo_export(name: str, output: Path, seed: int, count: int | None) -> None:
    """Write NAME's model.onnx and samples/ into a folder."""
    from edgec import zoo as zoo_lib

    zoo_lib.export(name, output, seed=seed, count=count)
    click.echo(f"wrote {output / 'model.onnx'} and {output / 'samples'}")


@cli.command("profile")
@_model_arg
@_samples_opt
@_out_opt("Where to write the profile (JSON).")
def profile_cmd(model: Path, samples: _SampleSource, output: Path) -> None:
    """Run MODEL on samples and record shapes, branches, trip counts, node times and ranges."""
    from edgec.core.model import load_model
    from edgec.stages.profile import profile

    loaded = load_model(model)
    result = profile(loaded, samples.read(loaded))
    result.save(output)
    _note_reference_error(result)
    click.echo(f"profiled {result.sample_count} samples, {len(result.shapes)} distinct shapes -> {output}")


def _note_reference_error(prof) -> None:
    if prof.reference_error:
        click.echo(f"note: shapes only, the reference could not run the model: {prof.reference_error}",
                   err=True)


@cli.command("plan")
@_model_arg
@_profile_opt
@click.option("--target", default=None,
              help="A target name or a .toml file (default: the best target this machine runs).")
@_plan_opts
@click.option("--samples", "samples_path", type=click.Path(path_type=Path), default=None,
              help="Samples to time every option on (policy oracle), and to check padding proofs "
                   "on (policies auto and oracle pad only where the check passes).")
@click.option("--explain", is_flag=True, help="Print a table per region: options, predicted cost, "
                                               "chosen option and why.")
@_out_opt("Where to write the plan (JSON).")
def plan_cmd(model: Path, profile_path: Path, target: str | None, policy: str,
             max_specializations: int, min_share: float, max_artifact_mb: float,
             compile_budget_s: float, max_runtime_mb: float, busy: int,
             samples_path: Path | None, explain: bool, output: Path) -> None:
    """Cut MODEL into regions and decide which shapes each runs specialized."""
    from edgec.core.model import load_model
    from edgec.stages.plan import PlanSettings
    from edgec.stages.profile import Profile

    from edgec.core.samples import load_samples
    from edgec.driver import make_plan

    settings = PlanSettings(policy, max_specializations, min_share, max_artifact_mb,
                            compile_budget_s, max_runtime_mb, busy)
    the_target = _targets_or_default((target,) if target else ())[0][0]
    loaded = load_model(model)
    samples = load_samples(samples_path, loaded) if samples_path is not None else None
    result = make_plan(loaded, Profile.load(profile_path), the_target, settings, samples)
    result.save(output)
    if explain:
        click.echo(result.explain())
    else:
        for region in result.regions:
            click.echo(f"region {region.name}: {region.mode} — {region.reason}")


def _targets_or_default(names: tuple[str, ...]):
    """The targets named, or the best one this machine runs; and how they were chosen."""
    from edgec.core.targets import load_target

    from edgec.driver import default_targets

    if names:
        return [load_target(t) for t in names], "given"
    targets, chosen = default_targets()
    _say_default(targets[0])
    return targets, chosen


def _target_or_default(name: str | None):
    """The target named, or the best one this machine runs (said on stderr)."""
    from edgec.core.targets import default_target, load_target

    if name is not None:
        return load_target(name)
    target = default_target()
    _say_default(target)
    return target


def _say_default(target) -> None:
    click.echo(f"target: {target.name} (default: the target with the most CPU features this "
               f"machine has)", err=True)


@cli.command("quantize")
@_model_arg
@_profile_opt
@click.option("--target", default=None,
              help="A target name or a .toml file (default: the best target this machine runs).")
@_quantize_opts
@_out_opt("Where to write the quantization decisions (JSON).")
def quantize_cmd(model: Path, profile_path: Path, target: str | None, quantize_mode: str,
                 max_accuracy_drop: float, calibration: str, quant_scheme: str,
                 held_out_path: Path | None, output: Path) -> None:
    """Decide each layer's precision within the accuracy budget (simulated on held-out samples)."""
    from edgec.core.model import load_model
    from edgec.stages.profile import Profile
    from edgec.stages.quantize import QuantizeSettings, quantize
    from edgec.core.samples import load_samples

    settings = QuantizeSettings(quantize_mode, max_accuracy_drop, calibration, quant_scheme)
    settings.check()
    if held_out_path is None and quantize_mode != "none":
        raise EdgecError("`edgec quantize` needs --held-out-samples for its accuracy guard")
    loaded = load_model(model)
    held_out = load_samples(held_out_path, loaded) if held_out_path is not None else []
    result = quantize(loaded, Profile.load(profile_path), _target_or_default(target), settings,
                      held_out)
    result.save(output)
    _echo_quantization(result)


@cli.command("build")
@_model_arg
@click.option("--plan", "plan_path", required=True, type=click.Path(path_type=Path),
              help="The plan from `edgec plan` (JSON): regions and their specializations.")
@click.option("--target", "targets", multiple=True,
              help="Repeat for several targets (default: the best target this machine runs).")
@click.option("--quantization", "quantization_path", type=click.Path(path_type=Path), default=None,
              help="Decisions from `edgec quantize` (the manifest then records their simulated "
                   "accuracy; `edgec compile --quantize` also measures the artifact).")
@_dump_ir_opt
@_name_opt
@_sign_opt
@_out_opt("Where to write the artifact (.edgec).")
def build_cmd(model: Path, plan_path: Path, targets: tuple[str, ...],
              quantization_path: Path | None, dump_ir: Path | None, model_name: str | None,
              sign_key: Path | None, output: Path) -> None:
    """Compile MODEL as the plan says into a single-file artifact."""
    from edgec.stages.build import build
    from edgec.core.model import load_model
    from edgec.stages.plan import Plan
    from edgec.stages.quantize import Quantization

    sign = _signer(sign_key)
    target_list, chosen = _targets_or_default(targets)
    quantization = Quantization.load(quantization_path) if quantization_path else None
    artifact = build(load_model(model, model_name), Plan.load(plan_path), target_list, targets_chosen=chosen,
                     quantization=quantization, dump_ir=dump_ir)
    sign(artifact).save(output)
    click.echo(f"wrote {output} ({output.stat().st_size} bytes)")


@cli.command("compile")
@_model_arg
@_samples_opt
@click.option("--target", "targets", multiple=True,
              help="Repeat for several targets (default: the best target this machine runs).")
@_plan_opts
@click.option("--save-stages", type=click.Path(path_type=Path), default=None,
              help="Also write profile.json, plan.json (and quantization.json) into this folder.")
@_quantize_opts
@_dump_ir_opt
@_name_opt
@_sign_opt
@_out_opt("Where to write the artifact (.edgec).")
def compile_cmd(model: Path, samples: _SampleSource, targets: tuple[str, ...], policy: str,
                max_specializations: int, min_share: float, max_artifact_mb: float,
                compile_budget_s: float, max_runtime_mb: float, busy: int,
                save_stages: Path | None,
                quantize_mode: str, max_accuracy_drop: float, calibration: str, quant_scheme: str,
                held_out_path: Path | None, dump_ir: Path | None, model_name: str | None,
                sign_key: Path | None, output: Path) -> None:
    """Profile, plan, quantize and build in one go."""
    from edgec.core.model import load_model
    from edgec.core.samples import load_samples
    from edgec.driver import CompileSettings, compile as compile_model, default_targets
    from edgec.stages.plan import PlanSettings
    from edgec.stages.quantize import QuantizeSettings

    from edgec.core.targets import load_target

    sign = _signer(sign_key)
    loaded = load_model(model, model_name)
    target_list = [load_target(t) for t in targets]
    if not target_list:
        _say_default(default_targets()[0][0])
    settings = CompileSettings(
        PlanSettings(policy, max_specializations, min_share, max_artifact_mb, compile_budget_s,
                     max_runtime_mb, busy),
        QuantizeSettings(quantize_mode, max_accuracy_drop, calibration, quant_scheme),
        dump_ir=dump_ir)
    settings.check()
    sample_list = samples.read(loaded)
    held_out = (load_samples(held_out_path, loaded)
                if held_out_path is not None and quantize_mode != "none" else None)
    result = compile_model(loaded, sample_list, target_list, settings, held_out=held_out)
    _note_reference_error(result.profile)
    for note in result.notes:
        click.echo(f"note: {note}", err=True)
    if save_stages is not None:
        result.profile.save(save_stages / "profile.json")
        result.plan.save(save_stages / "plan.json")
        if quantize_mode != "none":
            result.quantization.save(save_stages / "quantization.json")
    sign(result.artifact).save(output)
    for region in result.plan.regions:
        click.echo(f"region {region.name}: {region.mode} — {region.reason}")
    if quantize_mode != "none":
        _echo_quantization(result.quantization)
    click.echo(f"wrote {output} ({output.stat().st_size} bytes)")


@cli.command("tune")
@_model_arg
@click.option("--target", default=None,
              help="A target name or a .toml file (default: the best target this machine runs).")
@click.option("--trials", default=64, show_default=True, type=int,
              help="Measured schedules wanted for MODEL's kernels in the database, in total: "
                   "rerunning after a kill spends only the missing ones.")
@click.option("--samples", "samples_path", default=None, type=click.Path(path_type=Path),
              help="Sample inputs of a dynamic model: the shapes the plan specializes are tuned.")
@click.option("--seed", default=0, show_default=True, type=int,
              help="Seed of MetaSchedule's search (same seed, same candidates tried).")
def tune_cmd(model: Path, target: str | None, trials: int, samples_path: Path | None,
             seed: int) -> None:
    """Tune the kernels TVM generates for MODEL into the target's database (in the user's
    autotune folder: $EDGEC_AUTOTUNE_DIR, default ~/.local/share/edgec/autotune/<target>/)."""
    from edgec.tools.tune import tune_model

    the_target = _targets_or_default((target,) if target else ())[0][0]
    summary = tune_model(model, the_target, trials, samples_path=samples_path, seed=seed)
    click.echo(f"{summary.tasks} kernels to tune, {summary.trials_before} trials already in "
               f"{summary.database}, {summary.trials_run} run now; the database holds "
               f"{summary.records_after} records")


def _echo_quantization(quant) -> None:
    counts: dict[str, int] = {}
    for layer in quant.layers:
        counts[layer["precision"]] = counts.get(layer["precision"], 0) + 1
    click.echo("quantization " + quant.settings.mode + ": "
               + ", ".join(f"{n} {p}" for p, n in sorted(counts.items())))
    for which in ("simulated", "measured"):
        result = quant.accuracy.get(which)
        if result:
            click.echo(f"  {which} on {result['samples']} held-out samples: drop "
                       f"{result['drop']:.4g} (budget {quant.settings.max_accuracy_drop:g})")
    if quant.accuracy.get("not_measured"):
        click.echo("  not measured: " + quant.accuracy["not_measured"])
    if quant.fp32_layers():
        click.echo("  kept fp32: " + ", ".join(quant.fp32_layers()))


@cli.command("run")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--inputs", "inputs_path", required=True, type=click.Path(path_type=Path),
              help="A .npz file keyed by input name.")
@click.option("--target", default=None, help="Run this target's library (default: this host's).")
@_require_signature_opt
@_out_opt("Also write the outputs here (.npz keyed by output name).", required=False)
def run_cmd(artifact: Path, inputs_path: Path, target: str | None, public_key: Path | None,
            output: Path | None) -> None:
    """Run an artifact on one set of inputs; print each output (name, dtype, shape, a few values)."""
    from edgec.core import remote
    from edgec.fileio import atomic_write
    from edgec.core.samples import read_npz, sample_files

    # here, through RPC or under qemu
    model = remote.load(artifact, target=target, require_signature=public_key)
    inputs = read_npz(sample_files(inputs_path)[0])
    outputs = model.run(inputs)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.savez(handle, **outputs)

    if output is not None:
        atomic_write(output, write)
    for name, value in outputs.items():
        click.echo(_describe_output(name, value))
    if output is not None:
        click.echo(f"wrote {output}")


def _describe_output(name: str, value: np.ndarray) -> str:
    """One output on one line, as iree-run-module shows it: name, dtype, shape, the first and last
    values in memory order (numpy's summarised print) and, for numbers, min, max and mean."""
    with np.printoptions(threshold=6, edgeitems=3, precision=4, linewidth=10**6):
        values = " ".join(np.array2string(value.ravel(), separator=", ").split())
    line = f"{name}: {value.dtype} {list(value.shape)} {values}"
    if value.size and value.dtype.kind in "biuf":
        line += (f" min {value.min():.4g} max {value.max():.4g} mean "
                 f"{value.mean(dtype=np.float64):.4g}")
    return line


@cli.command("bench")
@click.argument("artifact", type=click.Path(path_type=Path))
@_samples_opt
@click.option("--model", "model_path", type=click.Path(path_type=Path), default=None,
              help="The model the artifact was built from, .onnx or .pt2 (default: its path "
                   "as the manifest records it).")
@click.option("--runs", default=10, show_default=True, type=int, help="Measured calls per sample.")
@click.option("--min-seconds", default=0.0, show_default=True, type=float,
              help="Repeat passes of --runs calls per sample until each system has run this "
                   "long (like trtexec --duration); 0: one pass.")
@click.option("--warmup", default=2, show_default=True, type=int, help="Unmeasured calls per sample.")
@click.option("--threads", default=2, show_default=True, type=int, help="Threads for both runtimes.")
@click.option("--busy", default=0, show_default=True, type=int,
              help="CPU-bound background processes to run while every system is measured.")
@click.option("--target", default=None, help="Bench this target's library (default: this host's).")
@click.option("--baselines", default="onnxruntime,onnxruntime-1t", show_default=True,
              help="Comma-separated: onnxruntime, onnxruntime-1t (one thread), tvm-plain (TVM, no plan).")
@_require_signature_opt
@_out_opt("Where to write the result (JSON).")
def bench_cmd(artifact: Path, samples: _SampleSource, model_path: Path | None, runs: int,
              min_seconds: float, warmup: int, threads: int, busy: int, target: str | None,
              baselines: str,
              public_key: Path | None,
              output: Path) -> None:
    """Measure latency and accuracy against onnxruntime (torch for a .pt2 program) in the same
    run."""
    from edgec.driver import benchmark
    from edgec.stages.bench import BenchSettings, summary_line
    from edgec.core.model import load_model
    from edgec.runtime.artifact import Artifact

    built_from = Artifact.load(artifact).manifest["model"]
    if model_path is None:
        source = built_from.get("source", "")
        if not source or not Path(source).is_file():
            raise EdgecError(f"the model '{artifact}' was built from is not at '{source}'; pass --model")
        model_path = Path(source)
    # Named as the artifact names it (`--name` at build), so its measurements are recorded so too.
    loaded = load_model(model_path, built_from["name"])
    settings = BenchSettings(runs=runs, warmup=warmup, threads=threads, min_seconds=min_seconds,
                             busy=busy)
    chosen = tuple(b.strip() for b in baselines.split(",") if b.strip())
    result = benchmark(artifact, loaded, samples.read(loaded), settings,
                       target=target, baselines=chosen, require_signature=public_key)
    result.save(output)
    for note in result.data.get("notes", []):
        click.echo(f"note: {note}", err=True)
    click.echo(summary_line(result))


@cli.command("report")
@click.argument("results", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Folder to write.")
@click.option("--compare", "baseline_path", type=click.Path(path_type=Path), default=None,
              help="A baseline report.json (or bench result) to hold these results against.")
@click.option("--max-regression", default="10%", show_default=True,
              help="Allowed worsening of latency ratio and accuracy against the baseline.")
def report_cmd(results: tuple[Path, ...], output: Path, baseline_path: Path | None,
               max_regression: str) -> None:
    """Render bench results as Markdown, HTML, CSV and JSON; optionally gate on a baseline."""
    from edgec.errors import StageInputError
    from edgec.stages.bench import BenchResult
    from edgec.fileio import write_text
    from edgec.stages.report import RegressionError, compare, load_baseline, parse_margin, report

    margin = parse_margin(max_regression)
    loaded = [BenchResult.load(p) for p in results]
    against_torch = [str(p) for p, r in zip(results, loaded) if r.data.get("reference") == "torch"]
    if against_torch:  # bench of a .pt2 program: no onnxruntime column to fill
        raise StageInputError(f"{', '.join(against_torch)}: measured against torch (a PyTorch "
                              f"program), and the report's tables are against onnxruntime; read "
                              f"the bench JSON, or bench the model's ONNX export")
    written = report(loaded).save(output)
    click.echo("wrote " + ", ".join(str(p) for p in written))
    if baseline_path is not None:
        table, regressions = compare(loaded, load_baseline(baseline_path), margin)
        write_text(output / "compare.md", table)
        click.echo(table)
        if regressions:
            raise RegressionError(f"{len(regressions)} regression(s) beyond {margin:.0%} against "
                                  f"'{baseline_path}': {'; '.join(regressions)}")


@cli.command("keygen")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path),
              help="Where to write the private key (PEM, mode 0600); the public key goes to OUTPUT.pub.")
def keygen_cmd(output: Path) -> None:
    """Make an Ed25519 key pair for `compile --sign` and `run/bench --require-signature`."""
    from edgec.signing import fingerprint, generate_keypair, load_public_key

    private_path, public_path = generate_keypair(output)
    click.echo(f"wrote {private_path} (private: keep it secret) and {public_path} (public: give it "
               f"to whoever loads your artifacts), key {fingerprint(load_public_key(public_path))}")


@cli.command("targets")
def targets_cmd() -> None:
    """List the known targets; * marks the one commands use when --target is left out."""
    from edgec.core.targets import default_target, list_targets
    from edgec.errors import TargetError

    try:
        default = default_target().name
    except TargetError:  # no target runs on this machine: every command then needs --target
        default = None
    click.echo(f"  {'NAME':20s} {'KIND':6s} {'ARCH':8s} {'RUN':6s} DESCRIPTION")
    for t in list_targets():
        mark = "*" if t.name == default else " "
        click.echo(f"{mark} {t.name:20s} {t.kind:6s} {t.arch:8s} {t.run.get('mode', 'local'):6s} "
                   f"{t.description}")
    click.echo("* this machine's default target" if default else
               "no target runs on this machine: pass --target to every command")


@cli.command("inspect")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest as JSON.")
def inspect_cmd(artifact: Path, as_json: bool) -> None:
    """Show an artifact's manifest: inputs, outputs, libraries, specializations and fallback."""
    from edgec.runtime.artifact import Artifact

    manifest = Artifact.load(artifact).manifest
    if as_json:
        click.echo(json.dumps(manifest, indent=1))
        return
    model = manifest["model"]
    click.echo(f"artifact {artifact}: format {manifest['format_version']}, model {model['name']} "
               f"(sha256 {model['sha256'][:16]}…)")
    for kind in ("inputs", "outputs"):
        for spec in manifest[kind]:
            click.echo(f"  {kind[:-1]:6s} {spec['name']}: {spec['dtype']} {spec['dims']}")
    for region in manifest["plan"]["regions"]:
        click.echo(f"  region {region['name']}: {region['mode']} — {region['reason']}")
    chosen = manifest["plan"].get("execution")
    if chosen:
        threads = "every core" if chosen["threads"] == 0 else f"{chosen['threads']} thread"
        click.echo(f"  execution: {chosen['route']} route, {threads} — {chosen['reason']}")
    for target, lib in manifest["libraries"].items():
        click.echo(f"  library {target} ({lib['arch']}, {lib['device']}): {lib['file']}, "
                   f"{lib['bytes']} bytes, sha256 {lib['sha256'][:16]}…")
        tuning = lib.get("tuning") or {}
        if tuning.get("database"):
            click.echo(f"    tuning database {tuning['database']} ({tuning['records']} records): "
                       f"{tuning['tuned_kernels']} of {tuning['kernels']} TVM kernels tuned")
        elif tuning:
            click.echo(f"    no tuning database: {tuning['kernels']} TVM kernels with default schedules")
        for func in lib["functions"]:
            dims = ", ".join(f"{k}={v}" for k, v in func.get("dims", {}).items())
            share = f", {func['share']:.0%} of profiled samples" if "share" in func else ""
            click.echo(f"    {func['name']:10s} {func['kind']}" + (f" [{dims}{share}]" if dims else ""))
    if "targets_chosen" in manifest:
        click.echo(f"  targets: {manifest['targets_chosen']}")
    versions = manifest.get("versions", {})
    click.echo(f"  built with edgec {versions.get('edgec')}, TVM {versions.get('tvm')}")


@cli.command("debug")
@_model_arg
@_samples_opt
@click.option("--target", default=None,
              help="A target name or a .toml file (default: the best target this machine runs).")
@click.option("--tolerance", default=1e-4, show_default=True, type=float,
              help="Max abs difference relative to each activation's scale.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Also write the per-node table as JSON.")
def debug_cmd(model: Path, samples: _SampleSource, target: str | None, tolerance: float,
              output: Path | None) -> None:
    """Name the first node (and region) whose compiled output diverges from the reference."""
    from edgec.tools.debug import debug
    from edgec.fileio import write_text
    from edgec.core.model import load_model

    the_target = _target_or_default(target)
    loaded = load_model(model)
    result = debug(loaded, samples.read(loaded), the_target, tolerance)
    if output is not None:
        write_text(output, json.dumps(result.to_json(), indent=1) + "\n")
    for row in sorted(result.nodes, key=lambda r: -r["max_rel"])[:10]:
        click.echo(f"  {row['max_rel']:10.3g}  {row['node']} ({row['op']}, region {row['region']})")
    if result.first is None:
        click.echo(f"no divergence: every activation within {tolerance:g} of the reference")
    else:
        click.echo(result.first.describe())


@cli.command("conformance")
@click.option("--subset", type=click.Choice(["ci", "all"]), default="ci", show_default=True,
              help="ci: every If/Loop/Scan case and every 10th other case; all: 1884 cases (hours).")
@click.option("--filter", "prefixes", multiple=True, help="Only cases whose name starts with this.")
@click.option("--timeout", default=300.0, show_default=True, type=float, help="Seconds per case.")
@click.option("--jobs", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes running cases at once.")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Folder to write.")
def conformance_cmd(subset: str, prefixes: tuple[str, ...], timeout: float, jobs: int,
                    output: Path) -> None:
    """Run ONNX's operator test cases through the whole pipeline; write a table per case."""
    from edgec.tools.conformance import ci_subset, node_cases, run_suite_parallel, summarize, write_results

    names = sorted(node_cases())
    if subset == "ci":
        names = ci_subset(names)
    if prefixes:
        names = [n for n in names if n.startswith(prefixes)]
    results = []
    for index, result in enumerate(run_suite_parallel(names, jobs, timeout_s=timeout), 1):
        results.append(result)
        click.echo(f"[{index}/{len(names)}] {result.status:7s} {result.name} {result.detail[:120]}")
    write_results(results, output)
    summary = summarize(results)
    click.echo(f"{summary['pass']} passed, {summary['cases'] - summary['pass']} failed "
               f"(of {summary['cases']}; control flow {summary['control_flow']['pass']} passed)")


@cli.group()
def costmodel() -> None:
    """The learned cost model behind `edgec plan --policy auto`: collect, train, eval."""


# The costmodel commands' target: like plan's, this machine's best when not given.
_costmodel_target = click.option(
    "--target", default=None,
    help="A target name or .toml file (default: the target with the most CPU features this "
         "machine has, as for `edgec plan`).")


@costmodel.command("collect")
@_costmodel_target
@click.option("--models", default="", help="Comma-separated zoo models (default: the dynamic ones).")
@click.option("--passes", default=3, show_default=True, type=int,
              help="Independent build+time passes per model (their spread is the noise).")
@click.option("--runs", default=5, show_default=True, type=int, help="Timed calls per batch.")
@click.option("--batches", default=3, show_default=True, type=int,
              help="Batches per option, interleaved; the least batch median is kept.")
@click.option("--max-specializations", default=3, show_default=True, type=int,
              help="Hot shapes compiled static per region.")
@click.option("--execution", is_flag=True,
              help="Time whole models under each execution option (library route or TVM "
                   "kernels only; every core or one thread), quiet and beside as many busy "
                   "processes as cores, instead of regions under each shape option.")
@click.option("--model-dir", "model_dirs", multiple=True, type=click.Path(path_type=Path),
              help="With --execution: also a folder holding model.onnx and samples/ (repeat).")
def costmodel_collect(target: str | None, models: str, passes: int, runs: int, batches: int,
                      max_specializations: int, execution: bool,
                      model_dirs: tuple[Path, ...]) -> None:
    """Time the zoo's regions under each option; append to the target's measurement store."""
    from edgec.costmodel.store import measurements_path

    if passes < 1 or runs < 1 or batches < 1:
        raise EdgecError("--passes, --runs and --batches must be at least 1")
    loaded = _target_or_default(target)
    names = [n.strip() for n in models.split(",") if n.strip()] or None
    if execution:
        from edgec.tools.costmodel.collect import execution_cases
        from edgec.tools.costmodel.collect_execution import collect_execution

        collect_execution(loaded, execution_cases(names, list(model_dirs)), passes,
                          progress=click.echo)
    elif model_dirs:
        raise EdgecError("--model-dir is for --execution; region timings use the zoo")
    else:
        from edgec.driver import kernels_on_calling_thread

        kernels_on_calling_thread()
        from edgec.tools.costmodel.collect import collect

        collect(loaded, names, passes, max_specializations, runs, batches, progress=click.echo)
    click.echo(f"appended to {measurements_path(loaded)}")


@costmodel.command("train")
@_costmodel_target
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Where to write the model (default: the user's autotune folder, "
                   "~/.local/share/edgec/autotune/<target>/costmodel.json).")
def costmodel_train(target: str | None, output: Path | None) -> None:
    """Fit the cost model on the target's measurements; the learner is picked by held-out error."""
    from edgec.costmodel.model import save_path
    from edgec.costmodel.store import load_measurements
    from edgec.tools.costmodel.evaluate import train

    loaded = _target_or_default(target)
    fitted, regions = train(loaded, load_measurements(loaded))
    path = fitted.save(output or save_path(loaded))
    scores = ", ".join(f"{k} rank error {v['rank_error']} log-RMSE {v['log_rmse']} MAPE {v['mape']}"
                       for k, v in fitted.training["held_out"].items())
    click.echo(f"fitted {fitted.training['learner']} on {regions} region timings of "
               f"{len(fitted.training['models'])} models (held out per model: {scores}) -> {path}")


@costmodel.command("eval")
@_costmodel_target
@click.option("--holdout", "holdout", multiple=True, help="Zoo model to hold out (repeat; default: "
                                                          "every measured zoo model but the "
                                                          "calibration suite's).")
@click.option("--max-specializations", default=3, show_default=True, type=int,
              help="At most this many shapes per region get a static function in each plan.")
@click.option("--execution", is_flag=True,
              help="Evaluate the execution prices (library route, threads) on the models timed "
                   "by `collect --execution` instead: auto's pick against the oracle, the hand "
                   "rules and each fixed option (default --holdout: every such model).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Also write the result: NAME.json and NAME.md.")
def costmodel_eval(target: str | None, holdout: tuple[str, ...], max_specializations: int,
                   execution: bool, output: Path | None) -> None:
    """Leave-one-model-out: Spearman, MAPE and each policy's measured expected latency."""
    from edgec import zoo
    from edgec.tools.costmodel.evaluate import evaluate, render
    from edgec.costmodel.store import load_measurements
    from edgec.fileio import write_text
    from edgec.stages.plan import PlanSettings

    loaded = _target_or_default(target)
    rows = load_measurements(loaded)
    if execution:
        from edgec.tools.costmodel.evaluate_execution import evaluate_execution, render_execution

        timed = sorted({r["model"] for r in rows if r.get("kind") == "execution"
                        and r["target"] == loaded.name})
        missing = [n for n in holdout if n not in timed]
        if not timed or missing:
            raise EdgecError(f"no execution timings of {', '.join(missing) or 'any model'} for "
                             f"target '{loaded.name}'; run `edgec costmodel collect --execution`")
        result = evaluate_execution(loaded, rows, list(holdout) or timed)
        table = render_execution(result)
        if output is not None:
            write_text(output.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
            write_text(output.with_suffix(".md"), table)
        click.echo(table)
        return
    measured_models = sorted({r["model"] for r in rows if r.get("kind") == "region"})
    # By default the zoo's models measured (a bench of another model adds rows too), less the
    # calibration suite: training data, not models a plan is judged on.
    names = list(holdout) or [n for n in measured_models
                              if n in zoo.names() and n not in zoo.calibration_names()]
    missing = [n for n in names if n not in measured_models]
    if missing:
        raise EdgecError(f"no measurements of {', '.join(missing)} for target '{loaded.name}'; "
                         f"run `edgec costmodel collect --models {','.join(missing)}`")
    result = evaluate(loaded, rows, names, PlanSettings(max_specializations=max_specializations))
    table = render(result)
    if output is not None:
        write_text(output.with_suffix(".json"), json.dumps(result, indent=1) + "\n")
        write_text(output.with_suffix(".md"), table)
    click.echo(table)


def _accept_debug_everywhere(group: click.Group) -> None:
    """Give every command and subgroup below ``group`` the ``--debug`` flag."""
    for command in group.commands.values():
        command.params.append(_debug_flag())
        if isinstance(command, click.Group):
            _accept_debug_everywhere(command)


_accept_debug_everywhere(cli)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the exit code. EdgecErrors print one line, never a traceback."""
    global _debug
    _debug = os.environ.get("EDGEC_DEBUG", "") not in ("", "0")
    try:
        cli.main(args=argv, prog_name="edgec", standalone_mode=False)
        return 0
    except EdgecError as exc:
        if _debug:
            traceback.print_exc()
        click.echo(f"edgec: error: {exc}", err=True)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("edgec: aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("edgec: interrupted", err=True)
        return 130
    except Exception as exc:  # an edgec bug: say so in one line unless asked for the traceback
        if _debug:
            traceback.print_exc()
        click.echo(f"edgec: internal error: {type(exc).__name__}: {describe(exc)} "
                   f"(rerun with --debug for the traceback)", err=True)
        return 1


def entry_point() -> None:
    sys.exit(main())
