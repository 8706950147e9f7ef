"""The VM's shape functions in one order and under one set of names (transform/shape_func_order):
TVM's VMShapeLower emits them in orders that change from run to run, so two builds of one model
gave libraries with different bytes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tvm
import tvm_ffi
from tvm.script import ir as I, relax as R, tirx as T

from edgec.compiler.pipeline import with_fixes
from edgec.compiler.transform.shape_func_order import OrderShapeFunctions
from edgec.zoo import export


@I.ir_module(check_well_formed=False)
class OneRun:
    @T.prim_func(s_tir=True)
    def shape_func(H: T.Buffer((T.int64(5),), "int64")):
        T.func_attr({"tirx.is_host_func": True})
        H[T.int64(3)] = H[T.int64(2)] * T.int64(2)
        H[T.int64(1)] = H[T.int64(0)] + T.int64(1)
        H[T.int64(2)] = H[T.int64(0)] * T.int64(4)

    @T.prim_func(s_tir=True)
    def shape_func1(H: T.Buffer((T.int64(5),), "int64")):
        T.func_attr({"tirx.is_host_func": True})
        H[T.int64(4)] = H[T.int64(0)] * T.int64(8)
        H[T.int64(1)] = H[T.int64(0)] * T.int64(3)

    @R.function
    def main(shape_heap: R.Tensor((5,), "int64")) -> R.Tensor((5,), "int64"):
        cls = OneRun
        cls.shape_func(shape_heap)
        cls.shape_func1(shape_heap)
        return shape_heap

    @R.function
    def other(shape_heap: R.Tensor((5,), "int64")) -> R.Tensor((5,), "int64"):
        cls = OneRun
        cls.shape_func1(shape_heap)
        return shape_heap


@I.ir_module(check_well_formed=False)
class AnotherRun:
    """OneRun as another run of TVM emits it: other statement orders, other names, and the two
    equal functions `main` and `other` call left unmerged."""

    @T.prim_func(s_tir=True)
    def shape_func(H: T.Buffer((T.int64(5),), "int64")):
        T.func_attr({"tirx.is_host_func": True})
        H[T.int64(1)] = H[T.int64(0)] * T.int64(3)
        H[T.int64(4)] = H[T.int64(0)] * T.int64(8)

    @T.prim_func(s_tir=True)
    def shape_func1(H: T.Buffer((T.int64(5),), "int64")):
        T.func_attr({"tirx.is_host_func": True})
        H[T.int64(2)] = H[T.int64(0)] * T.int64(4)
        H[T.int64(1)] = H[T.int64(0)] + T.int64(1)
        H[T.int64(3)] = H[T.int64(2)] * T.int64(2)

    @T.prim_func(s_tir=True)
    def shape_func2(H: T.Buffer((T.int64(5),), "int64")):
        T.func_attr({"tirx.is_host_func": True})
        H[T.int64(4)] = H[T.int64(0)] * T.int64(8)
        H[T.int64(1)] = H[T.int64(0)] * T.int64(3)

    @R.function
    def main(shape_heap: R.Tensor((5,), "int64")) -> R.Tensor((5,), "int64"):
        cls = AnotherRun
        cls.shape_func1(shape_heap)
        cls.shape_func(shape_heap)
        return shape_heap

    @R.function
    def other(shape_heap: R.Tensor((5,), "int64")) -> R.Tensor((5,), "int64"):
        cls = AnotherRun
        cls.shape_func2(shape_heap)
        return shape_heap


def test_two_runs_orders_become_one():
    one, another = OrderShapeFunctions(OneRun), OrderShapeFunctions(AnotherRun)
    assert tvm_ffi.structural_equal(one, another)
    assert sorted(g.name_hint for g in one.functions) == ["main", "other", "shape_func",
                                                          "shape_func1"]


def test_stores_sorted_by_slot_after_the_slots_they_read():
    func = OrderShapeFunctions(OneRun)["shape_func"]
    written = [int(store.indices[0].value) for store in func.body.seq]
    # 1 and 2 read only slot 0; 3 reads 2, so it waits for it whatever its number.
    assert written == [1, 2, 3]


def test_placed_right_after_the_shape_lowering():
    target = tvm.target.Target({"kind": "llvm"})
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    names = [p.info.name for p in with_fixes(cpu.finalize_passes(target))]
    assert names[names.index("VMShapeLower") + 1] == "edgec.OrderShapeFunctions"


_BUILD = """
import hashlib, sys
import edgec
from edgec.core.model import load_model
from edgec.core.samples import load_samples
from edgec.core.targets import load_target
model = load_model(sys.argv[1] + "/model.onnx")
result = edgec.compile(model, load_samples(sys.argv[1] + "/samples", model), [load_target("x86_64")])
print(hashlib.sha256(result.artifact.to_bytes()).hexdigest())
"""


@pytest.mark.slow
def test_two_builds_of_a_model_give_identical_bytes(tmp_path):
    """In two processes (addresses, and so TVM's map orders, differ between them), a model with
    several regions and shape functions."""
    export("moe", tmp_path, seed=0)
    digests = {subprocess.run([sys.executable, "-c", _BUILD, str(tmp_path)], capture_output=True,
                              text=True, check=True).stdout.split()[-1] for _ in range(2)}
    assert len(digests) == 1


@I.ir_module(check_well_formed=False)
class KernelNamedShapeFunc:
    @T.prim_func(s_tir=True)
    def shape_func(A: T.Buffer((T.int64(2),), "int64")):
        A[T.int64(0)] = A[T.int64(1)]

    @T.prim_func(s_tir=True)
    def shape_func1(H: T.Buffer((T.int64(5),), "int64")):
        T.func_attr({"tirx.is_host_func": True})
        H[T.int64(1)] = H[T.int64(0)] * T.int64(3)

    @R.function
    def main(shape_heap: R.Tensor((5,), "int64")) -> R.Tensor((5,), "int64"):
        cls = KernelNamedShapeFunc
        cls.shape_func1(shape_heap)
        return shape_heap


def test_a_kernel_already_named_shape_func_keeps_its_name():
    """TOPI names some kernels shape_func too (NonMaxSuppression's): the shape functions take
    the free names."""
    renamed = OrderShapeFunctions(KernelNamedShapeFunc)
    assert tvm_ffi.structural_equal(renamed["shape_func"], KernelNamedShapeFunc["shape_func"])
    assert sorted(g.name_hint for g in renamed.functions) == ["main", "shape_func", "shape_func1"]
    assert "tirx.is_host_func" in renamed["shape_func1"].attrs
