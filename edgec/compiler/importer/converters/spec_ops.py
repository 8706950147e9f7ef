"""Converters for corners of the ONNX spec that TVM 0.27's converters miss: attributes they
ignore or refuse, dtypes they do not keep, outputs they do not produce. Most wrap TVM's
converter and handle only the case it lacks, the rest going to TVM's converter unchanged; the
activations (Elu, Selu, ThresholdedRelu) and Upsample (as Resize) replace it."""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
import tvm
from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from edgec.compiler.importer.converters import ops
from edgec.compiler.ir import constant, static_shape
from edgec.core.model import attribute_text


def _dtype(ty) -> str:
    return str(ty.dtype)


class Constant:
    """ONNX Constant: ``fold`` has turned every value form into a ``value`` tensor (what TVM's
    converter reads); strings, which no TVM tensor holds (TVM's converter would make them 0),
    are refused."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Constant.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            value = attrs.get("value")
            if "value_string" in attrs or "value_strings" in attrs or (
                    value is not None and value.data_type == onnx.TensorProto.STRING):
                raise ValueError("string constants are not supported (TVM tensors hold numbers)")
            if value is None:
                raise ValueError(f"a constant given as {', '.join(a for a in attrs if a != 'tvm_custom')} "
                                 "reached the importer without the fold pass")
            return fallback(bb, inputs, attrs, params)
        return convert


class EyeLike:
    """ONNX EyeLike with a ``dtype`` attribute (TVM's converter refuses one that differs from
    the input's, and TVM's legalization of ``eye_like`` ignores its dtype: a cast follows)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            dtype = onnx_frontend.get_type(attrs["dtype"]) if "dtype" in attrs else _dtype(x.ty)
            eye = relax.op.eye_like(x, attrs.get("k", 0))
            return eye if dtype == _dtype(x.ty) else relax.op.astype(bb.normalize(eye), dtype)
        return convert


class Split:
    """ONNX Split whose parts include empty ones: each part is a slice (TVM's split needs
    strictly increasing split points)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Split.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            count = attrs["tvm_custom"]["num_outputs"]
            rank = x.ty.ndim
            axis = attrs.get("axis", 0)
            axis = axis + rank if axis < 0 else axis
            sizes = _split_sizes(inputs, attrs, opset)
            if sizes is None or all(sizes):
                return fallback(bb, inputs, attrs, params)
            if len(sizes) != count:
                raise ValueError(f"split gives {len(sizes)} sizes for {count} outputs")
            parts, begin = [], 0
            for size in sizes:
                parts.append(bb.normalize(relax.op.strided_slice(
                    x, axes=[axis], begin=[begin], end=[begin + size])))
                begin += size
            return relax.Tuple(parts)
        return convert


def _split_sizes(inputs, attrs, opset: int) -> list[int] | None:
    """The sizes of the parts when given (the ``split`` attribute or a constant input)."""
    if opset < 13:
        split = attrs.get("split")
        if split is None and len(inputs) > 1 and isinstance(inputs[1], tvm.ir.GenericConst):
            split = inputs[1].value.numpy().tolist()
        return None if split is None else [int(s) for s in split]
    if len(inputs) > 1 and inputs[1] is not None:
        if not isinstance(inputs[1], tvm.ir.GenericConst):
            raise ValueError("Split's split sizes must be known at compile time (a constant or "
                             "a fixed input)")
        return [int(s) for s in np.asarray(inputs[1].value.numpy()).reshape(-1)]
    return None


class Unsqueeze:
    """ONNX Unsqueeze (opset 13+) with rank-0 axes, which ONNX allows for one axis (TVM's
    converter iterates over the axes): they become a one-element list."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Unsqueeze.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            axes = inputs[1] if len(inputs) > 1 else None
            if isinstance(axes, tvm.ir.GenericConst) and axes.ty.ndim == 0:
                axes = constant(axes.value.numpy().reshape(1))
                inputs = [inputs[0], axes, *inputs[2:]]
            return fallback(bb, inputs, attrs, params)
        return convert


class Upsample:
    """ONNX Upsample (opset 7-9; deprecated since 10): ``Resize`` with ``asymmetric``
    coordinates and ``floor`` nearest rounding, the scales an attribute (opset 7) or a constant
    input (opset 9; TVM's converter reads only the attribute)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        resize = ops.Resize.get_converter(13)

        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            scales = attrs.get("scales")
            if scales is None and len(inputs) > 1 and inputs[1] is not None:
                if not isinstance(inputs[1], tvm.ir.GenericConst):
                    raise ValueError("Upsample's scales must be known at compile time (a "
                                     "constant or a fixed input)")
                scales = inputs[1].value.numpy().reshape(-1)
            if scales is None:
                raise ValueError("Upsample has no scales")
            mode = attribute_text(attrs.get("mode"), "nearest")
            # As ONNX attributes are (bytes): TVM's Resize converter decodes them.
            resize_attrs = {"mode": b"linear" if mode in ("linear", "bilinear") else mode.encode(),
                            "coordinate_transformation_mode": b"asymmetric",
                            "nearest_mode": b"floor", "tvm_custom": attrs.get("tvm_custom", {})}
            scales = constant(np.asarray(scales, np.float32))
            return resize(bb, [x, None, scales, None], resize_attrs, params)
        return convert


class BatchNormalization:
    """ONNX BatchNormalization with ``training_mode=1``: normalized by the batch's statistics,
    with running mean and variance ``running * momentum + batch * (1 - momentum)`` (TVM's
    batch_norm weighs them the other way round); float16 data computed in float32."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.BatchNormalization.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            if opset < 14 or not attrs.get("training_mode", 0):
                return fallback(bb, inputs, attrs, params)
            x, scale, bias, mean, var = inputs[:5]
            data_dtype = _dtype(x.ty)
            work = "float32" if data_dtype == "float16" else data_dtype
            cast = lambda e: e if _dtype(e.ty) == work else bb.normalize(relax.op.astype(e, work))  # noqa: E731
            x, scale, bias, mean, var = (cast(e) for e in (x, scale, bias, mean, var))
            rank = x.ty.ndim
            axes = [a for a in range(rank) if a != 1]
            along = lambda e: relax.op.reshape(bb.normalize(e), [-1] + [1] * (rank - 2))  # noqa: E731
            batch_mean = bb.normalize(relax.op.mean(x, axes, keepdims=False))
            centered = bb.normalize(relax.op.subtract(x, along(batch_mean)))
            batch_var = bb.normalize(relax.op.mean(relax.op.multiply(centered, centered), axes,
                                                   keepdims=False))
            eps = relax.const(attrs.get("epsilon", 1e-5), work)
            inv_std = relax.op.rsqrt(relax.op.add(batch_var, eps))
            y = relax.op.add(relax.op.multiply(centered, along(relax.op.multiply(scale, inv_std))),
                             along(bias))
            momentum = attrs.get("momentum", 0.9)
            keep, take = relax.const(momentum, work), relax.const(1.0 - momentum, work)
            running = [relax.op.add(relax.op.multiply(old, keep), relax.op.multiply(new, take))
                       for old, new in ((mean, batch_mean), (var, batch_var))]
            outputs = [bb.normalize(y)] + [bb.normalize(r) for r in running]
            dtypes = [data_dtype, _dtype(inputs[3].ty), _dtype(inputs[4].ty)]
            return relax.Tuple([o if _dtype(o.ty) == d else bb.normalize(relax.op.astype(o, d))
                                for o, d in zip(outputs, dtypes)])
        return convert


class MaxPool:
    """ONNX MaxPool with its ``Indices`` output (TVM's converter gives only ``Y``), for static
    shapes: every window is gathered from the flattened spatial dims with constant positions
    (padding reads a sentinel below every value), then reduced with argmax; an index is
    the position in the whole input, row-major (``storage_order`` 0) or with the spatial dims
    column-major (1), as onnxruntime counts it."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.MaxPool.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            if attrs["tvm_custom"]["num_outputs"] < 2:
                return fallback(bb, inputs, attrs, params)
            x = inputs[0]
            shape = static_shape(x)
            if shape is None:
                raise ValueError("MaxPool's Indices output needs a static input shape")
            spatial = list(shape[2:])
            positions, out_dims = _pool_windows(spatial, attrs)
            dtype = _dtype(x.ty)
            lowest = -np.inf if "float" in dtype else np.iinfo(dtype).min
            count = int(np.prod(spatial))
            n, c = shape[0], shape[1]
            flat = bb.normalize(relax.op.reshape(x, [n, c, count]))
            sentinel = constant(np.full((n, c, 1), lowest, dtype))
            flat = bb.normalize(relax.op.concat([flat, sentinel], axis=2))
            windows = bb.normalize(relax.op.take(flat, constant(positions.reshape(-1)), axis=2))
            windows = bb.normalize(relax.op.reshape(windows, [n, c, *positions.shape]))
            # TVM's argmax and max start from the lowest finite value: a window of -inf gets -1,
            # which is its first slot (a real value: padding comes last); y is read there.
            chosen = relax.op.argmax(windows, axis=3, keepdims=True)
            chosen = bb.normalize(relax.op.maximum(chosen, relax.const(0, "int64")))
            y = relax.op.reshape(relax.op.gather_elements(windows, chosen, axis=3),
                                 [n, c, *out_dims])
            # The chosen window slot's position in the spatial dims, in the storage order.
            order = positions.copy()
            if attrs.get("storage_order", 0):
                coords = np.unravel_index(np.minimum(positions, count - 1), spatial)
                order = np.ravel_multi_index(coords, spatial, order="F")
            table = constant(np.broadcast_to(order, (n, c, *order.shape)).astype(np.int64))
            index = relax.op.squeeze(relax.op.gather_elements(table, chosen, axis=3), [3])
            base = constant((np.arange(n * c, dtype=np.int64) * count).reshape(n, c, 1))
            index = relax.op.add(bb.normalize(index), base)
            return relax.Tuple([bb.normalize(y),
                                bb.normalize(relax.op.reshape(index, [n, c, *out_dims]))])
        return convert


def _pool_windows(spatial: list[int], attrs) -> tuple[np.ndarray, list[int]]:
    """Per output position (row-major) and window slot (in window order, padding last), the
    flat position it reads in the spatial dims, ``prod(spatial)`` for padding; and the output's spatial dims (ONNX's rules for
    pads, auto_pad, dilations and ceil_mode)."""
    rank = len(spatial)
    kernel = [int(k) for k in attrs["kernel_shape"]]
    strides = [int(v) for v in attrs.get("strides", [1] * rank)]
    dilations = [int(v) for v in attrs.get("dilations", [1] * rank)]
    pads = [int(v) for v in attrs.get("pads", [0] * (2 * rank))]
    auto_pad = attribute_text(attrs.get("auto_pad"), "NOTSET")
    ceil_mode = int(attrs.get("ceil_mode", 0))
    out_dims, begins = [], []
    for i, size in enumerate(spatial):
        extent = (kernel[i] - 1) * dilations[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out = -(-size // strides[i])
            total = max(0, (out - 1) * strides[i] + extent - size)
            begin = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
        elif auto_pad == "VALID":
            out, begin = (size - extent) // strides[i] + 1, 0
        else:
            begin, span = pads[i], size + pads[i] + pads[i + rank] - extent
            out = (-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1
            if ceil_mode and (out - 1) * strides[i] >= size + pads[i]:
                out -= 1  # the last window would start in the end padding
        out_dims.append(out)
        begins.append(begin)
    count = int(np.prod(spatial))
    grids = np.meshgrid(*[np.arange(o) for o in out_dims], indexing="ij")
    slots = np.meshgrid(*[np.arange(k) for k in kernel], indexing="ij")
    positions = np.zeros((int(np.prod(out_dims)), int(np.prod(kernel))), np.int64)
    valid = np.ones(positions.shape, bool)
    flat = np.zeros(positions.shape, np.int64)
    for i in range(rank):
        coord = (grids[i].reshape(-1, 1) * strides[i] - begins[i]
                 + slots[i].reshape(1, -1) * dilations[i])
        valid &= (coord >= 0) & (coord < spatial[i])
        flat = flat * spatial[i] + np.clip(coord, 0, spatial[i] - 1)
    positions[:] = np.where(valid, flat, count)
    # Padding last in each window: a tie of the sentinel with a real lowest value picks the value.
    return np.take_along_axis(positions, np.argsort(~valid, axis=1, kind="stable"), 1), out_dims


class OptionalHasElement:
    """ONNX OptionalHasElement without an input (the spec allows it: an empty optional), which
    TVM's converter refuses: False."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.OptionalHasElement.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            if not len(inputs):
                return relax.const(False, "bool")
            return fallback(bb, inputs, attrs, params)
        return convert


def _activation(op_type: str, formula: Callable) -> type:
    """An elementwise activation computed in its input's dtype (TVM's Elu, Selu and
    ThresholdedRelu mix in float32 constants, which fails or changes the dtype for float16 and
    float64): ``formula(x, attrs, const)`` with ``const(v)`` a constant of x's dtype."""

    class Activation:
        @classmethod
        def get_converter(cls, opset: int) -> Callable:
            def convert(bb, inputs, attrs, params):
                x = inputs[0]
                dtype = _dtype(x.ty)
                return formula(x, attrs, lambda v: relax.const(v, dtype))
            return convert

    Activation.__name__ = op_type
    return Activation


def _elu(x, attrs, const):
    alpha = const(attrs.get("alpha", 1.0))
    negative = relax.op.multiply(alpha, relax.op.subtract(relax.op.exp(x), const(1.0)))
    return relax.op.where(relax.op.greater(x, const(0.0)), x, negative)


def _selu(x, attrs, const):
    alpha = const(attrs.get("alpha", 1.67326319217681884765625))
    gamma = const(attrs.get("gamma", 1.05070102214813232421875))
    negative = relax.op.subtract(relax.op.multiply(alpha, relax.op.exp(x)), alpha)
    return relax.op.multiply(gamma, relax.op.where(relax.op.greater(x, const(0.0)), x, negative))


def _thresholded_relu(x, attrs, const):
    return relax.op.where(relax.op.greater(x, const(attrs.get("alpha", 1.0))), x, const(0.0))


CONVERTERS: dict[str, type] = {
    "BatchNormalization": BatchNormalization,
    "Constant": Constant,
    "Elu": _activation("Elu", _elu),
    "Selu": _activation("Selu", _selu),
    "ThresholdedRelu": _activation("ThresholdedRelu", _thresholded_relu),
    "EyeLike": EyeLike,
    "MaxPool": MaxPool,
    "OptionalHasElement": OptionalHasElement,
    "Split": Split,
    "Unsqueeze": Unsqueeze,
    "Upsample": Upsample,
}
