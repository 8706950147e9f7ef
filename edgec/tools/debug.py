"""Find where compiled numbers go wrong: run the compiled model and the reference side by side on
every activation and name the first node (and its region) whose output diverges.

The model is rebuilt with every top-level activation exposed as an output, compiled through the
normal pipeline for the target, and compared with the reference (onnxruntime; torch for a
PyTorch program) on the same samples, node by node in graph order.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from edgec import runtime
from edgec.core.model import Model, expose_activations, from_proto
from edgec.core.reference import reference_session
from edgec.core.samples import Sample
from edgec.core.targets import Target
from edgec.driver import CompileSettings, compile as compile_model
from edgec.stages.bench import compare_outputs
from edgec.stages.plan import PlanSettings


@dataclass(frozen=True)
class Divergence:
    """The first node whose output differs beyond tolerance on some sample."""

    sample: str
    node: str
    op: str
    output: str
    region: str
    max_abs: float
    max_rel: float

    def describe(self) -> str:
        return (f"first divergence: node '{self.node}' ({self.op}) output '{self.output}' in region "
                f"'{self.region}' on sample '{self.sample}': max abs {self.max_abs:.3g}, "
                f"relative {self.max_rel:.3g}")


@dataclass(frozen=True)
class DebugResult:
    """Per-node worst relative difference over the samples, and the first divergence if any."""

    tolerance: float
    nodes: list[dict[str, Any]] = field(default_factory=list)
    first: Divergence | None = None

    def to_json(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "nodes": self.nodes,
                "first_divergence": None if self.first is None else vars(self.first)}


def debug(model: Model, samples: list[Sample], target: Target, tolerance: float = 1e-4,
          settings: PlanSettings = PlanSettings()) -> DebugResult:
    """Compile ``model`` with its activations exposed and compare them all with the reference:
    onnxruntime for an ONNX model, torch running the program eagerly for a PyTorch program.

    ``tolerance`` bounds the max abs difference relative to each activation's scale. Nodes are
    visited in graph order per sample; the first one over the tolerance is the divergence.
    """
    if model.kind == "torch":
        from edgec.core.torch_program import TorchReference, activations_exposed

        with activations_exposed(model) as (exposed, nodes):
            compiled, region_of = _compiled(exposed, samples, target, settings)
            reference = TorchReference(exposed)
            runs = ((s, compiled.run(s.arrays), reference.run(s.arrays)) for s in samples)
            return _compare(runs, nodes, region_of, tolerance)
    exposed = from_proto(expose_activations(model.proto), f"{model.name}-debug")
    compiled, region_of = _compiled(exposed, samples, target, settings)
    reference = reference_session(exposed.proto, optimize=False)
    nodes = [(node.name, node.op_type, output) for node in exposed.proto.graph.node
             for output in node.output]
    runs = ((s, compiled.run(s.arrays), reference.run(s.arrays)) for s in samples)
    return _compare(runs, nodes, region_of, tolerance)


def _compiled(exposed: Model, samples: list[Sample], target: Target,
              settings: PlanSettings) -> tuple[Any, dict[str, str]]:
    """``exposed`` compiled for ``target`` and loaded, and the region of each node."""
    compiled_model = compile_model(exposed, samples, [target], CompileSettings(plan=settings))
    region_of = {node: region.name for region in compiled_model.plan.regions
                 for node in region.nodes}
    with tempfile.TemporaryDirectory(prefix="edgec-debug-") as tmp:
        path = compiled_model.artifact.save(Path(tmp) / "debug.edgec")
        return runtime.load(path, target=target.name), region_of


def _compare(runs: Iterable[tuple[Sample, dict, dict]], nodes: list[tuple[str, str, str]],
             region_of: dict[str, str], tolerance: float) -> DebugResult:
    """Each (node, op, output) in graph order against the reference on each (sample, compiled
    outputs, reference outputs), one sample's activations in memory at a time."""
    worst: dict[str, float] = {}
    first: Divergence | None = None
    for sample, got, expected in runs:
        for node, op, output in nodes:
            if output not in expected or output not in got:
                continue
            diff = compare_outputs({output: got[output]}, {output: expected[output]})
            worst[node] = max(worst.get(node, 0.0), diff["max_rel"])
            if first is None and diff["max_rel"] > tolerance:
                first = Divergence(sample.name, node, op, output, region_of.get(node, "?"),
                                   diff["max_abs"], diff["max_rel"])
    ops = {node: op for node, op, _ in nodes}
    rows = [{"node": name, "op": ops[name], "region": region_of.get(name, "?"), "max_rel": value}
            for name, value in worst.items()]
    return DebugResult(tolerance, rows, first)
