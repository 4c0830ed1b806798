"""Kernels: RNG ops (seeded once per plan) and the quantized ops (generic: rlx_runtime.packed; CPU overrides:
numba kernels in quant_kernels.py; CUDA override: the fused GEMV of rlx_runtime.cuda)."""

from __future__ import annotations

from rlx_format.dtypes import compute_dtype

from .. import packed as packed_blocks
from ..backend import backend_of
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
    return packed_blocks.dequantize_all(xp, packed, a["encoding"], a["shape"])


@kernel("Dequantize", backend="cpu")
def _dequantize_cpu(xp, a, packed):
    from ..quant_kernels import dequantize_cpu
    return dequantize_cpu(packed, a["encoding"], a["shape"])


@kernel("DequantGather")
def _dequant_gather(xp, a, packed, idx):
    """Rows `idx` of a packed [N, K] table, dequantized: only the gathered rows are decoded."""
    return packed_blocks.dequant_gather(xp, packed, idx, a["encoding"], a["K"])


@kernel("DequantMatMul")
def _dequant_matmul(xp, a, x, packed):
    """Row tiles of the weight dequantized into one buffer, then BLAS. The split (codes view + f32
    scales) is made once per weight array."""
    N, K = a["N"], a["K"]
    split = a.get("_split")
    if split is None or split.packed is not packed:
        split = a["_split"] = packed_blocks.split(xp, packed, a["encoding"])
    rows = packed_blocks.split_rows(xp, split)
    return packed_blocks.tiled_matmul(xp, x.reshape(-1, K), rows, N, K).reshape(*x.shape[:-1], N)


@kernel("DequantMatMul", backend="cpu")
def _dequant_matmul_cpu(xp, a, x, packed):
    from ..quant_kernels import dequant_matmul
    return dequant_matmul(x, packed, a["encoding"], a["N"], a["K"])


@kernel("DequantMatMul", backend="cuda")
def _dequant_matmul_cuda(xp, a, x, packed):
    """Small batches: the fused kernel of kernels.cu over the packed bytes; otherwise the generic path."""
    from ..cuda import fused

    K = a["K"]
    x2 = x.reshape(-1, K)
    if x2.shape[0] <= fused.FUSED_MAX_ROWS and fused.supports(a["encoding"]) and backend_of(xp).fused_kernels:
        return fused.gemv(xp, x2, packed, a["encoding"], a["N"], K).reshape(*x.shape[:-1], a["N"])
    return _dequant_matmul(xp, a, x, packed)
