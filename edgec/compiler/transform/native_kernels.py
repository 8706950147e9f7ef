"""Calls to TVM functions that exist only in TVM's Python package, redirected to edgec's C++ ones.

TVM 0.27 lowers ``relax.nonzero`` and ``relax.unique`` (ONNX NonZero, Unique) to
``call_pure_packed("relax.run.nonzero" | "relax.run.unique", ...)``, functions that TVM registers
from Python. An artifact calling them would run only where the compiler is installed: never in
edgec's runtime or a C/C++ host. ``redirect`` legalizes the module and renames those calls to
``edgec_nonzero`` / ``edgec_unique`` (``edgec_unique_axis`` with an axis;
``edgec/native/runtime_kernels.cc``, linked into the model library), and refuses any other Python-only function with a one-line error. Calls edgec's
converters make to that library directly (``NATIVE_KERNELS``: the recurrent layers' loop, the
stacked outputs of Loop and Scan) are counted too, so the library gets linked with the kernels
the program calls.
"""

from __future__ import annotations

import tvm
from tvm import relax

from edgec.compiler import native
from edgec.compiler.ir import rewrite_functions
from edgec.errors import CompileError

REPLACEMENTS = {"relax.run.nonzero": "edgec_nonzero", "relax.run.unique": "edgec_unique"}
UNIQUE_AXIS = "edgec_unique_axis"  # relax.run.unique's replacement when it has an axis
# Kernels edgec's converters call directly: the recurrent layers' loop (importer/recurrent.py),
# the stacked outputs of Loop and Scan (importer/converters/control_flow.py).
NATIVE_KERNELS = native.RUNTIME_KERNELS - set(REPLACEMENTS.values()) - {UNIQUE_AXIS}
_PYTHON_ONLY_PREFIX = "relax.run."
_UNIQUE_ARGS = 5  # x, sorted, return_index, return_inverse, return_counts; an axis makes six


@relax.expr_functor.mutator
class _Redirect(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.used: set[str] = set()
        self.refused: set[str] = set()

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (isinstance(call.args[0] if call.args else None, relax.ExternFunc)):
            return call
        name = call.args[0].global_symbol
        if name in NATIVE_KERNELS:
            self.used.add(name)
            return call
        if not name.startswith(_PYTHON_ONLY_PREFIX):
            return call
        if name not in REPLACEMENTS:
            self.refused.add(name)
            return call
        kernel = REPLACEMENTS[name]
        if name == "relax.run.unique" and len(call.args) > 1 + _UNIQUE_ARGS:
            kernel = UNIQUE_AXIS
        self.used.add(kernel)
        args = [relax.ExternFunc(kernel), *call.args[1:]]
        return relax.Call(call.op, args, call.attrs, call.ty_args, call.span)


def redirect(mod: tvm.IRModule) -> tuple[tvm.IRModule, set[str]]:
    """Legalize ``mod`` and point Python-only calls at edgec's native kernels.

    Returns the new module and the names of the native kernels it now calls (empty when none).
    Raises CompileError naming what has no native version.
    """
    mod = relax.transform.LegalizeOps()(mod)
    mutator = _Redirect(mod)
    mod = rewrite_functions(mutator, mod)
    if mutator.refused:
        raise CompileError(
            f"the model needs {', '.join(sorted(mutator.refused))}, which TVM provides only from "
            f"Python; edgec has no native version yet, so the artifact could not run on a device"
        )
    return mod, mutator.used


def NativeKernels(allowed: bool, target_name: str) -> tvm.transform.Pass:  # noqa: N802
    """``redirect`` as a pass. ``allowed``: the backend may call edgec's CPU kernels; where it
    may not (GPU targets: they take host pointers), a program that needs them is refused in one
    line naming them."""

    @tvm.transform.module_pass(opt_level=0, name="edgec.NativeKernels")
    def native_kernels(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mod, kernels = redirect(mod)
        if kernels and not allowed:
            raise CompileError(
                f"the model needs edgec's CPU kernels {', '.join(sorted(kernels))} (NonZero/"
                f"Unique), which target '{target_name}' cannot call yet; build it for a CPU target")
        return mod

    return native_kernels
