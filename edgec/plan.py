"""The plan stage: decide, from a profile, which parts of a model run specialized for which shapes.

A plan cuts the model into regions and says, for each, whether it is static (no symbolic dims),
specialized (compiled for a few hot shapes, with a symbolic fallback for every other shape) or
symbolic (one function for every shape), and why. The planner decides and records; only ``build``
lowers. Policies:

- ``specialize-seen``: specialize the most frequent shapes whose share of the samples is at least
  ``min_share``, up to ``max_specializations``; every other shape takes the fallback.
- ``symbolic``: no specialization.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import EdgecError, StageInputError
from .fileio import load_json_value, save_json_value
from .model import Model
from .profile import Profile
from .provenance import tool_versions
from .targets import Target

PLAN_VERSION = 1
POLICIES = ("specialize-seen", "symbolic")


@dataclass(frozen=True)
class PlanSettings:
    """The knobs a plan was made with; saved with it."""

    policy: str = "specialize-seen"
    max_specializations: int = 4
    min_share: float = 0.1

    def check(self) -> None:
        if self.policy not in POLICIES:
            raise EdgecError(f"unknown plan policy '{self.policy}'; known: {', '.join(POLICIES)}")
        if self.max_specializations < 0:
            raise EdgecError("--max-specializations must be 0 or more")
        if not 0.0 <= self.min_share <= 1.0:
            raise EdgecError("--min-share must lie between 0 and 1")


@dataclass(frozen=True)
class Region:
    """A part of the model and how it is compiled.

    ``specializations`` lists the dim assignments compiled as static functions, each with the share
    of profiled samples it serves and the reference latency measured for it.
    """

    name: str
    nodes: list[str]
    mode: str
    specializations: list[dict[str, Any]]
    fallback: bool
    dynamic_nodes: list[str]
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "nodes": self.nodes, "mode": self.mode,
            "specializations": self.specializations, "fallback": self.fallback,
            "dynamic_nodes": self.dynamic_nodes, "reason": self.reason,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "Region":
        return cls(doc["name"], doc["nodes"], doc["mode"], doc["specializations"],
                   doc["fallback"], doc["dynamic_nodes"], doc["reason"])


@dataclass(frozen=True)
class Plan:
    """Regions and their compile decisions for one model and target."""

    model_name: str
    model_sha256: str
    target: str
    settings: PlanSettings
    regions: list[Region]
    coverage: float
    versions: dict[str, str] = field(default_factory=tool_versions)
    # Shape-like inputs compiled as a fixed value: {name: {"dtype", "shape", "value", "reason"}}.
    constant_inputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def save(self, path: str | Path) -> Path:
        payload = {
            "model": {"name": self.model_name, "sha256": self.model_sha256},
            "target": self.target,
            "settings": vars(self.settings),
            "coverage": self.coverage,
            "regions": [r.to_json() for r in self.regions],
            "constant_inputs": self.constant_inputs,
            "versions": self.versions,
        }
        return save_json_value(path, "plan", PLAN_VERSION, payload)

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        doc = load_json_value(path, "plan", PLAN_VERSION)
        return cls(
            model_name=doc["model"]["name"], model_sha256=doc["model"]["sha256"],
            target=doc["target"], settings=PlanSettings(**doc["settings"]),
            regions=[Region.from_json(r) for r in doc["regions"]],
            coverage=doc["coverage"], versions=doc["versions"],
            constant_inputs=doc.get("constant_inputs", {}),
        )

    def summary(self) -> dict[str, Any]:
        """The part of the plan an artifact's manifest keeps."""
        return {
            "policy": self.settings.policy, "coverage": self.coverage,
            "regions": [
                {"name": r.name, "mode": r.mode, "fallback": r.fallback,
                 "specializations": [s["dims"] for s in r.specializations], "reason": r.reason}
                for r in self.regions
            ],
            "constant_inputs": {name: c["reason"] for name, c in self.constant_inputs.items()},
        }


def check_matches(model: Model, model_sha256: str, what: str) -> None:
    """Refuse a saved stage result that was made for another model."""
    if model_sha256 != model.sha256:
        raise StageInputError(
            f"the {what} was made for another model (sha256 {model_sha256[:12]}…, this model "
            f"{model.sha256[:12]}…); rerun `edgec {what}` on this model"
        )


def plan(model: Model, prof: Profile, target: Target, settings: PlanSettings = PlanSettings()) -> Plan:
    """Decide how to compile ``model`` for ``target`` from what ``prof`` observed."""
    settings.check()
    check_matches(model, prof.model_sha256, "profile")
    nodes = model.node_names
    dynamic_nodes = [name for name, _ in model.control_flow]
    distribution = prof.shape_distribution()
    reference = {tuple(sorted(s["dims"].items())): s["reference_ms"] for s in prof.shapes}

    if not model.dynamic_dims:
        region = Region("main", nodes, "static", [], False, dynamic_nodes,
                        "every input dim is fixed: one static function")
        return Plan(model.name, model.sha256, target.name, settings, [region], 1.0,
                    constant_inputs=constant_inputs(model, prof))

    chosen: list[dict[str, Any]] = []
    if settings.policy == "specialize-seen":
        for dims, share in distribution:
            if len(chosen) >= settings.max_specializations or share < settings.min_share:
                break
            chosen.append({
                "dims": dims, "share": round(share, 4),
                "reference_ms": reference.get(tuple(sorted(dims.items()))),
            })
    coverage = round(sum(s["share"] for s in chosen), 4)
    if chosen:
        reason = (
            f"policy {settings.policy}: {len(chosen)} shape(s) each seen in at least "
            f"{settings.min_share:.0%} of {prof.sample_count} samples cover {coverage:.0%}; "
            f"every other shape runs the symbolic fallback"
        )
        mode = "specialized"
    else:
        why = ("policy symbolic" if settings.policy == "symbolic" else
               f"no shape reached {settings.min_share:.0%} of {prof.sample_count} samples")
        reason = f"{why}: one symbolic function over {', '.join(model.dynamic_dims)}"
        mode = "symbolic"
    region = Region("main", nodes, mode, chosen, True, dynamic_nodes, reason)
    return Plan(model.name, model.sha256, target.name, settings, [region], coverage,
                constant_inputs=constant_inputs(model, prof))


def constant_inputs(model: Model, prof: Profile) -> dict[str, dict[str, Any]]:
    """Shape-like inputs that took one value in every profiled sample: compiled as that value.

    The runtime refuses another value (the fix is to recompile with samples covering it).
    """
    fixed: dict[str, dict[str, Any]] = {}
    for name, seen in prof.values.items():
        if len(seen) == 1 and seen[0]["count"] == prof.sample_count:
            fixed[name] = {
                "dtype": model.input(name).dtype, "shape": seen[0]["shape"],
                "value": seen[0]["value"],
                "reason": f"shape-like input with the same value in all {prof.sample_count} samples",
            }
    return fixed
