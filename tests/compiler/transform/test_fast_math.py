"""The fast-math approximations stay within float32 rounding of the exact functions."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import te, topi

from edgec.compiler.transform.fast_math import _fast_sigmoid


def _run(compute, values: np.ndarray) -> np.ndarray:
    x = te.placeholder(values.shape, "float32", name="x")
    lib = tvm.compile(te.create_prim_func([x, compute(x)]), "llvm")
    out = tvm.runtime.tensor(np.empty_like(values))
    lib(tvm.runtime.tensor(values), out)
    return out.numpy()


def test_fast_sigmoid_and_tanh_match_the_exact_functions_across_float32_range():
    values = np.concatenate([np.linspace(-120, 120, 4001), [-1e30, -89, 89, 1e30, 0.0]])
    values = values.astype(np.float32)
    with np.errstate(over="ignore"):
        exact = 1 / (1 + np.exp(-values.astype(np.float64)))
    got = _run(_fast_sigmoid, values)
    assert np.all(np.isfinite(got)) and np.all((got >= 0) & (got <= 1))
    np.testing.assert_allclose(got, exact, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_run(topi.fast_tanh, values), np.tanh(values.astype(np.float64)),
                               rtol=1e-6, atol=3e-7)
