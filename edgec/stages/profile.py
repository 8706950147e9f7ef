"""The profile stage: run a model on representative inputs and record how it behaves.

Recorded per model: the values each symbolic input dim takes and the input shapes seen, the branch
taken by each top-level ``If``, the trip count of each top-level ``Loop`` and ``Scan``, the time of
each node (onnxruntime's profiler, graph unoptimized so nodes keep their names), the reference
latency per shape, the range of every float activation, and the values taken by small inputs
that a node reads as a shape-like argument (``SHAPE_ARGUMENTS``: axes, shape, sizes, k, pads...),
so the plan can fix the ones that never change. The reference that runs the model is onnxruntime
for ONNX models and torch itself (eager) for PyTorch programs; ``_PROBES`` picks it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgec.core.model import Model, all_nodes, expose_activations, subgraphs
from edgec.core.provenance import tool_versions
from edgec.core.quant_layers import find_layers
from edgec.core.reference import reference_for, reference_session
from edgec.core.samples import Sample, sample_dims
from edgec.errors import ModelError, SamplesError, describe
from edgec.fileio import load_json_value, save_json_value
from edgec.runtime.signature import TensorSpec

PROFILE_VERSION = 1
_TRIPS_SUFFIX = "__edgec_trips"
_TIMING_RUNS = 3
# Inputs with more elements are data, not a shape-like argument: their values are not recorded.
MAX_RECORDED_ELEMENTS = 64

_REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
               "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
# Per op, the input positions holding a shape-like argument (axes, shape, sizes, k, pads, ...):
# values the compiler handles best, or only, as constants.
SHAPE_ARGUMENTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,),
    "Unsqueeze": (1,), "TopK": (1,), "Pad": (1, 2, 3), "Resize": (1, 2, 3), "Upsample": (1,),
    "Split": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2), "OneHot": (1, 2), "CumSum": (1,),
    "CumProd": (1,), "Trilu": (1,), "NonMaxSuppression": (2, 3, 4), "CenterCropPad": (1,),
    "Col2Im": (1, 2), "DFT": (1, 2), "STFT": (1, 3), "HannWindow": (0,), "HammingWindow": (0,),
    "BlackmanWindow": (0,), "MelWeightMatrix": (0, 1, 2, 3, 4), "Dropout": (1, 2),
    "SplitToSequence": (1,), "AffineGrid": (1,), "ReverseSequence": (1,),
    **{op: (1,) for op in _REDUCTIONS},
}


@dataclass(frozen=True)
class Profile:
    """What a model did on its samples. ``shapes`` is sorted by how often each shape was seen."""

    model_name: str
    model_sha256: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    sample_count: int
    dims: dict[str, dict[str, int]]
    shapes: list[dict[str, Any]]
    control_flow: dict[str, dict[str, Any]]
    nodes: dict[str, dict[str, Any]]
    # Per float tensor: min, max, absmax_p999; the inputs of layers with a constant weight also
    # abs_hist and abs_hist_max (see _add_to_histogram), for entropy calibration.
    ranges: dict[str, dict[str, Any]]
    reference_error: str = ""
    # Per shape-like input: each distinct value seen, as {"shape", "value" (flat), "count"}.
    values: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=tool_versions)

    def shape_distribution(self) -> list[tuple[dict[str, int], float]]:
        """Each seen assignment of the symbolic dims with its share of the samples."""
        total = sum(entry["count"] for entry in self.shapes) or 1
        return [(dict(entry["dims"]), entry["count"] / total) for entry in self.shapes]

    def save(self, path: str | Path) -> Path:
        payload = {
            "model": {
                "name": self.model_name, "sha256": self.model_sha256,
                "inputs": [s.to_json() for s in self.inputs],
                "outputs": [s.to_json() for s in self.outputs],
            },
            "sample_count": self.sample_count, "dims": self.dims, "shapes": self.shapes,
            "control_flow": self.control_flow, "nodes": self.nodes, "ranges": self.ranges,
            "reference_error": self.reference_error, "values": self.values,
            "versions": self.versions,
        }
        return save_json_value(path, "profile", PROFILE_VERSION, payload)

    @classmethod
    def load(cls, path: str | Path) -> "Profile":
        doc = load_json_value(path, "profile", PROFILE_VERSION)
        model = doc["model"]
        return cls(
            model_name=model["name"], model_sha256=model["sha256"],
            inputs=[TensorSpec.from_json(s) for s in model["inputs"]],
            outputs=[TensorSpec.from_json(s) for s in model["outputs"]],
            sample_count=doc["sample_count"], dims=doc["dims"], shapes=doc["shapes"],
            control_flow=doc["control_flow"], nodes=doc["nodes"], ranges=doc["ranges"],
            reference_error=doc["reference_error"], values=doc.get("values", {}),
            versions=doc["versions"],
        )


def _instrumented(model: Model) -> tuple[onnx.ModelProto, dict[str, str]]:
    """A copy of the model whose graph outputs also expose every top-level activation.

    Each top-level ``Loop`` gains a scan output of its iteration numbers, whose length is the trip
    count. Returns the proto and, per Loop node, the name of that extra output.
    """
    proto = expose_activations(model.proto)
    trips: dict[str, str] = {}
    for node in proto.graph.node:
        if node.op_type == "Loop":
            body = next(a.g for a in node.attribute if a.name == "body")
            counter = f"{node.name}{_TRIPS_SUFFIX}"
            body.node.append(helper.make_node(
                "Identity", [body.input[0].name], [counter + "_iter"], name=counter + "_identity"))
            body.output.append(helper.make_tensor_value_info(counter + "_iter", TensorProto.INT64, []))
            node.output.append(counter)
            proto.graph.output.append(helper.make_tensor_value_info(counter, TensorProto.INT64, None))
            trips[node.name] = counter
    return proto, trips


def _node_times(model: Model, samples: list[Sample]) -> dict[str, dict[str, Any]]:
    """Mean time per node and run, from onnxruntime's profiler on the unoptimized graph."""
    with tempfile.TemporaryDirectory(prefix="edgec-profile-") as tmp:
        session = reference_session(model.proto, optimize=False,
                                    profile_prefix=os.path.join(tmp, "ort"))
        for sample in samples:
            session.run(sample.arrays)
        trace_path = session.session.end_profiling()
        events = json.loads(Path(trace_path).read_text())
    ops = {node.name: node.op_type for node in model.proto.graph.node}
    total_us: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            total_us[event["name"][: -len("_kernel_time")]] += float(event.get("dur", 0))
    runs = max(len(samples), 1)
    return {
        name: {"op": ops.get(name, ""), "mean_us": round(total_us[name] / runs, 3)}
        for name in sorted(total_us, key=lambda n: -total_us[n])
    }


def _range_of(values: np.ndarray) -> dict[str, float] | None:
    """The range of the finite values (NaN/Inf from NaN/Inf inputs say nothing about scale);
    None when there is none."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return None
    flat = np.abs(finite.astype(np.float64, copy=False))
    return {
        "min": float(finite.min()), "max": float(finite.max()),
        "absmax_p999": float(np.percentile(flat, 99.9)),
    }


# Bins of the |x| histograms kept for the activations quantization calibrates (entropy
# calibration searches clipping thresholds over them, see edgec.core.quant_schemes).
HISTOGRAM_BINS = 1024


def _add_to_histogram(entry: dict[str, Any], values: np.ndarray) -> None:
    """Count the finite |values| into ``entry``'s histogram (``abs_hist``, ``HISTOGRAM_BINS``
    bins over [0, ``abs_hist_max``], the largest |x| seen). When a sample widens the range, the
    counts so far move to the new bins in proportion to their overlap (each count assumed
    spread evenly over its old bin); deterministic for given samples in a given order."""
    flat = np.abs(values[np.isfinite(values)].astype(np.float64, copy=False)).ravel()
    if not flat.size:
        return
    top = float(flat.max())
    old = entry.get("abs_hist")
    old_top = float(entry.get("abs_hist_max", 0.0))
    new_top = max(top, old_top) or 1.0
    counts = np.histogram(flat, bins=HISTOGRAM_BINS, range=(0.0, new_top))[0].astype(np.float64)
    if old is not None:
        old_counts = np.asarray(old, np.float64)
        if new_top == old_top:
            counts += old_counts
        else:
            # Cumulative counts at the new bin edges, interpolated within the old bins.
            old_edges = np.linspace(0.0, old_top, HISTOGRAM_BINS + 1)
            cumulative = np.concatenate([[0.0], np.cumsum(old_counts)])
            at_new_edges = np.interp(np.linspace(0.0, new_top, HISTOGRAM_BINS + 1), old_edges, cumulative)
            counts += np.diff(at_new_edges)
    entry["abs_hist_max"] = new_top
    # Counts stay whole numbers in the file: rounding the cumulative sum keeps the total exact.
    entry["abs_hist"] = [int(c) for c in np.diff(np.rint(np.concatenate([[0.0], np.cumsum(counts)])))]


def _calibrated_activations(model: Model) -> set[str]:
    """The tensors a quantized layer would take as input: those get histograms."""
    if model.proto is None:
        return set()

    return {layer.activation for layer in find_layers(model.proto) if layer.kind != "embedding"}


def _merge_range(old: dict[str, float] | None, new: dict[str, float], count: int) -> dict[str, float]:
    if old is None:
        return new
    return {
        **old, "min": min(old["min"], new["min"]), "max": max(old["max"], new["max"]),
        # Mean over samples of the per-sample percentile: robust to one outlier sample.
        "absmax_p999": old["absmax_p999"] + (new["absmax_p999"] - old["absmax_p999"]) / count,
    }


def profile(model: Model, samples: list[Sample]) -> Profile:
    """Run ``model`` on ``samples`` with its reference (onnxruntime, or torch for a PyTorch
    program) and return what was observed.

    Samples must already be checked against the model (``load_samples`` does it); raises
    ``SamplesError`` when there are none. Shapes come from the samples themselves. When
    the reference cannot run the model, the rest (branches, trips, times, ranges) stays empty and
    ``reference_error`` says why: edgec may compile what onnxruntime cannot run.
    """
    if not samples:
        raise SamplesError("no samples to profile; pass at least one .npz file")
    keys = [tuple(sorted(sample_dims(model, sample).items())) for sample in samples]
    dim_counts: dict[str, Counter] = {d: Counter() for d in model.dynamic_dims}
    for key in keys:
        for dim, value in key:
            dim_counts[dim][str(value)] += 1
    try:
        observed = _observe(model, samples, keys)
        reference_error = ""
    except ModelError as exc:
        observed = _Observations()
        reference_error = str(exc)
    shapes = [
        {"dims": dict(key), "count": count,
         "reference_ms": (round(float(np.median(observed.shape_times[key])), 4)
                          if observed.shape_times.get(key) else None)}
        for key, count in sorted(Counter(keys).items(), key=lambda kv: (-kv[1], kv[0]))
    ]
    return Profile(
        model_name=model.name, model_sha256=model.sha256,
        inputs=list(model.inputs), outputs=list(model.outputs),
        sample_count=len(samples),
        dims={d: dict(sorted(c.items(), key=lambda kv: int(kv[0]))) for d, c in dim_counts.items()},
        shapes=shapes, control_flow=observed.control_flow, nodes=observed.nodes,
        ranges=dict(sorted(observed.ranges.items())), reference_error=reference_error,
        values=_input_values(model, samples),
    )


# Integer ops through which a shape-like argument is computed from other values (an expanded
# CenterCropPad computes its pads as Max/Sub/Div of the target shape and the input's; an
# expanded AffineGrid splits its size input into N, C, H, W inside an If).
_SHAPE_ARITHMETIC = {"Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Neg", "Abs", "Concat",
                     "Cast", "Identity", "Unsqueeze", "Squeeze", "Gather", "Slice", "Where",
                     "Equal", "Less", "Greater", "Not", "And", "Or", "ReduceProd", "ReduceSum",
                     "Split", "If"}


def shape_argument_inputs(proto: onnx.ModelProto) -> list[str]:
    """Graph inputs that some node, subgraphs included, reads as a shape-like argument, directly
    or (integer inputs) through integer arithmetic in the top-level graph."""
    inputs = {value.name: value for value in proto.graph.input}
    integer = {name for name, value in inputs.items() if value.type.tensor_type.elem_type in (
        onnx.TensorProto.INT64, onnx.TensorProto.INT32)}
    found: set[str] = set()
    wanted: set[str] = set()

    for node in all_nodes(proto.graph):
        for position in SHAPE_ARGUMENTS.get(node.op_type, ()):
            if position < len(node.input) and node.input[position]:
                wanted.add(node.input[position])
    found = {name for name in wanted if name in inputs}
    for node in reversed(proto.graph.node):  # producers come before consumers
        if node.op_type in _SHAPE_ARITHMETIC and any(out in wanted for out in node.output):
            wanted.update(name for name in node.input if name)
            # An If's outputs are computed from what its branches read from this graph.
            wanted.update(name for sub in subgraphs(node) for name in _outer_names(sub))
    found |= {name for name in wanted if name in integer}
    return [value.name for value in proto.graph.input if value.name in found]


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names ``graph`` (its subgraphs included) reads without defining them."""
    defined = {v.name for v in graph.input} | {i.name for i in graph.initializer}
    defined.update(name for node in all_nodes(graph) for name in node.output)
    read = {name for node in all_nodes(graph) for name in node.input if name}
    return (read | {v.name for v in graph.output}) - defined


def _input_values(model: Model, samples: list[Sample]) -> dict[str, list[dict[str, Any]]]:
    """The distinct values of each small shape-like input over the samples, most frequent first."""
    recorded: dict[str, list[dict[str, Any]]] = {}
    if model.proto is None:  # a torch program: torch.export already fixed its shape arguments
        return recorded
    for name in shape_argument_inputs(model.proto):
        seen: Counter = Counter()
        for sample in samples:
            array = np.asarray(sample.arrays[name])
            if array.size > MAX_RECORDED_ELEMENTS or array.dtype.kind not in "iufb" or (
                    array.dtype.kind == "f" and not np.isfinite(array).all()):
                break
            seen[(tuple(array.shape), tuple(array.ravel().tolist()))] += 1
        else:
            recorded[name] = [{"shape": list(shape), "value": list(value), "count": count}
                              for (shape, value), count in seen.most_common()]
    return recorded


@dataclass
class _Observations:
    """What running the model with onnxruntime showed."""

    shape_times: dict[tuple, list[float]] = field(default_factory=dict)
    control_flow: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    ranges: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class _Probe:
    """How to observe one kind of model: its reference executor (``run``/``timed_run``), an
    instrumented run returning every activation by name and, per top-level control-flow node, the
    branch taken (a bool: the then/true branch) or the trip count (an int), and node timing."""

    reference: Any
    instrumented_run: Callable[[dict[str, np.ndarray]], tuple[dict[str, np.ndarray], dict[str, Any]]]
    node_times: Callable[[list[Sample]], dict[str, dict[str, Any]]]


def _onnx_probe(model: Model) -> _Probe:
    """onnxruntime on the model, and on a copy exposing activations and Loop trip counts."""
    instrumented_proto, trips = _instrumented(model)
    instrumented = reference_session(instrumented_proto, optimize=False)
    nodes = {n.name: n for n in model.proto.graph.node}
    initializers = {i.name: i for i in model.proto.graph.initializer}

    def instrumented_run(arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
        values = {**arrays, **instrumented.run(arrays)}
        events: dict[str, Any] = {}
        for name, node in nodes.items():
            if node.op_type == "If":
                cond = values.get(node.input[0])
                if cond is None:
                    cond = numpy_helper.to_array(initializers[node.input[0]])
                events[name] = bool(np.asarray(cond).reshape(-1)[0])
            elif node.op_type == "Loop":
                events[name] = int(np.asarray(values[trips[name]]).shape[0])
            elif node.op_type == "Scan":
                events[name] = _scan_trips(node, values)
        return values, events

    return _Probe(reference_for(model), instrumented_run, lambda samples: _node_times(model, samples))


def _torch_probe(model: Model) -> _Probe:
    """The torch program run eagerly; activations, branches, trips and times from an fx interpreter."""
    reference = reference_for(model)

    def instrumented_run(arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
        values, events = reference.instrumented_run(arrays)
        return {**arrays, **values}, events

    return _Probe(reference, instrumented_run, reference.node_times)


_PROBES = {"onnx": _onnx_probe, "torch": _torch_probe}
# Control-flow ops whose observation is a branch taken; the others' is a trip count.
_BRANCH_OPS = ("If", "cond")


def _observe(model: Model, samples: list[Sample], keys: list[tuple]) -> _Observations:
    """Reference latency per shape, control-flow statistics, node times and activation ranges."""
    probe = _PROBES[model.kind](model)
    reference = probe.reference
    observed = _Observations(shape_times=defaultdict(list))
    trip_counts: dict[str, Counter] = defaultdict(Counter)
    branch_counts: dict[str, Counter] = defaultdict(Counter)
    range_counts: Counter = Counter()
    histograms = _calibrated_activations(model)

    for sample, key in zip(samples, keys):
        try:
            reference.run(sample.arrays)  # warm-up: first runs allocate
            times = [reference.timed_run(sample.arrays)[1] for _ in range(_TIMING_RUNS)]
            values, events = probe.instrumented_run(sample.arrays)
        except ModelError:
            raise
        except Exception as exc:  # the reference's own error types
            raise ModelError(f"{reference.name} failed on sample '{sample.name}': {describe(exc)}") from None
        observed.shape_times[key].append(float(np.median(times)))
        for name, value in values.items():
            found = _range_of(value) if isinstance(value, np.ndarray) and value.dtype.kind == "f" else None
            if found is not None:
                range_counts[name] += 1
                observed.ranges[name] = _merge_range(observed.ranges.get(name), found, range_counts[name])
                if name in histograms:
                    _add_to_histogram(observed.ranges[name], value)
        for name, event in events.items():
            if isinstance(event, bool):
                branch_counts[name]["then" if event else "else"] += 1
            else:
                trip_counts[name][event] += 1

    for name, op in model.control_flow:
        if op in _BRANCH_OPS:
            observed.control_flow[name] = {
                "op": op, "branches": {b: branch_counts[name][b] for b in ("then", "else")}}
        elif trip_counts[name]:
            counts = trip_counts[name]
            seen = sorted(counts.elements())
            observed.control_flow[name] = {
                "op": op,
                "trips": {str(k): counts[k] for k in sorted(counts)},
                "trip_min": seen[0], "trip_max": seen[-1],
                "trip_mean": round(float(np.mean(seen)), 3),
            }
    observed.nodes = probe.node_times(samples)
    return observed


def _scan_trips(node: onnx.NodeProto, values: dict[str, np.ndarray]) -> int:
    """A Scan's trip count: the length of its first scan input along its scan axis."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    body_inputs = len(next(a.g for a in node.attribute if a.name == "body").input)
    num_scan = int(attrs["num_scan_inputs"])
    first_scan = node.input[body_inputs - num_scan]
    axes = list(attrs.get("scan_input_axes", [0] * num_scan))
    if first_scan not in values:
        raise ModelError(f"Scan node '{node.name}': cannot observe its scan input '{first_scan}'")
    array = np.asarray(values[first_scan])
    axis = axes[0] if axes else 0
    return int(array.shape[axis % max(array.ndim, 1)])
