"""Choosing each region's option: the number of hot shapes it specializes (0 = symbolic).

Regions run one after the other, so a plan's latency at a shape is the sum of its regions'; the
expected latency over the profiled distribution is then a sum over regions, and each region's
choice is independent except through the budgets. ``choose`` takes, per region, the ``k``
(0..max) of least expected latency, then, while a budget is exceeded, takes back the
specialization whose removal costs least latency per budget unit freed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

Dims = Mapping[str, int]
# latency(region index, option, graph dims) -> ms
Latency = Callable[[int, str, Dims], float]


def dims_key(dims: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(dims.items())) or "static"


@dataclass(frozen=True)
class RegionSpace:
    """What a region can choose from: its hot shapes (over ``dims``, the graph dims it is
    specialized on) by share, most frequent first, and its size in nodes."""

    index: int
    dims: tuple[str, ...]
    hot: tuple[tuple[tuple[tuple[str, int], ...], float], ...]
    nodes: int

    def project(self, graph_dims: Dims) -> tuple[tuple[str, int], ...]:
        return tuple(sorted((d, int(graph_dims[d])) for d in self.dims if d in graph_dims))

    def specialized_at(self, k: int, graph_dims: Dims) -> bool:
        return self.project(graph_dims) in {shape for shape, _ in self.hot[:k]}


def region_space(index: int, dims: list[str], distribution: list[tuple[dict[str, int], float]],
                 nodes: int) -> RegionSpace:
    shares: dict[tuple[tuple[str, int], ...], float] = {}
    for graph_dims, share in distribution:
        key = tuple(sorted((d, int(graph_dims[d])) for d in dims if d in graph_dims))
        shares[key] = shares.get(key, 0.0) + share
    hot = tuple(sorted(shares.items(), key=lambda kv: (-kv[1], kv[0]))) if dims else ()
    return RegionSpace(index, tuple(dims), hot, nodes)


def option_at(space: RegionSpace, k: int, graph_dims: Dims) -> str:
    """How a region with ``k`` specializations runs at a shape (see ``features.OPTIONS``)."""
    if k == 0 or not space.dims:
        return "symbolic"
    return "specialized" if space.specialized_at(k, graph_dims) else "fallback"


def expected_ms(space: RegionSpace, k: int, distribution: list[tuple[dict[str, int], float]],
                latency: Latency) -> float:
    return sum(share * latency(space.index, option_at(space, k, g), g) for g, share in distribution)


@dataclass
class Budgets:
    compile_s: float = 0.0  # 0 = unlimited
    artifact_bytes: float = 0.0
    # seconds/bytes of ``copies`` compiled nodes; None when no cost model is at hand
    seconds_of: Callable[[float], float] | None = None
    bytes_of: Callable[[float], float] | None = None
    fixed_bytes: float = 0.0  # weights: paid once whatever the plan


def totals(spaces: list[RegionSpace], ks: list[int], budgets: Budgets) -> tuple[float | None, float | None]:
    copies = sum(s.nodes * (1 + k) for s, k in zip(spaces, ks))
    seconds = budgets.seconds_of(copies) if budgets.seconds_of else None
    size = budgets.bytes_of(copies) + budgets.fixed_bytes if budgets.bytes_of else None
    return seconds, size


def fit_budgets(spaces: list[RegionSpace], ks: list[int], budgets: Budgets,
                loss: Callable[[RegionSpace, int], float]) -> tuple[list[int], list[str]]:
    """Lower ``ks`` until the predicted compile time and size fit; ``loss(space, k)`` is what
    going from ``k`` to ``k-1`` costs. Returns the new ks and a note per step taken."""
    ks = list(ks)
    notes = []
    while True:
        seconds, size = totals(spaces, ks, budgets)
        over_s = budgets.compile_s > 0 and seconds is not None and seconds > budgets.compile_s
        over_b = budgets.artifact_bytes > 0 and size is not None and size > budgets.artifact_bytes
        if not (over_s or over_b):
            return ks, notes
        steps = [(loss(s, k) / max(s.nodes, 1), i) for i, (s, k) in enumerate(zip(spaces, ks)) if k > 0]
        if not steps:
            notes.append("budget cannot be met even with every region symbolic")
            return ks, notes
        _, i = min(steps)
        ks[i] -= 1
        notes.append(f"region {i}: one specialization fewer")
