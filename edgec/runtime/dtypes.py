"""Tensors of element types DLPack exchange with numpy cannot carry: bfloat16, float8, float4,
int4/uint4, int2/uint2 (numpy holds them through ``ml_dtypes``, as onnx does).

numpy refuses to export such arrays and TVM's tensors of them cannot be imported by numpy, so
they cross the boundary as unsigned integers of the same width and are re-typed on the other side
with TVM's ``runtime.TVMTensorCreateView``. numpy keeps one byte per sub-byte element (int4,
float4...), and so does the code TVM compiles for them (measured: it reads element ``i`` from byte
``i``), so they cross as bytes too. TVM cannot allocate sub-byte outputs ("dtype.bits % 8"), so
only inputs of those types occur.
"""

from __future__ import annotations

from typing import Any

import numpy as np

NUMPY_NATIVE = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "float16", "float32", "float64", "complex64", "complex128"}


def is_extended(dtype: np.dtype) -> bool:
    """True for the ml_dtypes element types numpy's DLPack export refuses."""
    try:
        return _EXTENDED[dtype]
    except KeyError:  # once per dtype: numpy builds ``dtype.name`` anew on every access
        extended = dtype.name not in NUMPY_NATIVE and dtype.names is None and dtype.kind in "Vf"
        _EXTENDED[dtype] = extended
        return extended


_EXTENDED: dict[np.dtype, bool] = {}


def to_tensor(ffi: Any, array: np.ndarray) -> Any:
    """A TVM tensor over ``array``'s values, with ``array``'s ml_dtypes element type.

    ``array`` must be C-contiguous and aligned (``aligned`` in the runtime does it).
    """
    name = array.dtype.name
    raw = array.view(f"uint{array.dtype.itemsize * 8}")
    tensor = ffi.from_dlpack(raw, require_alignment=0)
    view = ffi.get_global_func("runtime.TVMTensorCreateView")
    return view(tensor, ffi.Shape(array.shape), ffi.dtype(name), 0)


def from_tensor(ffi: Any, tensor: Any) -> np.ndarray:
    """A numpy array (ml_dtypes element type) holding ``tensor``'s values."""
    import ml_dtypes  # only models with such outputs need it

    name = str(tensor.dtype)
    dtype = np.dtype(getattr(ml_dtypes, name))
    view = ffi.get_global_func("runtime.TVMTensorCreateView")
    shape = tuple(tensor.shape)
    raw = np.from_dlpack(view(tensor, ffi.Shape(shape), ffi.dtype(f"uint{dtype.itemsize * 8}"), 0))
    return raw.copy().view(dtype)
