"""The ``edgec`` command line. Each command parses its options, calls one library function and saves
the result; errors a user can cause print one line and exit with their class's code."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import click
import numpy as np

from .errors import EdgecError, describe

_debug = False


def _model_arg(func):
    return click.argument("model", type=click.Path(path_type=Path))(func)


def _samples_opt(func):
    return click.option("--samples", "samples_path", required=True, type=click.Path(path_type=Path),
                        help="A .npz file or a folder of them; keys are the model's input names.")(func)


def _out_opt(help_text: str):
    return click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
                        help=help_text)


def _plan_opts(func):
    func = click.option("--policy", default="specialize-seen", show_default=True,
                        type=click.Choice(["specialize-seen", "symbolic"]),
                        help="How to pick shape specializations.")(func)
    func = click.option("--max-specializations", default=4, show_default=True, type=int,
                        help="At most this many shapes get a static function.")(func)
    func = click.option("--min-share", default=0.1, show_default=True, type=float,
                        help="A shape is specialized only if this share of samples has it.")(func)
    return func


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the full traceback on errors (or set EDGEC_DEBUG=1).")
@click.version_option(package_name="edgec", prog_name="edgec")
def cli(debug: bool) -> None:
    """Profile, split, compile and benchmark dynamic ONNX models for edge devices."""
    global _debug
    _debug = _debug or debug


@cli.group()
def zoo() -> None:
    """Models generated in code (seeded) with sample inputs."""


@zoo.command("list")
def zoo_list() -> None:
    """List the zoo's models."""
    from . import zoo as zoo_lib

    for name in zoo_lib.names():
        entry = zoo_lib.get(name)
        click.echo(f"{name:24s} {entry.kind:8s} {entry.description}")


@zoo.command("export")
@click.argument("name")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), help="Folder to write.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--count", default=None, type=int, help="Number of samples (default: the model's).")
def zoo_export(name: str, output: Path, seed: int, count: int | None) -> None:
    """Write NAME's model.onnx and samples/ into a folder."""
    from . import zoo as zoo_lib

    zoo_lib.export(name, output, seed=seed, count=count)
    click.echo(f"wrote {output / 'model.onnx'} and {output / 'samples'}")


@cli.command("profile")
@_model_arg
@_samples_opt
@_out_opt("Where to write the profile (JSON).")
def profile_cmd(model: Path, samples_path: Path, output: Path) -> None:
    """Run MODEL on samples and record shapes, branches, trip counts, node times and ranges."""
    from .model import load_model
    from .profile import profile
    from .samples import load_samples

    loaded = load_model(model)
    result = profile(loaded, load_samples(samples_path, loaded))
    result.save(output)
    _note_reference_error(result)
    click.echo(f"profiled {result.sample_count} samples, {len(result.shapes)} distinct shapes -> {output}")


def _note_reference_error(prof) -> None:
    if prof.reference_error:
        click.echo(f"note: shapes only, onnxruntime could not run the model: {prof.reference_error}",
                   err=True)


@cli.command("plan")
@_model_arg
@click.option("--profile", "profile_path", required=True, type=click.Path(path_type=Path))
@click.option("--target", required=True, help="A target name (see `edgec targets`) or a .toml file.")
@_plan_opts
@_out_opt("Where to write the plan (JSON).")
def plan_cmd(model: Path, profile_path: Path, target: str, policy: str, max_specializations: int,
             min_share: float, output: Path) -> None:
    """Decide which shapes run specialized and which stay symbolic."""
    from .model import load_model
    from .plan import PlanSettings, plan
    from .profile import Profile
    from .targets import load_target

    settings = PlanSettings(policy, max_specializations, min_share)
    result = plan(load_model(model), Profile.load(profile_path), load_target(target), settings)
    result.save(output)
    for region in result.regions:
        click.echo(f"region {region.name}: {region.mode} — {region.reason}")


@cli.command("build")
@_model_arg
@click.option("--plan", "plan_path", required=True, type=click.Path(path_type=Path))
@click.option("--target", "targets", required=True, multiple=True, help="Repeat for several targets.")
@_out_opt("Where to write the artifact (.edgec).")
def build_cmd(model: Path, plan_path: Path, targets: tuple[str, ...], output: Path) -> None:
    """Compile MODEL as the plan says into a single-file artifact."""
    from .build import build
    from .model import load_model
    from .plan import Plan
    from .targets import load_target

    artifact = build(load_model(model), Plan.load(plan_path), [load_target(t) for t in targets])
    artifact.save(output)
    click.echo(f"wrote {output} ({output.stat().st_size} bytes)")


@cli.command("compile")
@_model_arg
@_samples_opt
@click.option("--target", "targets", required=True, multiple=True, help="Repeat for several targets.")
@_plan_opts
@click.option("--save-stages", type=click.Path(path_type=Path), default=None,
              help="Also write profile.json and plan.json into this folder.")
@_out_opt("Where to write the artifact (.edgec).")
def compile_cmd(model: Path, samples_path: Path, targets: tuple[str, ...], policy: str,
                max_specializations: int, min_share: float, save_stages: Path | None,
                output: Path) -> None:
    """Profile, plan and build in one go."""
    from .build import build
    from .model import load_model
    from .plan import PlanSettings, plan
    from .profile import profile
    from .samples import load_samples
    from .targets import load_target

    loaded = load_model(model)
    target_list = [load_target(t) for t in targets]
    settings = PlanSettings(policy, max_specializations, min_share)
    settings.check()
    prof = profile(loaded, load_samples(samples_path, loaded))
    _note_reference_error(prof)
    the_plan = plan(loaded, prof, target_list[0], settings)
    artifact = build(loaded, the_plan, target_list)
    if save_stages is not None:
        prof.save(save_stages / "profile.json")
        the_plan.save(save_stages / "plan.json")
    artifact.save(output)
    for region in the_plan.regions:
        click.echo(f"region {region.name}: {region.mode} — {region.reason}")
    click.echo(f"wrote {output} ({output.stat().st_size} bytes)")


@cli.command("run")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--inputs", "inputs_path", required=True, type=click.Path(path_type=Path),
              help="A .npz file keyed by input name.")
@click.option("--target", default=None, help="Run this target's library (default: this host's).")
@_out_opt("Where to write the outputs (.npz keyed by output name).")
def run_cmd(artifact: Path, inputs_path: Path, target: str | None, output: Path) -> None:
    """Run an artifact on one set of inputs."""
    from . import runtime
    from .fileio import atomic_write
    from .samples import read_npz, sample_files

    model = runtime.load(artifact, target=target)
    inputs = read_npz(sample_files(inputs_path)[0])
    outputs = model.run(inputs)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.savez(handle, **outputs)

    atomic_write(output, write)
    for name, value in outputs.items():
        click.echo(f"{name}: {value.dtype} {list(value.shape)}")


@cli.command("bench")
@click.argument("artifact", type=click.Path(path_type=Path))
@_samples_opt
@click.option("--model", "model_path", type=click.Path(path_type=Path), default=None,
              help="The ONNX model for the onnxruntime baseline (default: the one it was built from).")
@click.option("--runs", default=10, show_default=True, type=int, help="Measured calls per sample.")
@click.option("--warmup", default=2, show_default=True, type=int, help="Unmeasured calls per sample.")
@click.option("--threads", default=2, show_default=True, type=int, help="Threads for both runtimes.")
@click.option("--target", default=None, help="Bench this target's library (default: this host's).")
@click.option("--baselines", default="onnxruntime,onnxruntime-1t", show_default=True,
              help="Comma-separated: onnxruntime, onnxruntime-1t (one thread), tvm-plain (TVM, no plan).")
@_out_opt("Where to write the result (JSON).")
def bench_cmd(artifact: Path, samples_path: Path, model_path: Path | None, runs: int, warmup: int,
              threads: int, target: str | None, baselines: str, output: Path) -> None:
    """Measure latency and accuracy against onnxruntime in the same run."""
    from .bench import BenchSettings, bench
    from .model import load_model
    from .runtime.artifact import Artifact
    from .samples import load_samples

    if model_path is None:
        source = Artifact.load(artifact).manifest["model"].get("source", "")
        if not source or not Path(source).is_file():
            raise EdgecError(f"the model '{artifact}' was built from is not at '{source}'; pass --model")
        model_path = Path(source)
    loaded = load_model(model_path)
    settings = BenchSettings(runs=runs, warmup=warmup, threads=threads)
    chosen = tuple(b.strip() for b in baselines.split(",") if b.strip())
    result = bench(artifact, loaded, load_samples(samples_path, loaded), settings, target=target,
                   baselines=chosen)
    result.save(output)
    click.echo(
        f"edgec p50 {result['edgec']['p50_ms']:.3f} ms, onnxruntime p50 "
        f"{result['onnxruntime']['p50_ms']:.3f} ms, ratio {result['ratio_p50']:.3f}, "
        f"max abs diff {result['accuracy']['max_abs']:.3g}"
    )


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
    from .bench import BenchResult
    from .fileio import write_text
    from .report import RegressionError, compare, load_baseline, parse_margin, report

    margin = parse_margin(max_regression)
    loaded = [BenchResult.load(p) for p in results]
    written = report(loaded).save(output)
    click.echo("wrote " + ", ".join(str(p) for p in written))
    if baseline_path is not None:
        table, regressions = compare(loaded, load_baseline(baseline_path), margin)
        write_text(output / "compare.md", table)
        click.echo(table)
        if regressions:
            raise RegressionError(f"{len(regressions)} regression(s) beyond {margin:.0%} against "
                                  f"'{baseline_path}': {'; '.join(regressions)}")


@cli.command("targets")
def targets_cmd() -> None:
    """List the known targets."""
    from .targets import list_targets

    for target in list_targets():
        click.echo(f"{target.name:20s} {target.kind:6s} {target.arch:8s} "
                   f"{target.run.get('mode', 'local'):6s} {target.description}")


@cli.command("inspect")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest as JSON.")
def inspect_cmd(artifact: Path, as_json: bool) -> None:
    """Show an artifact's manifest: inputs, outputs, libraries, specializations and fallback."""
    from .runtime.artifact import Artifact

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
    for target, lib in manifest["libraries"].items():
        click.echo(f"  library {target} ({lib['arch']}, {lib['device']}): {lib['file']}, "
                   f"{lib['bytes']} bytes, sha256 {lib['sha256'][:16]}…")
        for func in lib["functions"]:
            dims = ", ".join(f"{k}={v}" for k, v in func.get("dims", {}).items())
            share = f", {func['share']:.0%} of profiled samples" if "share" in func else ""
            click.echo(f"    {func['name']:10s} {func['kind']}" + (f" [{dims}{share}]" if dims else ""))
    versions = manifest.get("versions", {})
    click.echo(f"  built with edgec {versions.get('edgec')}, TVM {versions.get('tvm')}")


@cli.command("debug")
@_model_arg
@_samples_opt
@click.option("--target", required=True, help="A target name or a .toml file.")
@click.option("--tolerance", default=1e-4, show_default=True, type=float,
              help="Max abs difference relative to each activation's scale.")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Also write the per-node table as JSON.")
def debug_cmd(model: Path, samples_path: Path, target: str, tolerance: float, output: Path | None) -> None:
    """Name the first node (and region) whose compiled output diverges from the reference."""
    from .debug import debug
    from .fileio import write_text
    from .model import load_model
    from .samples import load_samples
    from .targets import load_target

    loaded = load_model(model)
    result = debug(loaded, load_samples(samples_path, loaded), load_target(target), tolerance)
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
    from .conformance import ci_subset, node_cases, run_suite_parallel, summarize, write_results

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
