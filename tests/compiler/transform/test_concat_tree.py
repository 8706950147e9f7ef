"""SplitWideConcats: wide concatenations of symbolic extents as trees of narrow ones."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from edgec.compiler.transform.concat_tree import MAX_INPUTS, SplitWideConcats
from edgec.compiler.pipeline import import_model
from edgec.core.model import from_proto
from edgec.core.samples import Sample


def _concat_model(count: int, symbolic: bool):
    """``count`` inputs [n_i, 4] (or [3, 4]) concatenated along axis 0."""
    names = [f"x{i}" for i in range(count)]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [f"n{i}" if symbolic else 3, 4])
              for i, n in enumerate(names)]
    graph = helper.make_graph([helper.make_node("Concat", names, ["y"], axis=0)], "concat",
                              inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                     ["total", 4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    return proto


def _widths(mod) -> list[int]:
    return [len(m.split(",")) for m in re.findall(r"R\.concat\(\(([^)]*)\)", mod.script())]


def test_a_wide_symbolic_concat_becomes_a_tree_of_narrow_ones():
    mod = import_model(from_proto(_concat_model(20, symbolic=True), "concat"))
    assert _widths(mod) == [20]
    out = SplitWideConcats(mod)
    widths = _widths(out)
    assert max(widths) <= MAX_INPUTS and sum(widths) == 20 + len(widths) - 1, widths
    # Static extents fold into constant offsets: one concat, as written.
    static = import_model(from_proto(_concat_model(20, symbolic=False), "concat"))
    assert _widths(SplitWideConcats(static)) == [20]


def test_compiled_tree_concat_matches_onnxruntime(tmp_path):
    import edgec
    from edgec.core.targets import load_target

    proto = _concat_model(20, symbolic=True)
    rng = np.random.default_rng(0)

    def sample(name):
        return Sample(name, {f"x{i}": rng.standard_normal((int(rng.integers(0, 5)), 4)).astype(
            np.float32) for i in range(20)})

    samples = [sample(f"s{i}") for i in range(3)]
    compiled = edgec.compile(from_proto(proto, "concat"), samples, [load_target("x86_64")])
    loaded = edgec.runtime.load(compiled.artifact.save(tmp_path / "concat.edgec"))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    for s in samples + [sample("unseen")]:
        np.testing.assert_array_equal(loaded.run(s.arrays)["y"], session.run(None, s.arrays)[0])
