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
    # For integer inputs used as indices into a fixed table: the valid values are [lo, hi).
    # Compiled gathers do not check their indices, so an out-of-range one must never reach them.
    bounds: tuple[int, int] | None = None
    # For a shape-like input the artifact was compiled for one value of (axes, shape, k, ...):
    # that value's shape and its elements in C order. Any other value is refused.
    fixed_shape: tuple[int, ...] | None = None
    fixed_value: tuple[int | float | bool, ...] | None = None

    @property
    def rank(self) -> int:
        return len(self.dims)

    def to_json(self) -> dict:
        doc = {"name": self.name, "dtype": self.dtype, "dims": list(self.dims)}
        if self.bounds is not None:
            doc["bounds"] = list(self.bounds)
        if self.fixed_value is not None:
            doc["fixed"] = {"shape": list(self.fixed_shape), "value": list(self.fixed_value)}
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> "TensorSpec":
        bounds = doc.get("bounds")
        fixed = doc.get("fixed")
        return cls(doc["name"], doc["dtype"], tuple(doc["dims"]), tuple(bounds) if bounds else None,
                   tuple(fixed["shape"]) if fixed else None, tuple(fixed["value"]) if fixed else None)

    def fixed_array(self) -> np.ndarray | None:
        """The value this input was compiled for, or None when any value is accepted."""
        if self.fixed_value is None:
            return None
        return np.array(self.fixed_value, dtype=self.dtype).reshape(self.fixed_shape)


@dataclass(frozen=True)
class ValueSpec:
    """A sequence or optional graph input/output (``kind``), of tensors of ``dtype``.

    The compiler resolves these to tensors for what the samples show (edgec.core.sequences); the
    artifact's manifest records the mapping under ``boundary``, read by ``flatten_inputs`` and
    ``group_outputs``.
    """

    name: str
    kind: str
    dtype: str
    dims: tuple[Dim, ...] = ()  # none of its own: its elements have dims


def flatten_inputs(boundary: dict, inputs: Mapping[str, object], where: str,
                   error: type[Exception]) -> dict[str, np.ndarray]:
    """A call's inputs (lists for sequences, None for an absent optional) as the artifact's
    tensor inputs; refuses a length, a presence or a fixed value it was not compiled for."""
    flat: dict[str, np.ndarray] = {}
    for record in boundary["inputs"]:
        name = record["name"]
        if name not in inputs:
            expected = ", ".join(r["name"] for r in boundary["inputs"])
            raise error(f"{where}: missing {name}; the model's inputs are {expected}")
        value = inputs[name]
        if record["kind"] == "tensor":
            fixed = boundary.get("fixed", {}).get(name)
            if fixed is not None:
                want = np.array(fixed["value"], dtype=fixed["dtype"]).reshape(fixed["shape"])
                array = np.asarray(value)
                if array.shape != want.shape or not np.array_equal(array, want):
                    raise error(f"{where}: input '{name}' is {_brief(array)}, the artifact was compiled "
                                f"for {_brief(want)} (its value in every profiled sample; it decides "
                                f"a sequence's structure); recompile with samples that cover this value")
            flat[name] = value
            continue
        tensors = record["tensors"]
        compiled = ("absent" if tensors is None else
                    f"a list of {len(tensors)}" if record.get("sequence") else "a tensor")
        if value is None:
            given = "absent (None)"
        elif isinstance(value, (list, tuple)):
            given = f"a list of {len(value)}"
        else:
            given = "a tensor"
        if given.split(" (")[0] != compiled:
            raise error(f"{where}: {record['kind']} input '{name}' is {given}, the artifact was compiled "
                        f"for {compiled} (every profiled sample); recompile with samples that show "
                        f"this length")
        if tensors:
            flat.update(zip(tensors, value if isinstance(value, (list, tuple)) else [value]))
    extra = sorted(set(inputs) - {r["name"] for r in boundary["inputs"]})
    if extra:
        raise error(f"{where}: unexpected {', '.join(extra)}; the model's inputs are "
                    f"{', '.join(r['name'] for r in boundary['inputs'])}")
    return flat


def group_outputs(boundary: dict, flat: Mapping[str, np.ndarray]) -> dict[str, object]:
    """The artifact's tensor outputs regrouped as the model's: lists for sequences, None for an
    absent optional."""
    outputs: dict[str, object] = {}
    for record in boundary["outputs"]:
        tensors = record.get("tensors")
        if record["kind"] == "tensor":
            outputs[record["name"]] = flat[record["name"]]
        elif tensors is None:
            outputs[record["name"]] = None
        elif record.get("sequence"):
            outputs[record["name"]] = [flat[t] for t in tensors]
        else:
            outputs[record["name"]] = flat[tensors[0]]
    return outputs


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
    if len(arrays) != len(specs) or not all(spec.name in arrays for spec in specs):
        expected = [spec.name for spec in specs]
        missing = [name for name in expected if name not in arrays]
        extra = sorted(set(arrays) - set(expected))
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unexpected {', '.join(extra)}"] if extra else [])
        raise error(f"{where}: {'; '.join(parts)}; the model's inputs are {', '.join(expected)}")
    bound: dict[str, int] = {}
    for spec in specs:
        array = arrays[spec.name]
        if isinstance(spec, ValueSpec):  # checked against what the samples show when compiled
            continue
        if not isinstance(array, np.ndarray):
            raise error(f"{where}: input '{spec.name}' is a {type(array).__name__}, not a numpy array")
        if array.dtype != spec.dtype:  # not dtype.name, which numpy rebuilds on every access
            raise error(f"{where}: input '{spec.name}' is {array.dtype.name}, the model expects "
                        f"{spec.dtype}; convert it first (numpy: .astype('{spec.dtype}'))")
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
        if spec.bounds is not None and array.size:
            low, high = spec.bounds
            smallest, largest = _extremes(array)
            if smallest < low or largest >= high:
                bad = smallest if smallest < low else largest
                raise error(
                    f"{where}: input '{spec.name}' holds {bad}, outside [{low}, {high}): it indexes "
                    f"a table of {high} entries"
                )
        fixed = spec.fixed_array()
        if fixed is not None and (array.shape != fixed.shape or not np.array_equal(array, fixed)):
            raise error(
                f"{where}: input '{spec.name}' is {_brief(array)}, the artifact was compiled for "
                f"{_brief(fixed)} (its value in every profiled sample); recompile with samples "
                f"that cover this value"
            )
    return bound


_SMALL_ARRAY = 64  # elements: up to here Python's min and max beat numpy's reductions


def _extremes(array: np.ndarray) -> tuple[int, int]:
    """The smallest and largest of an integer array's values (not empty). A few token ids are
    faster through Python's min and max than through two numpy reductions (about 1 us each, in
    model calls of about 10 us)."""
    if array.size <= _SMALL_ARRAY:
        values = array.ravel().tolist()
        return min(values), max(values)
    return int(array.min()), int(array.max())


def _brief(array: np.ndarray) -> str:
    """A short rendering of a small array's value for error messages."""
    text = np.array2string(array.ravel() if array.ndim > 1 else array, separator=", ",
                           threshold=8, max_line_width=10**6)
    return text if array.ndim <= 1 else f"{text} (shape {list(array.shape)})"
