"""Find where compiled numbers go wrong: run the compiled model and the reference side by side on
every activation and name the first node (and its region) whose output diverges.

The model is rebuilt with every top-level activation exposed as an output, compiled through the
normal pipeline for the target, and compared with onnxruntime on the same samples, node by node
in graph order.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgec import runtime
from edgec.core.model import Model, expose_activations, from_proto
from edgec.core.reference import reference_session
from edgec.core.samples import Sample
from edgec.core.targets import Target
from edgec.driver import CompileSettings, compile as compile_model
from edgec.errors import EdgecError
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
    """Compile ``model`` with its activations exposed and compare them all with onnxruntime.

    ``tolerance`` bounds the max abs difference relative to each activation's scale. Nodes are
    visited in graph order per sample; the first one over the tolerance is the divergence.
    """
    if model.proto is None:
        raise EdgecError(f"'{model.name}' is a PyTorch program; edgec debug compares node by node "
                         f"with onnxruntime and needs an ONNX model")
    exposed = from_proto(expose_activations(model.proto), f"{model.name}-debug")
    compiled_model = compile_model(exposed, samples, [target], CompileSettings(plan=settings))
    region_of = {node: region.name for region in compiled_model.plan.regions
                 for node in region.nodes}
    with tempfile.TemporaryDirectory(prefix="edgec-debug-") as tmp:
        path = compiled_model.artifact.save(Path(tmp) / "debug.edgec")
        compiled = runtime.load(path, target=target.name)
    reference = reference_session(exposed.proto, optimize=False)
    worst: dict[str, float] = {}
    first: Divergence | None = None
    for sample in samples:
        got = compiled.run(sample.arrays)
        expected = reference.run(sample.arrays)
        for node in exposed.proto.graph.node:
            for output in node.output:
                if output not in expected or output not in got:
                    continue
                diff = compare_outputs({output: got[output]}, {output: expected[output]})
                worst[node.name] = max(worst.get(node.name, 0.0), diff["max_rel"])
                if first is None and diff["max_rel"] > tolerance:
                    first = Divergence(sample.name, node.name, node.op_type, output,
                                       region_of.get(node.name, "?"), diff["max_abs"], diff["max_rel"])
    ops = {node.name: node.op_type for node in exposed.proto.graph.node}
    rows = [{"node": name, "op": ops[name], "region": region_of.get(name, "?"), "max_rel": value}
            for name, value in worst.items()]
    return DebugResult(tolerance, rows, first)
