"""Blocked layout: keep activations in the library's layout (oneDNN: NCHW{b}c; XNNPACK: NHWC)
between its convolutions, and run the TVM ops between them in that layout too."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

from edgec.compiler.transform.library_offload.rules import LIBRARIES, DispatchRules
from edgec.compiler.transform.library_offload.analysis import (
    _Analysis, _equal_dims, _is_call, _per_channel, _same_shape, constant_value)

_CONV_FUNCTIONS = tuple(DispatchRules(library=lib).symbol(f)
                        for lib in LIBRARIES for f in ("conv2d", "conv2d_add"))
_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")
_UNARY = tuple(tvm.ir.Op.get(f"relax.{name}") for name in (
    "nn.relu", "sigmoid", "tanh", "clip", "nn.silu", "nn.gelu", "nn.gelu_tanh", "exp", "sqrt",
    "negative", "abs",
))
_BINARY = tuple(tvm.ir.Op.get(f"relax.{name}") for name in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum",
))
_POOLS = (tvm.ir.Op.get("relax.nn.max_pool2d"), tvm.ir.Op.get("relax.nn.avg_pool2d"))
_MEAN = tvm.ir.Op.get("relax.mean")
_RESIZE = tvm.ir.Op.get("relax.image.resize2d")
_CONCAT = tvm.ir.Op.get("relax.concat")
_SPLIT = tvm.ir.Op.get("relax.split")


def _channels(expr: relax.Expr) -> int | None:
    """The static channel count of a rank-4 float32 tensor, else None."""
    return _type_channels(expr.ty)


def _type_channels(ty) -> int | None:
    """The static channel count of a rank-4 float32 tensor type, else None."""
    if not isinstance(ty, relax.TensorType) or ty.ndim != 4 or ty.dtype != "float32":
        return None
    values = getattr(ty.shape, "values", None) if ty.shape is not None else None
    if values is None or not isinstance(values[1], tirx.IntImm):
        return None
    return int(values[1])


def _channel_broadcast(arg: relax.Expr, like: relax.Expr) -> bool:
    """Whether ``arg`` is [N, C, 1, 1] of rank-4 ``like``'s N and C: a per-channel value per image
    (a squeeze-excite gate), which broadcasts over a blocked tensor once blocked alike."""
    a, b = arg.ty, like.ty
    if not (isinstance(a, relax.TensorType) and isinstance(b, relax.TensorType)
            and a.dtype == b.dtype and a.ndim == 4 and b.ndim == 4):
        return False
    va, vb = getattr(a.shape, "values", None), getattr(b.shape, "values", None)
    if va is None or vb is None:
        return False
    ones = all(isinstance(d, tirx.IntImm) and int(d) == 1 for d in va[2:])
    return ones and _equal_dims(va[:2], vb[:2])


def _block_of(channels: int | None, preferred: int | None) -> int | None:
    """The channel block for a tensor: ``preferred`` if it divides the channels, else all of them
    (``preferred`` None: always all of them).

    A block of all channels, [N, 1, H, W, C], is NHWC: XNNPACK's layout, and oneDNN's for grouped
    and depthwise convolutions and for channel counts its blocked kernels do not take.
    """
    if channels is None:
        return None
    return preferred if preferred is not None and channels % preferred == 0 else channels


def _to_blocked(x: relax.Expr, block: int) -> relax.Expr:
    return relax.op.layout_transform(
        x, index_map=lambda n, c, h, w: (n, c // block, h, w, c % block))


def _to_plain(x: relax.Expr, block: int) -> relax.Expr:
    return relax.op.layout_transform(x, index_map=lambda n, cb, h, w, c: (n, cb * block + c, h, w))


def _reblock(x: relax.Expr, old: int, new: int) -> relax.Expr:
    return relax.op.layout_transform(
        x, index_map=lambda n, cb, h, w, c: (n, (cb * old + c) // new, h, w, (cb * old + c) % new))


def _blocked_type(ty: relax.TensorType, block: int) -> relax.TensorType:
    n, c, h, w = ty.shape.values
    return relax.TensorType([n, int(c) // block, h, w, block], ty.dtype)


def _blocked_constant(array: np.ndarray, channels: int, block: int) -> np.ndarray | None:
    """A constant operand of a rank-4 op, rewritten for the blocked layout, else None."""
    if array.size == 1:
        return array.reshape(()) if array.ndim else array
    vector = _per_channel(array, channels, 4, 1)
    if vector is None:
        return None
    return vector.reshape(1, channels // block, 1, 1, block)


_RESHAPE = tvm.ir.Op.get("relax.reshape")
_PERMUTE_DIMS = tvm.ir.Op.get("relax.permute_dims")
_SHUFFLE_LIMIT = 1 << 22  # elements simulated to recognize a shuffle


def _batch_dim(expr: relax.Expr) -> tirx.Var | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None) or []
    return values[0] if values and isinstance(values[0], tirx.Var) else None


def _shape_with_batch(expr: relax.Expr, batch: tirx.Var | None) -> tuple[int, ...] | None:
    """``expr``'s static shape, with a leading symbolic ``batch`` dim taken as 1."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = list(getattr(ty.shape, "values", None) or [])
    if values and batch is not None and values[0].same_as(batch):
        values[0] = tirx.IntImm("int64", 1)
    if not values or not all(isinstance(v, tirx.IntImm) for v in values):
        return None
    return tuple(int(v) for v in values)


def _channel_shuffles(analysis: _Analysis) -> dict[relax.Var, tuple]:
    """``reshape -> permute_dims -> reshape`` chains that only permute channels (ShuffleNet).

    Maps the last variable of each to (its NCHW input, the two intermediate variables, the
    channel permutation as int64 indices). The chain is simulated on an index tensor of the
    input's static shape, so only true channel permutations match.
    """
    found = {}
    for var, binding in analysis.bindings.items():
        last = binding.value
        if not _is_call(last, _RESHAPE) or not isinstance(last.args[0], relax.Var):
            continue
        middle_var = last.args[0]
        middle = analysis.value(middle_var)
        if not _is_call(middle, _PERMUTE_DIMS) or not isinstance(middle.args[0], relax.Var):
            continue
        first_var = middle.args[0]
        first = analysis.value(first_var)
        if not _is_call(first, _RESHAPE) or analysis.sole_consumer(first_var) is None:
            continue
        if analysis.sole_consumer(middle_var) is None or first_var in analysis.used_outside:
            continue
        source = first.args[0]
        batch = _batch_dim(source)
        shape = _shape_with_batch(source, batch) if _channels(source) is not None else None
        inner = _shape_with_batch(first_var, batch)
        if shape is None or inner is None or _shape_with_batch(var, batch) != shape:
            continue
        if int(np.prod(shape)) > _SHUFFLE_LIMIT or middle.attrs.axes is None:
            continue
        index = np.arange(int(np.prod(shape))).reshape(shape)
        moved = index.reshape(inner).transpose([int(a) for a in middle.attrs.axes]).reshape(shape)
        n, c, h, w = np.unravel_index(moved, shape)
        grid = np.indices(shape)
        if not ((n == grid[0]).all() and (h == grid[2]).all() and (w == grid[3]).all()):
            continue
        permutation = c[0, :, 0, 0]
        if not (c == permutation.reshape(1, -1, 1, 1)).all():
            continue
        found[var] = (source, (first_var, middle_var), permutation.astype(np.int64))
    return found


def _library_pool(x: relax.Expr, attrs, is_max: bool, symbol: str,
                  out_ty: relax.TensorType) -> relax.Expr | None:
    """A 2-D pooling of blocked ``x`` as a call of the library's ``symbol`` (``pool2d``), else
    None: dilated windows, and averages in ceil mode (whose border windows frameworks divide
    each their own way), stay TVM's."""
    if any(int(d) != 1 for d in attrs.dilation) or (not is_max and attrs.ceil_mode):
        return None
    kind = 0 if is_max else (1 if attrs.count_include_pad else 2)
    (kh, kw), (sh, sw) = ([int(v) for v in a] for a in (attrs.pool_size, attrs.strides))
    pt, pl = int(attrs.padding[0]), int(attrs.padding[1])
    ints = [kind, kh, kw, sh, sw, pt, pl]
    return relax.call_dps_packed(symbol, [x, *(relax.prim_value(v) for v in ints)], out_ty)


def _library_resize(x: relax.Expr, value: relax.Call, var: relax.Var, symbol: str,
                    out_ty: relax.TensorType) -> relax.Expr | None:
    """A resize of blocked ``x`` as a call of the library's ``symbol`` (``resize2d``), else None.

    oneDNN computes bilinear with half-pixel coordinates (PyTorch's and ONNX's default) and
    nearest as round((o + 0.5) / f - 0.5), which equals the asymmetric floor(o / f) of PyTorch's
    nearest only for whole factors f: nearest goes only with static sizes that are whole
    multiples. Other modes stay TVM's.
    """
    attrs = value.attrs
    if attrs.layout != "NCHW" or attrs.out_dtype not in (None, "", "float32"):
        return None
    if attrs.method == "linear" and attrs.coordinate_transformation_mode == "half_pixel":
        return relax.call_dps_packed(symbol, [x, relax.prim_value(1)], out_ty)
    if (attrs.method != "nearest_neighbor" or attrs.coordinate_transformation_mode != "asymmetric"
            or attrs.rounding_method not in ("floor", "")):
        return None
    sizes = [getattr(v.ty.shape, "values", None) for v in (value.args[0], var)]
    if sizes[0] is None or sizes[1] is None:
        return None
    dims = [(i, o) for i, o in zip(sizes[0][2:], sizes[1][2:])]
    if not all(isinstance(i, tirx.IntImm) and isinstance(o, tirx.IntImm) and int(i) > 0
               and int(o) % int(i) == 0 for i, o in dims):
        return None
    return relax.call_dps_packed(symbol, [x, relax.prim_value(0)], out_ty)


def _block_layout(func: relax.Function, preferred: int | None, mod: tvm.IRModule,
                  library: dict[str, str] | None = None) -> relax.Function:
    """Rewrite ``func`` so tensors flow between library convolutions in a blocked layout.

    A library convolution writes NCHW{b}c, with b ``preferred`` where it divides the output
    channels, else all channels (NHWC as [N, 1, H, W, C]; ``preferred`` None: always NHWC,
    XNNPACK's layout). Ops that can run on blocked tensors of one block
    (elementwise with per-channel or scalar constants, 2-D pooling, channel concat and split,
    spatial mean) then run blocked in TVM; pooling, spatial means (as global average pools) and
    resizing (``relax.image.resize2d``) as calls of the library's ``library["pool2d"]``,
    ``library["resize2d"]`` where given. Any other use
    of a blocked tensor gets a ``layout_transform`` back to NCHW before its first such use, or
    right after its binding when it is used outside its block, so the NCHW variable keeps its
    name and scope.
    """
    library = library or {}
    analysis = _Analysis(func)
    shuffles = _channel_shuffles(analysis)
    shuffle_steps = {v for _, steps, _ in shuffles.values() for v in steps}

    @relax.expr_functor.mutator
    class Blocker(relax.PyExprMutator):
        def __init__(self, mod: tvm.IRModule) -> None:
            super().__init__(mod)
            self.blocked: dict[relax.Var, tuple[relax.Var, int]] = {}
            self.plain: dict[relax.Var, relax.Var] = {}
            self.deferred: dict[relax.Var, relax.VarBinding] = {}
            # Channel splits of blocked tensors: the split's tuple and each part's block.
            self.blocked_tuples: dict[relax.Var, tuple[relax.Var, list[int]]] = {}

        def _plain(self, var: relax.Var) -> relax.Var:
            if var not in self.plain:
                blocked, block = self.blocked[var]
                self.plain[var] = self.builder_.emit(_to_plain(blocked, block), f"{var.name}_nchw")
            return self.plain[var]

        def visit_var_(self, var: relax.Var) -> relax.Expr:
            return self._plain(var) if var in self.blocked else super().visit_var_(var)

        def visit_dataflow_var_(self, var: relax.Var) -> relax.Expr:
            return self._plain(var) if var in self.blocked else super().visit_dataflow_var_(var)

        def _block(self, expr: relax.Expr) -> int | None:
            if isinstance(expr, relax.Var) and expr in self.blocked:
                return self.blocked[expr][1]
            return None

        def _blocked_arg(self, expr: relax.Expr, block: int) -> relax.Expr:
            """``expr`` in NCHW{block}c, converted from NCHW or another block if need be."""
            current = self._block(expr)
            if current == block:
                return self.blocked[expr][0]
            if current is not None:
                return _reblock(self.blocked[expr][0], current, block)
            return _to_blocked(self.visit_expr(expr), block)

        def visit_var_binding_(self, binding: relax.VarBinding) -> None:
            var = binding.var
            if self._split_binding(var, binding.value):
                return
            if var in shuffle_steps:  # decided at the shuffle's last step
                self.deferred[var] = binding
                return
            if var in shuffles:
                source, steps, permutation = shuffles[var]
                if self._block(source) is None:  # an NCHW input: the shuffle stays as written
                    for step in steps:
                        super().visit_var_binding_(self.deferred.pop(step))
                    super().visit_var_binding_(binding)
                    return
                channels = _channels(source)
                nhwc = self._blocked_arg(source, channels)
                value = relax.op.take(nhwc, relax.const(permutation), axis=4)
                self._keep_blocked(var, value, channels, f"{var.name}_nhwc")
                return
            preferred_block = _block_of(_channels(var), preferred)
            found = (self._blocked_value(var, binding.value, preferred_block)
                     if preferred_block else None)
            if found is None:
                super().visit_var_binding_(binding)
                return
            self._keep_blocked(var, *found)

        def _keep_blocked(self, var: relax.Var, value: relax.Expr, block: int,
                          name: str | None = None) -> None:
            """Bind ``value`` (``var`` in NCHW{block}c), with an NCHW copy under ``var``'s own
            name when ``var`` is used outside its block."""
            name = name or f"{var.name}_nc{block}c"
            self.blocked[var] = (self.builder_.emit(value, name), block)
            if var in analysis.used_outside:
                plain = self.builder_.normalize(_to_plain(self.blocked[var][0], block))
                self.builder_.emit_normalized(relax.VarBinding(var, plain))
                self.plain[var] = var

        def _split_binding(self, var: relax.Var, value: relax.Expr) -> bool:
            """A channel split of a blocked tensor, or a part of one, bound blocked; False for
            any other binding.

            The parts keep the input's block where each has whole blocks, else all go NHWC
            (ShuffleNet's units split a shuffled NHWC tensor in halves of 24 or 58 channels).
            Only a split whose every use is taking a part in its own block qualifies.
            """
            if isinstance(value, relax.TupleGetItem) and value.tuple_value in self.blocked_tuples:
                parts, blocks = self.blocked_tuples[value.tuple_value]
                self._keep_blocked(var, relax.TupleGetItem(parts, value.index),
                                   blocks[int(value.index)])
                return True
            if not _is_call(value, _SPLIT) or self._block(value.args[0]) is None:
                return False
            if int(value.attrs.axis) % 4 != 1 or var in analysis.used_outside:
                return False
            consumers = analysis.consumers.get(var, [])
            if analysis.uses.get(var, 0) != len(consumers) or not all(
                    isinstance(analysis.value(c), relax.TupleGetItem)
                    and c not in analysis.used_outside for c in consumers):
                return False
            channels = [_type_channels(ty) for ty in var.ty.fields]
            if any(c is None for c in channels):
                return False
            data, block = value.args[0], self._block(value.args[0])
            sections = value.attrs.indices_or_sections
            if block != _channels(data) and all(c % block == 0 for c in channels):
                split = (relax.op.split(self.blocked[data][0], int(sections), axis=1)
                         if isinstance(sections, tirx.IntImm) else
                         relax.op.split(self.blocked[data][0],
                                        [int(i) // block for i in sections], axis=1))
                blocks = [block] * len(channels)
            else:
                nhwc = self._blocked_arg(data, _channels(data))
                split = relax.op.split(nhwc, int(sections) if isinstance(sections, tirx.IntImm)
                                       else [int(i) for i in sections], axis=4)
                blocks = channels
            self.blocked_tuples[var] = (self.builder_.emit(split, f"{var.name}_parts"), blocks)
            return True

        def _blocked_value(self, var: relax.Var, value: relax.Expr,
                           preferred_block: int) -> tuple[relax.Expr, int] | None:
            """``value`` computed in a blocked layout, and its block; None to keep it NCHW.

            Ops other than convolutions go blocked only when an input already is: converting
            their NCHW inputs would add copies, not remove them.
            """
            if not isinstance(value, relax.Call):
                return None
            op, args = value.op, value.args
            if op.same_as(_CALL_DPS_PACKED):
                return self._conv(var, value, preferred_block)
            blocks = [self._block(arg) for arg in args]
            block = next((b for b in blocks if b is not None), None)
            if block is None and op.same_as(_CONCAT) and isinstance(args[0], relax.Tuple):
                blocks = [self._block(f) for f in args[0].fields]
                block = next((b for b in blocks if b is not None), None)
            if block is None:
                return None
            if op.same_as(_CONCAT):
                return self._concat(var, value)
            first = self.blocked[args[0]][0] if blocks[0] == block else None
            if any(op.same_as(unary) for unary in _UNARY) and first is not None:
                return relax.Call(op, [first, *args[1:]], value.attrs), block
            if any(op.same_as(binary) for binary in _BINARY):
                # The block of a full-size operand: a broadcast gate alone does not make it pay
                # to convert the tensor it scales.
                block = next((self._block(a) for a in args
                              if _same_shape(a, var) and self._block(a) is not None), None)
                if block is None:
                    return None
                new_args = []
                for arg in args:
                    constant = constant_value(arg)
                    if constant is not None:
                        folded = _blocked_constant(constant, _channels(var), block)
                        if folded is None:
                            return None
                        new_args.append(relax.const(folded.astype(constant.dtype)))
                    elif _same_shape(arg, var) or _channel_broadcast(arg, var):
                        new_args.append(self._blocked_arg(arg, block))
                    else:
                        return None
                return relax.Call(op, new_args, value.attrs), block
            if any(op.same_as(pool) for pool in _POOLS) and first is not None:
                attrs = value.attrs
                if attrs.layout != "NCHW" or attrs.out_layout != "NCHW":
                    return None
                is_max = op.same_as(_POOLS[0])
                if "pool2d" in library:
                    call = _library_pool(first, attrs, is_max, library["pool2d"],
                                         _blocked_type(var.ty, block))
                    if call is not None:
                        return call, block
                make = relax.op.nn.max_pool2d if is_max else relax.op.nn.avg_pool2d
                return make(first, attrs.pool_size, attrs.strides, attrs.padding, attrs.dilation,
                            attrs.ceil_mode, attrs.count_include_pad, f"NCHW{block}c",
                            f"NCHW{block}c"), block
            if op.same_as(_RESIZE) and first is not None and "resize2d" in library:
                call = _library_resize(first, value, var, library["resize2d"],
                                       _blocked_type(var.ty, block))
                return None if call is None else (call, block)
            if op.same_as(_MEAN) and first is not None:
                axes = sorted(int(a) % 4 for a in value.attrs.axis) if value.attrs.axis else []
                if axes != [2, 3] or not value.attrs.keepdims:
                    return None
                if "pool2d" in library:  # a global average pool (kernel 0 x 0: all of it)
                    ints = [1, 0, 0, 1, 1, 0, 0]
                    return relax.call_dps_packed(
                        library["pool2d"], [first, *(relax.prim_value(v) for v in ints)],
                        _blocked_type(var.ty, block)), block
                return relax.op.mean(first, axis=[2, 3], keepdims=True), block
            return None

        def _concat(self, var: relax.Var, value: relax.Call) -> tuple[relax.Expr, int] | None:
            """A channel concat: along the block axis when every input divides into the output's
            blocks, else in NHWC ([N, 1, H, W, C]) along the channel axis."""
            fields = list(value.args[0].fields)
            if value.attrs.axis is None or int(value.attrs.axis) % 4 != 1:
                return None
            channels = [_channels(f) for f in fields]
            if any(c is None for c in channels):
                return None
            block = _block_of(_channels(var), preferred)
            if block != _channels(var) and all(c % block == 0 for c in channels):
                return relax.op.concat([self._blocked_arg(f, block) for f in fields], axis=1), block
            nhwc = [self._blocked_arg(f, c) for f, c in zip(fields, channels)]
            return relax.op.concat(nhwc, axis=4), _channels(var)

        def _conv(self, var: relax.Var, value: relax.Call,
                  block: int) -> tuple[relax.Expr, int] | None:
            func, args = value.args
            if not (isinstance(func, relax.ExternFunc) and func.global_symbol in _CONV_FUNCTIONS):
                return None
            residual = str(func.global_symbol).endswith("_conv2d_add")
            nhwc_only = str(func.global_symbol).startswith("edgec_xnn_")
            fields = list(args.fields)
            weight = constant_value(fields[1])
            groups = int(fields[12 if residual else 11].value)
            if (weight is not None and groups > 1 and weight.shape[1] > 1
                    and (weight.shape[1] % block or weight.shape[0] // groups % block)):
                # oneDNN's blocked kernels take groups of whole blocks; the others run NHWC.
                block = _channels(var)
            new_args = []
            for index, arg in enumerate(fields):
                if (index == 0 and self._block(arg) is not None and nhwc_only
                        and self._block(arg) != _channels(arg)):  # XNNPACK reads NHWC only
                    new_args.append(self._blocked_arg(arg, _channels(arg)))
                elif index == 0 and self._block(arg) is not None:  # oneDNN reads any block
                    new_args.append(self.blocked[arg][0])
                elif index == 3 and residual:  # the residual takes the output's layout
                    new_args.append(self._blocked_arg(arg, block))
                else:  # weights, attributes, and an NCHW input (the image) the shim reorders
                    new_args.append(self.visit_expr(arg))
            out_ty = _blocked_type(var.ty, block)
            return relax.call_dps_packed(func.global_symbol, new_args, out_ty), block

    return Blocker(mod).visit_expr(func)
