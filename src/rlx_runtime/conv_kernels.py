"""numba epilogue of the CPU FusedConv: bias and activation applied to the GEMM's result in one pass.

Each (image, channel) row of the GEMM output gets its bias added and its activation applied while it is
still in cache, instead of one whole-tensor pass for the bias and another for the activation. The float32
steps are those of the unfused ops (Conv's `y += b`, then the activation's own CPU kernel: Sigmoid and
Silu call the very loop of ufuncs.py on the row), so the results are bitwise the unfused ones.
"""

from __future__ import annotations

import math

import numpy as np

from rlx_format.numba_setup import numba

from .ufuncs import EXP_TERMS, sigmoid_f32_loop

ACTIVATION_CODES = {"Relu": 0, "Sigmoid": 1, "Silu": 2, "LeakyRelu": 3, "Clip": 4}


# error_model="numpy" as in ufuncs.py: no exception branch, so the row loops vectorize
@numba.njit(cache=True, error_model="numpy")
def _bias_act_rows(y, bias, has_bias, act, alpha, has_lo, lo, has_hi, hi, terms):  # pragma: no cover - compiled
    """y: (n, o, P) float32 in place; bias: (o,)."""
    o = y.shape[1]
    tmp = np.empty(y.shape[2], np.float32)
    for r in range(y.shape[0] * o):
        row = y[r // o, r % o]
        if act == 1 or act == 2:
            # the sigmoid loop reads one buffer and writes another: with in == out LLVM's alias check
            # fails and the scalar loop runs (measured 6x slower)
            bv = bias[r % o] if has_bias else np.float32(0.0)
            for i in range(row.size):
                tmp[i] = row[i] + bv if has_bias else row[i]
            sigmoid_f32_loop(tmp, row, act == 2, terms)
            continue
        if has_bias:
            bv = bias[r % o]
            for i in range(row.size):
                row[i] += bv
        if act == 0:  # Relu: np.maximum(v, 0) keeps NaN and -0.0
            for i in range(row.size):
                v = row[i]
                row[i] = np.float32(0.0) if v < 0 else v
        elif act == 3:  # LeakyRelu: where(v >= 0, v, v * alpha); NaN takes the second branch and stays NaN
            for i in range(row.size):
                v = row[i]
                row[i] = v if v >= 0 else v * alpha
        else:  # Clip: np.maximum with lo, then np.minimum with hi (a NaN on either side gives NaN)
            for i in range(row.size):
                v = row[i]
                if has_lo and (v < lo or lo != lo):
                    v = lo
                if has_hi and (v > hi or hi != hi):
                    v = hi
                row[i] = v


def bias_activation_(y: np.ndarray, bias: np.ndarray | None, activation: str, alpha: float,
                     lo: float | None, hi: float | None) -> np.ndarray:
    """Apply Conv's bias and then `activation` to the float32 (n, o, *out) array `y` in place."""
    y3 = y.reshape(y.shape[0], y.shape[1], math.prod(y.shape[2:]))
    b = np.zeros(1, np.float32) if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
    _bias_act_rows(y3, b, bias is not None, ACTIVATION_CODES[activation], np.float32(alpha),
                   lo is not None, np.float32(0 if lo is None else lo), hi is not None,
                   np.float32(0 if hi is None else hi), EXP_TERMS)
    return y
