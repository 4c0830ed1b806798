"""CPU kernels for Dequantize and DequantMatMul on packed GGML blocks (numba).

DequantMatMul never materializes the whole f32 weight: small batches use a fused dot kernel
that reads the packed bytes directly (parallel over output rows); larger batches dequantize
row tiles into one reused buffer and hand each tile to BLAS. Extra memory per forward is one
tile (TILE_ROWS x K floats), not the N x K weight.
"""

from __future__ import annotations

import threading

import numpy as np

from rlx_format.numba_setup import numba
from rlx_format.codecs import CODECS, get_codec
from rlx_format.quants import block_fields, dequantize, dequantize_fields

prange = numba.prange

# OpenMP worker threads spin after a parallel region and then fight OpenBLAS's threads for the
# same cores (measured: a 4096x4096 tiled matmul went from 20 ms to 130-560 ms). The workqueue
# layer does not spin. Must be chosen before the first parallel kernel runs.
if numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"

# The workqueue layer aborts the process if two Python threads enter parallel kernels at once, so
# every parallel numba call in rlx goes through this lock (uncontended it costs ~0.1 us).
PARALLEL_LOCK = threading.Lock()


def parallel_call(fn, *args):
    with PARALLEL_LOCK:
        return fn(*args)

FUSED_MAX_ROWS = 12  # measured crossover with the tiled path (4096x4096, 2 cores)
TILE_ROWS = 256

_POW2 = np.array([2.0 ** (e - 25) for e in range(32)], dtype=np.float32)
_SUB = np.float32(2.0 ** -24)


@numba.njit(cache=True, inline="always")
def _half(lo, hi):
    h = np.int32(lo) | (np.int32(hi) << 8)
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        v = np.float32(m) * _SUB
    elif e == 31:
        v = np.float32(np.inf) if m == 0 else np.float32(np.nan)
    else:
        v = np.float32(1024 + m) * _POW2[e]
    return -v if h & 0x8000 else v


# Reassociation (and multiply-add contraction) is all the fused dot kernels need to vectorize; numba's
# fastmath=True would also promise LLVM that no NaN or Inf ever occurs, which makes the result for an
# input holding NaN/Inf undefined (it differs between CPUs). These flags keep IEEE NaN/Inf semantics.
_DOT_MATH = {"reassoc", "contract"}

# The fused kernels keep 32 independent accumulator lanes per input row (acc[m, i]) instead of a
# scalar reduction per block: LLVM turns the lane loop into plain SIMD multiply-adds (measured 2x
# faster than a per-block dot on AVX-512), and lanes are summed once per output.


@numba.njit(cache=True, parallel=True, fastmath=_DOT_MATH)
def _q8_0_fused(x, pk, pk8, out):  # x (M,K) f32; pk (N,RB) u8; pk8 same bytes as int8
    M, K = x.shape
    nb = K // 32
    for n in prange(pk.shape[0]):
        prow = pk[n]
        qrow = pk8[n]
        acc = np.zeros((M, 32), np.float32)
        for b in range(nb):
            o = b * 34
            d = _half(prow[o], prow[o + 1])
            for m in range(M):
                for i in range(32):
                    acc[m, i] += d * (np.float32(qrow[o + 2 + i]) * x[m, b * 32 + i])
        for m in range(M):
            out[m, n] = acc[m].sum()


@numba.njit(cache=True, parallel=True, fastmath=_DOT_MATH)
def _tq2_0_fused(x, pk, out):
    M, K = x.shape
    nb = K // 256
    for n in prange(pk.shape[0]):
        prow = pk[n]
        acc = np.zeros((M, 32), np.float32)
        for b in range(nb):
            o = b * 66
            d = _half(prow[o + 64], prow[o + 65])
            for j in range(2):
                for l in range(4):
                    base = b * 256 + j * 128 + l * 32
                    for m in range(M):
                        for i in range(32):
                            q = np.float32((prow[o + j * 32 + i] >> (2 * l)) & 3) - np.float32(1.0)
                            acc[m, i] += d * (q * x[m, base + i])
        for m in range(M):
            out[m, n] = acc[m].sum()


# Tile dequantization runs on one thread: BLAS uses the cores for the GEMM right after, and a
# parallel dequant measured slower (20-21 ms vs 17.6 ms for a batch-32 4096^2 DequantMatMul here).
@numba.njit(cache=True, nogil=True)
def _q8_0_rows(pk, pk8, n0, n1, buf):  # dequantize rows n0..n1 into buf[:n1-n0]
    nb = buf.shape[1] // 32
    for r in range(n1 - n0):
        prow, qrow, brow = pk[n0 + r], pk8[n0 + r], buf[r]  # 1-D rows vectorize better
        for b in range(nb):
            o = b * 34
            d = _half(prow[o], prow[o + 1])
            for i in range(32):
                brow[b * 32 + i] = np.float32(qrow[o + 2 + i]) * d


@numba.njit(cache=True, nogil=True)
def _tq2_0_rows(pk, n0, n1, buf):
    nb = buf.shape[1] // 256
    for r in range(n1 - n0):
        prow, brow = pk[n0 + r], buf[r]
        for b in range(nb):
            o = b * 66
            d = _half(prow[o + 64], prow[o + 65])
            for j in range(2):
                for l in range(4):
                    for i in range(32):
                        q = np.float32((prow[o + j * 32 + i] >> (2 * l)) & 3) - np.float32(1.0)
                        brow[b * 256 + j * 128 + l * 32 + i] = q * d


def q8_0_fused(x2, pk, out):
    parallel_call(_q8_0_fused, x2, pk, pk.view(np.int8), out)


def tq2_0_fused(x2, pk, out):
    parallel_call(_tq2_0_fused, x2, pk, out)


def q8_0_rows(pk, n0, n1, buf):
    _q8_0_rows(pk, pk.view(np.int8), n0, n1, buf)


def tq2_0_rows(pk, n0, n1, buf):
    _tq2_0_rows(pk, n0, n1, buf)


def _array_rows(encoding: str):
    """Row-tile decoder for a codec without a numba one: the registry's array-op decoder on numpy."""
    def rows(pk, n0, n1, buf):
        with np.errstate(invalid="ignore"):  # an infinite scale times code 0 is NaN, as in dequantize()
            dequantize_fields(np, block_fields(np, pk[n0:n1], encoding), encoding, buf[: n1 - n0])
    return rows


# encoding -> (fused dot kernel or None, row-tile decoder), as each codec names them
_CPU = {name: (globals()[c.cpu_fused] if c.cpu_fused else None,
               globals()[c.cpu_rows] if c.cpu_rows else _array_rows(name)) for name, c in CODECS.items()}


def dequant_matmul(x: np.ndarray, packed: np.ndarray, encoding: str, n: int, k: int) -> np.ndarray:
    """x[..., K] f32 @ W.T where W (N, K) is given as packed GGML rows -> [..., N] f32."""
    fused, rows = _CPU[get_codec(encoding, "DequantMatMul").name]
    lead = x.shape[:-1]
    x2 = np.ascontiguousarray(x.reshape(-1, k), dtype=np.float32)
    pk = np.ascontiguousarray(packed)
    m = x2.shape[0]
    out = np.empty((m, n), np.float32)
    if m <= FUSED_MAX_ROWS and fused is not None:
        fused(x2, pk, out)
    else:
        buf = np.empty((min(TILE_ROWS, n), k), np.float32)
        for n0 in range(0, n, TILE_ROWS):
            n1 = min(n, n0 + TILE_ROWS)
            rows(pk, n0, n1, buf)
            out[:, n0:n1] = x2 @ buf[: n1 - n0].T  # (matmul into a strided `out=` skips BLAS)
    return out.reshape(*lead, n)


def dequantize_cpu(packed: np.ndarray, encoding: str, shape: list[int]) -> np.ndarray:
    return dequantize(packed, encoding).reshape(shape)


__all__ = ["dequant_matmul", "dequantize_cpu"]
