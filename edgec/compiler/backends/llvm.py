"""Compile a Relax module for a target and export its library, one small class per kind of target.

Adding a kind of target (CUDA, say) is adding a class to ``CODEGENS``; target files pick it by
their ``kind`` field.

The LLVM codegen sends convolutions and matmuls to oneDNN when the target file says
``[libraries] dnnl = true``, or to XNNPACK (aarch64 targets) when it says ``xnnpack = true``
(``library_dispatch``), then compiles the rest with TVM's CPU pipeline plus fusion and simple
vectorizing schedules (``cpu_pipeline``): TVM's own default CPU build neither fuses nor schedules.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import tvm
import tvm_ffi
from tvm import relax, topi
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import get_extent, try_inline
from tvm.s_tir.schedule import ScheduleError

from edgec.errors import CompileError, ToolchainError, describe
from edgec.core.targets import Target
from edgec.compiler import native
from edgec.compiler.transform import native_kernels as runtime_kernels
from edgec.compiler.backends.cuda import CUDACodegen
from edgec.compiler.transform.library_offload import DispatchRules, dispatch_with_stats
from edgec.compiler.tuning_database import open_database


# A module rewrite run after library dispatch, returning the native addons its calls need.
LibraryRewrite = Callable[[tvm.IRModule, Target], "tuple[tvm.IRModule, list[native.NativeAddon]]"]


@dataclass(frozen=True)
class CompiledLibrary:
    """A target's model library and the shared libraries it needs at run time besides TVM's."""

    data: bytes
    native_dependencies: list[str] = field(default_factory=list)
    # Which tuning database was applied and how many of TVM's kernels took schedules from it.
    tuning: dict = field(default_factory=dict)
    # False when TVM's kernels were compiled serial (oneDNN's threads own the cores): the
    # runtimes then start TVM's thread pool with one thread, which only TOPI's built-in parallel
    # loops (scatter_nd...) would wake on every call, for no gain (moe: 0.16 -> 0.11 ms).
    tvm_kernels_parallel: bool = True
    # How the VM runs the Relax functions: "bytecode" (interpreted) or "compiled" (native code),
    # and, for compiled ones, the functions linked into the library that the runtime must bind
    # (see ``linked_functions``).
    vm_exec_mode: str = "bytecode"
    linked_functions: list[str] = field(default_factory=list)


# Relax functions as native code instead of VM bytecode: no instruction decoding around each
# builtin call. Same outputs; per call, on this machine: scan_rnn 0.150 -> 0.106 ms,
# greedy_decoder 0.142 -> 0.112, moe 0.089 -> 0.064 (without Python), transformer and early_exit
# within 3%. Only edgec's runtimes bind the functions such code needs (``linked_functions``):
# targets run through TVM's own RPC server keep bytecode.
VM_EXEC_MODE = "compiled"
LINKED_PREFIX = "edgec_"


def vm_exec_mode(target: Target) -> str:
    """How ``target``'s library runs its Relax functions (see ``VM_EXEC_MODE``)."""
    return "bytecode" if target.run.get("mode", "local") == "rpc" else VM_EXEC_MODE


def without_kernel_asserts() -> tvm.transform.PassContext:
    """The current pass context, with TIR's asserts dropped from generated code.

    Each kernel's packed wrapper re-checks every argument's type, dtype, rank, shape and
    strides, about 2.5 KB of code per kernel (transformer int8-weight: 190 KB of 856 KB).
    The VM checks the model's inputs against their declared types (``check_tensor_info``,
    ``match_shape``) before any kernel runs, and a data-dependent shape at its ``match_cast``,
    so the kernels only ever see the shapes the VM allocated for them.
    """
    current = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=current.opt_level, required_pass=list(current.required_pass),
        disabled_pass=list(current.disabled_pass), instruments=list(current.instruments),
        config={**dict(current.config), "tirx.disable_assert": True})


def linked_functions(mod: tvm.IRModule) -> list[str]:
    """The functions edgec links into the model library (its shims: oneDNN, NonZero...) that
    ``mod``'s Relax functions call.

    Compiled VM code looks such a function up among the library's imports and TVM's global
    registry, never among the library's own symbols, so the runtimes bind each one into the
    library when they load it (``edgec.runtime``, ``edgec.cc``), and need the list.
    """
    return sorted(name for name in _extern_symbols(mod) if name.startswith(LINKED_PREFIX))


@dataclass(frozen=True)
class PreparedModule:
    """A module whose heavy ops call native libraries, and what linking it needs."""

    mod: tvm.IRModule
    addons: list  # native.NativeAddon: objects to link and the libraries they need at run time
    parallel: bool  # whether TVM's own kernels may use TVM's thread pool


class LLVMCodegen:
    """CPU code through LLVM, linked into a shared library by the host or a cross C++ compiler."""

    device = "cpu"

    def tvm_target(self, target: Target) -> tvm.target.Target:
        try:
            return tvm.target.Target(dict(target.tvm))
        except Exception as exc:  # TVM validates target attributes with its own error types
            raise CompileError(f"target '{target.name}' has an invalid [tvm] table: {describe(exc)}") from None

    def prepare(self, mod: tvm.IRModule, target: Target,
                library_rewrite: LibraryRewrite | None = None) -> PreparedModule:
        """``mod`` with library calls in place, before TVM legalizes and schedules the rest.

        With ``[libraries] dnnl = true`` in the target file, convolutions and matmuls go to
        oneDNN through edgec's shim, linked into the library; the library then needs
        ``libdnnl.so.2`` on the device, which ``native_dependencies`` records. With
        ``xnnpack = true`` (aarch64 targets) they go to XNNPACK likewise, and the library needs
        ``libXNNPACK.so.0`` and ``libpthreadpool.so.0``. ``edgec tune``
        starts from this module too, so it tunes exactly the kernels TVM still generates.
        ``library_rewrite`` (quantization's hook) rewrites the module right after library
        dispatch and returns the native code its calls need.
        """
        mod = fast_math(_fusable(mod))
        addons: list[native.NativeAddon] = []
        rules = library_rules(target)
        if rules is not None and library_rewrite is not None:
            # Quantized layers are int8 only as library calls, and a layer must be int8 in every
            # function the plan made (a specialization's static shapes may make a matmul tiny).
            rules = replace(rules, dense_min_macs=0)
        if rules is not None:
            # Fails early, in one line, when the library or the compiler is missing.
            shim = SHIMS[rules.library](target.cross_compiler or "g++")
            try:
                mod, stats = dispatch_with_stats(mod, rules)
            except Exception as exc:  # TVM's own errors from rewriting and type inference
                raise CompileError(
                    f"library dispatch for '{target.name}' failed: {describe(exc)}") from None
            if stats.calls:
                addons.append(shim)
        if library_rewrite is not None:
            mod, extra = library_rewrite(mod, target)
            addons += extra
        if rules is not None and shim in addons:
            # The shim with only the functions the program calls, after any rewrite (none when
            # every layer went int8): each export is 8-30 KB of code.
            addons.remove(shim)
            called = [name for name in _extern_symbols(mod) if name.startswith(rules.symbol(""))]
            if called:
                addons.insert(0, SHIMS[rules.library](target.cross_compiler or "g++", called))
        uses_library = bool(addons)
        # After library dispatch: this legalizes, which would hide convolutions from it.
        mod, kernels = runtime_kernels.redirect(mod)
        if kernels:
            addons.append(native.runtime_kernels(target.cross_compiler or "g++", kernels))
        # oneDNN's OpenMP threads own the cores between its calls: TVM kernels that also
        # ran on TVM's thread pool made whole models slower (measured), so they stay serial.
        # XNNPACK's pthreadpool is kept alike (not measured on an Arm board).
        return PreparedModule(mod, addons, parallel=not uses_library)

    def compile(self, mod: tvm.IRModule, target: Target,
                library_rewrite: LibraryRewrite | None = None) -> CompiledLibrary:
        """Compile ``mod`` for ``target`` and link it into one shared library.

        Kernels that the target's tuning database (``edgec tune``) has records for take their
        tuned schedules; the others get ``cpu_pipeline``'s simple ones.
        """
        tvm_target = self.tvm_target(target)
        # Checked first: linking is the last step, after minutes of compiling.
        if target.cross_compiler and shutil.which(target.cross_compiler) is None:
            raise ToolchainError(
                f"cross compiler '{target.cross_compiler}' for target '{target.name}' is not "
                f"installed; install it ({_debian_cross_package(target.cross_compiler)})"
            )
        prepared = self.prepare(mod, target, library_rewrite)
        addons = prepared.addons
        database = open_database(target, must_exist=False)
        applied = _AppliedCount()
        try:
            pipeline = cpu_pipeline(tvm_target, parallel=prepared.parallel,
                                    database=database, applied=applied)
            with without_kernel_asserts():
                executable = relax.build(prepared.mod, tvm_target, relax_pipeline=pipeline,
                                         exec_mode=vm_exec_mode(target))
        except Exception as exc:  # lowering errors arrive as TVM's InternalError and friends
            raise CompileError(f"compiling for '{target.name}' failed: {describe(exc)}") from None
        tuning = {"database": None, "records": 0, "kernels": applied.kernels, "tuned_kernels": 0}
        if database is not None:
            tuning.update(database=database.location, records=len(database),
                          tuned_kernels=applied.tuned)
        export_kwargs = {"options": list(native.LINK_OPTIONS)}
        if target.cross_compiler:
            export_kwargs["fcompile"] = tvm.support.cc.cross_compiler(target.cross_compiler)
        if addons:
            # addons, not options: options land before the objects and the linker drops them.
            export_kwargs["addons"] = [arg for addon in addons for arg in addon.addons]
        with tempfile.TemporaryDirectory(prefix="edgec-build-") as tmp:
            path = Path(tmp) / "model.so"
            try:
                executable.export_library(str(path), **export_kwargs)
            except Exception as exc:  # the linker's failure surfaces as a RuntimeError
                raise CompileError(f"linking the library for '{target.name}' failed: {describe(exc)}") from None
            dependencies = list(dict.fromkeys(
                lib for addon in addons for lib in addon.runtime_libraries))
            return CompiledLibrary(path.read_bytes(), native_dependencies=dependencies,
                                   tuning=tuning, tvm_kernels_parallel=prepared.parallel,
                                   vm_exec_mode=vm_exec_mode(target),
                                   linked_functions=linked_functions(prepared.mod))


def _extern_symbols(mod: tvm.IRModule) -> set[str]:
    """The external functions (``call_dps_packed`` and friends) the Relax functions of ``mod``
    call, by symbol."""
    found: set[str] = set()

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.ExternFunc):
            found.add(str(expr.global_symbol))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def _debian_cross_package(compiler: str) -> str:
    """How to install a GNU cross compiler on Debian, from its name (``<triple>-g++`` is in
    package ``g++-<triple>``)."""
    match = re.fullmatch(r"(?:.*/)?([a-z0-9_]+-[a-z0-9_-]+?)-(g\+\+|gcc)(?:-\d+)?", compiler)
    if not match:
        return "from your toolchain vendor, or set build.cross_compiler to one on PATH"
    return f"Debian: apt-get install {match.group(2)}-{match.group(1)}"


def _fusable(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with variables of its own in every function, as TVM's operator fusion needs.

    Fusion (which TVM's default CPU build skips) maps the variables of all functions in one
    graph; shape specializations are copies of one function that share variables, which it
    rejects ("appears at multiple definition sites").
    """
    result = tvm.IRModule(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            result[gvar] = relax.utils.copy_with_new_vars(func)
    return result


# The shim of each library route (``DispatchRules.library``), compiled with the target's compiler.
SHIMS = {"dnnl": native.dnnl_shim, "xnn": native.xnnpack_shim}


def library_rules(target: Target) -> DispatchRules | None:
    """The library route ``target``'s file enables (``[libraries] dnnl`` or ``xnnpack``), with
    what goes there and in which layout; None when it enables neither.

    Raises CompileError when it enables both, or XNNPACK for another architecture than aarch64
    (the shim is built and tested against Debian's arm64 XNNPACK only).
    """
    enabled = [name for name in ("dnnl", "xnnpack") if target.libraries.get(name, False)]
    if len(enabled) > 1:
        raise CompileError(f"target '{target.name}' enables both [libraries] dnnl and xnnpack; "
                           f"keep one")
    if not enabled:
        return None
    if enabled[0] == "dnnl":
        return dnnl_rules(target)
    if target.arch != "aarch64":
        raise CompileError(f"target '{target.name}': [libraries] xnnpack is for aarch64 targets "
                           f"(this one is {target.arch}); use dnnl on x86_64")
    return xnnpack_rules(target)


def xnnpack_rules(target: Target) -> DispatchRules:  # noqa: ARG001 - one set for every Arm core
    """What goes to XNNPACK for ``target``: every convolution and dense matmul with a constant
    fp32 weight (TVM's untuned kernels lose by far more than XNNPACK's NEON ones), activations
    NHWC between its calls, XNNPACK's only layout."""
    return DispatchRules(library="xnn")


def dnnl_rules(target: Target) -> DispatchRules:
    """What goes to oneDNN for ``target``, and in which activation layout.

    oneDNN's AVX-512 kernels work on 16-channel blocks, its AVX2 ones on 8: the target's declared
    ISA picks the block (a library built for one ISA runs everywhere, with reorders where the
    machine's kernels want the other block). Other architectures keep NCHW.
    """
    mattr = [str(a) for a in target.tvm.get("mattr", [])]
    if target.arch != "x86_64":
        return DispatchRules(block=0)
    return DispatchRules(block=16 if "+avx512f" in mattr else 8)


def fusion_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """TVM's CPU passes up to legalized, fused kernels: what MetaSchedule's tasks are cut from."""
    backend = relax.backend.cpu_generic.pipeline
    return backend.library_dispatch_passes(target) + backend.legalize_passes(target)


@dataclass
class _AppliedCount:
    """How many kernels TVM generated, and how many of them took a tuned schedule."""

    kernels: int = 0
    tuned: int = 0


def cpu_pipeline(target: tvm.target.Target, parallel: bool = True, database=None,
                 applied: _AppliedCount | None = None) -> tvm.transform.Pass:
    """TVM's CPU pipeline, with tuned or simple schedules applied to the kernels TVM generates.

    TVM's default CPU build schedules nothing: every kernel is one thread of naive loops. After
    legalization and fusion, kernels ``database`` (a MetaSchedule database, see ``edgec.tools.tune``)
    has records for take the best one; of the rest, kernels with one block (elementwise, layout
    changes, concatenations, pooling) are vectorized, and with ``parallel`` spread over TVM's
    thread pool; the rest stay as TVM writes them. ``applied`` receives the counts.
    """
    backend = relax.backend.cpu_generic.pipeline
    before = fusion_passes(target)
    after = ([dlight.ApplyDefaultSchedule(_SimpleKernel(parallel))]
             + backend.dataflow_lower_passes(target) + backend.finalize_passes(target))

    @tvm.transform.module_pass(opt_level=0, name="EdgecCPUPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        with target:
            mod = tvm.transform.Sequential(before)(mod)
            kernels = _prim_funcs(mod)
            if database is not None:
                with database:
                    mod = relax.transform.MetaScheduleApplyDatabase()(mod)
            if applied is not None:
                tuned = _prim_funcs(mod)
                applied.kernels = len(kernels)
                applied.tuned = sum(not tvm_ffi.structural_equal(func, tuned[name])
                                    for name, func in kernels.items() if name in tuned)
            return tvm.transform.Sequential(after)(mod)

    return _pipeline


def _prim_funcs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    return {gvar.name_hint: func for gvar, func in mod.functions.items()
            if isinstance(func, tvm.tirx.PrimFunc)}


@relax.expr_functor.mutator
class _FastMath(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        if call.op.name == "relax.erf":
            return self.builder_.call_te(topi.fast_erf, call.args[0])
        if call.op.name == "relax.nn.softmax" and getattr(call.args[0].ty, "dtype", None) == "float32":
            return self.builder_.call_te(topi.nn.fast_softmax, call.args[0], call.attrs.axis)
        return call


def fast_math(mod: tvm.IRModule) -> tvm.IRModule:
    """``erf`` (GELU's) and float32 softmax as TOPI's vectorizable approximations.

    TVM's own lower to a scalar libm call per element (``erff``, ``expf``): in a small transformer
    they were the two hottest functions (perf: 13% and 9% of its time). ``fast_erf`` is a rational
    approximation (max error 4e-7); ``fast_softmax`` uses ``fast_exp`` (Cephes polynomial,
    float32 rounding), whose input clamp to +-88.38 is harmless after softmax subtracts the
    maximum. Plain ``exp`` keeps libm: the clamp would turn its overflow to Inf into a finite value.
    Runs before legalization, which would hide these ops inside TIR kernels.
    """
    return runtime_kernels.rewrite_functions(_FastMath(mod), mod)


class _SimpleKernel(dlight.ScheduleRule):
    """Vectorize a one-block kernel along its innermost spatial loop; parallelize it if asked.

    That loop is contiguous in memory for elementwise kernels, concatenations and layout changes,
    and for pooling in blocked layouts (NCHW16c) it is the channel block, which becomes innermost
    (inside the window's reduction loops) so each window step is one vector operation. With
    ``parallel``, the outer spatial loops run on TVM's thread pool; when oneDNN's OpenMP threads
    own the cores, two pools only fight, so the LLVM codegen turns it off then (measured).
    Kernels with fewer than ``MIN_PARALLEL`` output elements stay serial.
    """

    MIN_PARALLEL = 16384
    VECTOR_LANES = 8

    def __init__(self, parallel: bool) -> None:
        self.parallel = parallel

    def apply(self, func, target, tunable):  # noqa: ARG002 - the ScheduleRule signature
        if not isinstance(func, tvm.tirx.PrimFunc):
            return None
        try:
            return self._schedule(func)
        except ScheduleError:  # a kernel this rule cannot restructure keeps TVM's loops
            return None

    def _schedule(self, func: tvm.tirx.PrimFunc) -> tvm.s_tir.Schedule | None:
        sch = tvm.s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        # A reduction with consumers (conv2d then a requantizing epilogue, a matmul then a
        # residual add) must not take them in: with its reduction loops of extent 1 (a 1x1 conv,
        # normalized away) the block looks spatial, try_inline moves the epilogue into it, and
        # TVM applies it to the T.init value too, so the epilogue ran twice (QLinearConv's zero
        # point was added twice). Each block gets its own loops scheduled instead.
        if any(sch.get(info.block_rv).init is not None and sch.get_consumers(info.block_rv)
               for info in infos):
            scheduled = [self._schedule_block(sch, info) for info in infos]
            return sch if any(scheduled) else None
        infos = try_inline(sch, infos)
        if len(infos) != 1:
            return None
        return sch if self._schedule_block(sch, infos[0]) else None

    def _schedule_block(self, sch: tvm.s_tir.Schedule, info) -> bool:
        """Vectorize (and parallelize) one block's loops; whether it changed anything."""
        block = info.block_rv
        kinds = info.dom_kind()
        if "O" in kinds or not kinds.startswith("S"):
            return False
        loops = sch.get_loops(block)
        spatial = [loop for loop, kind in zip(loops, kinds) if kind == "S"]
        reduce = [loop for loop, kind in zip(loops, kinds) if kind == "R"]
        extents = [get_extent(sch, loop) for loop in spatial]
        # Only the innermost loop needs a known extent; outer ones may be symbolic (batch, seq).
        inner = spatial[-1] if len(spatial) > 1 else None
        if inner is not None and not (isinstance(extents[-1], int)
                                      and extents[-1] % self.VECTOR_LANES == 0):
            inner = None
        if inner is None and not self.parallel:
            return False
        if inner is not None and reduce:
            sch.reorder(*spatial[:-1], *reduce, inner)
        outer_total = 1
        for extent in extents[:-1]:
            outer_total = outer_total * extent if isinstance(extent, int) else self.MIN_PARALLEL
        parallel = self.parallel and len(spatial) > 1 and outer_total * (
            extents[-1] if isinstance(extents[-1], int) else 1) >= self.MIN_PARALLEL
        if parallel:
            sch.parallel(sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0])
        if inner is not None:
            _, lanes = sch.split(inner, factors=[None, self.VECTOR_LANES])
            sch.vectorize(lanes)
        return parallel or inner is not None


CODEGENS = {"llvm": LLVMCodegen(), "cuda": CUDACodegen()}


def codegen_for(target: Target) -> LLVMCodegen | CUDACodegen:
    """The code generator for a target's kind; unknown kinds list the known ones."""
    try:
        return CODEGENS[target.kind]
    except KeyError:
        raise CompileError(
            f"target '{target.name}' has kind '{target.kind}'; known kinds: {', '.join(CODEGENS)}"
        ) from None
