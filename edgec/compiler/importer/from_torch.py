"""PyTorch programs (``torch.export``) to Relax, through TVM's ExportedProgram importer.

The program is decomposed to core ATen as TVM's ``from_exported_program`` does, then imported by
a subclass of TVM's ``ExportedProgramImporter`` that adds what TVM 0.27 lacks:

* ``torch.ops.higher_order.cond``: TVM's own converter is used (a ``relax.If`` calling one private
  function per branch, so only the taken branch runs), with edgec's import of the branch
  subgraphs, which keeps dims that operands share tied (TVM's gives each dim its own var).
* ``torch.ops.higher_order.while_loop(cond_fn, body_fn, carried, extra)``: lowered like ONNX
  ``Loop`` (edgec.compiler.importer.converters.control_flow), as recursive functions::

      cond_fn(carried..., extra...) -> bool          body_fn(carried..., extra...) -> carried'
      loop_L0(i, go, carried..., limit, extra...):
          if i < limit and go:
              carried' = body_fn(carried, extra)
              return loop_L0(i + 1, cond_fn(carried', extra), carried', limit, extra)
          return (i, go, carried...)
      caller: loop_L2((0, cond_fn(carried0, extra), carried0...), INT64_MAX, extra...)

  with the chunk levels L1/L2 of the ONNX lowering bounding the VM's recursion depth. Carried
  values keep their shapes between iterations (torch.export requires it); the VM checks that on
  each call.

Dynamic dims become symbolic vars named after torch's symbols (``s77``), as the model's input
specs name them. The range torch.export recorded for a dim is not given to TVM: TVM would plan
memory for the upper bound, and edgec's runtime does not refuse larger inputs, so the compiled
function stays valid for every size. Every use of TVM's torch importer is in this module.
"""

from __future__ import annotations

import warnings
from typing import Any

import tvm
from tvm import relax, tirx

from edgec.compiler.importer.converters.control_flow import _build_loop, _LoopSpec
from edgec.compiler.importer.converters.subgraph import (BOOL_SCALAR, INT64_SCALAR, Patterns,
                                                         Session, scalar, shaped)
from edgec.core.model import Model
from edgec.core.torch_program import higher_order_name
from edgec.errors import ModelError, describe

_INT64_MAX = 2**63 - 1
# Function attributes the importer sets from torch.export's dim ranges (see the module docstring).
_RANGE_ATTRS = ("tir_var_lower_bound", "tir_var_upper_bound")


def import_torch(model: Model) -> tvm.IRModule:
    """Import a torch program into a Relax module whose ``main`` takes the user inputs in order.

    Weights become constants; ``main`` returns a tuple of the user outputs. Raises ModelError naming
    the first node whose operator the importer cannot convert, or why the import failed.
    """
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    program = model.program
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = program.run_decompositions()
    except Exception as exc:  # torch's decompositions raise many types
        raise ModelError(f"program '{model.name}': torch could not decompose it to core ATen: "
                         f"{describe(exc)}") from None
    importer = _importer_class(ExportedProgramImporter)()
    _check_supported(model.name, program, importer.convert_map)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importer.from_exported_program(program, False, False, False, None)
    except ModelError:
        raise
    except Exception as exc:  # the importer raises many types; each is a program it cannot handle
        raise ModelError(f"program '{model.name}' failed to import: {describe(exc)}") from None
    main = mod["main"]
    for attr in _RANGE_ATTRS:
        if main.attrs is not None and attr in main.attrs:
            main = main.without_attr(attr)
    mod["main"] = main
    # Control flow keeps the importer from emitting dataflow blocks, which fusion needs.
    return relax.transform.ConvertToDataflow()(mod)


def _check_supported(name: str, program: Any, convert_map: dict) -> None:
    """Raise ModelError for the first op call, in any subgraph, the importer has no converter for."""
    import torch

    for module in program.graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            if node.op == "call_function" and node.target.__name__ not in convert_map:
                raise ModelError(
                    f"program '{name}': node '{node.name}' calls {node.target}, which TVM's "
                    f"torch importer cannot convert; rewrite the model without it")
            if node.op not in ("placeholder", "output", "get_attr", "call_function"):
                raise ModelError(f"program '{name}': node '{node.name}' is a {node.op}, which "
                                 f"a torch.export program should not contain; re-export it")


_IMPORTER: type | None = None


def _importer_class(base: type) -> type:
    """TVM's importer with ``while_loop`` (made on first use: the base class imports torch)."""
    global _IMPORTER
    if _IMPORTER is not None:
        return _IMPORTER

    class Importer(base):
        def create_convert_map(self) -> dict:
            return {**super().create_convert_map(), "while_loop": self._while_loop}

        @staticmethod
        def _has_cond_op(nodes: Any) -> bool:
            # Functions for branches and loop bodies are built while main is; main then must not
            # be inside a dataflow block (the importer's rule for cond, extended to while_loop).
            return any(higher_order_name(node) is not None for node in nodes)

        def _while_loop(self, node: Any) -> relax.Expr:
            return lower_while_loop(self, node)

        def _import_branch_subgraph(self, graph_module: Any, operands: list[relax.Expr],
                                    name_hint: str) -> relax.GlobalVar:
            """A subgraph (cond branch, loop cond or body) as a function of ``operands``' types.

            TVM's version gives each dim of each operand its own fresh var, so two operands that
            share a dim (``x`` and a value computed from it) lose the relation and an op combining
            them gets no known shape. Here one fresh var stands for each var of the caller.
            """
            cache = self.__dict__.setdefault("_edgec_subgraphs", {})
            if id(graph_module) in cache:
                return cache[id(graph_module)]
            name = f"{name_hint}_{len(cache)}"
            copies: dict[tirx.Var, tirx.Var] = {}
            placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
            saved, self.env = self.env, {}
            try:
                params = []
                for node, operand in zip(placeholders, operands):
                    param = relax.Var(node.name, _fresh_type(operand.ty, copies))
                    params.append(param)
                    self.env[node] = param
                pure = not self._has_assert_async(graph_module)
                with self.block_builder.function(name=name, params=params, pure=pure, private=True):
                    inner = self._translate_fx_graph(graph_module, list(graph_module.graph.nodes), {})
                    outputs = [self.block_builder.emit(value) for value in inner]
                    self.block_builder.emit_func_output(
                        outputs[0] if len(outputs) == 1 else relax.Tuple(outputs))
            finally:
                self.env = saved
            cache[id(graph_module)] = self.block_builder.get().get_global_var(name)
            return cache[id(graph_module)]

    _IMPORTER = Importer
    return Importer


def lower_while_loop(importer: Any, node: Any) -> relax.Expr:
    """Emit ``torch.ops.higher_order.while_loop`` as the module docstring shows; returns the final
    carried values as a tuple (the node's ``getitem`` users index it)."""
    bb: relax.BlockBuilder = importer.block_builder
    cond_graph, body_graph = importer.env[node.args[0]], importer.env[node.args[1]]
    if len(node.args) != 4 or node.kwargs:
        raise ModelError(f"while_loop node '{node.name}': unexpected arguments; edgec takes "
                         f"while_loop(cond_fn, body_fn, carried_inputs, additional_inputs)")

    def tensor(arg: Any, hint: str) -> relax.Expr:
        value = importer.env.get(arg) if hasattr(arg, "op") else arg
        if not isinstance(value, relax.Expr) or not isinstance(bb.normalize(value).ty,
                                                               relax.TensorType):
            raise ModelError(f"while_loop node '{node.name}': the carried or additional value "
                             f"{arg} is not a tensor; edgec lowers loops over tensors only")
        return shaped(bb, value, hint)

    carried0 = [tensor(arg, "v") for arg in node.args[2]]
    extra = [tensor(arg, "c") for arg in node.args[3]]
    name = f"while_{node.name}"
    cond_gv = importer._import_branch_subgraph(cond_graph, carried0 + extra, f"{name}_cond")
    body_gv = importer._import_branch_subgraph(body_graph, carried0 + extra, f"{name}_body")
    n_carried = len(carried0)

    def step(fbb: relax.BlockBuilder, state: list[relax.Var], invariants: list[relax.Var]):
        i, values = state[0], state[2:]
        out = fbb.emit(relax.Call(body_gv, list(values) + invariants))
        if n_carried == 1 and not isinstance(out.ty, relax.TupleType):
            new_values = [out]
        else:
            new_values = [fbb.emit(relax.TupleGetItem(out, k)) for k in range(n_carried)]
        # The body's result types are in terms of its own vars; cast to the carried types so the
        # recursive call type-checks (the VM checks the shapes at run time).
        new_values = [_cast_like(fbb, value, var.ty) for value, var in zip(new_values, values)]
        go = scalar(fbb, fbb.emit(relax.Call(cond_gv, new_values + invariants)), "bool")
        return [fbb.emit(relax.op.add(i, relax.const(1, "int64"))), go] + new_values

    patterns = Patterns()
    carried = [patterns.of(value.ty, "v") for value in carried0]
    spec = _LoopSpec(name=name, state=[INT64_SCALAR, BOOL_SCALAR] + carried,
                     loose=[False] * (2 + n_carried),
                     invariants=[patterns.of(value.ty, "c") for value in extra],
                     has_cond=True, step=step)
    session = Session(0, {}, {})
    top = _build_loop(bb, session, spec)
    go0 = scalar(bb, bb.emit(relax.Call(cond_gv, carried0 + extra)), "bool")
    state0 = [relax.const(0, "int64"), go0] + carried0
    result = bb.emit(relax.Call(top, state0 + [relax.const(_INT64_MAX, "int64")] + extra))
    return relax.Tuple([bb.emit(relax.TupleGetItem(result, 2 + k)) for k in range(n_carried)])


def _fresh_type(ty: relax.Type, copies: dict[tirx.Var, tirx.Var]) -> relax.Type:
    """``ty`` for a new function's parameter: each symbolic var replaced by its copy (made on first
    use), each other symbolic dim by a fresh var."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return ty
    dims = []
    for k, dim in enumerate(ty.shape.values):
        if isinstance(dim, tirx.Var):
            dim = copies.setdefault(dim, tirx.Var(dim.name, "int64"))
        elif not isinstance(dim, tirx.IntImm):
            dim = tirx.Var(f"d{k}", "int64")
        dims.append(dim)
    return relax.TensorType(dims, str(ty.dtype))


def _cast_like(bb: relax.BlockBuilder, value: relax.Expr, ty: relax.TensorType) -> relax.Expr:
    if value.ty.same_as(ty):
        return value
    return bb.match_cast(value, ty)
