"""The compiler pipeline: every pass edgec runs, in phases, per backend. The one place that says
what runs for a target.

    import      ONNX-level passes (``onnx_passes``), then TVM's importer with edgec's converter
                table (``importer``); torch programs through ``importer.from_torch``
    (specialize the build stage adds shape and value dispatch, from the plan: ``transform``)
    prepare     fresh variables, fast math, library offload, quantized lowering, native kernels
    legalize    TVM's legalization and operator fusion (GPU: with dlight's schedules)
    tune        tuned schedules from the target's MetaSchedule database (CPU)
    schedule    edgec's vectorizing schedules for the other kernels (CPU)
    lower       TVM's dataflow lowering and memory planning (each If branch then allocating the
                storage it uses: ``transform.branch_storage``), VM code generation (shape
                functions in one order: ``transform.shape_func_order``) and linking

``phases(backend, target, options, record)`` lists the Relax phases for a backend from its
capability attributes (``backends.base.Backend``); ``compile`` runs them and links the library.
Each phase is a ``tvm.transform.Sequential`` named ``edgec.<phase>``, so a pass instrument sees
phase boundaries: ``DumpIR`` writes the module after each phase (``edgec build --dump-ir DIR``),
and ``lower_to`` stops after any phase.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import onnx
import tvm
from tvm import relax

from edgec.compiler import native
from edgec.compiler.backends import Backend, CompiledLibrary, backend_for
from edgec.compiler.importer import from_onnx
from edgec.compiler.importer.converter_table import BUILT_IN, converter_table
from edgec.compiler.importer.expand import expand_functions, value_types
from edgec.compiler.importer.fold import fix_inputs, fold_constants
from edgec.compiler.importer.pads import fold_pads
from edgec.compiler.importer.recurrent import rewrite_recurrent
from edgec.compiler.importer.transposes import sink_transposes
from edgec.compiler.ir import extern_symbols
from edgec.compiler.transform import library_offload
from edgec.compiler.transform.branch_storage import BranchStorage
from edgec.compiler.transform.concat_tree import SplitWideConcats
from edgec.compiler.transform.fast_math import FastMath
from edgec.compiler.transform.fp16 import FP16
from edgec.compiler.transform.native_kernels import NativeKernels
from edgec.compiler.transform.safe_take import ClipTakes
from edgec.compiler.transform.quantized import Int8Lowering, QuantizedLowering
from edgec.compiler.transform.schedules import (ApplyTuningDatabase, CPUSchedules, KernelCount,
                                                kernels_parallel)
from edgec.compiler.transform.shape_func_order import OrderShapeFunctions
from edgec.compiler.transform.shape_reads import UnfusedShapeReads
from edgec.compiler.transform.trusted_params import TrustedParams
from edgec.compiler.transform.unique_vars import UniqueVars
from edgec.compiler.tuning_database import open_database
from edgec.core.model import Model
from edgec.core.quant_schemes import integer_weight_levels
from edgec.core.targets import Target
from edgec.errors import CompileError, EdgecError, describe

# Functions of edgec's shims and kernels that a program calls by name: the runtimes bind them.
LINKED_PREFIX = "edgec_"


@dataclass(frozen=True)
class Options:
    """What the plan and the quantize stage decided that changes which passes run.

    ``native_loops``: the importer may use edgec's CPU kernels (recurrent time loop, rows
    appended in place) — only when every target's backend can call them. ``quantized``: the
    quantize stage's decision, or None for fp32. ``library``: the plan's execution route; False
    keeps every op a TVM kernel even where the target enables a library (a device without room
    for oneDNN, or a model too small to gain from its calls).
    """

    native_loops: bool = True
    quantized: QuantizedLowering | None = None
    library: bool = True


@dataclass
class Record:
    """What the passes found while they ran, for the manifest."""

    quantized_calls: dict[str, int] = field(default_factory=dict)
    kernels: KernelCount = field(default_factory=KernelCount)
    database: Any = None  # the tuning database the tune phase applied (CPU lowering)


@dataclass(frozen=True)
class Phase:
    name: str
    passes: list

    def as_pass(self) -> tvm.transform.Pass:
        return tvm.transform.Sequential(self.passes, name=f"edgec.{self.name}")


# ---------------------------------------------------------------------------------------------
# import


OnnxPass = Callable[[onnx.ModelProto], onnx.ModelProto]


def onnx_passes(name: str, converters: Mapping[str, Any], native_loops: bool,
                constants: Mapping[str, np.ndarray]) -> list[tuple[str, OnnxPass]]:
    """The ONNX-level passes before TVM's importer, in order: inputs the plan fixed become
    constants, recurrent layers become loops (``native_loops``: edgec's CPU time loop), model
    functions the converters lack are expanded, what is known at compile time is folded,
    transposes are pushed through layout-free ops until they cancel, and zero pads become their
    convolutions' own padding."""
    known = lambda op: op in converters or op in BUILT_IN  # noqa: E731
    return [
        ("fix_inputs", lambda proto: fix_inputs(proto, dict(constants))),
        ("recurrent", lambda proto: rewrite_recurrent(proto, name, value_types(proto).get,
                                                      native=native_loops)),
        ("expand", lambda proto: expand_functions(proto, known)),
        ("fold", fold_constants),
        ("transposes", sink_transposes),
        ("pads", fold_pads),
    ]


def import_model(model: Model, constants: Mapping[str, np.ndarray] | None = None,
                 native_loops: bool = True) -> tvm.IRModule:
    """``model`` as a Relax module whose ``main`` takes the graph inputs in order.

    ONNX models run ``onnx_passes`` and then the converter table's import; inputs named in
    ``constants`` are compiled as those values (``main`` still takes them; the runtime checks
    they match). ``native_loops``: see ``Options``. Torch programs go through torch's exported
    program importer. Raises ModelError naming what cannot be imported.
    """
    if model.kind == "torch":
        from edgec.compiler.importer.from_torch import import_torch  # torch: an optional extra

        return import_torch(model)
    converters = converter_table(native_rows=native_loops)
    proto = model.proto
    for _name, onnx_pass in onnx_passes(model.name, converters, native_loops, constants or {}):
        proto = onnx_pass(proto)
    return from_onnx.convert(model.name, proto, converters)


# ---------------------------------------------------------------------------------------------
# Relax phases


def _tvm_lowering(kind: str):
    """TVM's own per-device pass lists (library dispatch, legalize, dataflow lower, finalize)."""
    return {"cpu": relax.backend.cpu_generic.pipeline, "cuda": relax.backend.cuda.pipeline,
            "gpu": relax.backend.gpu_generic.pipeline}[kind]


def library_rules(backend: Backend, target: Target, options: Options):
    """What goes to the target's library in this build: the backend's rules for the target, as
    the build's quantized layers need them (every int8 matmul a library call; NHWC activations
    for oneDNN's AMX convolutions), or None when the target enables no library or the plan
    routes every op to TVM."""
    rules = backend.library_rules(target) if options.library else None
    quantized = options.quantized
    if rules is None or quantized is None or quantized.mode == "fp16":
        return rules
    # Integer layers are int8 only as library calls, and a layer must be so in every function
    # the plan made (a specialization's static shapes may make a matmul tiny). A bf16 layer too
    # small for the library stays a TVM kernel in fp32, as the shim would run it (Bf16Pays).
    if set(quantized.layers()) - set(quantized.layers("bf16")):
        rules = replace(rules, dense_min_macs=0)
    convs = {quantized.decisions[n]["precision"] for n in quantized.layers()
             if quantized.decisions[n]["kind"] == "conv"}
    if "bf16" in convs or (convs and rules.block == 16):
        # The layout of oneDNN's AMX convolutions, bf16 and int8: on blocked tensors each call
        # reordered its input and output (resnet50_rand int8-static 0.48 -> 0.35 of fp32's time,
        # Sapphire Rapids). Without such a layer NHWC only slowed the fp32 convolutions
        # (wav2vec2's feature extractor: its bf16 build 1.10x the fp32 one's time). AVX2
        # targets' int8 kernels (block 8) are not measured in NHWC and stay blocked.
        rules = replace(rules, channels_last=True)
    return rules


def prepare_passes(backend: Backend, target: Target, options: Options, record: Record) -> list:
    """The Relax rewrites before TVM legalizes: what edgec decides about the program."""
    passes = [UniqueVars]
    rules = library_rules(backend, target, options)
    quantized = options.quantized
    int8 = quantized is not None and quantized.mode != "fp16"
    if rules is not None:
        passes += [library_offload.Canonicalize(), library_offload.Offload(rules),
                   library_offload.PropagateLayout(rules)]
    if backend.fast_math:  # after the offload: its activation patterns read erf and sigmoid
        passes.append(FastMath)
    if int8:
        if not backend.int8:
            raise CompileError(f"target '{target.name}': edgec's int8 kernels are oneDNN's (x86) "
                               f"and XNNPACK's (Arm); build '{target.name}' without --quantize "
                               f"(or with --quantize fp16)")
        passes.append(Int8Lowering(quantized.proto, quantized, record.quantized_calls,
                                   integer_weight_levels(target.arch, target.cpu_features)))
    elif quantized is not None and backend.fp16:
        passes.append(FP16(quantized.layers("fp16"), record.quantized_calls, target.name))
    passes.append(SplitWideConcats)
    passes.append(ClipTakes)  # after every pass that adds a take (layout, int8 embeddings)
    passes.append(NativeKernels(backend.native_kernels, target.name))  # legalizes
    passes.append(UnfusedShapeReads)
    return passes


def phases(backend: Backend, target: Target, options: Options, record: Record) -> list[Phase]:
    """Every Relax phase for ``target`` (of ``backend``), in order."""
    tvm_target = backend.tvm_target(target)
    lowering = _tvm_lowering(backend.lowering)
    result = [Phase("prepare", prepare_passes(backend, target, options, record)),
              Phase("legalize", lowering.library_dispatch_passes(tvm_target)
                    + lowering.legalize_passes(tvm_target))]
    if backend.lowering == "cpu":  # the GPU lowering schedules inside legalize (dlight)
        record.database = open_database(target, must_exist=False)
        result += [Phase("tune", [ApplyTuningDatabase(record.database, record.kernels)]),
                   Phase("schedule", [CPUSchedules])]
    result.append(Phase("lower", with_fixes(lowering.dataflow_lower_passes(tvm_target)
                                            + lowering.finalize_passes(tvm_target))))
    return result


# edgec's passes that mend what one of TVM's passes leaves, each run right after that pass: the
# memory planning may hand one branch of an If storage bound in another (each branch then
# allocates its own); the shape lowering orders its statements differently on every run, and
# checks the arguments of loop steps that only edgec_loop calls.
_FIXES_AFTER = {"StaticPlanBlockMemory": [BranchStorage],
                "VMShapeLower": [OrderShapeFunctions, TrustedParams]}


def with_fixes(passes: list) -> list:
    """TVM's ``passes`` with each of edgec's fixes right after the pass it mends."""
    result = []
    for p in passes:
        result.append(p)
        result += _FIXES_AFTER.get(p.info.name, [])
    return result


# ---------------------------------------------------------------------------------------------
# Running the phases


@tvm.instrument.pass_instrument
class DumpIR:
    """Writes the module after each phase into ``directory`` as ``NN_<phase>.py`` (TVMScript)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.count = 0

    def write(self, phase: str, mod: tvm.IRModule) -> Path:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.count:02d}_{re.sub(r'[^A-Za-z0-9_.-]', '_', phase)}.py"
        self.count += 1
        path.write_text(mod.script(show_meta=False), encoding="utf-8")
        return path

    def run_after_pass(self, mod: tvm.IRModule, info: tvm.transform.PassInfo) -> None:
        if info.name.startswith("edgec.") and info.name[len("edgec."):] in _PHASE_NAMES:
            self.write(info.name[len("edgec."):], mod)


_PHASE_NAMES = ("prepare", "legalize", "tune", "schedule", "lower")


def _pass_context(backend: Backend, instruments: list) -> tvm.transform.PassContext:
    """The current pass context with ``instruments`` added and, for backends that drop them,
    TIR's per-kernel argument asserts off (``tirx.disable_assert``): each kernel's packed
    wrapper re-checks every argument's type, dtype, rank, shape and strides, about 2.5 KB of
    code per kernel, after the VM has checked the model's inputs (``check_tensor_info``,
    ``match_shape``) and a data-dependent shape at its ``match_cast``."""
    current = tvm.transform.PassContext.current()
    config = dict(current.config)
    if not backend.kernel_asserts:
        config["tirx.disable_assert"] = True
    return tvm.transform.PassContext(
        opt_level=current.opt_level, required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass),
        instruments=list(current.instruments) + list(instruments), config=config)


def lower_to(mod: tvm.IRModule, target: Target, phase: str,
             options: Options = Options()) -> tvm.IRModule:
    """``mod`` after every phase up to and including ``phase`` for ``target`` (what ``edgec
    tune`` cuts its tasks from, after ``legalize``)."""
    backend = backend_for(target)
    selected = []
    for item in phases(backend, target, options, Record()):
        selected.append(item.as_pass())
        if item.name == phase:
            break
    else:
        raise ValueError(f"no phase '{phase}'; phases: {', '.join(_PHASE_NAMES)}")
    with backend.tvm_target(target), _pass_context(backend, []):
        return tvm.transform.Sequential(selected)(mod)


def compile(mod: tvm.IRModule, target: Target, options: Options = Options(),  # noqa: A001
            dump_ir: DumpIR | None = None) -> tuple[CompiledLibrary, Record]:
    """Compile ``mod`` for ``target`` through every phase and link one shared library, with the
    native code its program calls (library shims, edgec's kernels). Returns the library and what
    the passes recorded."""
    backend = backend_for(target)
    tvm_target = backend.tvm_target(target)
    # Checked first: linking is the last step, after minutes of compiling.
    backend.check_toolchain(target)
    rules = library_rules(backend, target, options)
    compiler = target.cross_compiler or "g++"
    if rules is not None:
        native.ROUTE_SHIMS[_route(target, backend)](compiler)  # fails now, in one line, if missing
    record = Record()
    all_phases = phases(backend, target, options, record)
    instruments = [dump_ir] if dump_ir is not None else []
    try:
        with tvm_target, _pass_context(backend, instruments):
            prepared = all_phases[0].as_pass()(mod)
            lowered = tvm.transform.Sequential([p.as_pass() for p in all_phases[1:]])(prepared)
            exec_mode = backend.vm_exec_mode(target, lowered)
            executable = relax.build(lowered, tvm_target, relax_pipeline=None,
                                     exec_mode=exec_mode)
    except EdgecError:
        raise
    except Exception as exc:  # lowering errors arrive as TVM's InternalError and friends
        raise CompileError(f"compiling for '{target.name}' failed: {describe(exc)}") from exc
    symbols = extern_symbols(prepared)
    addons = native.addons_for(symbols, compiler)
    data = backend.link(executable, target, addons)
    tuning: dict = {}
    if backend.lowering == "cpu":
        tuning = {"database": None, "records": 0, "kernels": record.kernels.kernels,
                  "tuned_kernels": 0}
        if record.database is not None:
            tuning.update(database=record.database.location, records=len(record.database),
                          tuned_kernels=record.kernels.tuned)
    library = CompiledLibrary(
        data, native_dependencies=list(dict.fromkeys(
            lib for addon in addons for lib in addon.runtime_libraries)),
        tuning=tuning, tvm_kernels_parallel=kernels_parallel(prepared),
        vm_exec_mode=exec_mode,
        linked_functions=sorted(s for s in symbols if s.startswith(LINKED_PREFIX)))
    return library, record


def _route(target: Target, backend: Backend) -> str:
    return next(name for name in backend.library_routes if target.libraries.get(name, False))
