import onnx
import pytest
from onnx import TensorProto, helper

from conftest import mlp_model
from edgec.errors import InputFileError, ModelError
from edgec.core.model import from_proto, load_model


def test_load_model_reads_inputs_outputs_and_dynamic_dims(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(mlp_model(), str(path))
    model = load_model(path)
    assert model.name == "mlp", "named after its graph, which travels with the file"
    assert [(s.name, s.dtype, s.dims) for s in model.inputs] == [("x", "float32", ("batch", "seq", 16))]
    assert [s.name for s in model.outputs] == ["y"]
    assert model.dynamic_dims == ["batch", "seq"]
    assert len(model.sha256) == 64


def test_zoo_layout_folder_is_accepted_and_a_renamed_folder_keeps_the_graph_name(tmp_path):
    folder = tmp_path / "renamed"
    folder.mkdir()
    onnx.save(mlp_model(), str(folder / "model.onnx"))
    assert load_model(folder).name == "mlp"
    assert load_model(folder, name="tagger").name == "tagger"


def test_an_exporters_default_graph_name_gives_way_to_the_file_name(tmp_path):
    proto = mlp_model()
    proto.graph.name = "main_graph"  # what torch.onnx writes for every model
    onnx.save(proto, str(tmp_path / "resnet.onnx"))
    assert load_model(tmp_path / "resnet.onnx").name == "resnet"
    (tmp_path / "tf").mkdir()
    onnx.save(proto, str(tmp_path / "tf" / "model.onnx"))
    assert load_model(tmp_path / "tf").name == "tf"


def test_missing_file_and_garbage_give_one_line_errors(tmp_path):
    with pytest.raises(InputFileError, match="does not exist"):
        load_model(tmp_path / "nope.onnx")
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\x01 this is not a protobuf" * 10)
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_model(garbage)
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(InputFileError, match="without model.onnx"):
        load_model(empty_dir)


def test_invalid_graph_is_refused():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="r"), helper.make_node("Relu", ["missing"], ["z"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(ModelError, match="reads 'missing', which no graph input, initializer or node"):
        from_proto(model)


def test_normalize_names_nodes_and_dims_and_drops_initializer_inputs():
    proto = mlp_model()
    for node in proto.graph.node:
        node.name = ""
    proto.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [16, 8]))
    proto.graph.input[0].type.tensor_type.shape.dim[1].dim_param = ""
    model = from_proto(proto)
    names = [n.name for n in model.proto.graph.node]
    assert all(names) and len(set(names)) == len(names)
    assert [s.name for s in model.inputs] == ["x"]
    assert model.inputs[0].dims == ("batch", "x_dim1", 16)
    assert proto.graph.node[0].name == "", "the caller's proto must not change"


def test_gather_indices_taken_from_inputs_get_bounds():
    from onnx import numpy_helper
    import numpy as np

    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
         helper.make_node("Gather", ["small", "ids"], ["emb2"], name="embed2", axis=1)],
        "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"]),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("emb2", TensorProto.FLOAT, [3, "n"])],
        [numpy_helper.from_array(np.zeros((10, 4), np.float32), "table"),
         numpy_helper.from_array(np.zeros((3, 7), np.float32), "small")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    spec = {s.name: s for s in from_proto(model).inputs}
    assert spec["ids"].bounds == (-7, 7) and spec["x"].bounds is None
