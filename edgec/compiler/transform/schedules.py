"""TIR-level passes of the CPU lowering: tuned schedules from a database, and simple vectorizing
schedules for the kernels no record covers.

TVM's default CPU build schedules nothing: every kernel is one thread of naive loops. After
legalization and fusion, kernels the target's MetaSchedule database (``edgec tune``) has records
for take the best one (``ApplyTuningDatabase``); of the rest, kernels with one block (elementwise,
layout changes, concatenations, pooling) are vectorized, and spread over TVM's thread pool unless a
library's threads own the cores (``CPUSchedules``).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import dlight
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import get_extent, try_inline
from tvm.s_tir.schedule import ScheduleError

from edgec.compiler import native
from edgec.compiler.ir import extern_symbols, prim_funcs


@dataclass
class KernelCount:
    """How many kernels TVM generated, and how many of them took a tuned schedule."""

    kernels: int = 0
    tuned: int = 0


def ApplyTuningDatabase(database, count: KernelCount) -> tvm.transform.Pass:  # noqa: N802
    """Kernels ``database`` (a MetaSchedule database, or None) has records for take the best one;
    ``count`` receives how many kernels there are and how many changed."""

    @tvm.transform.module_pass(opt_level=0, name="edgec.ApplyTuningDatabase")
    def apply(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        kernels = prim_funcs(mod)
        count.kernels = len(kernels)
        if database is None:
            return mod
        with database:
            tuned_mod = relax.transform.MetaScheduleApplyDatabase()(mod)
        tuned = prim_funcs(tuned_mod)
        count.tuned = sum(not tvm_ffi.structural_equal(func, tuned[name])
                          for name, func in kernels.items() if name in tuned)
        return tuned_mod

    return apply


def kernels_parallel(mod: tvm.IRModule) -> bool:
    """Whether TVM's kernels may use TVM's thread pool: not when the program calls a library.

    oneDNN's OpenMP threads own the cores between its calls: TVM kernels that also ran on TVM's
    thread pool made whole models slower (measured), so they stay serial. XNNPACK's pthreadpool
    is kept alike (not measured on an Arm board).
    """
    return not any(native.is_library_function(name) for name in extern_symbols(mod))


@tvm.transform.module_pass(opt_level=0, name="edgec.CPUSchedules")
def CPUSchedules(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802
    """``SimpleKernel`` on every kernel without a schedule, parallel as ``kernels_parallel`` says."""
    return dlight.ApplyDefaultSchedule(SimpleKernel(kernels_parallel(mod)))(mod)


class SimpleKernel(dlight.ScheduleRule):
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
