"""BranchStorage: after TVM's memory planning, every memory.alloc_tensor allocates from storage
bound in its own scope (TVM's planning shares one token pool, and one storage variable per
token, across the branches of an If), and the lowered program runs every branch."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R, tirx as T  # noqa: E741

from edgec.compiler.pipeline import with_fixes
from edgec.compiler.transform.branch_storage import BranchStorage


@I.ir_module
class Nested:
    """Two planned intermediates in every branch of an If nested in an If, and two after it."""

    @T.prim_func
    def plus_one(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i] + T.float32(1)

    @T.prim_func
    def twice(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            b[i] = a[i] * T.float32(2)

    @R.function
    def main(x: R.Tensor((4,), "float32"), c1: R.Tensor((), "bool"),
             c2: R.Tensor((), "bool")) -> R.Tensor((4,), "float32"):
        R.func_attr({"relax.force_pure": True})
        cls = Nested
        if c1:
            if c2:
                a0 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
                _0 = cls.plus_one(x, a0)
                a1 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
                _1 = cls.twice(a0, a1)
                a2 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
                _2 = cls.plus_one(a1, a2)
                y1 = a2
            else:
                b0 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
                _3 = cls.twice(x, b0)
                b1 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
                _4 = cls.twice(b0, b1)
                b2 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
                _5 = cls.plus_one(b1, b2)
                y1 = b2
            y = y1
        else:
            d0 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
            _6 = cls.plus_one(x, d0)
            d1 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
            _7 = cls.plus_one(d0, d1)
            y = d1
        e0 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
        _8 = cls.twice(y, e0)
        e1 = R.builtin.alloc_tensor(R.shape([4]), R.dtype("float32"), R.prim_value(0))
        _9 = cls.plus_one(e0, e1)
        return e1


def expected(x: np.ndarray, c1: bool, c2: bool) -> np.ndarray:
    if c1:
        y = (x * 2 * 2 + 1) if not c2 else ((x + 1) * 2 + 1)
    else:
        y = x + 2
    return y * 2 + 1


def storage_in_scope(func: relax.Function) -> list[str]:
    """The names of storage variables a memory.alloc_tensor uses out of their scope."""
    alloc_tensor = tvm.ir.Op.get("relax.memory.alloc_tensor")
    bad: list[str] = []

    def seq(expr: relax.SeqExpr, scope: set) -> None:
        scope = set(scope)
        for block in expr.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.If):
                    seq(value.true_branch, scope)
                    seq(value.false_branch, scope)
                elif (isinstance(value, relax.Call) and value.op.same_as(alloc_tensor)
                      and value.args[0] not in scope):
                    bad.append(value.args[0].name_hint)
                scope.add(binding.var)

    seq(func.body, set(func.params))
    return bad


def test_every_alloc_tensor_uses_storage_of_its_scope():
    planned = relax.transform.StaticPlanBlockMemory()(Nested)
    fixed = BranchStorage(planned)
    relax.analysis.well_formed(fixed)
    assert storage_in_scope(fixed["main"]) == []
    # Reuse inside a branch is kept: each branch's three tensors take at most two storages.
    alloc_storage = tvm.ir.Op.get("relax.memory.alloc_storage")
    counts = []

    def count(expr: relax.SeqExpr) -> int:
        n = 0
        for block in expr.blocks:
            for binding in block.bindings:
                value = binding.value
                if isinstance(value, relax.If):
                    counts.append(count(value.true_branch))
                    counts.append(count(value.false_branch))
                elif isinstance(value, relax.Call) and value.op.same_as(alloc_storage):
                    n += 1
        return n

    count(fixed["main"].body)
    assert all(n <= 2 for n in counts), counts


def test_a_planning_without_cross_branch_reuse_is_unchanged():
    planned = relax.transform.StaticPlanBlockMemory()(Nested)
    fixed = BranchStorage(planned)
    assert BranchStorage(fixed)["main"].same_as(fixed["main"])


def test_with_fixes_places_the_pass():
    passes = with_fixes([relax.transform.ToNonDataflow(), relax.transform.StaticPlanBlockMemory(),
                         relax.transform.KillAfterLastUse()])
    assert [p.info.name for p in passes] == ["ToNonDataflow", "StaticPlanBlockMemory",
                                             "edgec.BranchStorage", "KillAfterLastUse"]


@pytest.mark.parametrize("order", [((True, True), (True, False), (False, True), (False, False)),
                                   ((False, False), (True, False), (True, True), (False, True))])
def test_every_branch_runs_in_turn(order):
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    target = tvm.target.Target("llvm")
    with target:
        lowered = tvm.transform.Sequential(
            with_fixes(cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target)))(Nested)
    vm = relax.VirtualMachine(tvm.compile(lowered, target), tvm.cpu())
    x = np.arange(4, dtype=np.float32)
    for c1, c2 in order:
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array(c1)),
                         tvm.runtime.tensor(np.array(c2))).numpy()
        np.testing.assert_allclose(got, expected(x, c1, c2), err_msg=str((c1, c2)))
