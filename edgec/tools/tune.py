"""``edgec tune``: MetaSchedule tuning of the kernels TVM generates, one database per target.

Library dispatch sends convolutions and matmuls to oneDNN; what is left (pooling, softmax, layout
changes, fused elementwise chains, matmuls of targets without a library) is TVM's own code, which
gets simple schedules unless a database holds tuned ones. ``edgec tune`` measures candidate
schedules of exactly those kernels (the module after the pipeline's ``legalize`` phase) and
appends every measured record to the target's ``tuning_records.jsonl`` in the user's autotune
folder; ``edgec build`` applies the best record per kernel.

The database (its format, locking and recovery) is ``edgec.compiler.tuning_database``.
"""
from __future__ import annotations

import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from edgec.compiler import pipeline
from edgec.compiler.backends import backend_for
from edgec.compiler.transform.schedules import kernels_parallel
from edgec.compiler.transform.shape_dispatch import add_shape_dispatch
from edgec.compiler.tuning_database import database_for
from edgec.core.model import load_model
from edgec.core.samples import load_samples
from edgec.core.targets import Target
from edgec.driver import profile_and_plan
from edgec.errors import CompileError, EdgecError, StageInputError, describe
from edgec.runtime import best_for_host, host_arch

# --- measuring: the builder and runner workers of this TVM build need two fixes (TVM_NOTES.md) ---

def _build_kernel(mod: tvm.IRModule, target: tvm.target.Target, _params: Any) -> Any:
    """MetaSchedule's default build without ``import tvm.s_tir.tensor_intrin``.

    That import takes ~41 s here (CUDA intrinsics) and the worker times out at 30 s on each batch;
    fp32 CPU schedules use none of those intrinsics.
    """
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def _runner_initializer() -> None:
    """The runner asks for device "llvm", a name this runtime no longer knows: map it to the CPU."""
    import tvm_ffi

    names = tvm_ffi.Device._DEVICE_NAME_TO_TYPE  # pylint: disable=protected-access
    names.setdefault("llvm", names["cpu"])


def _pickle_workers_by_value() -> None:
    """Send this module's worker functions by value: a worker's ``import edgec`` may find another
    checkout (an installed one) than the one running."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


# --- schedule rules: TOPI's pooling asks for rules this TVM build does not register on CPU ---

# TOPI marks pooling blocks with ``schedule_rule = "meta_schedule.<one of these>"``. TVM registers
# no function of that name for CPU targets, so MetaSchedule logs "Unknown schedule rule" for each
# pooling block it visits, drops the mark, and schedules the block with its generic rules.
# Registering each rule as exactly that (drop the mark, keep the schedule) leaves the design
# spaces and the kernels' workload hashes (database keys) as they were, without the warning.
_POOL_RULES = ("pool_max", "pool_avg", "adaptive_pool_max", "adaptive_pool_avg")


def _generic_rules(sch: Any, block: Any) -> list:
    sch.unannotate(block, "schedule_rule")
    return [sch]


def register_pool_rules() -> None:
    """Register TOPI's pooling schedule rules for CPU targets where TVM has none (idempotent)."""
    for rule in _POOL_RULES:
        name = f"s_tir.meta_schedule.cpu.meta_schedule.{rule}"
        if tvm.get_global_func(name, allow_missing=True) is None:
            tvm.register_global_func(name, _generic_rules)


@derived_object
class _Progress(ms.measure_callback.PyMeasureCallback):
    """A progress line on stderr after each measured batch: trials done, valid ones, best time."""

    def __init__(self, total: int, stream: Any = None) -> None:
        super().__init__()
        self.total = total
        self.done = 0
        self.valid = 0
        self.started = time.monotonic()
        self.stream = stream if stream is not None else sys.stderr

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        # run_secs arrive as tvm FloatImm values; an error leaves them unset.
        self.done += len(runner_results)
        self.valid += sum(1 for r in runner_results if r.error_msg is None and r.run_secs)
        width = 30
        filled = min(width, width * self.done // max(self.total, 1))
        elapsed = time.monotonic() - self.started
        self.stream.write(f"\rtuning [{'#' * filled}{'.' * (width - filled)}] "
                          f"{self.done} of {self.total} trials measured ({self.valid} valid; "
                          f"the last batch may overshoot), task {task_id}, {elapsed:.0f} s")
        self.stream.flush()


@dataclass
class TuneSummary:
    """What one ``edgec tune`` run did."""

    database: str
    tasks: int
    trials_requested: int
    trials_before: int  # records this model's kernels already had
    trials_run: int
    records_before: int
    records_after: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _static(func: tvm.tirx.PrimFunc) -> bool:
    """MetaSchedule tunes kernels of known shapes only; symbolic ones keep the simple schedules."""
    try:
        ms.arg_info.ArgInfo.from_prim_func(func)  # refuses symbolic buffer shapes
    except Exception:  # noqa: BLE001 - TVM's conversion error is its signal for "symbolic"
        return False
    return True


def tuning_tasks(mod: tvm.IRModule, target: Target) -> tuple[list, tvm.target.Target]:
    """The kernels of ``mod`` TVM generates for ``target`` (after library dispatch), as tasks.

    Returns the tasks and the TVM target to tune with. Where a library's threads own the cores,
    TVM's kernels run serially (``transform.schedules.kernels_parallel``), so they are tuned with
    one core.
    """
    tvm_target = backend_for(target).tvm_target(target)
    try:
        fused = pipeline.lower_to(mod, target, "legalize")
        config = dict(tvm_target.export())
        if not kernels_parallel(fused):
            config["num-cores"] = 1
        tune_target = tvm.target.Target(config)
        tasks = ms.relax_integration.extract_tasks(fused, tune_target)
    except EdgecError:
        raise
    except Exception as exc:  # TVM's errors from legalizing and fusing
        raise CompileError(f"extracting kernels to tune for '{target.name}' failed: "
                           f"{describe(exc)}") from None
    return [t for t in tasks if _static(t.dispatched[0]["main"])], tune_target


def tune(mod: tvm.IRModule, target: Target, trials: int, seed: int = 0,
         progress: Any = None) -> TuneSummary:
    """Tune ``mod``'s TVM kernels for ``target`` until the database holds ``trials`` records of them.

    Counting what is already there makes a killed run resumable: running the same command again
    spends only the trials still missing, starting from the records kept.
    """
    if trials <= 0:
        raise EdgecError(f"--trials must be positive, got {trials}")
    if "num-cores" not in target.tvm:
        raise StageInputError(f"target '{target.name}' has no 'num-cores' in its [tvm] table; "
                              f"MetaSchedule needs it: add the device's core count")
    _check_runs_here(target)
    tasks, tune_target = tuning_tasks(mod, target)
    register_pool_rules()
    database = database_for(target)
    records_before = len(database)
    before = sum(database.records_for(t.dispatched[0]) for t in tasks)
    remaining = trials - before
    summary = TuneSummary(database.location, len(tasks), trials, before, 0, records_before,
                          records_before)
    if not tasks or remaining <= 0:
        return summary
    # MetaSchedule's scheduler gives each task one batch in list order, then the batches go to
    # the tasks improving most: the least-tuned kernels go first, and batches are sized so that
    # the first round reaches every kernel the trials can.
    tasks.sort(key=lambda t: database.records_for(t.dispatched[0]))
    per_round, split = split_trials(remaining, len(tasks), before)
    (progress or sys.stderr).write(split + "\n")
    _pickle_workers_by_value()
    callbacks = [*ms.measure_callback.MeasureCallback.create("default"),
                 _Progress(remaining, progress)]
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="edgec-tune-") as work_dir:  # MetaSchedule's logs
        contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            tasks, work_dir=work_dir, seed=seed)
        try:
            ms.tune.tune_tasks(
                tasks=contexts, task_weights=weights, work_dir=work_dir,
                max_trials_global=remaining, num_trials_per_iter=per_round,
                builder=ms.builder.LocalBuilder(f_build=_build_kernel, max_workers=1),
                runner=ms.runner.LocalRunner(initializer=_runner_initializer),
                database=database, cost_model=_cost_model(), measure_callbacks=callbacks,
            )
        except EdgecError:
            raise
        except Exception as exc:  # MetaSchedule reports worker failures with TVM's error types
            raise CompileError(f"tuning for '{target.name}' failed: {describe(exc)}") from None
        finally:
            (progress or sys.stderr).write("\n")
    summary.trials_run = sum(database.records_for(t.dispatched[0]) for t in tasks) - before
    summary.records_after = len(database)
    return summary


def split_trials(remaining: int, kernels: int, before: int = 0) -> tuple[int, str]:
    """How ``remaining`` trials are spread over ``kernels`` tasks: the batch size (trials per task
    per round, at most 16) and one line saying so up front, a warning when some kernels get no
    trial. ``before`` is the trials already recorded, which ``--trials`` counts too."""
    per_round = max(1, min(16, remaining // kernels))
    if remaining < kernels:
        return per_round, (f"warning: {remaining} trials for {kernels} kernels: "
                           f"{kernels - remaining} get no trial and keep the default schedule; "
                           f"pass --trials {before + kernels} or more to tune them all")
    first = per_round * kernels
    rest = (f", then the other {remaining - first} to the kernels whose best time improves most"
            if remaining > first else "")
    return per_round, (f"{remaining} trials for {kernels} kernels: {per_round} for each in turn"
                       f"{rest}")


def _check_runs_here(target: Target) -> None:
    """Tuning measures candidates on this machine: the target's code must run here."""

    if best_for_host({target.name: {**target.to_json(), "device": "cpu"}}) is None:
        needs = ", ".join(target.cpu_features) or "no CPU features"
        raise StageInputError(
            f"target '{target.name}' ({target.arch}, needs {needs}) cannot run on this machine "
            f"({host_arch()}), and tuning measures here; tune on a machine the target describes")


def _cost_model() -> str:
    """XGBoost's model when it is installed (MetaSchedule's default); random sampling otherwise."""
    try:
        import xgboost  # noqa: F401 - only probing
    except ImportError:
        return "random"
    return "xgb"


def tune_model(model_path: str | Path, target: Target, trials: int,
               samples_path: str | Path | None = None, seed: int = 0,
               progress: Any = None) -> TuneSummary:
    """``edgec tune``: load the model, and for a dynamic one plan its shape specializations from
    samples as ``edgec compile`` would, then tune the module ``edgec build`` compiles."""
    model = load_model(model_path)
    specializations: list = []
    if samples_path is not None:
        _, the_plan = profile_and_plan(model, load_samples(samples_path, model), target)
        if len(the_plan.regions) == 1:
            specializations = [s["dims"] for s in the_plan.regions[0].specializations]
    mod = add_shape_dispatch(pipeline.import_model(model), specializations)
    return tune(mod, target, trials, seed=seed, progress=progress)
