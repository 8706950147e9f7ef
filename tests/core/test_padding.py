"""Padding to buckets: the proof (edgec.core.padding), the dispatch that pads and slices
(compiler.dispatch), and the plan that uses it only where it is proved and checked."""

import tempfile
from pathlib import Path

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax, tirx

from edgec import runtime
from edgec.core import padding
from edgec.stages.build import build
from edgec.compiler.transform.shape_dispatch import PadSpec, add_shape_dispatch
from edgec.core.model import from_proto
from edgec.stages.plan import Plan, PlanSettings, plan
from edgec.stages.profile import profile
from edgec.core.reference import reference_session
from edgec.core.samples import Sample
from edgec.core.targets import load_target
from edgec.zoo import bucketed

TARGET = load_target("x86_64")


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _seq_model(op_nodes):
    """x[1, seq, 8] -> op_nodes -> y."""
    return _model(op_nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", 8])])


def test_zoo_models_pad_along_their_dynamic_dim():
    proof = padding.prove(bucketed.make_cnn_batch(0), "batch", {}, 2, 5)
    assert proof.safe, proof.reason
    assert proof.inputs == {"images": [0]} and proof.outputs == {"logits": [0]}
    proof = padding.prove(bucketed.make_token_tagger(0), "seq", {}, 7, 20)
    assert proof.safe, proof.reason
    assert proof.inputs == {"input_ids": [1]} and proof.outputs == {"tag_logits": [1]}


def test_transformer_pads_batch_but_not_seq():
    # Its position ids are a Slice up to a length read from the input's shape: ONNX inference
    # leaves them untyped, onnxruntime types them. Nothing mixes across the batch; the attention
    # softmax mixes tokens.
    from edgec.zoo import dynamic

    model = dynamic.make_transformer(0)
    batch = padding.prove(model, "batch", {"seq": 16}, 1, 4)
    assert batch.safe, batch.reason
    assert batch.inputs == {"input_ids": [0], "attention_mask": [0]} and batch.outputs == {"hidden": [0]}
    seq = padding.prove(model, "seq", {"batch": 1}, 8, 16)
    assert not seq.safe and "(Softmax) works along an axis carrying seq" in seq.reason


@pytest.mark.parametrize("nodes, initializers, refusal", [
    ([helper.make_node("Softmax", ["x"], ["y"], name="attn", axis=1)], [], "'attn' (Softmax) works"),
    ([helper.make_node("ReduceMean", ["x"], ["y"], name="pool", axes=[1])], [], "'pool' (ReduceMean) reduces"),
    ([helper.make_node("Transpose", ["x"], ["t"], name="t", perm=[0, 2, 1]),
      helper.make_node("MatMul", ["t", "x"], ["y"], name="gram")], [], "'gram' (MatMul) contracts"),
    ([helper.make_node("Reshape", ["x", "flat"], ["y"], name="merge")],
     [numpy_helper.from_array(np.array([1, -1], np.int64), "flat")], "'merge' (Reshape) merges"),
    # A mean over the sequence written by hand: the length read from the shape is used as data.
    ([helper.make_node("ReduceSum", ["x", "ax"], ["s"], name="sum", keepdims=1),
      helper.make_node("Shape", ["x"], ["shape"], name="shape"),
      helper.make_node("Gather", ["shape", "one"], ["n"], name="n", axis=0),
      helper.make_node("Cast", ["n"], ["nf"], name="nf", to=TensorProto.FLOAT),
      helper.make_node("Div", ["x", "nf"], ["y"], name="scale")],
     [numpy_helper.from_array(np.array([2], np.int64), "ax"),
      numpy_helper.from_array(np.array(1, np.int64), "one")], "computed from seq's size, as data"),
])
def test_ops_that_mix_positions_refuse_the_proof(nodes, initializers, refusal):
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    proof = padding.prove(model, "seq", {}, 4, 9)
    assert not proof.safe
    assert refusal in proof.reason


def test_a_prefix_slice_and_a_kept_axis_reshape_are_safe():
    model = _model(
        [helper.make_node("Reshape", ["x", "split"], ["r"], name="heads"),
         helper.make_node("Slice", ["r", "zero", "big", "axis1"], ["y"], name="prefix")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([1, -1, 2, 4], np.int64), "split"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([1000], np.int64), "big"),
         numpy_helper.from_array(np.array([1], np.int64), "axis1")])
    proof = padding.prove(model, "seq", {}, 4, 9)
    assert proof.safe, proof.reason
    assert proof.outputs == {"y": [1]}


def test_dispatch_pads_to_the_least_bucket_and_slices_back():
    n = tirx.Var("n", "int64")
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, 4], "float32"))
    with builder.function("main", [x]):
        out = builder.emit(relax.op.multiply(x, relax.const(2.0, "float32")))
        builder.emit_func_output(out)
    spec = PadSpec(["n"], [[(0, "n")]], [[(0, "n")]])
    mod = add_shape_dispatch(builder.get(), [{"n": 8}, {"n": 4}], padding=spec, exact_dispatch=True)
    text = mod["main"].script()
    assert "concat" in text and "strided_slice" in text
    assert "concat" not in mod["exact"].script()
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    for rows in (3, 4, 6, 8, 11):
        a = np.arange(rows * 4, dtype="float32").reshape(rows, 4)
        got = vm["main"](tvm.runtime.tensor(a)).numpy()
        assert got.shape == (rows, 4) and np.array_equal(got, 2 * a)


def _tagger_case():
    model = from_proto(bucketed.make_token_tagger(0), "token_tagger")
    samples = [Sample(f"s{i}", a) for i, a in enumerate(bucketed.token_tagger_samples(16, 0))]
    return model, samples, profile(model, samples)


def test_plan_pads_where_proved_and_outputs_match_onnxruntime_on_unseen_shapes():
    model, samples, prof = _tagger_case()
    lengths = sorted({s.arrays["input_ids"].shape[1] for s in samples})

    # A latency table on which static copies are 10x faster: buckets pay.
    def measured(index, option, dims, bucket=None):
        seq = (bucket or dims)["seq"]
        return seq * (0.1 if option in ("specialized", "padded") else 1.0)

    the_plan = plan(model, prof, TARGET, PlanSettings("oracle", 2), measured=measured,
                    samples=samples)
    region = the_plan.regions[0]
    assert region.padding["used"] and region.padding["dims"] == ["seq"]
    assert region.specializations[0]["dims"] == {"seq": lengths[-1]}
    explained = the_plan.explain()
    assert "padded to buckets" in explained and "padding seq: padded (proved safe: " in explained

    artifact = build(model, the_plan, [TARGET])
    main = artifact.manifest["libraries"][TARGET.name]["functions"][0]
    assert main["name"] == "main" and main["pads"] == ["seq"]
    reference = reference_session(model.proto)
    unseen = [n for n in range(3, lengths[-1] + 1) if n not in lengths][:4] + [lengths[-1] + 5]
    with tempfile.TemporaryDirectory() as tmp:
        compiled = runtime.load(artifact.save(Path(tmp) / "t.edgec"), target=TARGET.name)
        for length in unseen:
            ids = (np.arange(length, dtype=np.int64) * 7 % bucketed.TAGGER_VOCAB)[None, :]
            got = compiled.run({"input_ids": ids})
            got = got["tag_logits"] if isinstance(got, dict) else got
            expected = reference.run({"input_ids": ids})["tag_logits"]
            assert np.asarray(got).shape == expected.shape
            np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-5)


def test_explain_says_a_proved_padding_was_not_chosen():
    """Padding proved safe but slower: the decision reads first, not beside a refusal."""
    model, samples, prof = _tagger_case()

    def measured(index, option, dims, bucket=None):
        return (bucket or dims)["seq"] * {"padded": 5.0, "specialized": 0.1}.get(option, 1.0)

    the_plan = plan(model, prof, TARGET, PlanSettings("oracle", 2), measured=measured,
                    samples=samples)
    assert not the_plan.regions[0].padding["used"]
    lines = [line for line in the_plan.explain().splitlines() if "padding seq" in line]
    assert len(lines) == 1 and lines[0].startswith(
        "  padding seq: proved safe, not chosen: an option without padding has the lower "
        "expected latency (proof: ")


def test_plan_refuses_padding_that_is_not_safe_and_says_why():
    nodes = [helper.make_node("Softmax", ["x"], ["y"], name="attn", axis=1)]
    model = from_proto(_seq_model(nodes), "softmax_seq")
    rng = np.random.default_rng(0)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((1, n, 8)).astype(np.float32)})
               for i, n in enumerate([3, 5, 5, 7, 9, 9, 9])]
    prof = profile(model, samples)

    def measured(index, option, dims, bucket=None):
        return dims["seq"] * (0.1 if option in ("specialized", "padded") else 1.0)

    the_plan = plan(model, prof, TARGET, PlanSettings("oracle", 2), measured=measured,
                    samples=samples)
    region = the_plan.regions[0]
    assert not region.padding["used"] and region.padding["dims"] == []
    assert "'attn' (Softmax) works along an axis carrying seq" in region.padding["refused"]["seq"]
    assert "padding seq: not padded: node 'attn' (Softmax)" in the_plan.explain()
    assert all(not option.get("padded") for option in region.options)


def test_padding_without_samples_is_not_used():
    model, samples, prof = _tagger_case()

    def measured(index, option, dims, bucket=None):
        return 1.0

    the_plan = plan(model, prof, TARGET, PlanSettings("oracle", 2), measured=measured)
    assert not the_plan.regions[0].padding["used"]
    assert "no samples" in the_plan.regions[0].padding["check"]


def test_plan_with_padding_round_trips(tmp_path):
    model, samples, prof = _tagger_case()

    def measured(index, option, dims, bucket=None):
        return (bucket or dims)["seq"] * (0.1 if option in ("specialized", "padded") else 1.0)

    the_plan = plan(model, prof, TARGET, PlanSettings("oracle", 2), measured=measured,
                    samples=samples)
    loaded = Plan.load(the_plan.save(tmp_path / "plan.json"))
    assert loaded.regions[0].padding == the_plan.regions[0].padding


def test_sample_check_catches_a_wrong_proof():
    # Feed a proof that claims a Softmax over seq is safe: onnxruntime shows it is not.
    model = from_proto(_seq_model([helper.make_node("Softmax", ["x"], ["y"], name="attn", axis=1)]),
                       "softmax_seq")
    rng = np.random.default_rng(0)
    samples = [Sample(f"s{i}", {"x": rng.standard_normal((1, n, 8)).astype(np.float32)})
               for i, n in enumerate([3, 9])]
    from edgec.core.regions import cut_regions

    claimed = {"dims": ["seq"], "inputs": {"x": [[1, "seq"]]}, "outputs": {"y": [[1, "seq"]]}}
    failed = padding.check_on_samples(model, cut_regions(model)[0], model.proto, claimed, samples,
                                      {"seq": 9})
    assert failed and "differs from the unpadded run" in failed


def test_inputs_without_padded_axes_are_fed_as_they_are():
    scalar = np.asarray(True)
    assert padding._pad_to(scalar, [], {"seq": 9}) is scalar
    padded = padding._pad_to(np.ones((1, 3), np.int64), [(1, "seq")], {"seq": 5})
    assert padded.tolist() == [[1, 1, 1, 0, 0]]
