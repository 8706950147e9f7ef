"""ONNX's recurrent layers (LSTM, GRU, RNN) rewritten as a loop over the time steps.

TVM's importer has no converter for them. The rewrite keeps what makes a recurrent layer fast:
the input projection of every time step, ``X·Wᵀ`` plus the biases, is one matmul before the loop
(a library call when W is a weight), and the loop holds only the recurrent matmul ``h·Rᵀ`` and
the gates. On CPU targets a float32 layer with the default activations loops in edgec's native
kernel (``edgec_recurrent``, whose node ``RecurrentLoop`` converts); any other layer becomes a
Scan, which edgec's Scan converter (``converters/control_flow.py``) lowers, with symbolic
sequence lengths and batch sizes.

Every attribute of the ONNX ops is honoured: ``direction`` (a reverse direction is a Scan that
runs backwards), ``layout``, ``activations`` with their alphas and betas, ``clip``,
``input_forget``, ``linear_before_reset``, peepholes, initial states and ``sequence_lens`` (steps
past a batch row's length leave its state alone and emit zeros, as onnxruntime does).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgec.compiler.importer.converters.subgraph import shaped
from edgec.core.model import all_graphs, all_nodes, attribute_text
from edgec.errors import ModelError

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
# edgec's native loop over the time steps (edgec/native/runtime_kernels.cc, ``edgec_recurrent``)
# for float32 layers with the default activations; other layers run as a Scan.
RECURRENT_KERNEL = "EdgecRecurrentLoop"
_KERNEL_SYMBOL = "edgec_recurrent"
_KINDS = {"LSTM": 0, "GRU": 1, "RNN": 2}
_NATIVE_RNN_ACTIVATIONS = {"tanh": 0, "relu": 1, "sigmoid": 2}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ("Sigmoid", "Tanh", "Tanh"), "GRU": ("Sigmoid", "Tanh"),
                        "RNN": ("Tanh",)}
# Activations with parameters: the defaults of (alpha, beta), None where one is not used. Each
# takes its parameters from activation_alpha/activation_beta in turn (onnxruntime's reading).
_PARAMETERS = {"affine": (1.0, 0.0), "leakyrelu": (0.01, None), "thresholdedrelu": (1.0, None),
               "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, None)}
_PLAIN = {"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid", "softsign": "Softsign",
          "softplus": "Softplus"}


def rewrite_recurrent(proto: onnx.ModelProto, model_name: str,
                      type_of: Callable[[str], onnx.TypeProto | None],
                      native: bool = True) -> onnx.ModelProto:
    """A copy of ``proto`` with every LSTM, GRU and RNN node, in the graph and in its subgraphs
    at any depth, replaced by a Scan, or, with ``native`` (CPU targets) where the layer allows,
    by edgec's native loop (``proto`` itself when it has none). ``type_of(name)`` gives a value's
    type as shape inference sees it, None when unknown. Raises ModelError for what the rewrite
    cannot express."""
    if not any(_is_recurrent(node) for node in all_nodes(proto.graph)):
        return proto
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    for graph in all_graphs(proto.graph):
        nodes: list[onnx.NodeProto] = []
        for index, node in enumerate(graph.node):
            if not _is_recurrent(node):
                nodes.append(node)
                continue
            where = f"model '{model_name}': {node.op_type} node '{node.name or index}'"
            # New weights go into the graph that uses them: a subgraph's own initializers.
            builder = _Builder(f"{node.name or node.op_type + str(index)}__{node.op_type}", opset,
                               _elem_type(type_of(node.input[0])), graph.initializer)
            _Recurrent(node, builder, where, native).emit()
            nodes.extend(builder.nodes)
        del graph.node[:]
        graph.node.extend(nodes)
    return proto


def native_loop_fits(node: onnx.NodeProto, elem_type: int) -> bool:
    """Whether a CPU build runs recurrent ``node`` (of element type ``elem_type``) in edgec's
    native loop: float32, and per direction the default activations (an RNN: any of
    tanh/relu/sigmoid). The cost model's features ask this too."""
    defaults = [a.lower() for a in _DEFAULT_ACTIVATIONS[node.op_type]]
    names = [attribute_text(name).lower() for a in node.attribute if a.name == "activations"
             for name in a.strings] or defaults
    per = len(defaults)
    return elem_type == TensorProto.FLOAT and all(
        names[at:at + per] == defaults or (node.op_type == "RNN" and names[at] in _NATIVE_RNN_ACTIVATIONS)
        for at in range(0, len(names), per))


def _elem_type(found: onnx.TypeProto | None) -> int:
    if found is not None and found.HasField("tensor_type") and found.tensor_type.elem_type:
        return found.tensor_type.elem_type
    return TensorProto.FLOAT


def _is_recurrent(node: onnx.NodeProto) -> bool:
    return node.op_type in RECURRENT_OPS and node.domain in ("", "ai.onnx")


class _Builder:
    """Nodes and constants under one name prefix, written for the model's opset."""

    def __init__(self, prefix: str, opset: int, elem_type: int, initializers) -> None:
        self.prefix, self.opset, self.elem_type = prefix, opset, elem_type
        self.dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        self.initializers = initializers
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}/{hint}_{self._count}"

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs) -> str:
        out = out or self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.fresh(op_type),
                                           **attrs))
        return out

    def const(self, value, hint: str = "c", dtype=None) -> str:
        """An initializer of the outer graph (loop bodies read it from the outer scope)."""
        name = self.fresh(hint)
        array = np.asarray(value, dtype=dtype or self.dtype)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def unsqueeze(self, value: str, axis: int, out: str | None = None) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [value, self.const([axis], "axes", np.int64)], out)
        return self.op("Unsqueeze", [value], out, axes=[axis])

    def split(self, value: str, parts: int) -> list[str]:
        """``value`` cut into ``parts`` equal pieces along its last axis."""
        if parts == 1:
            return [value]
        outs = [self.fresh("part") for _ in range(parts)]
        attrs = {"num_outputs": parts} if self.opset >= 18 else {}
        self.nodes.append(helper.make_node("Split", [value], outs, name=self.fresh("Split"),
                                           axis=-1, **attrs))
        return outs

    def take(self, value: str, index: int, axis: int = 0) -> str:
        return self.op("Gather", [value, self.const(index, "index", np.int64)], axis=axis)


class _Recurrent:
    """One LSTM/GRU/RNN node's rewrite."""

    def __init__(self, node: onnx.NodeProto, builder: _Builder, where: str, native: bool) -> None:
        self.node, self.b, self.where = node, builder, where
        self.kind = node.op_type
        self.gates = _GATES[self.kind]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        direction = attribute_text(attrs.get("direction"), "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ModelError(f"{where} has direction '{direction}'; ONNX allows forward, "
                             f"reverse or bidirectional")
        self.reverse = [False, True] if direction == "bidirectional" else [direction == "reverse"]
        if "hidden_size" not in attrs:
            raise ModelError(f"{where} has no hidden_size attribute; re-export the model with it")
        self.hidden = int(attrs["hidden_size"])
        self.layout = int(attrs.get("layout", 0))
        self.clip = attrs.get("clip")
        self.input_forget = bool(attrs.get("input_forget", 0))
        self.linear_before_reset = bool(attrs.get("linear_before_reset", 0))
        if builder.opset < 9:
            raise ModelError(f"{where}: recurrent layers need opset 9 or later (this model has "
                             f"{builder.opset}); convert it with onnx.version_converter")
        self.activations = self._activations(attrs)
        inputs = list(node.input) + [""] * (8 - len(node.input))
        self.x, self.w, self.r, self.bias, self.lens, self.h0, self.c0, self.peep = inputs[:8]
        self.native = native and native_loop_fits(node, builder.elem_type)
        if self.lens and builder.opset < 11 and not self.native:
            raise ModelError(f"{where}: sequence_lens needs opset 11 or later (this model has "
                             f"{builder.opset}); convert it with onnx.version_converter")

    def _activations(self, attrs: dict) -> list[list[tuple[str, float | None, float | None]]]:
        """Per direction, the activation functions as (lower-case name, alpha, beta)."""
        per = len(_DEFAULT_ACTIVATIONS[self.kind])
        names = [attribute_text(n) for n in attrs.get("activations", [])]
        if not names:
            names = list(_DEFAULT_ACTIVATIONS[self.kind]) * len(self.reverse)
        if len(names) != per * len(self.reverse):
            raise ModelError(f"{self.where} lists {len(names)} activations; it needs {per} per "
                             f"direction")
        alphas = list(attrs.get("activation_alpha", []))
        betas = list(attrs.get("activation_beta", []))
        resolved = []
        for name in names:
            key = name.lower()
            if key not in _PLAIN and key not in _PARAMETERS:
                raise ModelError(f"{self.where} uses activation '{name}', which ONNX does not "
                                 f"define for recurrent layers")
            alpha, beta = _PARAMETERS.get(key, (None, None))
            if alpha is not None and alphas:
                alpha = alphas.pop(0)
            if beta is not None and betas:
                beta = betas.pop(0)
            resolved.append((key, alpha, beta))
        return [resolved[d * per:(d + 1) * per] for d in range(len(self.reverse))]

    # -- the outer graph -------------------------------------------------------------------

    def emit(self) -> None:
        b, hidden, gates = self.b, self.hidden, self.gates
        outputs = list(self.node.output) + [""] * (3 - len(self.node.output))
        x = self.x
        if self.layout:  # [batch, seq, input] -> [seq, batch, input]
            x = b.op("Transpose", [x], perm=[1, 0, 2])
        states0 = []
        for value in (self.h0, self.c0):
            if value and self.layout:  # [batch, directions, hidden] -> [directions, batch, hidden]
                value = b.op("Transpose", [value], perm=[1, 0, 2])
            states0.append(value)
        mask = self._step_mask(x) if self.lens and not self.native else None
        zeros = None
        finals: list[list[str]] = []
        ys = []
        for d, backwards in enumerate(self.reverse):
            w_t = b.op("Transpose", [b.take(self.w, d)], perm=[1, 0])  # [input, gates*hidden]
            r = b.take(self.r, d)  # [gates*hidden, hidden]
            projected = b.op("MatMul", [x, w_t])  # [seq, batch, gates*hidden]
            bias_w = bias_r = None
            if self.bias:
                both = b.op("Reshape", [b.take(self.bias, d), b.const([2, gates * hidden], "shape",
                                                                      np.int64)])
                bias_w, bias_r = b.take(both, 0), b.take(both, 1)
                projected = b.op("Add", [projected, self._input_bias(bias_w, bias_r)])
            initial = []
            for value in states0[:2 if self.kind == "LSTM" else 1]:
                if value:
                    initial.append(b.take(value, d))
                else:
                    zeros = zeros or self._zero_state(x)
                    initial.append(zeros)
            n_states = len(initial)
            if self.native:
                y, states = self._native_loop(d, backwards, projected, r, bias_r, initial)
            else:
                body = self._body(d, r, bias_r)
                scan_inputs = [projected] + ([mask] if mask else [])
                outs = [b.fresh("final") for _ in range(n_states)] + [b.fresh("y")]
                b.nodes.append(helper.make_node(
                    "Scan", initial + scan_inputs, outs, name=b.fresh("Scan"), body=body,
                    num_scan_inputs=len(scan_inputs),
                    scan_input_directions=[int(backwards)] * len(scan_inputs),
                    scan_output_directions=[int(backwards)]))
                y, states = outs[-1], outs[:n_states]
            finals.append(states)
            ys.append(y)
        self._outputs(ys, finals, outputs)

    def _native_loop(self, d: int, backwards: bool, projected: str, r: str, bias_r: str | None,
                     initial: list[str]) -> tuple[str, list[str]]:
        """One direction as edgec's native loop (``RECURRENT_KERNEL``): its output sequence and
        final states."""
        b, hidden = self.b, self.hidden
        dummy = b.const([0.0], "unused")
        r_t = b.op("Transpose", [r], perm=[1, 0])  # [hidden, gates*hidden]
        peep = b.take(self.peep, d) if self.peep else dummy
        lens = b.op("Cast", [self.lens], to=TensorProto.INT32) if self.lens else \
            b.const([0], "unused", np.int32)
        rbh = dummy
        if self.kind == "GRU" and self.linear_before_reset:
            rbh = b.const(np.zeros(hidden), "rbh") if bias_r is None else b.split(bias_r, 3)[2]
        c0 = initial[1] if self.kind == "LSTM" else dummy
        outs = [b.fresh("y"), b.fresh("final"), b.fresh("final")]
        attrs = {"kind": self.kind, "reverse": int(backwards), "input_forget": int(self.input_forget),
                 "linear_before_reset": int(self.linear_before_reset),
                 "has_peepholes": int(bool(self.peep)), "has_lengths": int(bool(self.lens)),
                 "activation": self.activations[d][0][0] if self.kind == "RNN" else ""}
        if self.clip is not None:
            attrs["clip"] = float(self.clip)
        b.nodes.append(helper.make_node(RECURRENT_KERNEL, [projected, r_t, initial[0], c0, peep, lens, rbh],
                                        outs, name=b.fresh(RECURRENT_KERNEL), **attrs))
        return outs[0], outs[1:1 + (2 if self.kind == "LSTM" else 1)]

    def _input_bias(self, bias_w: str, bias_r: str) -> str:
        """The biases added to the projected input: all of them, except a GRU's recurrent bias of
        its candidate gate when linear_before_reset puts it inside the reset product."""
        b = self.b
        if self.kind == "GRU" and self.linear_before_reset:
            keep = np.concatenate([np.ones(2 * self.hidden), np.zeros(self.hidden)])
            bias_r = b.op("Mul", [bias_r, b.const(keep, "keep")])
        return b.op("Add", [bias_w, bias_r])

    def _zero_state(self, x: str) -> str:
        """Zeros [batch, hidden], the batch read from X's shape."""
        b = self.b
        batch = b.op("Gather", [b.op("Shape", [x]), b.const([1], "axis", np.int64)])
        shape = b.op("Concat", [batch, b.const([self.hidden], "hidden", np.int64)], axis=0)
        return b.op("ConstantOfShape", [shape], value=helper.make_tensor("zero", b.elem_type, [1], [0]))

    def _step_mask(self, x: str) -> str:
        """[seq, batch, 1] bool: whether step t is inside batch row n's sequence."""
        b = self.b
        seq = b.op("Gather", [b.op("Shape", [x]), b.const(0, "axis", np.int64)])
        steps = b.op("Range", [b.const(0, "start", np.int64), seq, b.const(1, "delta", np.int64)])
        steps = b.op("Reshape", [steps, b.const([-1, 1], "shape", np.int64)])
        lengths = b.op("Reshape", [b.op("Cast", [self.lens], to=TensorProto.INT64),
                                   b.const([1, -1], "shape", np.int64)])
        inside = b.op("Less", [steps, lengths])
        return b.unsqueeze(inside, 2)

    def _outputs(self, ys: list[str], finals: list[list[str]], outputs: list[str]) -> None:
        b = self.b
        y, y_h, y_c = outputs[:3]
        if y:  # [seq, directions, batch, hidden], or [batch, seq, directions, hidden]
            stacked = b.op("Concat", [b.unsqueeze(v, 1) for v in ys], axis=1)
            if self.layout:
                b.op("Transpose", [stacked], y, perm=[2, 0, 1, 3])
            else:
                b.op("Identity", [stacked], y)
        for k, out in enumerate((y_h, y_c)):
            if not out or k >= len(finals[0]):
                continue
            stacked = b.op("Concat", [b.unsqueeze(f[k], 0) for f in finals], axis=0)
            if self.layout:
                b.op("Transpose", [stacked], out, perm=[1, 0, 2])
            else:
                b.op("Identity", [stacked], out)

    # -- the loop body ---------------------------------------------------------------------

    def _body(self, d: int, r: str, bias_r: str | None) -> onnx.GraphProto:
        """One time step: (states..., projected input[, mask]) -> (states..., output)."""
        outer = self.b
        b = _Builder(f"{outer.prefix}/d{d}", outer.opset, outer.elem_type, outer.initializers)
        b._count = outer._count  # constants go to the outer graph: keep their names unique
        states = [b.fresh("h_in")] + ([b.fresh("c_in")] if self.kind == "LSTM" else [])
        step_in = b.fresh("x_in")
        mask = b.fresh("m_in") if self.lens else None
        acts = [self._activation_fn(b, *a) for a in self.activations[d]]
        h = states[0]
        if self.kind == "LSTM":
            new = self._lstm_step(b, d, r, h, states[1], step_in, acts)
        elif self.kind == "GRU":
            new = self._gru_step(b, d, r, bias_r, h, step_in, acts)
        else:
            recurrent = outer.op("Transpose", [r], perm=[1, 0])
            new = [acts[0](self._clip(b, b.op("Add", [step_in, b.op("MatMul", [h, recurrent])])))]
        if mask:
            new = [b.op("Where", [mask, v, old]) for v, old in zip(new, states)]
            emitted = b.op("Where", [mask, new[0], b.const(0.0, "zero")])
        else:
            emitted = b.op("Identity", [new[0]])
        outer._count = b._count
        tensor = helper.make_tensor_value_info
        rank2 = [None, None]
        inputs = [tensor(s, b.elem_type, rank2) for s in states] + [tensor(step_in, b.elem_type, rank2)]
        if mask:
            inputs.append(tensor(mask, TensorProto.BOOL, rank2))
        outputs = [tensor(v, b.elem_type, rank2) for v in new + [emitted]]
        return helper.make_graph(b.nodes, b.fresh("step"), inputs, outputs)

    def _lstm_step(self, b: _Builder, d: int, r: str, h: str, c: str, step_in: str, acts) -> list[str]:
        f, g, act_h = acts
        outer = self.b
        recurrent = outer.op("Transpose", [r], perm=[1, 0])
        gates = b.op("Add", [step_in, b.op("MatMul", [h, recurrent])])
        i, o, forget, cell = b.split(gates, 4)
        peep = None
        if self.peep:
            peep = outer.split(outer.take(self.peep, d), 3)  # i, o, f
            i = b.op("Add", [i, b.op("Mul", [peep[0], c])])
            forget = b.op("Add", [forget, b.op("Mul", [peep[2], c])])
        i = f(self._clip(b, i))
        if self.input_forget:
            forget = b.op("Sub", [b.const(1.0, "one"), i])
        else:
            forget = f(self._clip(b, forget))
        cell = g(self._clip(b, cell))
        c_new = b.op("Add", [b.op("Mul", [forget, c]), b.op("Mul", [i, cell])])
        if peep:
            o = b.op("Add", [o, b.op("Mul", [peep[1], c_new])])
        o = f(self._clip(b, o))
        return [b.op("Mul", [o, act_h(c_new)]), c_new]

    def _gru_step(self, b: _Builder, d: int, r: str, bias_r: str | None, h: str, step_in: str,
                  acts) -> list[str]:
        f, g = acts
        outer, hidden = self.b, self.hidden
        x_z, x_r, x_h = b.split(step_in, 3)
        rows = outer.op("Reshape", [r, outer.const([3, hidden, hidden], "shape", np.int64)])
        r_zr = outer.op("Transpose", [outer.op("Concat", [outer.take(rows, 0), outer.take(rows, 1)],
                                               axis=0)], perm=[1, 0])  # [hidden, 2*hidden]
        r_h = outer.op("Transpose", [outer.take(rows, 2)], perm=[1, 0])
        h_z, h_r = b.split(b.op("MatMul", [h, r_zr]), 2)
        z = f(self._clip(b, b.op("Add", [x_z, h_z])))
        reset = f(self._clip(b, b.op("Add", [x_r, h_r])))
        if self.linear_before_reset:
            hidden_part = b.op("MatMul", [h, r_h])
            if bias_r:
                hidden_part = b.op("Add", [hidden_part, outer.split(bias_r, 3)[2]])
            candidate = b.op("Add", [x_h, b.op("Mul", [reset, hidden_part])])
        else:
            candidate = b.op("Add", [x_h, b.op("MatMul", [b.op("Mul", [reset, h]), r_h])])
        candidate = g(self._clip(b, candidate))
        # h' = (1 - z) * candidate + z * h = candidate + z * (h - candidate)
        return [b.op("Add", [candidate, b.op("Mul", [z, b.op("Sub", [h, candidate])])])]

    def _clip(self, b: _Builder, value: str) -> str:
        if self.clip is None:
            return value
        limit = float(self.clip)
        return b.op("Min", [b.op("Max", [value, b.const(-limit, "lo")]), b.const(limit, "hi")])

    @staticmethod
    def _activation_fn(b: _Builder, key: str, alpha: float | None, beta: float | None):
        def apply(value: str) -> str:
            if key in _PLAIN:
                return b.op(_PLAIN[key], [value])
            if key == "affine":
                return b.op("Add", [b.op("Mul", [value, b.const(alpha, "alpha")]), b.const(beta, "beta")])
            if key == "scaledtanh":
                inner = b.op("Tanh", [b.op("Mul", [value, b.const(beta, "beta")])])
                return b.op("Mul", [inner, b.const(alpha, "alpha")])
            if key == "hardsigmoid":
                return b.op("HardSigmoid", [value], alpha=alpha, beta=beta)
            op = {"leakyrelu": "LeakyRelu", "thresholdedrelu": "ThresholdedRelu", "elu": "Elu"}[key]
            return b.op(op, [value], alpha=alpha)
        return apply


class RecurrentLoop:
    """The converter of ``RECURRENT_KERNEL`` nodes: a destination-passing call of the native loop,
    its outputs (the sequence [steps, batch, hidden] and the final h and c [batch, hidden])
    shaped from the projected input's dims."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:  # noqa: ARG003 - the converter protocol
        from tvm import relax


        def convert(bb, inputs, attrs, params):
            x = shaped(bb, inputs[0], "r")
            args = [x] + [bb.normalize(v) for v in inputs[1:]]
            steps, batch, _ = x.ty.shape.values
            hidden = args[1].ty.shape.values[0]
            kind = attribute_text(attrs["kind"])
            config = [_KINDS[kind], attrs.get("reverse", 0), attrs.get("input_forget", 0),
                      attrs.get("linear_before_reset", 0), attrs.get("has_peepholes", 0),
                      attrs.get("has_lengths", 0),
                      _NATIVE_RNN_ACTIVATIONS.get(attribute_text(attrs.get("activation")), 0), "clip" in attrs]
            args += [relax.const(np.array(config, np.int64)),
                     relax.const(np.array([attrs.get("clip", 0.0)], np.float32))]
            state = relax.TensorType([batch, hidden], "float32")
            out = [relax.TensorType([steps, batch, hidden], "float32"), state, state]
            return bb.emit(relax.op.call_dps_packed(relax.ExternFunc(_KERNEL_SYMBOL), relax.Tuple(args),
                                                    out))
        return convert
