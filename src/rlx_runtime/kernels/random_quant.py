"""Kernels: RNG ops (seeded once per plan) and the quantized ops (numba CPU kernels)."""

from __future__ import annotations


import numpy as np

from rlx_format.dtypes import compute_dtype
from rlx_format.errors import RlxError

from .registry import kernel

@kernel("RandomNormal")
def _rnormal(xp, a, rng=None):
    vals = a["_rng"].standard_normal(tuple(a["shape"])) * a["scale"] + a["mean"]
    return xp.asarray(vals.astype(compute_dtype(a["dtype"])))


@kernel("RandomUniform")
def _runiform(xp, a):
    vals = a["_rng"].uniform(a["low"], a["high"], tuple(a["shape"]))
    return xp.asarray(vals.astype(compute_dtype(a["dtype"])))






@kernel("Dequantize")
def _dequantize(xp, a, packed):
    if xp is np:
        from ..quant_kernels import dequantize_cpu
        return dequantize_cpu(packed, a["encoding"], a["shape"])
    raise RlxError("Dequantize on CUDA is not implemented yet; run this graph on Device.CPU")


@kernel("DequantGather")
def _dequant_gather(xp, a, packed, idx):
    """Rows `idx` of a packed [N, K] table, dequantized: only the gathered rows are decoded."""
    if xp is not np:
        raise RlxError("DequantGather on CUDA is not implemented yet; run this graph on Device.CPU")
    from rlx_format.quants import dequantize
    rows = np.take(packed, idx.astype(np.int64).ravel(), axis=0)
    return dequantize(rows, a["encoding"]).reshape(*idx.shape, a["K"])


@kernel("DequantMatMul")
def _dequant_matmul(xp, a, x, packed):
    if xp is np:
        from ..quant_kernels import dequant_matmul
        return dequant_matmul(x, packed, a["encoding"], a["N"], a["K"])
    raise RlxError("DequantMatMul on CUDA is not implemented yet; run this graph on Device.CPU")
