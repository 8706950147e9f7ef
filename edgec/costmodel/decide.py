"""Choosing each region's option: the number of hot shapes it specializes (0 = symbolic), and
whether shapes it did not specialize run padded to a larger specialized one (a bucket).

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
# latency(region index, option, graph dims, bucket) -> ms; ``bucket`` (the specialized dims a
# padded run uses) is given for option "padded" only.
Latency = Callable[..., float]


def dims_key(dims: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(dims.items())) or "static"


@dataclass(frozen=True)
class RegionSpace:
    """What a region can choose from: its hot shapes (over ``dims``, the graph dims it is
    specialized on) in the order they are specialized (by share, most frequent first), and its
    size in nodes. ``pad_dims``: the dims padded to buckets (empty: no padding); in such a space
    ``hot`` starts with the largest profiled shape, the bucket every smaller shape fits."""

    index: int
    dims: tuple[str, ...]
    hot: tuple[tuple[tuple[tuple[str, int], ...], float], ...]
    nodes: int
    pad_dims: tuple[str, ...] = ()

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


def padded_space(space: RegionSpace, pad_dims: tuple[str, ...]) -> RegionSpace:
    """``space`` with ``pad_dims`` padded: the largest profiled shape (in padded elements) is
    specialized first, so that one bucket already serves every shape that fits it; then the
    hot shapes in order."""
    if not pad_dims or not space.hot:
        return space
    largest = max(space.hot, key=lambda entry: (_volume(dict(entry[0]), pad_dims), entry[0]))
    rest = tuple(entry for entry in space.hot if entry is not largest)
    return RegionSpace(space.index, space.dims, (largest,) + rest, space.nodes, tuple(pad_dims))


def _volume(dims: Dims, pad_dims) -> int:
    volume = 1
    for dim in pad_dims:
        volume *= int(dims.get(dim, 1))
    return volume


def run_option(specs: list[Dims], pad_dims, graph_dims: Dims) -> tuple[str, dict[str, int] | None]:
    """How a region specialized for ``specs`` (dicts over its dims), padding ``pad_dims``, runs at
    ``graph_dims``: ``("specialized", None)`` for an exact match; ``("padded", bucket)`` for the
    smallest spec that every padded dim fits and every other dim equals (what
    ``compiler.dispatch`` picks); else ``("fallback", None)``; ``("symbolic", None)`` without
    specs."""
    if not specs:
        return "symbolic", None
    for spec in specs:
        if all(int(graph_dims.get(d, -1)) == int(v) for d, v in spec.items()):
            return "specialized", None
    if pad_dims:
        fitting = [spec for spec in specs if all(
            int(graph_dims.get(d, -1)) <= int(v) if d in pad_dims else int(graph_dims.get(d, -1)) == int(v)
            for d, v in spec.items())]
        if fitting:
            return "padded", dict(min(fitting, key=lambda spec: _volume(spec, pad_dims)))
    return "fallback", None


def option_at(space: RegionSpace, k: int, graph_dims: Dims) -> tuple[str, dict[str, int] | None]:
    """How a region with ``k`` specializations runs at a shape (see ``features.OPTIONS``), and
    the bucket a padded run uses."""
    if k == 0 or not space.dims:
        return "symbolic", None
    return run_option([dict(shape) for shape, _ in space.hot[:k]], space.pad_dims, graph_dims)


def latency_at(space: RegionSpace, k: int, graph_dims: Dims, latency: Latency) -> float:
    option, bucket = option_at(space, k, graph_dims)
    if option == "padded":
        return latency(space.index, option, graph_dims, bucket)
    return latency(space.index, option, graph_dims)


def expected_ms(space: RegionSpace, k: int, distribution: list[tuple[dict[str, int], float]],
                latency: Latency) -> float:
    return sum(share * latency_at(space, k, g, latency) for g, share in distribution)


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
