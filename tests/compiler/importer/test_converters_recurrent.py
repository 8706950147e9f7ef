"""ONNX LSTM, GRU and RNN (compiler/recurrent.py), both ways they compile: as a Scan, and as
edgec's native loop (edgec_recurrent, CPU targets). Checked against onnxruntime over their
attributes, with symbolic sequence and batch dims, and end to end through edgec."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from compiler.importer.test_converters_control_flow import _outputs, model, vi
from tvm import relax

from edgec import runtime
from edgec.stages.build import build
from edgec.compiler.pipeline import import_model
from edgec.errors import ModelError
from edgec.core.model import from_proto
from edgec.stages.plan import plan
from edgec.stages.profile import profile
from edgec.core.samples import Sample
from edgec.core.targets import load_target

F = TensorProto.FLOAT
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def recurrent(op: str, *, hidden=5, features=3, directions=1, weights_as_inputs=False,
              bias=True, lens=False, initial=False, peepholes=False, layout=0, outputs=None,
              seed=0, opset=17, scale=0.5, **attrs) -> onnx.ModelProto:
    """One ``op`` node over X [seq, batch, features] (symbolic seq and batch; [batch, seq, ...]
    with layout 1). Weights are initializers unless ``weights_as_inputs``; W and R have standard
    deviation ``scale``."""
    rng = np.random.default_rng(seed)
    gates = GATES[op]
    arrays = {"W": rng.standard_normal((directions, gates * hidden, features)) * scale,
              "R": rng.standard_normal((directions, gates * hidden, hidden)) * scale}
    if bias:
        arrays["B"] = rng.standard_normal((directions, 2 * gates * hidden)) * 0.3
    if peepholes:
        arrays["P"] = rng.standard_normal((directions, 3 * hidden)) * 0.3
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    batch_first = bool(layout)
    x_shape = ["batch", "seq", features] if batch_first else ["seq", "batch", features]
    state_shape = ["batch", directions, hidden] if batch_first else [directions, "batch", hidden]
    inputs = [vi("X", F, x_shape)]
    names = ["X", "W", "R", "B" if bias else ""]
    names.append("lens" if lens else "")
    if lens:
        inputs.append(vi("lens", TensorProto.INT32, ["batch"]))
    names.append("h0" if initial else "")
    if initial:
        inputs.append(vi("h0", F, state_shape))
    if op == "LSTM":
        names.append("c0" if initial else "")
        if initial:
            inputs.append(vi("c0", F, state_shape))
        names.append("P" if peepholes else "")
    while names and not names[-1]:
        names.pop()
    initializers = []
    for key, value in arrays.items():
        if weights_as_inputs:
            inputs.append(vi(key, F, list(value.shape)))
        else:
            initializers.append(numpy_helper.from_array(value, key))
    y_shape = (["batch", "seq", directions, hidden] if batch_first
               else ["seq", directions, "batch", hidden])
    out_specs = {"Y": y_shape, "Y_h": state_shape, "Y_c": state_shape}
    wanted = outputs or (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])
    node_outputs = [o if o in wanted else "" for o in ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]]
    while node_outputs and not node_outputs[-1]:
        node_outputs.pop()
    if layout:
        attrs["layout"] = 1
    if directions == 2:
        attrs.setdefault("direction", "bidirectional")
    node = helper.make_node(op, names, node_outputs, name="rec", hidden_size=hidden, **attrs)
    proto = model([node], inputs, [vi(o, F, out_specs[o]) for o in wanted], initializers, opset=opset)
    proto.graph.name = f"{op.lower()}_test"
    return proto, arrays


def feed(proto, arrays, seq, batch, seed=1, lens=None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for value in proto.graph.input:
        dims = [d.dim_value or {"seq": seq, "batch": batch}[d.dim_param]
                for d in value.type.tensor_type.shape.dim]
        if value.name == "lens":
            out["lens"] = np.asarray(lens, np.int32)
        elif value.name in arrays:
            out[value.name] = arrays[value.name]
        else:
            out[value.name] = rng.standard_normal(dims).astype(np.float32)
    return out


CASES = [
    ("LSTM", {}),
    ("LSTM", {"directions": 2, "initial": True, "peepholes": True}),
    ("LSTM", {"direction": "reverse", "clip": 0.7, "input_forget": 1}),
    ("LSTM", {"layout": 1, "initial": True, "outputs": ["Y_c"]}),
    ("LSTM", {"activations": ["HardSigmoid", "LeakyRelu", "ScaledTanh"],
              "activation_alpha": [0.3, 0.05, 0.9], "activation_beta": [0.4, 1.1], "bias": False}),
    ("GRU", {}),
    ("GRU", {"linear_before_reset": 1, "directions": 2}),
    ("GRU", {"direction": "reverse", "initial": True, "clip": 1.5, "layout": 1}),
    ("GRU", {"activations": ["Sigmoid", "Softsign", "HardSigmoid", "Elu"],
             "activation_alpha": [0.25, 0.8], "activation_beta": [0.45], "directions": 2,
             "linear_before_reset": 1}),
    ("RNN", {}),
    ("RNN", {"directions": 2, "initial": True, "outputs": ["Y_h"]}),
    ("RNN", {"activations": ["Relu"], "weights_as_inputs": True, "opset": 11}),
]


def seq_major(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with its layout-1 node made layout 0 between transposes: onnxruntime has no
    batch-major recurrent layers, so this is what it checks them against."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    node = proto.graph.node[0]
    if not any(a.name == "layout" and a.i for a in node.attribute):
        return proto
    kept = [a for a in node.attribute if a.name != "layout"]
    del node.attribute[:]
    node.attribute.extend(kept)
    before, after = [], []
    for k, name in enumerate(node.input):
        if name in ("X", "h0", "c0"):
            before.append(helper.make_node("Transpose", [name], [name + "_t"], perm=[1, 0, 2]))
            node.input[k] = name + "_t"
    for k, name in enumerate(node.output):
        if name:
            perm = [2, 0, 1, 3] if k == 0 else [1, 0, 2]
            after.append(helper.make_node("Transpose", [name + "_t"], [name], perm=perm))
            node.output[k] = name + "_t"
    nodes = before + [node] + after
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return proto


def run_scan(proto: onnx.ModelProto, feeds) -> list[list[np.ndarray]]:
    """The Scan form, compiled by TVM alone."""
    mod = import_model(from_proto(proto, "recurrent_scan"), native_loops=False)
    vm = relax.VirtualMachine(tvm.compile(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    names = [value.name for value in proto.graph.input]
    return [_outputs(vm["main"](*[tvm.runtime.tensor(feed[n]) for n in names])) for feed in feeds]


def run_edgec(proto: onnx.ModelProto, feeds, tmp_path) -> tuple[list[list[np.ndarray]], dict]:
    """Through edgec's pipeline for the host (the native loop where the layer allows): the
    outputs and the artifact's library manifest."""
    model_ = from_proto(proto, "recurrent_native")
    samples = [Sample(f"s{k}", feed) for k, feed in enumerate(feeds)]
    target = load_target("x86_64")
    path = build(model_, plan(model_, profile(model_, samples), target), [target]).save(
        tmp_path / "recurrent.edgec")
    loaded = runtime.load(path)
    names = [value.name for value in proto.graph.output]
    return ([[loaded.run(feed)[n] for n in names] for feed in feeds],
            loaded.manifest["libraries"]["x86_64"])


def check(proto: onnx.ModelProto, feeds, tmp_path, native: bool) -> None:
    """Both forms' outputs against onnxruntime's for each feed; ``native``: whether the layer
    should have compiled to the native loop."""
    session = ort.InferenceSession(seq_major(proto).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    expected = [session.run(None, feed) for feed in feeds]
    edgec_outputs, library = run_edgec(proto, feeds, tmp_path)
    assert ("edgec_recurrent" in library["linked_functions"]) == native
    for form, outputs in (("scan", run_scan(proto, feeds)), ("edgec", edgec_outputs)):
        for got, want in zip(outputs, expected):
            assert len(got) == len(want)
            for index, (g, e) in enumerate(zip(got, want)):
                assert g.shape == e.shape, f"{form} output {index}: shape {g.shape} != {e.shape}"
                np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5, err_msg=f"{form} output {index}")


@pytest.mark.parametrize("op,options", CASES, ids=lambda v: v if isinstance(v, str) else
                         "-".join(f"{k}={v}" for k, v in v.items()) or "defaults")
def test_matches_onnxruntime_at_several_shapes(op, options, tmp_path):
    proto, arrays = recurrent(op, **options)
    native = "activations" not in options or options["activations"] == ["Relu"]
    check(proto, [feed(proto, arrays, seq, batch, seed=seq) for seq, batch in ((4, 1), (7, 3), (1, 2))],
          tmp_path, native)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("directions", [1, 2])
def test_sequence_lens_leave_state_alone_past_each_rows_length(op, directions, tmp_path):
    proto, arrays = recurrent(op, directions=directions, lens=True, initial=True, layout=directions - 1)
    check(proto, [feed(proto, arrays, 6, 3, lens=[6, 2, 4]), feed(proto, arrays, 5, 2, lens=[1, 5])],
          tmp_path, True)


@pytest.mark.parametrize("op,options", [("LSTM", {"peepholes": True}), ("GRU", {}),
                                        ("GRU", {"linear_before_reset": 1}), ("RNN", {})],
                         ids=["LSTM", "GRU", "GRU-linear_before_reset", "RNN"])
def test_layers_wide_enough_to_share_their_steps_over_threads_match_onnxruntime(op, options, tmp_path):
    """Hidden 136 over 4 rows is enough work per step (at least kParallelStepWork multiply-adds,
    the RNN's too) for the native loop to split the hidden units over OpenMP's threads (two
    slices of unequal size here), meeting at barriers. R is scaled so the state does not amplify
    float32 rounding step after step (at the other tests' scale an RNN this wide is chaotic: any
    two summation orders part by 2e-5 in 7 steps)."""
    proto, arrays = recurrent(op, hidden=136, features=8, directions=2, lens=True, initial=True,
                              scale=0.07, **options)
    check(proto, [feed(proto, arrays, 7, 4, lens=[7, 3, 5, 1]), feed(proto, arrays, 3, 4, lens=[3, 3, 3, 3])],
          tmp_path, True)


def test_what_the_rewrite_cannot_express_is_a_one_line_model_error():
    proto, _ = recurrent("LSTM", activations=["Sigmoid", "Gelu", "Tanh"])
    with pytest.raises(ModelError, match="activation 'Gelu'"):
        import_model(from_proto(proto, "bad_activation"))
    proto, _ = recurrent("GRU", activations=["Sigmoid"])
    with pytest.raises(ModelError, match="lists 1 activations; it needs 2 per direction"):
        import_model(from_proto(proto, "few_activations"))


@pytest.mark.slow
def test_lstm_tagger_end_to_end_with_library_dispatch(tmp_path):
    """A two-layer LSTM (the second bidirectional) compiled by edgec for the host with its
    default routes, run by the Python runtime at profiled and unseen lengths."""
    rng = np.random.default_rng(3)
    hidden, features = 16, 8

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [weight("W1", 1, 4 * hidden, features), weight("R1", 1, 4 * hidden, hidden),
             weight("B1", 1, 8 * hidden), weight("W2", 2, 4 * hidden, hidden),
             weight("R2", 2, 4 * hidden, hidden), weight("B2", 2, 8 * hidden)]
    nodes = [helper.make_node("LSTM", ["X", "W1", "R1", "B1"], ["Y1"], hidden_size=hidden),
             helper.make_node("Squeeze", ["Y1", "axis1"], ["S1"]),
             helper.make_node("LSTM", ["S1", "W2", "R2", "B2"], ["Y2", "H2"], hidden_size=hidden,
                              direction="bidirectional")]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis1"))
    proto = model(nodes, [vi("X", F, ["seq", 1, features])],
                  [vi("Y2", F, ["seq", 2, 1, hidden]), vi("H2", F, [2, 1, hidden])], inits)
    path = tmp_path / "tagger.onnx"
    onnx.save(proto, str(path))
    edgec_model = from_proto(proto, "lstm_tagger", str(path))
    seen = [Sample(f"s{n}", {"X": rng.standard_normal((n, 1, features)).astype(np.float32)})
            for n in (3, 5, 5, 9)]
    target = load_target("x86_64")
    artifact = build(edgec_model, plan(edgec_model, profile(edgec_model, seen), target), [target])
    artifact.save(tmp_path / "tagger.edgec")
    loaded = runtime.load(tmp_path / "tagger.edgec")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (5, 9, 17, 1):
        x = {"X": rng.standard_normal((n, 1, features)).astype(np.float32)}
        got, expected = loaded.run(x), session.run(None, x)
        for name, want in zip(("Y2", "H2"), expected):
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"{name} at seq {n}")


def test_cost_model_features_price_a_native_loop_apart_from_a_scan():
    from edgec.costmodel.features import region_features
    from edgec.core.regions import cut_regions

    proto, _ = recurrent("LSTM", hidden=8, features=6, directions=2, layout=1)
    lstm = from_proto(proto, "lstm_features")
    cut = cut_regions(lstm)[0]
    dims = {"seq": 10, "batch": 3}
    native = region_features(lstm, cut, dims, "symbolic", load_target("x86_64"))
    scan = region_features(lstm, cut, dims, "symbolic", load_target("cuda-sm90"))
    # Per step and batch row, 2 directions x 32 gate rows x (6 inputs + 8 hidden) multiply-adds;
    # the input part is one library matmul before the loop either way.
    for feats in (native, scan):
        assert 10 ** feats["log_flops"] - 1 == pytest.approx(2 * 10 * 3 * 2 * 32 * 14, rel=1e-4)
        assert 10 ** feats["log_library_flops"] - 1 == pytest.approx(2 * 10 * 3 * 2 * 32 * 6, rel=1e-4)
        assert feats["frac_matmul"] == 1
    # On a CPU the steps run in edgec's native loop: one call, its matrix-vector work priced apart.
    assert 10 ** native["log_recurrent_flops"] - 1 == pytest.approx(2 * 10 * 3 * 2 * 32 * 8, rel=1e-4)
    assert native["log_trips"] == 0 and native["control_flow"] == 0
    # On a GPU they run as a Scan: a loop of 10 trips.
    assert scan["log_recurrent_flops"] == 0
    assert 10 ** scan["log_trips"] - 1 == pytest.approx(10) and scan["control_flow"] == 1


def test_a_recurrent_layer_inside_nested_ifs_is_rewritten_too(tmp_path):
    """Every rewrite reaches subgraphs at any depth: an LSTM in an If in an If imports."""
    import edgec
    from edgec.core.reference import reference_session
    from edgec.core.samples import Sample

    rng = np.random.default_rng(3)
    hidden, width = 8, 4
    inits = [numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, width)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((1, 4 * hidden, hidden)).astype(np.float32), "R"),
             numpy_helper.from_array(np.array([1], np.int64), "one")]
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, ["s", 1, hidden])  # noqa: E731
    lstm = helper.make_graph([helper.make_node("LSTM", ["x", "W", "R"], ["y4"], hidden_size=hidden),
                              helper.make_node("Squeeze", ["y4", "one"], ["t2"])], "t2", [], [out("t2")])
    zero = helper.make_graph([helper.make_node("Mul", ["x8", "x8"], ["e2"])], "e2", [], [out("e2")])
    inner = helper.make_node("If", ["c2"], ["inner"], then_branch=lstm, else_branch=zero)
    then1 = helper.make_graph([inner, helper.make_node("Identity", ["inner"], ["t1"])], "t1", [], [out("t1")])
    else1 = helper.make_graph([helper.make_node("Neg", ["x8"], ["e1"])], "e1", [], [out("e1")])
    graph = helper.make_graph(
        [helper.make_node("Tile", ["x", "tiles"], ["x8"]),
         helper.make_node("If", ["c1"], ["y"], then_branch=then1, else_branch=else1)], "nested",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["s", 1, width]),
         helper.make_tensor_value_info("c1", TensorProto.BOOL, []),
         helper.make_tensor_value_info("c2", TensorProto.BOOL, [])], [out("y")],
        inits + [numpy_helper.from_array(np.array([1, 1, 2], np.int64), "tiles")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((n, 1, width)).astype(np.float32),
                                "c1": np.array(True), "c2": np.array(True)})
               for i, n in enumerate([5, 3])]
    compiled = edgec.compile(from_proto(proto, "nested"), samples)
    loaded = runtime.load(compiled.artifact.save(tmp_path / "nested.edgec"))
    reference = reference_session(proto)
    for sample in samples:
        np.testing.assert_allclose(loaded.run(sample.arrays)["y"], reference.run(sample.arrays)["y"],
                                   rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_threads_giving_up_on_a_busy_machine_keep_the_outputs_bit_for_bit(op, tmp_path):
    """Beside as many CPU-bound processes as cores, a task of the threaded loop is descheduled
    and its partner waits at the step's barrier: the tasks then hand the remaining steps to one
    thread (runtime_kernels.cc, kSlowBarrierNs). Whenever that happens, each element still sums
    the same products in the same order, so every call's outputs equal a quiet call's exactly."""
    import os

    from edgec.core.busy import busy_processes

    proto, arrays = recurrent(op, hidden=136, features=8, lens=True, initial=True, scale=0.07)
    feeds = [feed(proto, arrays, 40, 4, lens=[40, 31, 17, 40])]
    run_edgec(proto, feeds, tmp_path)
    loaded = runtime.load(tmp_path / "recurrent.edgec", threads=2)
    quiet = loaded.run(feeds[0])
    with busy_processes(os.cpu_count() or 2):
        for _ in range(60):
            for name, value in loaded.run(feeds[0]).items():
                np.testing.assert_array_equal(value, quiet[name], err_msg=name)
