"""PyTorch programs (``torch.export``) as edgec models, and running them eagerly as their reference.

A program enters as a ``torch.export.ExportedProgram`` or a ``.pt2`` file written by
``torch.export.save``. It becomes a :class:`~edgec.core.model.Model` whose ``program`` is the exported
program (``proto`` is None): inputs are the program's user inputs by placeholder name, outputs are
``output_0``, ``output_1``... in the order the program returns them, and each dynamic dim is a
symbol named as torch names it (``s77``), which is also the name the compiled function's symbolic
var gets. The profile's reference is the program run eagerly by torch.

Imported only for torch programs: torch is the optional extra ``edgec[torch]``.
"""

from __future__ import annotations

import hashlib
import io
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from edgec.core.model import Model
from edgec.errors import ModelError
from edgec.runtime.signature import Dim, TensorSpec

# The control-flow operators of torch.export (``torch.ops.higher_order``), by target name.
BRANCH_OPS = ("cond",)
LOOP_OPS = ("while_loop",)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ModelError("PyTorch programs need torch; install the extra: "
                         "pip install 'edgec[torch]'") from None
    return torch


def higher_order_name(node: Any) -> str | None:
    """``cond`` or ``while_loop`` for a node calling that higher-order op, else None."""
    if node.op != "call_function":
        return None
    name = getattr(node.target, "__name__", "")
    module = getattr(node.target, "__module__", "")
    return name if name in BRANCH_OPS + LOOP_OPS and module == "torch.ops.higher_order" else None


def _numpy_dtype(dtype: Any, where: str) -> str:
    torch = _torch()
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype.name
    except (TypeError, RuntimeError):
        raise ModelError(f"{where} has dtype {dtype}, which numpy (and so edgec's runtime) has no "
                         f"type for; export with a numpy-compatible dtype") from None


def _dims(value: Any, where: str) -> tuple[Dim, ...]:
    torch = _torch()
    import sympy

    dims: list[Dim] = []
    for axis, size in enumerate(value.shape):
        if isinstance(size, torch.SymInt):
            expr = size.node.expr
            if not isinstance(expr, sympy.Symbol):
                raise ModelError(f"{where} axis {axis} has the derived dim {expr}; edgec takes plain "
                                 f"dims (one torch.export.Dim per axis)")
            dims.append(str(expr))
        else:
            dims.append(int(size))
    return tuple(dims)


def _spec(node: Any, name: str, where: str) -> TensorSpec:
    torch = _torch()
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
    if not isinstance(value, torch.Tensor):
        raise ModelError(f"{where} '{name}' is a {type(value).__name__}, not a tensor; edgec "
                         f"supports tensor inputs and outputs")
    return TensorSpec(name, _numpy_dtype(value.dtype, f"{where} '{name}'"),
                      _dims(value, f"{where} '{name}'"))


def serialized(program: Any) -> bytes:
    """The bytes ``torch.export.save`` writes for ``program`` (deterministic for one program)."""
    buffer = io.BytesIO()
    _torch().export.save(program, buffer)
    return buffer.getvalue()


def from_program(program: Any, name: str = "model", path: str = "", sha256: str = "") -> Model:
    """Wrap a ``torch.export.ExportedProgram`` as a Model; the program is not changed.

    ``sha256`` identifies the program (default: that of its ``torch.export.save`` bytes). Raises
    ModelError for inputs or outputs edgec cannot represent (non-tensors, derived dims).
    """
    torch = _torch()
    if not isinstance(program, torch.export.ExportedProgram):
        raise ModelError(f"'{name}' is a {type(program).__name__}, not a "
                         f"torch.export.ExportedProgram; pass the result of torch.export.export")
    signature = program.graph_signature
    kinds = torch.export.graph_signature
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    inputs = tuple(_spec(placeholders[spec.arg.name], spec.arg.name, "input")
                   for spec in signature.input_specs if spec.kind is kinds.InputKind.USER_INPUT)
    if not inputs:
        raise ModelError(f"program '{name}' has no tensor inputs; edgec compiles models that "
                         f"take inputs")
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    returned = list(output_node.args[0])
    user_outputs = [node for node, spec in zip(returned, signature.output_specs)
                    if spec.kind in (kinds.OutputKind.USER_OUTPUT, kinds.OutputKind.LOSS_OUTPUT)]
    outputs = tuple(_spec(node, f"output_{k}", "output") for k, node in enumerate(user_outputs))
    control_flow = tuple((n.name, op) for n in program.graph.nodes
                         if (op := higher_order_name(n)) is not None)
    digest = sha256 or hashlib.sha256(serialized(program)).hexdigest()
    return Model(None, name, digest, inputs, outputs, 0, control_flow, path, program)


@contextmanager
def activations_exposed(model: Model) -> Iterator[tuple[Model, list[tuple[str, str, str]]]]:
    """Within the block, ``model``'s program also returns every tensor a top-level node computes.

    Yields a Model of that program (named ``<name>-debug``) and, in graph order, each node's
    name, its operator and the output (``output_<k>``) that carries it, the program's own
    outputs included. The program is
    edited in place and restored on leaving the block, so the yielded Model is valid inside it
    only: a deep copy of an ExportedProgram renames placeholders that shadow Python builtins
    (``input`` becomes ``input_1``) while its signature keeps the old names.
    """
    torch = _torch()
    from torch.export.graph_signature import OutputKind, OutputSpec, TensorArgument

    program = model.program
    graph_module = program.graph_module
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    returned = list(output.args[0])
    kept = {n for n in returned if isinstance(n, torch.fx.Node)}
    exposed = [n for n in graph_module.graph.nodes if n.op == "call_function" and n not in kept
               and isinstance(n.meta.get("val"), torch.Tensor)]
    specs = program.graph_signature.output_specs
    call_signature = program.module_call_graph[0].signature
    saved = (output.args, list(specs), call_signature.out_spec)
    first = len(model.outputs)
    try:
        output.args = (tuple(returned + exposed),)
        specs.extend(OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(n.name), None)
                     for n in exposed)
        call_signature.out_spec = torch.utils._pytree.tree_flatten(  # noqa: SLF001 - torch's own
            tuple(range(first + len(exposed))))[1]
        graph_module.recompile()
        user = [n for n, spec in zip(returned, saved[1])
                if spec.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT)]
        carried = {n: k for k, n in enumerate(user)}
        carried.update({n: first + k for k, n in enumerate(exposed)})
        nodes = [(n.name, getattr(n.target, "__name__", str(n.target)), f"output_{carried[n]}")
                 for n in graph_module.graph.nodes if n in carried and n.op == "call_function"]
        yield from_program(program, f"{model.name}-debug"), nodes
    finally:
        output.args, call_signature.out_spec = saved[0], saved[2]
        specs[:] = saved[1]
        graph_module.recompile()


def load_program(path: str | Path) -> Model:
    """Load a ``.pt2`` file written by ``torch.export.save``; its sha256 is the file's."""
    path = Path(path)
    data = path.read_bytes()
    torch = _torch()
    try:
        program = torch.export.load(io.BytesIO(data))
    except Exception as exc:  # torch raises several unrelated types on a bad archive
        raise ModelError(f"'{path}' is not a torch.export program ({type(exc).__name__}); write it "
                         f"with torch.export.save") from None
    return from_program(program, path.stem, str(path.resolve()), hashlib.sha256(data).hexdigest())


# ---------------------------------------------------------------------------------------------
# The reference: the program run eagerly


def _as_torch(arrays: dict[str, np.ndarray], names: list[str]) -> list[Any]:
    torch = _torch()
    return [torch.from_numpy(np.array(arrays[name], copy=True)) for name in names]


def _to_numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy()


class TorchReference:
    """A torch.export program run eagerly (``program.module()``), returning outputs by name."""

    name = "torch"

    def __init__(self, model: Model) -> None:
        self.model = model
        self.module = model.program.module()
        self.input_names = [spec.name for spec in model.inputs]
        self.output_names = [spec.name for spec in model.outputs]

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = _torch()
        with torch.no_grad():
            result = self.module(*_as_torch(arrays, self.input_names))
        leaves = torch.utils._pytree.tree_leaves(result)
        return {name: _to_numpy(value) for name, value in zip(self.output_names, leaves)}

    def timed_run(self, arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
        start = time.perf_counter()
        outputs = self.run(arrays)
        return outputs, (time.perf_counter() - start) * 1e3

    def instrumented_run(self, arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict]:
        """Every tensor a top-level node computes, by node name, and per control-flow node what
        it did: the branch taken (``True`` for the true branch) or the trip count."""
        values, events, _ = self._interpret(arrays)
        return values, events

    def node_times(self, samples: list[Any]) -> dict[str, dict[str, Any]]:
        """Mean wall time of each top-level node per run, slowest first (Python overhead included:
        nodes run one by one through ``torch.fx.Interpreter``)."""
        total_us: dict[str, float] = defaultdict(float)
        ops: dict[str, str] = {}
        for sample in samples:
            _, _, times = self._interpret(sample.arrays)
            for name, (op, us) in times.items():
                total_us[name] += us
                ops[name] = op
        runs = max(len(samples), 1)
        return {name: {"op": ops[name], "mean_us": round(total_us[name] / runs, 3)}
                for name in sorted(total_us, key=lambda n: -total_us[n])}

    def _interpret(self, arrays: dict[str, np.ndarray]) -> tuple[dict, dict, dict]:
        torch = _torch()
        program = self.model.program
        kinds = torch.export.graph_signature.InputKind
        user = iter(_as_torch(arrays, self.input_names))
        args = []
        for spec in program.graph_signature.input_specs:
            if spec.kind is kinds.USER_INPUT:
                args.append(next(user))
            elif spec.target in program.state_dict:
                args.append(program.state_dict[spec.target])
            else:
                args.append(program.constants[spec.target])
        recorder = _recorder_class()(program.graph_module)
        with torch.no_grad():
            recorder.run(*args)
        return recorder.values, recorder.events, recorder.times


_RECORDER: type | None = None


def _recorder_class() -> type:
    """A ``torch.fx.Interpreter`` that keeps each node's tensor output, its time, and what each
    control-flow node did (made on first use, so that importing this module does not import torch)."""
    global _RECORDER
    if _RECORDER is not None:
        return _RECORDER
    torch = _torch()

    class Recorder(torch.fx.Interpreter):
        def __init__(self, graph_module: Any) -> None:
            super().__init__(graph_module)
            self.values: dict[str, np.ndarray] = {}
            self.events: dict[str, Any] = {}
            self.times: dict[str, tuple[str, float]] = {}
            self._node: Any = None

        def run_node(self, node: Any) -> Any:
            self._node = node
            start = time.perf_counter()
            result = super().run_node(node)
            if node.op == "call_function":
                op = higher_order_name(node) or getattr(node.target, "__name__", str(node.target))
                self.times[node.name] = (op, (time.perf_counter() - start) * 1e6)
                if isinstance(result, torch.Tensor):
                    self.values[node.name] = _to_numpy(result)
            return result

        def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
            op = higher_order_name(self._node)
            if op == "cond":
                self.events[self._node.name] = bool(args[0])
            elif op == "while_loop":
                # Run the loop here to count its trips; the semantics are the op's own.
                cond_fn, body_fn, carried, extra = args
                carried, trips = tuple(carried), 0
                while bool(_single(cond_fn(*carried, *extra))):
                    out = body_fn(*carried, *extra)
                    carried = tuple(out) if isinstance(out, (tuple, list)) else (out,)
                    trips += 1
                self.events[self._node.name] = trips
                return carried
            return super().call_function(target, args, kwargs)

    _RECORDER = Recorder
    return Recorder


def _single(value: Any) -> Any:
    return value[0] if isinstance(value, (tuple, list)) else value
