"""A model's inputs and outputs as the artifact records them, and checking arrays against them.

Shared by the compiler (checking samples) and the runtime (checking a call's inputs), so both
accept and refuse the same arrays.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: name, numpy dtype name and dims (ints or symbol names)."""

    name: str
    dtype: str
    dims: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.dims)

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "dims": list(self.dims)}

    @classmethod
    def from_json(cls, doc: dict) -> "TensorSpec":
        return cls(doc["name"], doc["dtype"], tuple(doc["dims"]))


def bind_inputs(
    specs: tuple[TensorSpec, ...] | list[TensorSpec],
    arrays: Mapping[str, np.ndarray],
    where: str,
    error: type[Exception],
) -> dict[str, int]:
    """Check ``arrays`` against ``specs`` and return the value each symbolic dim takes.

    Names must match exactly; dtype and rank must be the spec's; fixed dims must be equal; a symbol
    used twice must take one value. Raises ``error`` with a one-line message otherwise.
    """
    expected = [spec.name for spec in specs]
    missing = [name for name in expected if name not in arrays]
    extra = sorted(set(arrays) - set(expected))
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unexpected {', '.join(extra)}"] if extra else [])
        raise error(f"{where}: {'; '.join(parts)}; the model's inputs are {', '.join(expected)}")
    bound: dict[str, int] = {}
    for spec in specs:
        array = arrays[spec.name]
        if not isinstance(array, np.ndarray):
            raise error(f"{where}: input '{spec.name}' is a {type(array).__name__}, not a numpy array")
        if array.dtype.name != spec.dtype:
            raise error(f"{where}: input '{spec.name}' is {array.dtype.name}, the model expects {spec.dtype}")
        if array.ndim != spec.rank:
            raise error(
                f"{where}: input '{spec.name}' has rank {array.ndim} (shape {list(array.shape)}), "
                f"the model expects rank {spec.rank} {list(spec.dims)}"
            )
        for axis, (dim, size) in enumerate(zip(spec.dims, array.shape)):
            if isinstance(dim, int):
                if dim != size:
                    raise error(
                        f"{where}: input '{spec.name}' has {size} at axis {axis}, the model fixes "
                        f"it to {dim} (shape {list(spec.dims)})"
                    )
            elif bound.setdefault(dim, size) != size:
                raise error(
                    f"{where}: dim '{dim}' is {bound[dim]} in one input and {size} in "
                    f"'{spec.name}' axis {axis}; inputs sharing a dim name must agree"
                )
    return bound
