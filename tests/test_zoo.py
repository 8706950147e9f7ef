"""Tests of the model zoo: every model is valid ONNX, deterministic, and runs on its samples."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from edgec import zoo
from edgec.errors import EdgecError
from edgec.zoo import control_flow, digits, dynamic, light

# Light models with 60-140 M weights (240-575 MB files): each check takes seconds, so slow.
_HEAVY = {"vgg19", "zfnet512", "bvlc_alexnet"}
GENERATED = ["cnn", "transformer", "early_exit", "greedy_decoder", "moe", "scan_rnn"]
RAND = [f"{name}_rand" for name in light.light_names()]


def _param(name: str):
    base = name.removeprefix("light_").removesuffix("_rand")
    return pytest.param(name, marks=pytest.mark.slow) if base in _HEAVY else name


ALL = [_param(name) for name in zoo.names()]


@pytest.fixture(scope="module", params=ALL)
def name(request):
    """Each zoo model name; module scope makes pytest run all tests of one model together."""
    return request.param

_NP_DTYPE = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT64: np.int64,
             onnx.TensorProto.BOOL: np.bool_}


# Small caches: tests are grouped by model, and the heavy models are hundreds of MB each.
@functools.lru_cache(maxsize=2)
def _model(name: str, seed: int = 0) -> onnx.ModelProto:
    return zoo.get(name).make_model(seed)


@functools.lru_cache(maxsize=2)
def _session(name: str) -> ort.InferenceSession:
    return _make_session(_model(name))


def _make_session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _samples(name: str, count: int | None = None, seed: int = 0) -> list[dict[str, np.ndarray]]:
    entry = zoo.get(name)
    return entry.make_samples(entry.default_samples if count is None else count, seed)


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param if d.HasField("dim_param") else d.dim_value
            for d in value_info.type.tensor_type.shape.dim]


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)


def test_registry_lists_every_model_kind():
    names = zoo.names()
    assert names == sorted(names)
    for name in GENERATED:
        assert name in names
    assert len(light.light_names()) == 9
    for base in light.light_names():
        assert f"light_{base}" in names and f"{base}_rand" in names
    for name in names:
        entry = zoo.get(name)
        assert entry.name == name
        assert entry.kind in ("static", "dynamic")
        assert entry.default_samples > 0
        assert entry.description and "\n" not in entry.description
    assert zoo.get("early_exit").features == ("If", "dynamic-shape")
    assert "Loop" in zoo.get("greedy_decoder").features
    assert "Scan" in zoo.get("scan_rnn").features
    assert "NonZero" in zoo.get("moe").features


def test_unknown_name_raises_listing_known_names():
    with pytest.raises(EdgecError) as info:
        zoo.get("resnet9000")
    message = str(info.value)
    assert "resnet9000" in message
    for name in ("cnn", "transformer", "moe", "squeezenet_rand"):
        assert name in message
    with pytest.raises(EdgecError):
        zoo.export("resnet9000", "unused")


def test_model_is_valid_onnx(name):
    model = _model(name)
    onnx.checker.check_model(model, full_check=True)
    assert 4 <= model.ir_version <= 9
    opset = {o.domain: o.version for o in model.opset_import}[""]
    assert opset == (9 if "light" in name or "_rand" in name else 17)
    nodes = list(_all_nodes(model.graph))
    node_names = [n.name for n in nodes]
    assert all(node_names), "every node needs a name"
    assert len(set(node_names)) == len(node_names), "node names must be unique"
    initializers = {t.name for t in model.graph.initializer}
    assert not initializers & {i.name for i in model.graph.input}
    for value in list(model.graph.input) + list(model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            assert dim.HasField("dim_value") or dim.HasField("dim_param"), value.name
    for tensor in model.graph.initializer:
        assert tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.INT64,
                                    onnx.TensorProto.BOOL), tensor.name
    values = list(model.graph.input) + list(model.graph.output)
    dynamic_dims = any(isinstance(d, str) for v in values for d in _dims(v))
    assert dynamic_dims == (zoo.get(name).kind == "dynamic")


def test_samples_match_model_inputs(name):
    model = _model(name)
    declared = {i.name: i for i in model.graph.input}
    samples = _samples(name)
    assert len(samples) == zoo.get(name).default_samples
    for sample in samples:
        assert set(sample) == set(declared)
        sizes: dict[str, int] = {}
        for input_name, array in sample.items():
            info = declared[input_name]
            assert array.dtype == _NP_DTYPE[info.type.tensor_type.elem_type], input_name
            dims = _dims(info)
            assert array.ndim == len(dims), input_name
            for size, dim in zip(array.shape, dims):
                if isinstance(dim, str):
                    # A named dim has one size across all inputs of a sample.
                    assert sizes.setdefault(dim, size) == size, (input_name, dim)
                else:
                    assert size == dim, input_name


def test_runs_on_onnxruntime_with_finite_outputs(name):
    model = _model(name)
    session = _session(name)
    declared = [_dims(o) for o in model.graph.output]
    for sample in _samples(name):
        outputs = session.run(None, sample)
        for array, dims in zip(outputs, declared):
            assert array.ndim == len(dims)
            assert all(isinstance(d, str) or d == s for s, d in zip(array.shape, dims))
            if array.dtype.kind == "f":
                assert np.isfinite(array).all()


def _export_files(path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_export_is_deterministic_and_seeded(name, tmp_path):
    first = _export_files(zoo.export(name, tmp_path / "a", seed=0, count=2))
    second = _export_files(zoo.export(name, tmp_path / "b", seed=0, count=2))
    other = _export_files(zoo.export(name, tmp_path / "c", seed=1, count=2))
    assert sorted(first) == ["model.onnx", "samples/sample_000.npz", "samples/sample_001.npz"]
    assert first == second
    # Shipped models and trained ones (digits) have no seed-dependent part.
    generated = not name.startswith("light_") and "trained" not in zoo.get(name).features
    assert (first["model.onnx"] != other["model.onnx"]) == generated
    assert first["samples/sample_000.npz"] != other["samples/sample_000.npz"]
    exported = onnx.load_from_string(first["model.onnx"])
    with np.load(tmp_path / "a" / "samples" / "sample_001.npz") as loaded:
        expected = _samples(name, 2)[1]
        assert sorted(loaded.files) == sorted(i.name for i in exported.graph.input)
        for key, array in expected.items():
            assert loaded[key].dtype == array.dtype
            np.testing.assert_array_equal(loaded[key], array)


def test_export_defaults_and_leaves_no_partial_or_stale_files(tmp_path):
    out = zoo.export("scan_rnn", tmp_path / "m")
    assert out == tmp_path / "m"
    samples = sorted(p.name for p in (out / "samples").iterdir())
    assert samples == [f"sample_{i:03d}.npz" for i in range(zoo.get("scan_rnn").default_samples)]
    zoo.export("scan_rnn", str(out), count=3)
    names = sorted(p.name for p in out.rglob("*"))
    assert names == ["model.onnx", "sample_000.npz", "sample_001.npz", "sample_002.npz",
                     "samples"]
    with pytest.raises(EdgecError):
        zoo.export("scan_rnn", out, count=-1)
    (tmp_path / "file").write_text("x")
    with pytest.raises(EdgecError):
        zoo.export("scan_rnn", tmp_path / "file" / "sub")


@pytest.mark.parametrize("base", [_param(n) for n in light.light_names()])
def test_light_model_matches_shipped_output(base):
    reference = onnx.TensorProto()
    with open(light.light_path(base, "_output_0.pb"), "rb") as f:
        reference.ParseFromString(f.read())
    (output,) = _session(f"light_{base}").run(None, _samples(f"light_{base}", 1)[0])
    np.testing.assert_allclose(output, numpy_helper.to_array(reference), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("rand_name", [_param(n) for n in RAND])
def test_rand_weights_replace_constants_and_outputs_vary(rand_name):
    model = _model(rand_name)
    assert not [n for n in model.graph.node if n.op_type == "ConstantOfShape"]
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer
               if t.data_type == onnx.TensorProto.FLOAT]
    assert sum(w.size for w in weights) > 1_000_000
    # Every weight tensor is random, none a constant fill.
    assert all(w.size == 1 or w.min() < w.max() for w in weights)
    outputs = np.stack([_session(rand_name).run(None, s)[0].ravel()
                        for s in _samples(rand_name)])
    assert np.isfinite(outputs).all()
    assert outputs.std(axis=1).min() > 1e-4, "output is constant within a sample"
    spread = outputs.std(axis=0).mean() / np.abs(outputs).mean()
    assert spread > 0.05, "outputs barely change between samples"


def test_cnn_logits_differ_between_images():
    outputs = np.stack([_session("cnn").run(None, s)[0] for s in _samples("cnn")])
    assert outputs.shape == (8, 1, 10)
    assert outputs.std(axis=0).mean() > 1e-3


def _exit_flags(samples) -> list[bool]:
    model = onnx.ModelProto.FromString(_model("early_exit").SerializeToString())
    (if_node,) = [n for n in model.graph.node if n.op_type == "If"]
    model.graph.output.append(helper.make_tensor_value_info(if_node.input[0],
                                                            onnx.TensorProto.BOOL, []))
    session = _make_session(model)
    return [bool(session.run(None, s)[1]) for s in samples]


def test_early_exit_samples_take_both_branches():
    flags = _exit_flags(_samples("early_exit"))
    assert any(flags) and not all(flags)
    # Calibrated for about 70% early exits; 120 fresh samples keep the estimate within ~0.1.
    rate = np.mean(_exit_flags(_samples("early_exit", 120, seed=7)))
    assert 0.55 <= rate <= 0.85, rate


def test_early_exit_branches_compute_different_heads():
    model = _model("early_exit")
    (if_node,) = [n for n in model.graph.node if n.op_type == "If"]
    branches = {a.name: a.g for a in if_node.attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["Identity"]
    assert {"Conv", "Gemm"} <= {n.op_type for n in branches["else_branch"].node}
    batches = {s["image"].shape[0] for s in _samples("early_exit", 40)}
    assert 1 in batches and len(batches) > 1


def test_greedy_decoder_trip_counts_vary():
    session = _session("greedy_decoder")
    steps, hit_limit, ended = [], 0, 0
    for sample in _samples("greedy_decoder"):
        assert sample["max_len"].shape == () and sample["max_len"].dtype == np.int64
        tokens, final_state = session.run(None, sample)
        assert tokens.dtype == np.int64 and tokens.ndim == 1 and final_state.shape == (1, 64)
        assert 1 <= len(tokens) <= sample["max_len"]
        # The loop stops at the first end token, so only the last token may be one.
        assert control_flow.END_ID not in tokens[:-1]
        steps.append(len(tokens))
        ended += int(tokens[-1] == control_flow.END_ID)
        hit_limit += int(len(tokens) == sample["max_len"] and tokens[-1] != control_flow.END_ID)
    assert len(set(steps)) >= 4, steps
    assert ended > hit_limit > 0, (ended, hit_limit)
    assert np.median(steps) < 16 < max(steps), steps


def test_transformer_padding_is_masked():
    session = _session("transformer")
    padded = next(s for s in _samples("transformer")
                  if s["input_ids"].shape[0] > 1 and s["attention_mask"].min() == 0)
    (hidden,) = session.run(None, padded)
    for row in range(padded["input_ids"].shape[0]):
        length = int(padded["attention_mask"][row].sum())
        alone = {"input_ids": padded["input_ids"][row:row + 1, :length],
                 "attention_mask": padded["attention_mask"][row:row + 1, :length]}
        (expected,) = session.run(None, alone)
        np.testing.assert_allclose(hidden[row:row + 1, :length], expected, atol=1e-4)


def test_transformer_sample_shapes_are_skewed():
    samples = _samples("transformer")
    seqs = [s["input_ids"].shape[1] for s in samples]
    batches = [s["input_ids"].shape[0] for s in samples]
    assert all(4 <= n <= 128 and n % 8 == 0 for n in seqs)
    assert np.median(seqs) <= 24 < max(seqs)
    assert batches.count(1) > len(batches) / 2 and max(batches) > 1
    for s in samples:
        assert s["attention_mask"][:, 0].all() and set(np.unique(s["attention_mask"])) <= {0, 1}


def _initializers(name: str) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in _model(name).graph.initializer}


def test_moe_matches_numpy_reference():
    w = _initializers("moe")
    session = _session("moe")
    loads = np.zeros(dynamic.EXPERTS)
    for sample in _samples("moe"):
        x = sample["x"].astype(np.float64)
        logits = x @ w["router.w"] + w["router.b"]
        probs = np.exp(logits - logits.max(1, keepdims=True))
        probs /= probs.sum(1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :dynamic.TOP_K]
        gates = np.take_along_axis(probs, top, 1)
        gates /= gates.sum(1, keepdims=True)
        expected = np.zeros_like(x)
        for e in range(dynamic.EXPERTS):
            h = np.maximum(x @ w[f"expert{e}.fc1.w"] + w[f"expert{e}.fc1.b"], 0)
            out = h @ w[f"expert{e}.fc2.w"] + w[f"expert{e}.fc2.b"]
            gate = (gates * (top == e)).sum(1, keepdims=True)
            expected += gate * out
            loads[e] += (top == e).any(1).sum()
        (y,) = session.run(None, sample)
        np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4)
    # Routing is imbalanced: the busiest expert gets clearly more tokens than the idlest.
    assert loads.max() > 1.5 * loads.min(), loads
    assert len({s["x"].shape[0] for s in _samples("moe")}) > 4


def test_scan_rnn_matches_numpy_reference():
    w = _initializers("scan_rnn")
    session = _session("scan_rnn")
    lengths = []
    for sample in _samples("scan_rnn"):
        state = w["rnn.h0"].astype(np.float64)
        expected = []
        for x_t in sample["x"]:
            state = np.tanh(x_t @ w["rnn.w_in"] + state @ w["rnn.w_rec"] + w["rnn.bias"])
            expected.append(state)
        states, last = session.run(None, sample)
        np.testing.assert_allclose(states, np.stack(expected), atol=1e-5)
        np.testing.assert_allclose(last, expected[-1], atol=1e-5)
        lengths.append(len(sample["x"]))
    assert np.median(lengths) < 20 and len(set(lengths)) > 5


# ---------------------------------------------------------------------------------------------
# digits: a classifier with trained weights


def test_digits_split_is_fixed_disjoint_and_covers_every_class():
    train_x, train_y = digits.split("train")
    held_x, held_y = digits.split("held_out")
    assert train_x.shape == (1437, 1, 8, 8) and held_x.shape == (360, 1, 8, 8)
    assert train_x.dtype == np.float32 and 0.0 <= train_x.min() and train_x.max() <= 1.0
    assert set(held_y.tolist()) == set(range(10)) == set(train_y.tolist())
    train_rows = {row.tobytes() for row in train_x}
    # The UCI set has a few duplicate images; almost all held-out images are unseen.
    assert sum(row.tobytes() in train_rows for row in held_x) <= 5
    np.testing.assert_array_equal(digits.split("held_out")[1], held_y)


def test_digits_weights_are_plain_arrays_without_subnormals():
    with np.load(digits.WEIGHTS_FILE, allow_pickle=False) as weights:
        assert sorted(weights.files) == sorted(
            [f"{n}.{p}" for n, _, _ in digits.CONVS for p in "wb"] + ["head.w", "head.b"])
        for key in weights.files:
            array = weights[key]
            assert array.dtype == np.float32 and np.isfinite(array).all()
            tiny = np.finfo(np.float32).tiny
            assert not ((np.abs(array) < tiny) & (array != 0)).any(), key


def test_digits_held_out_accuracy_with_onnxruntime():
    session = _make_session(_model("digits"))
    correct = total = 0
    for inputs, labels in digits.held_out_batches():
        logits = session.run(None, inputs)[0]
        correct += int((logits.argmax(-1) == labels).sum())
        total += len(labels)
    assert total == digits.HELD_OUT
    assert correct / total >= 0.97  # 353/360 = 0.9806 when trained


def test_digits_samples_come_from_the_training_split_and_export_held_out(tmp_path):
    train_rows = {row.tobytes() for row in digits.split("train")[0]}
    for sample in _samples("digits", 3):
        assert sample["image"].shape == (digits.BATCH, 1, 8, 8)
        assert all(row.tobytes() in train_rows for row in sample["image"])
    folder, labels = digits.export_held_out(tmp_path / "held")
    files = sorted(folder.glob("held_out_*.npz"))
    assert len(files) == -(-digits.HELD_OUT // digits.BATCH) and len(labels) == digits.HELD_OUT
    with np.load(files[0]) as first:
        np.testing.assert_array_equal(first["image"], digits.held_out_batches()[0][0]["image"])


@pytest.mark.slow
def test_digits_int8_static_keeps_held_out_accuracy_within_a_point(tmp_path):
    from edgec.stages.build import build
    from edgec.core.model import from_proto
    from edgec.stages.plan import plan
    from edgec.stages.profile import profile
    from edgec.driver import build_guarded
    from edgec.stages.quantize import QuantizeSettings, quantize
    from edgec.runtime import load
    from edgec.core.samples import Sample
    from edgec.core.targets import load_target

    model = from_proto(_model("digits"), "digits")
    target = load_target("x86_64")
    samples = [Sample(f"s{i}", s) for i, s in enumerate(_samples("digits", 8))]
    batches = digits.held_out_batches()
    held_out = [Sample(f"h{i}", inputs) for i, (inputs, _) in enumerate(batches)]
    prof = profile(model, samples)
    the_plan = plan(model, prof, target)
    quant = quantize(model, prof, target, QuantizeSettings("int8-static", 0.01), held_out)
    accuracies = {}
    for name, artifact in (("fp32", build(model, the_plan, [target])),
                           ("int8", build_guarded(model, the_plan, [target], quant, held_out)[0])):
        compiled = load(artifact.save(tmp_path / f"{name}.edgec"))
        hits = [compiled.run(inputs)["logits"].argmax(-1) == labels for inputs, labels in batches]
        accuracies[name] = float(np.mean(np.concatenate(hits)))
    assert quant.active
    assert accuracies["fp32"] >= 0.97
    assert abs(accuracies["fp32"] - accuracies["int8"]) <= 0.01


@pytest.mark.parametrize("name, low, high", [("cnn_batch", 1, 16), ("token_tagger", 4, 64),
                                             ("prompt_encoder", 4, 96)])
def test_bucketed_models_see_many_shapes(name, low, high):
    # As collect samples them (twice the default count): many distinct sizes of the dynamic dim.
    samples = _samples(name, zoo.get(name).default_samples * 2)
    sizes = [next(iter(s.values())).shape[0 if name == "cnn_batch" else 1] for s in samples]
    assert all(low <= n <= high for n in sizes) and len(set(sizes)) >= 6
    shares = sorted((sizes.count(n) / len(sizes) for n in set(sizes)), reverse=True)
    if name == "token_tagger":
        assert shares[0] < 0.1  # no length reaches specialize-seen's 10%
    if name == "cnn_batch":
        assert shares[0] < 0.4
    if name == "prompt_encoder":
        from edgec.zoo import bucketed

        assert set(bucketed.PROMPT_TEMPLATES) <= set(sizes)
