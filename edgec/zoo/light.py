"""The CNNs that ship with the ``onnx`` package (``onnx/backend/test/data/light``), made usable.

The shipped files are old (IR 3, opset 9) exports whose weights are built at run time by
``ConstantOfShape`` filling every tensor with 0.02 (so their output does not depend on the input),
and which list every initializer as a graph input. :func:`load_light` returns the model as shipped,
only cleaned up so that the graph inputs are the real inputs and every node has a unique name.
:func:`randomize_weights` turns the same graph into one whose weights are seeded random
initializers, so that its outputs depend on its input.
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper

from edgec.zoo import data
from edgec.zoo.builders import IR_VERSION

_LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
_PREFIX = "light_"


def light_names() -> list[str]:
    """Names (``resnet50``, ``squeezenet``...) of the light models in the installed onnx package."""
    if not os.path.isdir(_LIGHT_DIR):
        return []
    return sorted(f[len(_PREFIX):-len(".onnx")] for f in os.listdir(_LIGHT_DIR)
                  if f.startswith(_PREFIX) and f.endswith(".onnx"))


def light_path(name: str, suffix: str = ".onnx") -> str:
    """Path of a file of the light model ``name`` (``suffix`` e.g. ``_output_0.pb``)."""
    return os.path.join(_LIGHT_DIR, f"{_PREFIX}{name}{suffix}")


def load_light(name: str) -> onnx.ModelProto:
    """The shipped light model ``name`` with initializers removed from its graph inputs.

    The IR version is raised to one where initializers need not be inputs (the opset stays), and
    nodes without a unique name get one. The computation is unchanged.
    """
    model = onnx.load(light_path(name))
    initializers = {t.name for t in model.graph.initializer}
    real_inputs = [i for i in model.graph.input if i.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(real_inputs)
    model.ir_version = max(model.ir_version, IR_VERSION)
    _name_nodes(model.graph)
    return model


def _name_nodes(graph: onnx.GraphProto) -> None:
    """Give every unnamed or duplicate-named node the name ``<op_type>_<index>``."""
    taken = {node.name for node in graph.node}
    seen: set[str] = set()
    for index, node in enumerate(graph.node):
        if not node.name or node.name in seen:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
        seen.add(node.name)


def real_inputs(model: onnx.ModelProto) -> list[tuple[str, int, list[int]]]:
    """(name, elem_type, dims) of each graph input; dims are fixed in the light models."""
    return [(i.name, i.type.tensor_type.elem_type,
             [d.dim_value for d in i.type.tensor_type.shape.dim]) for i in model.graph.input]


def light_samples(name: str, count: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Inputs for the light model ``name``: the shipped input first if there is one, then random.

    Random samples are seeded normal images of the input's shape (see :func:`data.images`).
    """
    inputs = real_inputs(load_light(name))
    shipped = {}
    for index, (input_name, _, _) in enumerate(inputs):
        path = light_path(name, f"_input_{index}.pb")
        if os.path.exists(path):
            tensor = onnx.TensorProto()
            with open(path, "rb") as f:
                tensor.ParseFromString(f.read())
            shipped[input_name] = numpy_helper.to_array(tensor)
    rng = np.random.default_rng(seed)
    samples = []
    if len(shipped) == len(inputs) and count > 0:
        samples.append(shipped)
    while len(samples) < count:
        samples.append({input_name: data.images(rng, tuple(dims))
                        for input_name, _, dims in inputs})
    return samples


def _reshaped(shape: tuple[int, ...], target: np.ndarray) -> tuple[int, ...]:
    """The shape Reshape gives ``shape`` with ``target`` (0 copies a dim, -1 is inferred)."""
    dims = [shape[i] if d == 0 else int(d) for i, d in enumerate(target)]
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        dims[dims.index(-1)] = int(np.prod(shape)) // known
    return tuple(dims)


Uses = dict[str, list[tuple[onnx.NodeProto, int]]]


def _uses(graph: onnx.GraphProto) -> Uses:
    """For each tensor, the (node, input index) pairs that read it."""
    uses: Uses = defaultdict(list)
    for node in graph.node:
        for index, tensor in enumerate(node.input):
            uses[tensor].append((node, index))
    return uses


# Ops that only re-view a weight before the op that really uses it (caffe scale layers read their
# multipliers through Unsqueeze; inception_v1 reshapes its classifier weight).
_VIEWS = ("Reshape", "Unsqueeze")


def _weight_use(uses: Uses, constants: dict[str, np.ndarray], tensor: str,
                shape: tuple[int, ...]) -> tuple[onnx.NodeProto | None, int, tuple[int, ...]]:
    """The node that uses weight ``tensor``, at which input, and the weight's shape there.

    The node is None when the weight has no single user.
    """
    while True:
        if len(uses.get(tensor, [])) != 1:
            return None, -1, shape
        node, index = uses[tensor][0]
        if node.op_type not in _VIEWS or index != 0:
            return node, index, shape
        if node.op_type == "Reshape" and node.input[1] in constants:
            shape = _reshaped(shape, constants[node.input[1]])
        tensor = node.output[0]


def _before_identity_shortcut(node: onnx.NodeProto, uses: Uses,
                              producers: dict[str, onnx.NodeProto]) -> bool:
    """Whether ``node`` feeds a residual ``Sum`` whose other input is not a projection BN."""
    for user, _ in uses.get(node.output[0], []):
        if user.op_type == "Sum" and not all(producers[t].op_type == "BatchNormalization"
                                             for t in user.input if t in producers):
            return True
    return False


def _random_weight(rng: np.random.Generator, node: onnx.NodeProto | None, index: int,
                   shape: tuple[int, ...], own_shape: tuple[int, ...],
                   residual: bool) -> np.ndarray:
    """A random weight for input ``index`` of ``node``, where it has ``shape``."""
    op = node.op_type if node is not None else None

    def normal(std: float, mean: float = 0.0) -> np.ndarray:
        # In place and in float32: vgg19's largest weight has 103 M elements.
        values = rng.standard_normal(own_shape, dtype=np.float32)
        values *= np.float32(std)
        values += np.float32(mean)
        return values

    if op == "Conv" and index == 1:
        return normal(np.sqrt(2.0 / int(np.prod(shape[1:]))))
    if op == "Gemm" and index == 1:
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        return normal(np.sqrt(2.0 / shape[1 if trans_b else 0]))
    if op == "BatchNormalization":
        # Without trained statistics BN does not normalize, so each identity-shortcut block would
        # double the residual stream's variance and resnet50's logits would reach thousands. A
        # small scale on the BN closing a residual branch (as in zero-init residual training)
        # keeps the stream's growth slow.
        scale = 0.2 if residual else 1.0
        if index == 1:
            return normal(0.1 * scale, scale)
        if index == 4:
            return rng.uniform(0.5, 1.5, size=own_shape).astype(np.float32)
        return normal(0.1)
    if op == "Mul":
        return normal(0.1, 1.0)
    return normal(0.02)


def randomize_weights(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy of a light model with seeded random initializers in place of its float weights.

    Weights made by ``ConstantOfShape`` and float initializers alike are replaced: Conv and Gemm
    weights He-normal, BatchNormalization mean about 0, variance in [0.5, 1.5], scale about 1,
    caffe scale-layer multipliers about 1, biases and offsets small. The ``ConstantOfShape`` nodes
    and the shape constants they read are dropped; the input model is not changed.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    rng = np.random.default_rng(seed)
    constants = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    uses = _uses(graph)
    producers = {out: node for node in graph.node for out in node.output}

    weights = [(node.output[0], tuple(int(d) for d in constants[node.input[0]]))
               for node in graph.node
               if node.op_type == "ConstantOfShape" and node.input[0] in constants]
    weights += [(t.name, tuple(t.dims)) for t in graph.initializer
                if t.data_type == onnx.TensorProto.FLOAT and t.name in uses]
    replaced = {}
    for name, shape in weights:
        node, index, used_shape = _weight_use(uses, constants, name, shape)
        residual = node is not None and _before_identity_shortcut(node, uses, producers)
        replaced[name] = _random_weight(rng, node, index, used_shape, shape, residual)

    kept_nodes = [n for n in graph.node
                  if not (n.op_type == "ConstantOfShape" and n.output[0] in replaced)]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    read = {tensor for node in graph.node for tensor in node.input}
    kept_constants = [t for t in graph.initializer if t.name in read and t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept_constants)
    graph.initializer.extend(numpy_helper.from_array(array, name)
                             for name, array in replaced.items())
    return model
