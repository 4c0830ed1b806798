"""Kernels: RNG ops (seeded once per plan) and the quantized ops (numba on CPU, rlx_runtime.cuda on GPU)."""

from __future__ import annotations

import numpy as np

from rlx_format.dtypes import compute_dtype

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
    from ..cuda.blocks import dequantize_all
    return dequantize_all(xp, packed, a["encoding"], a["shape"])


@kernel("DequantGather")
def _dequant_gather(xp, a, packed, idx):
    """Rows `idx` of a packed [N, K] table, dequantized: only the gathered rows are decoded."""
    from ..cuda.blocks import dequant_gather  # array-module generic: the same code on CPU and GPU
    return dequant_gather(xp, packed, idx, a["encoding"], a["K"])


@kernel("DequantMatMul")
def _dequant_matmul(xp, a, x, packed):
    if xp is np:
        from ..quant_kernels import dequant_matmul
        return dequant_matmul(x, packed, a["encoding"], a["N"], a["K"])
    return _dequant_matmul_device(xp, a, x, packed)


def _dequant_matmul_device(xp, a, x, packed):
    """Small batches: fused kernel over the packed bytes. Otherwise: row tiles dequantized into one
    buffer, then cuBLAS. The split (codes view + f32 scales) is made once per weight array."""
    from ..cuda import blocks, fused

    enc, N, K = a["encoding"], a["N"], a["K"]
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    if x2.shape[0] <= fused.FUSED_MAX_ROWS and fused.supports(enc) and fused.available(xp):
        y = fused.gemv(xp, x2, packed, enc, N, K)
    else:
        split = a.get("_split")
        if split is None or split.packed is not packed:
            split = a["_split"] = blocks.split(xp, packed, enc)
        y = blocks.tiled_matmul(xp, x2, split, N, K)
    return y.reshape(*lead, N)
