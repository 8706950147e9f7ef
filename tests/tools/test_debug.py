from tvm import relax

from conftest import mlp_model, mlp_samples
from edgec.compiler.importer import converter_table
from edgec.tools.debug import debug
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.core.targets import load_target
from edgec.zoo import get

TARGET = load_target("x86_64")


class _WrongRelu:
    """A deliberately broken converter: Relu that lets negative values through at half size."""

    @classmethod
    def get_converter(cls, opset):
        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            return relax.op.maximum(x, relax.op.multiply(x, relax.const(0.5, "float32")))
        return convert


def test_no_divergence_on_a_correct_build():
    samples = [Sample(f"s{i}", a) for i, a in enumerate(mlp_samples([(1, 3), (2, 2)]))]
    result = debug(from_proto(mlp_model()), samples, TARGET)
    assert result.first is None
    assert {row["node"] for row in result.nodes} == {"matmul", "relu"}
    assert all(row["max_rel"] < 1e-5 for row in result.nodes)


def test_injected_divergence_is_found_at_its_node(monkeypatch):
    entry = get("cnn")
    model = from_proto(entry.make_model(0), "cnn")
    samples = [Sample(f"s{i}", a) for i, a in enumerate(entry.make_samples(2, 0))]
    monkeypatch.setitem(converter_table.CONVERTERS, "Relu", _WrongRelu)
    result = debug(model, samples, TARGET)
    assert result.first is not None
    first_relu = next(n.name for n in model.proto.graph.node if n.op_type == "Relu")
    assert result.first.node == first_relu and result.first.op == "Relu"
    assert result.first.region == "main" and result.first.max_rel > 1e-3
    convs = [row for row in result.nodes if row["op"] == "Conv"]
    assert convs[0]["max_rel"] < 1e-4, "the first conv comes before the injected bug"
