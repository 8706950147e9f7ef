"""Variables of its own in every function of a module, as TVM's operator fusion needs."""

from __future__ import annotations

import tvm
from tvm import relax


@tvm.transform.module_pass(opt_level=0, name="edgec.UniqueVars")
def UniqueVars(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802
    """Fusion (which TVM's default CPU build skips) maps the variables of all functions in one
    graph; shape specializations are copies of one function that share variables, which it
    rejects ("appears at multiple definition sites")."""
    result = tvm.IRModule(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            result[gvar] = relax.utils.copy_with_new_vars(func)
    return result
