"""MatMulInteger and ConvInteger: uint8/int8 operands minus their zero points, summed exactly.

The operands are widened to float64 (every product and sum of 8-bit values is an integer below 2^53,
so BLAS and the Conv kernel compute them exactly) and the sums converted to int32 by the defined
float->int rule (saturating: ONNX leaves int32 overflow undefined).
"""

from __future__ import annotations

import numpy as np

from rlx_format.dtypes import float_to_int

from .registry import KERNELS, kernel


def _minus_zero_point(xp, v, zp, axis_len_shape: tuple[int, ...] | None = None):
    f = v.astype(np.float64)
    if zp is None:
        return f
    z = zp.astype(np.float64)
    if axis_len_shape is not None and z.ndim == 1 and z.size > 1:
        z = z.reshape(axis_len_shape)
    return f - z


@kernel("MatMulInteger")
def _matmul_integer(xp, a, x, w, *zps):
    opt = dict(zip(a["optional"], zps))
    fx = _minus_zero_point(xp, x, opt.get("a_zero_point"), (-1, 1))  # a vector zero point: one per row of A
    fw = _minus_zero_point(xp, w, opt.get("b_zero_point"))  # ... one per column of B (broadcasts as is)
    return float_to_int(xp, fx @ fw, np.int32)


@kernel("ConvInteger")
def _conv_integer(xp, a, x, w, *zps):
    opt = dict(zip(a["optional"], zps))
    spatial = (1,) * (w.ndim - 2)
    fx = _minus_zero_point(xp, x, opt.get("x_zero_point"))
    fw = _minus_zero_point(xp, w, opt.get("w_zero_point"), (-1, 1, *spatial))  # per output channel
    return float_to_int(xp, KERNELS["Conv"](xp, a, fx, fw), np.int32)
