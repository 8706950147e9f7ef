"""Converters for ONNX tensor ops TVM 0.27's importer has no converter for: BitCast, Col2Im,
DeformConv, TensorScatter, Det and ReverseSequence. Each is Relax ops or a TOPI / ``te.compute``
kernel, so it lowers through the normal pipeline, with symbolic batch dims where the op allows."""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax, te, topi
from tvm.relax.frontend.onnx import onnx_frontend

from edgec.compiler.importer.converters import shape_values
from edgec.compiler.ir import constant, static_shape
from edgec.core.model import attribute_text


def _name(attrs: dict, op: str) -> str:
    return attrs.get("tvm_custom", {}).get("name", op) or op


class BitCast:
    """ONNX BitCast (opset 26): the input's bytes read as the type ``to`` of the same bit width;
    the shape is the input's. ``bool`` is one byte holding 0 or 1 (TVM's bool is a 1-bit type, so
    it goes through uint8)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            name = _name(attrs, "BitCast")
            target = onnx_frontend.get_type(attrs["to"])
            source = str(x.ty.dtype)
            width = {d: 8 if d == "bool" else tvm.DataType(d).bits for d in (source, target)}
            if width[source] != width[target]:
                raise ValueError(f"{name}: BitCast needs types of one bit width, got {source} "
                                 f"({width[source]} bits) and {target} ({width[target]} bits)")
            if isinstance(x, tvm.ir.GenericConst):
                array = np.asarray(x.value.numpy())
                if target == "bool":
                    return constant(array.view(np.uint8) != 0)
                return constant(array.view(np.dtype(target)))
            if source == target:
                return x
            if source == "bool":
                x = bb.normalize(relax.op.astype(x, "uint8"))
                source = "uint8"
            if target == "bool":
                as_bytes = x if source == "uint8" else bb.emit_te(topi.reinterpret, x, "uint8")
                return relax.op.not_equal(as_bytes, relax.const(0, "uint8"))
            if source == target:
                return x
            return bb.emit_te(topi.reinterpret, x, target)
        return convert


def _dims(bb, expr, what: str, name: str, numbers: bool) -> list:
    """The elements of a 1-D integer input known at compile time: constants, inputs the plan
    fixed, or shape values computed on the input dims (as int64 PrimExprs; ints where
    ``numbers``, which refuses dims)."""
    dims = shape_values.dims_of(bb, expr)
    if dims is not None and numbers:
        dims = [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in dims]
        dims = None if None in dims else dims
    if dims is None:
        known = "a constant or a fixed input" + ("" if numbers else ", or computed from shapes")
        raise ValueError(f"{name}: {what} must be known at compile time ({known})")
    return dims


def _flat_index(indices, extents):
    """Row-major flat index of ``indices`` in a box of ``extents``."""
    flat = indices[0]
    for index, extent in zip(indices[1:], extents[1:]):
        flat = flat * extent + index
    return flat


class Col2Im:
    """ONNX Col2Im: [N, C * prod(block), L] columns summed back into an [N, C, *image] image,
    any number of spatial dims. Each image element gathers the kernel offsets whose block lands
    on it (a reduction over the block, no scatter). ``block_shape`` must be known at compile
    time, ``image_shape`` too or computed from dims (it may be symbolic); N and C may be."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            data = inputs[0]
            name = _name(attrs, "Col2Im")
            image = _dims(bb, inputs[1], "image_shape", name, numbers=False)
            block = _dims(bb, inputs[2], "block_shape", name, numbers=True)
            spatial = len(image)
            if len(block) != spatial or data.ty.ndim != 3:
                raise ValueError(f"{name}: needs a 3-D input and image_shape and block_shape of one "
                                 f"length, got rank {data.ty.ndim}, {image} and {block}")
            dilations = list(attrs.get("dilations", [1] * spatial))
            strides = list(attrs.get("strides", [1] * spatial))
            pads = list(attrs.get("pads", [0] * 2 * spatial))
            image = [int(d) if isinstance(d, tvm.tirx.IntImm) else d for d in image]
            blocks = [(image[d] + pads[d] + pads[d + spatial] - dilations[d] * (block[d] - 1) - 1)
                      // strides[d] + 1 for d in range(spatial)]  # floordiv on dims too
            blocks = [shape_values.simplify(b, bb) if not isinstance(b, int) else b for b in blocks]
            length = data.ty.shape.values[2]
            if all(isinstance(b, int) for b in blocks):
                if min(blocks) < 1:
                    raise ValueError(f"{name}: no sliding block fits image {image} with block {block}")
                if isinstance(length, tvm.tirx.IntImm) and int(length) != int(np.prod(blocks)):
                    raise ValueError(f"{name}: the input has {int(length)} blocks, image {image} with "
                                     f"block {block} makes {int(np.prod(blocks))}")
            kernel = int(np.prod(block))

            def compute(x):
                n, ck, _ = x.shape
                axes = [te.reduce_axis((0, b), f"k{d}") for d, b in enumerate(block)]

                def element(b, c, *pixel):
                    inside, cols = [], []
                    for d in range(spatial):
                        offset = pixel[d] + pads[d] - axes[d] * dilations[d]
                        col = tvm.tirx.floordiv(offset, strides[d])
                        inside += [offset >= 0, col < blocks[d]]
                        if strides[d] != 1:
                            inside.append(tvm.tirx.floormod(offset, strides[d]) == 0)
                        cols.append(col)
                    channel = c * kernel + _flat_index(axes, block)
                    value = x[b, channel, _flat_index(cols, blocks)]
                    return te.sum(tvm.tirx.if_then_else(tvm.tirx.all(*inside), value,
                                                        tvm.tirx.const(0, x.dtype)), axis=axes)

                return te.compute((n, tvm.tirx.floordiv(ck, kernel), *image), element, name="col2im")

            return bb.emit_te(compute, data, primfunc_name_hint="col2im")
        return convert


def _optional(inputs, index: int):
    return inputs[index] if len(inputs) > index else None


class DeformConv:
    """ONNX DeformConv, 2-D: each kernel tap samples X bilinearly at its offset position (zero
    outside the image, as GridSample with zero padding and aligned corners), times the mask;
    the sampled columns [N, C * kH * kW, oH * oW] then meet the weights in one grouped matmul,
    plus the bias. W's shape must be known; N and the spatial dims may be symbolic."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x, w, offset = inputs[0], inputs[1], inputs[2]
            bias, mask = _optional(inputs, 3), _optional(inputs, 4)
            name = _name(attrs, "DeformConv")
            w_shape = static_shape(w)
            if x.ty.ndim != 4 or w_shape is None:
                raise ValueError(f"{name}: only 2-D deformable convolution (a 4-D X) with a weight "
                                 "of known shape is supported")
            out_channels, group_channels, *kernel = w_shape
            kernel = list(attrs.get("kernel_shape", kernel))
            group, offset_group = int(attrs.get("group", 1)), int(attrs.get("offset_group", 1))
            strides = list(attrs.get("strides", [1, 1]))
            dilations = list(attrs.get("dilations", [1, 1]))
            pads = list(attrs.get("pads", [0, 0, 0, 0]))
            channels = x.ty.shape.values[1]
            if not isinstance(channels, tvm.tirx.IntImm):
                raise ValueError(f"{name}: the input channels must be known at compile time")
            channels = int(channels)
            if (channels != group_channels * group or out_channels % group
                    or channels % offset_group):
                raise ValueError(f"{name}: {channels} input channels do not fit W {list(w_shape)}, "
                                 f"group {group} and offset_group {offset_group}")
            taps = kernel[0] * kernel[1]
            per_offset_group = channels // offset_group
            compute_dtype = "float64" if str(x.ty.dtype) == "float64" else "float32"

            def sample(data, off, *rest):
                weights = rest[0] if rest else None
                n, _, height, width = data.shape
                out_h, out_w = off.shape[2], off.shape[3]

                def at(b, c, i, j, oy, ox):
                    g = tvm.tirx.floordiv(c, per_offset_group)
                    tap = (g * kernel[0] + i) * kernel[1] + j
                    y = (off[b, tap * 2, oy, ox].astype(compute_dtype)
                         + (oy * strides[0] - pads[0] + i * dilations[0]).astype(compute_dtype))
                    xx = (off[b, tap * 2 + 1, oy, ox].astype(compute_dtype)
                          + (ox * strides[1] - pads[1] + j * dilations[1]).astype(compute_dtype))
                    y0, x0 = tvm.tirx.floor(y), tvm.tirx.floor(xx)
                    ly, lx = y - y0, xx - x0
                    y0, x0 = y0.astype("int64"), x0.astype("int64")
                    value = tvm.tirx.const(0, compute_dtype)
                    for dy, wy in ((0, 1 - ly), (1, ly)):
                        for dx, wx in ((0, 1 - lx), (1, lx)):
                            yy, xq = y0 + dy, x0 + dx
                            inside = tvm.tirx.all(yy >= 0, yy < height, xq >= 0, xq < width)
                            pixel = tvm.tirx.if_then_else(
                                inside, data[b, c, yy, xq].astype(compute_dtype),
                                tvm.tirx.const(0, compute_dtype))
                            value = value + wy * wx * pixel
                    # Outside (-1, H) x (-1, W) no corner is inside; the floor of a NaN or huge
                    # offset is then never read.
                    valid = tvm.tirx.all(y > -1, y < height.astype(compute_dtype),
                                         xx > -1, xx < width.astype(compute_dtype))
                    value = tvm.tirx.if_then_else(valid, value, tvm.tirx.const(0, compute_dtype))
                    if weights is not None:
                        value = value * weights[b, tap, oy, ox].astype(compute_dtype)
                    return value.astype(data.dtype)

                return te.compute((n, channels, kernel[0], kernel[1], out_h, out_w), at,
                                  name="deform_sample")

            args = [x, offset] + ([mask] if mask is not None else [])
            cols = bb.emit_te(sample, *args, primfunc_name_hint="deform_conv_sample")
            n = x.ty.shape.values[0]
            out_h, out_w = offset.ty.shape.values[2], offset.ty.shape.values[3]
            cols = bb.normalize(relax.op.reshape(cols, (n, group, group_channels * taps, out_h * out_w)))
            weight = bb.normalize(relax.op.reshape(w, (group, out_channels // group, group_channels * taps)))
            y = bb.normalize(relax.op.matmul(weight, cols))
            y = bb.normalize(relax.op.reshape(y, (n, out_channels, out_h, out_w)))
            if bias is not None:
                y = relax.op.add(y, relax.op.reshape(bias, (1, out_channels, 1, 1)))
            return y
        return convert


class TensorScatter:
    """ONNX TensorScatter (a KV-cache write): ``update``'s rows along ``axis`` written into
    ``past_cache`` from each batch entry's ``write_indices`` on (zero when absent), modulo the
    cache length in ``circular`` mode. Each output element reads the update row that lands on
    it, else the cache (a gather, no scatter); every dim may be symbolic."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            cache, update = inputs[0], inputs[1]
            indices = _optional(inputs, 2)
            name = _name(attrs, "TensorScatter")
            mode = attribute_text(attrs.get("mode"), "linear")
            if mode not in ("linear", "circular"):
                raise ValueError(f"{name}: unknown mode {mode!r} (linear or circular)")
            rank = cache.ty.ndim
            if update.ty.ndim != rank:
                raise ValueError(f"{name}: past_cache and update differ in rank ({rank}, {update.ty.ndim})")
            axis = int(attrs.get("axis", -2))
            axis = axis + rank if axis < 0 else axis
            if not 0 < axis < rank:
                raise ValueError(f"{name}: axis {attrs.get('axis', -2)} is not a non-batch axis of a "
                                 f"rank-{rank} cache")

            def compute(past, new, *rest):
                length, total = new.shape[axis], past.shape[axis]

                def element(*index):
                    row = index[axis].astype("int64")
                    if rest:
                        row = row - rest[0][index[0]].astype("int64")
                    if mode == "circular":
                        row = tvm.tirx.floormod(row, total.astype("int64"))
                    inside = tvm.tirx.all(row >= 0, row < length.astype("int64"))
                    source = list(index)
                    source[axis] = row
                    return tvm.tirx.if_then_else(inside, new[tuple(source)], past[index])

                return te.compute(past.shape, element, name="tensor_scatter")

            return bb.emit_te(compute, cache, update, *([indices] if indices is not None else []),
                              primfunc_name_hint="tensor_scatter")
        return convert


def _det_kernel(dtype: str, compute: str) -> tvm.tirx.PrimFunc:
    """det of each [m, m] matrix of ``a`` [n, m, m] by LU decomposition with partial pivoting
    (the largest remaining entry of each column becomes the pivot; a row swap flips the sign),
    eliminating in ``work``, a copy in ``compute`` precision. ``n`` and ``m`` are symbolic; each
    matrix is one block instance, so the batch loop can be spread over threads."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def det_lu(a: T.handle, w: T.handle, d: T.handle):
        T.func_attr({"tirx.noalias": True})
        n, m = T.int64(), T.int64()
        A = T.match_buffer(a, (n, m, m), dtype)
        work = T.match_buffer(w, (n, m, m), compute)
        D = T.match_buffer(d, (n,), dtype)
        for b in T.serial(n):
            with T.sblock("det"):
                vb = T.axis.spatial(n, b)
                T.reads(A[vb, 0:m, 0:m])
                T.writes(work[vb, 0:m, 0:m], D[vb])
                row = T.sblock_alloc_buffer((1,), "int64", scope="local")
                best = T.sblock_alloc_buffer((1,), compute, scope="local")
                acc = T.sblock_alloc_buffer((1,), compute, scope="local")
                swap = T.sblock_alloc_buffer((1,), compute, scope="local")
                for i, j in T.grid(m, m):
                    work[vb, i, j] = T.Cast(compute, A[vb, i, j])
                acc[0] = T.Cast(compute, 1)
                for k in T.serial(m):
                    row[0] = k
                    best[0] = T.abs(work[vb, k, k])
                    for i in T.serial(k + 1, m):
                        if T.abs(work[vb, i, k]) > best[0]:
                            best[0] = T.abs(work[vb, i, k])
                            row[0] = i
                    if row[0] != k:
                        for j in T.serial(k, m):
                            swap[0] = work[vb, k, j]
                            work[vb, k, j] = work[vb, row[0], j]
                            work[vb, row[0], j] = swap[0]
                        acc[0] = -acc[0]
                    acc[0] = acc[0] * work[vb, k, k]
                    if work[vb, k, k] != T.Cast(compute, 0):
                        for i in T.serial(k + 1, m):
                            for j in T.serial(k + 1, m):
                                work[vb, i, j] = (work[vb, i, j]
                                                  - work[vb, i, k] / work[vb, k, k] * work[vb, k, j])
                D[vb] = T.Cast(dtype, acc[0])

    return det_lu


class Det:
    """ONNX Det: the determinant of each [M, M] matrix of a [..., M, M] input, by LU with partial
    pivoting in a TIR kernel (float16 and bfloat16 eliminate in float32). The batch dims and M may
    be symbolic."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            name = _name(attrs, "Det")
            dtype = str(x.ty.dtype)
            if "float" not in dtype or x.ty.ndim < 2:
                raise ValueError(f"{name}: needs a float tensor of rank 2 or more, got {dtype} of "
                                 f"rank {x.ty.ndim}")
            compute = dtype if dtype in ("float32", "float64") else "float32"
            *batch, rows, cols = x.ty.shape.values
            analyzer = tvm.sym.Analyzer()
            if all(isinstance(v, tvm.tirx.IntImm) for v in (rows, cols)) and int(rows) != int(cols):
                raise ValueError(f"{name}: needs square matrices, got [{rows}, {cols}]")
            count = tvm.tirx.const(1, "int64")
            for dim in batch:
                count = count * dim
            count = analyzer.simplify(count)
            flat = bb.normalize(relax.op.reshape(x, (count, rows, rows)))
            kernel = bb.add_func(_det_kernel(dtype, compute), "edgec_det_lu")
            out = bb.emit(relax.call_tir(kernel, [flat], [relax.TensorType((count, rows, rows), compute),
                                                          relax.TensorType((count,), dtype)]))
            return relax.op.reshape(relax.TupleGetItem(out, 1), batch)
        return convert


class ReverseSequence:
    """ONNX ReverseSequence: the first ``sequence_lens[b]`` entries along ``time_axis`` of each
    batch entry reversed, the rest kept (Relax's reverse_sequence); any dim may be symbolic."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x, lengths = inputs
            name = _name(attrs, "ReverseSequence")
            time_axis, batch_axis = int(attrs.get("time_axis", 0)), int(attrs.get("batch_axis", 1))
            if sorted((time_axis, batch_axis)) != [0, 1] or x.ty.ndim < 2:
                raise ValueError(f"{name}: time_axis and batch_axis must be 0 and 1 (in either order) "
                                 f"of a tensor of rank 2 or more, got {time_axis}, {batch_axis}")
            return relax.op.reverse_sequence(x, lengths, time_axis, batch_axis)
        return convert
