"""Storage that TVM's memory planning shares across the branches of an ``If``, made each
branch's own.

TVM's ``StaticPlanBlockMemory`` (0.27) plans each binding block, but keeps one pool of storage
tokens, and one storage variable per token, for the whole function: a token released in one
branch of an ``If`` is handed to a tensor of the other branch (or to one after the ``If``), and
that tensor is then allocated from the storage variable bound in the first branch, out of its
scope. The VM reads that variable's register, which is null when the branch that binds it has
not run, and crashes in ``StorageObj::AllocTensor`` (a nested ``If`` reading a top-level value
in both inner branches; any two sibling branches with one planned intermediate each).

``BranchStorage`` runs right after the planning: where a ``memory.alloc_tensor`` names a storage
variable not bound in its scope or one around it, the scope gets its own ``memory.alloc_storage``
(the same call, planned size included) before it, and the scope's later tensors on that token use
it. Only one branch of an ``If`` runs, so tensors the planning put on one token in different
branches never needed the same memory; reuse inside a branch is kept.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

_ALLOC_STORAGE = tvm.ir.Op.get("relax.memory.alloc_storage")
_ALLOC_TENSOR = tvm.ir.Op.get("relax.memory.alloc_tensor")


@mutator
class _BranchStorage(PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        # One dict per SeqExpr being visited (a function's body, an If's branches): the storage
        # variables usable there, planned variable -> the variable bound in that scope.
        self.scopes: list[dict[relax.Var, relax.Var]] = []
        self.storage_calls: dict[relax.Var, relax.Call] = {}
        self.copies = 0

    def visible(self, storage: relax.Var) -> relax.Var | None:
        for scope in reversed(self.scopes):
            if storage in scope:
                return scope[storage]
        return None

    def visit_seq_expr_(self, op: relax.SeqExpr) -> relax.Expr:
        self.scopes.append({})
        try:
            return super().visit_seq_expr_(op)
        finally:
            self.scopes.pop()

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        if isinstance(value, relax.Call) and value.op.same_as(_ALLOC_STORAGE) and self.scopes:
            self.storage_calls[binding.var] = value
            self.scopes[-1][binding.var] = binding.var
        elif (isinstance(value, relax.Call) and value.op.same_as(_ALLOC_TENSOR) and self.scopes
              and isinstance(value.args[0], relax.Var) and value.args[0] in self.storage_calls):
            storage = value.args[0]
            local = self.visible(storage)
            if local is None:
                local = self.builder_.emit(self.storage_calls[storage], "storage")
                self.scopes[-1][storage] = local
                self.copies += 1
            if not local.same_as(storage):
                binding = relax.VarBinding(
                    binding.var, relax.Call(value.op, [local, *value.args[1:]], value.attrs,
                                            value.ty_args, value.span), binding.span)
        super().visit_var_binding_(binding)


@tvm.transform.module_pass(opt_level=0, name="edgec.BranchStorage")
def BranchStorage(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802
    """Each scope allocates the planned storage it uses (see the module's docstring); to run
    right after ``relax.transform.StaticPlanBlockMemory``."""
    rewriter = _BranchStorage(mod)
    result = tvm.IRModule(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.copies = 0
            new = rewriter.visit_expr(func)
            if rewriter.copies:
                result[gvar] = new
    return result

