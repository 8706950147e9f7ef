"""Shape values computed on the dims (converters/shape_values.py): shape arithmetic as exporters
write it keeps the input's dims, compiled at several input shapes and compared with onnxruntime."""

import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from edgec import runtime
from edgec.compiler.pipeline import import_model
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.driver import compile as compile_model


def _c(name, value, dtype=np.int64):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.array(value, dtype=dtype)))


def _model(nodes, inputs, outputs, opset=17):
    graph = h.make_graph(nodes, "g", inputs, outputs)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _check(model, samples, atol=1e-5, unseen=()):
    """Compile ``model`` for all ``samples`` (one symbolic program) and compare every output
    with onnxruntime on each; then ``unseen`` on the same artifact, exactly: values the profile
    never saw, so the program's run-time values (not a specialization for a seen one) run."""
    loaded = from_proto(model, "case")
    artifact = compile_model(loaded, [Sample(f"s{k}", s) for k, s in enumerate(samples)]).artifact
    session = ort.InferenceSession(model.SerializeToString())
    with tempfile.TemporaryDirectory() as tmp:
        compiled = runtime.load(artifact.save(Path(tmp) / "case.edgec"))
        for sample in samples:
            got = compiled.run(sample)
            for spec, want in zip(session.get_outputs(), session.run(None, sample)):
                np.testing.assert_allclose(np.asarray(got[spec.name]), want, atol=atol)
        for sample in unseen:
            got = compiled.run(sample)
            for spec, want in zip(session.get_outputs(), session.run(None, sample)):
                np.testing.assert_array_equal(np.asarray(got[spec.name]), want)


def _script(model) -> str:
    return import_model(from_proto(model)).script()


def _f(name, dims):
    return h.make_tensor_value_info(name, T.FLOAT, dims)


def test_range_over_a_shape_has_the_input_dim_as_extent():
    """arange(seq) + x: Range's length is ``seq`` itself, so the add keeps [batch, seq]."""
    nodes = [h.make_node("Shape", ["x"], ["s"], start=1, end=2), _c("one", 1), _c("zero", 0),
             h.make_node("Squeeze", ["s"], ["seq"]),
             h.make_node("Range", ["zero", "seq", "one"], ["pos"]),
             h.make_node("Cast", ["pos"], ["posf"], to=T.FLOAT),
             h.make_node("Add", ["x", "posf"], ["out"])]
    model = _model(nodes, [_f("x", ["batch", "seq"])], [_f("out", ["batch", "seq"])])
    script = _script(model)
    assert 'R.Tensor((seq,), dtype="int64") = R.arange(0, seq, 1' in script
    assert "range_len" not in script and "match_cast" not in script
    _check(model, [{"x": np.random.rand(b, s).astype(np.float32)} for b, s in ((1, 8), (2, 5), (3, 1))])


def test_range_with_offset_and_step_from_shapes():
    """Range(start=seq-4, limit=2*seq, delta=3) in int64: length ceil((limit-start)/3)."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i1", [1]), _c("four", 4), _c("two", 2), _c("three", 3),
             h.make_node("Gather", ["s", "i1"], ["n1"], axis=0),
             h.make_node("Squeeze", ["n1"], ["n"]),
             h.make_node("Sub", ["n", "four"], ["start"]),
             h.make_node("Mul", ["n", "two"], ["limit"]),
             h.make_node("Range", ["start", "limit", "three"], ["out"])]
    model = _model(nodes, [_f("x", ["batch", "seq"])], [h.make_tensor_value_info("out", T.INT64, ["k"])])
    assert "range_len" not in _script(model)
    _check(model, [{"x": np.zeros((1, s), np.float32)} for s in (1, 4, 9)])


def test_numel_of_a_symbolic_shape():
    """x / x.numel(): ReduceProd over Shape (TVM: "cannot handle ShapeExpr inputs")."""
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("ReduceProd", ["s"], ["numel"], keepdims=0),
             h.make_node("Cast", ["numel"], ["nf"], to=T.FLOAT),
             h.make_node("Div", ["x", "nf"], ["out"])]
    model = _model(nodes, [_f("x", ["n", 4])], [_f("out", ["n", 4])])
    _check(model, [{"x": np.random.rand(n, 4).astype(np.float32)} for n in (3, 5)])


def test_chunk_on_a_static_axis_stays_static_with_a_dynamic_batch():
    """torch.chunk: Gather(Shape, [1]) / 2 is the number 2, so the Slice is static."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("one", [1]), _c("zero", [0]), _c("two", [2]),
             h.make_node("Gather", ["s", "one"], ["c"], axis=0),
             h.make_node("Div", ["c", "two"], ["half"]),
             h.make_node("Slice", ["x", "zero", "half", "one"], ["a"]),
             h.make_node("Shape", ["a"], ["s2"]),
             h.make_node("Gather", ["s2", "zero"], ["n"], axis=0),
             h.make_node("Relu", ["a"], ["out"])]
    model = _model(nodes, [_f("x", ["N", 4, 8, 8])],
                   [_f("out", ["N", 2, 8, 8]), h.make_tensor_value_info("n", T.INT64, [1])])
    assert 'R.Tensor((N, 2, 8, 8), dtype="float32") = R.nn.relu' in _script(model)
    _check(model, [{"x": np.random.rand(b, 4, 8, 8).astype(np.float32)} for b in (1, 3)])


def test_pad_by_a_difference_of_shapes():
    """F.pad(mask, (0, total - len)): pads computed from shapes (TVM: "Dynamic pads")."""
    nodes = [h.make_node("Shape", ["mask"], ["s"]), h.make_node("Shape", ["kv"], ["t"]),
             _c("one", [1]), _c("zero3", [0, 0, 0]),
             h.make_node("Gather", ["s", "one"], ["len"], axis=0),
             h.make_node("Gather", ["t", "one"], ["total"], axis=0),
             h.make_node("Sub", ["total", "len"], ["extra"]),
             h.make_node("Concat", ["zero3", "extra"], ["pads"], axis=0),
             h.make_node("Pad", ["mask", "pads"], ["padded"], mode="constant"),
             h.make_node("Add", ["padded", "kv"], ["out"])]
    model = _model(nodes, [_f("mask", ["batch", "seq"]), _f("kv", ["batch", "total"])],
                   [_f("out", ["batch", "total"])])
    assert 'R.Tensor((batch, total), dtype="float32") = R.add' in _script(model)
    _check(model, [{"mask": np.random.rand(b, s).astype(np.float32),
                    "kv": np.random.rand(b, s + e).astype(np.float32)} for b, s, e in ((1, 4, 3), (2, 8, 0))])


def test_pads_paired_reversed_and_flattened_as_torchscript_writes_them():
    """TorchScript's F.pad: pads Concat -> Reshape [-1, 2] -> Slice(step -1) -> Transpose ->
    Reshape [-1] -> Cast, with the last dim's padding computed from another input's shape."""
    nodes = [h.make_node("Shape", ["kv"], ["t"]), h.make_node("Shape", ["x"], ["s"]), _c("i1", [1]),
             h.make_node("Gather", ["t", "i1"], ["total"], axis=0),
             h.make_node("Gather", ["s", "i1"], ["len"], axis=0),
             h.make_node("Sub", ["total", "len"], ["extra"]),
             _c("z1", [0]), _c("z2", [0, 0]),
             h.make_node("Concat", ["z1", "extra", "z2"], ["flat"], axis=0),  # torch order: last dim first
             _c("pairs", [-1, 2]), h.make_node("Reshape", ["flat", "pairs"], ["p2"]),
             _c("st", [-1]), _c("en", [-(2**62)]), _c("ax", [0]), _c("step", [-1]),
             h.make_node("Slice", ["p2", "st", "en", "ax", "step"], ["rev"]),
             h.make_node("Transpose", ["rev"], ["tr"], perm=[1, 0]),
             _c("m1", [-1]), h.make_node("Reshape", ["tr", "m1"], ["pads"]),
             h.make_node("Pad", ["x", "pads"], ["out"], mode="constant")]
    model = _model(nodes, [_f("x", ["batch", "seq"]), _f("kv", ["batch", "total"])],
                   [_f("out", ["batch", "total"])])
    assert "R.Tensor((batch, total)" in _script(model)
    _check(model, [{"x": np.random.rand(2, s).astype(np.float32), "kv": np.zeros((2, s + 2), np.float32)}
                   for s in (3, 6)])


def test_reshape_to_heads_from_shape_arithmetic():
    """[batch, seq, 8] -> [batch, seq, 2, 4] -> [batch*seq, -1] with targets built from Shape,
    Gather, Mul and Concat; the result keeps batch and seq."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), _c("i0", [0]), _c("i1", [1]), _c("heads", [2, 4]),
             h.make_node("Gather", ["s", "i0"], ["b"], axis=0),
             h.make_node("Gather", ["s", "i1"], ["n"], axis=0),
             h.make_node("Concat", ["b", "n", "heads"], ["t1"], axis=0),
             h.make_node("Reshape", ["x", "t1"], ["y"]),
             h.make_node("Mul", ["b", "n"], ["bn"]), _c("m1", [-1]),
             h.make_node("Concat", ["bn", "m1"], ["t2"], axis=0),
             h.make_node("Reshape", ["y", "t2"], ["out"])]
    model = _model(nodes, [_f("x", ["batch", "seq", 8])], [_f("out", ["bs", 8])])
    assert 'R.Tensor((batch * seq, 8), dtype="float32") = R.reshape' in _script(model)
    _check(model, [{"x": np.random.rand(b, s, 8).astype(np.float32)} for b, s in ((1, 3), (2, 5))])


def test_expand_to_another_inputs_shape_and_float_length_arithmetic():
    """Expand(mask, Shape(x)) and a conv length computed in floats (floor((L - 3) / 2) + 1)
    reshaping an input: both stay in the input dims."""
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("Expand", ["m", "s"], ["e"]),
             h.make_node("Mul", ["x", "e"], ["xm"]),
             _c("i1", [1]), h.make_node("Gather", ["s", "i1"], ["L"], axis=0),
             h.make_node("Cast", ["L"], ["Lf"], to=T.FLOAT),
             _c("three", [3.0], np.float32), _c("twof", [2.0], np.float32), _c("onei", [1]),
             h.make_node("Sub", ["Lf", "three"], ["d"]), h.make_node("Div", ["d", "twof"], ["q"]),
             h.make_node("Floor", ["q"], ["fl"]), h.make_node("Cast", ["fl"], ["qi"], to=T.INT64),
             h.make_node("Add", ["qi", "onei"], ["out_len"]),
             h.make_node("Shape", ["y"], ["ys"]), _c("i0", [0]),
             h.make_node("Gather", ["ys", "i0"], ["yb"], axis=0),
             h.make_node("Concat", ["yb", "out_len"], ["target"], axis=0),
             h.make_node("Reshape", ["y", "target"], ["yr"])]
    model = _model(nodes, [_f("x", ["batch", "L"]), _f("m", [1, "L"]), _f("y", ["batch", "k"])],
                   [_f("xm", ["batch", "L"]), _f("yr", ["batch", "j"])])
    script = _script(model)
    assert 'R.Tensor((batch, L), dtype="float32") = R.multiply' in script
    _check(model, [{"x": np.random.rand(b, L).astype(np.float32), "m": np.random.rand(1, L).astype(np.float32),
                    "y": np.random.rand(b, (L - 3) // 2 + 1).astype(np.float32)} for b, L in ((1, 7), (2, 12))])


def test_a_shape_from_tensor_data_gets_fresh_dims():
    """Reshape to a shape read from an int64 input: one program, the output's dims matched at
    run time (tensor_to_shape + match_cast), not an import error."""
    nodes = [h.make_node("Reshape", ["x", "shape"], ["out"])]
    model = _model(nodes, [_f("x", ["n"]), h.make_tensor_value_info("shape", T.INT64, [2])],
                   [_f("out", ["a", "b"])])
    assert "match_cast" in _script(model)


@pytest.mark.parametrize("op,want", [("Min", "T.min"), ("Max", "T.max")])
def test_min_max_of_dims_stay_symbolic(op, want):
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Shape", ["y"], ["t"]),
             h.make_node(op, ["s", "t"], ["m"]),
             h.make_node("ConstantOfShape", ["m"], ["out"], value=nh.from_array(np.array([1.0], np.float32)))]
    model = _model(nodes, [_f("x", ["a"]), _f("y", ["b"])], [_f("out", ["c"])])
    assert want in _script(model)
    _check(model, [{"x": np.zeros(a, np.float32), "y": np.zeros(b, np.float32)} for a, b in ((2, 5), (6, 3))])


def test_pad_to_a_sum_of_dims_fuses():
    """GPT-2 with past key values: the mask [batch, total] padded to the KV length past + seq.
    The pad's index tensors once compared positions with a ``shape_to_tensor`` of ``total``,
    whose fused kernel FuseTIR rejected (``VarRemapGet(source) == nullptr``)."""
    nodes = [h.make_node("Shape", ["mask"], ["s"]), h.make_node("Shape", ["past"], ["p"]),
             h.make_node("Shape", ["x"], ["q"]), _c("one", [1]), _c("zero3", [0, 0, 0]),
             h.make_node("Gather", ["s", "one"], ["len"], axis=0),
             h.make_node("Gather", ["p", "one"], ["np"], axis=0),
             h.make_node("Gather", ["q", "one"], ["nq"], axis=0),
             h.make_node("Add", ["np", "nq"], ["kv"]),
             h.make_node("Sub", ["kv", "len"], ["extra"]),
             h.make_node("Concat", ["zero3", "extra"], ["pads"], axis=0),
             h.make_node("Pad", ["mask", "pads"], ["padded"], mode="constant"),
             h.make_node("Concat", ["past", "x"], ["cat"], axis=1),
             h.make_node("Add", ["padded", "cat"], ["out"])]
    model = _model(nodes, [_f("mask", ["batch", "total"]), _f("past", ["batch", "past"]),
                           _f("x", ["batch", "seq"])], [_f("out", ["batch", "kv"])])
    assert 'R.Tensor((batch, past + seq), dtype="float32") = R.add' in _script(model)
    _check(model, [{"mask": np.random.rand(b, t).astype(np.float32),
                    "past": np.random.rand(b, p).astype(np.float32),
                    "x": np.random.rand(b, s).astype(np.float32)}
                   for b, t, p, s in ((1, 4, 3, 1), (2, 5, 4, 2), (1, 3, 0, 3))])


def test_range_over_a_conv_length_computed_from_the_input_length():
    """HuBERT (dynamo): positions arange(L) for a conv's output length L = (n - 3) // 2 + 1,
    computed from the input's length, added to the conv's output [1, 2, L]. L is not >= 0 from
    n >= 0 alone, yet is a tensor's extent: Range's length max(L, 0) simplifies to L, and the
    add keeps its shape."""
    w = np.random.rand(2, 1, 3).astype(np.float32)
    nodes = [h.make_node("Constant", [], ["w"], value=nh.from_array(w)),
             h.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3], strides=[2]),
             h.make_node("Shape", ["x"], ["s"], start=2, end=3), h.make_node("Squeeze", ["s"], ["n"]),
             _c("three", 3), _c("two", 2), _c("one", 1), _c("zero", 0),
             h.make_node("Sub", ["n", "three"], ["a"]), h.make_node("Div", ["a", "two"], ["b"]),
             h.make_node("Add", ["b", "one"], ["length"]),
             h.make_node("Range", ["zero", "length", "one"], ["pos"]),
             h.make_node("Cast", ["pos"], ["posf"], to=T.FLOAT),
             h.make_node("Add", ["y", "posf"], ["sum"]),
             _c("flat", [0, -1]), h.make_node("Reshape", ["sum", "flat"], ["out"])]
    model = _model(nodes, [_f("x", [1, 1, "n"])], [_f("out", [1, "m"])])
    script = _script(model)
    assert 'R.Tensor((1, 2, (n - 3) // 2 + 1), dtype="float32") = R.add' in script, script
    _check(model, [{"x": np.random.rand(1, 1, n).astype(np.float32)} for n in (3, 8, 11)])


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_with_k_from_an_input_that_changes_per_call(largest):
    """k is a graph input with a different value on each sample: one program whose outputs'
    length is k's value at run time, not "TopK k must be a constant"."""
    nodes = [h.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1, largest=largest)]
    model = _model(nodes, [_f("x", ["n", 12]), h.make_tensor_value_info("k", T.INT64, [1])],
                   [_f("values", ["n", "k"]), h.make_tensor_value_info("indices", T.INT64, ["n", "k"])])
    rng = np.random.default_rng(0)

    def sample(n, k):  # distinct values: the order is well defined
        x = rng.permutation(n * 12).reshape(n, 12).astype(np.float32)
        return {"x": x, "k": np.array([k], np.int64)}

    _check(model, [sample(2, 3), sample(1, 5), sample(3, 1)], unseen=[sample(2, 7), sample(4, 12)])


def test_topk_of_at_most_n_boxes_keeps_the_min_as_its_length():
    """A detector's NMS idiom: k = min(4, number of candidates), the candidates' count a dim."""
    nodes = [h.make_node("Shape", ["scores"], ["shape"]),
             h.make_node("Slice", ["shape", "zero", "one"], ["count"]),
             h.make_node("Concat", ["cap", "count"], ["both"], axis=0),
             h.make_node("ReduceMin", ["both"], ["k"], keepdims=1),
             h.make_node("TopK", ["scores", "k"], ["values", "indices"], axis=0)]
    model = _model([_c("zero", [0]), _c("one", [1]), _c("cap", [4])] + nodes,
                   [_f("scores", ["n"])],
                   [_f("values", ["m"]), h.make_tensor_value_info("indices", T.INT64, ["m"])])
    assert "T.min" in _script(model)
    rng = np.random.default_rng(1)
    scores = [rng.permutation(n).astype(np.float32) for n in (6, 2, 9)]
    _check(model, [{"scores": s} for s in scores[:2]], unseen=[{"scores": scores[2]}])
