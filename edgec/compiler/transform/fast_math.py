"""``erf`` (GELU's), float32 softmax, sigmoid and tanh as TOPI's vectorizable approximations.

TVM's own lower to a scalar libm call per element (``erff``, ``expf``): in a small transformer they
were the two hottest functions (perf: 13% and 9% of its time). ``fast_erf`` is a rational
approximation (max error 4e-7); ``fast_softmax`` uses ``fast_exp`` (Cephes polynomial, float32
rounding), whose input clamp to +-88.38 is harmless after softmax subtracts the maximum. Plain
``exp`` keeps libm: the clamp would turn its overflow to Inf into a finite value. Runs before
legalization, which would hide these ops inside TIR kernels, and after the library offload,
whose activation patterns (SiLU, GELU) read these ops. Float32 ``sigmoid`` (SiLU's, squeeze-excite
gates) is ``1 / (1 + fast_exp(-x))``: there the clamp only turns results below 1e-38 into
1e-38-sized ones; libm's ``expf`` per element was 14% of efficientnet_b0's time (perf).
``tanh`` is TOPI's ``fast_tanh`` (a rational approximation: max error 2.3e-7 over [-20, 20],
measured).
"""

from __future__ import annotations

import tvm
from tvm import relax, te, topi

from edgec.compiler.ir import rewrite_functions


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
        if call.op.name == "relax.sigmoid" and getattr(call.args[0].ty, "dtype", None) == "float32":
            return self.builder_.call_te(_fast_sigmoid, call.args[0])
        if call.op.name == "relax.tanh" and getattr(call.args[0].ty, "dtype", None) == "float32":
            return self.builder_.call_te(topi.fast_tanh, call.args[0])
        return call


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    exp = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: tvm.tirx.const(1.0, "float32") / (1.0 + exp(*i)),
                      name="fast_sigmoid", tag="elemwise")


@tvm.transform.module_pass(opt_level=0, name="edgec.FastMath")
def FastMath(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802
    """The module with erf and float32 softmax approximated (module docstring)."""
    return rewrite_functions(_FastMath(mod), mod)
