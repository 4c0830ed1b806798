"""CPU kernels for Dequantize and DequantMatMul on packed GGML blocks (numba).

DequantMatMul never materializes the whole f32 weight: small batches use a fused dot kernel
that reads the packed bytes directly (parallel over output rows); larger batches dequantize
row tiles into one reused buffer and hand each tile to BLAS. Extra memory per forward is one
tile (TILE_ROWS x K floats; from WIDE_ROWS input rows on, up to packed.TILE_BYTES), not the N x K weight
(unless it fits in that).
"""

from __future__ import annotations

import math

import numpy as np

from rlx_format.numba_setup import numba
from rlx_format.codecs import CODECS, get_codec
from rlx_format.quants import block_fields, dequantize, dequantize_fields

from .numba_parallel import parallel_call
from .packed import tiled_matmul
from .simd import (q4_0_row_decode, q4_0_row_dot, q4_1_row_decode, q4_1_row_dot, q5_0_row_decode, q5_0_row_dot,
                   q5_1_row_decode, q5_1_row_dot, q8_0_row_decode, q8_0_row_dot, tq2_0_row_decode, tq2_0_row_dot)
from .threads import matmul

prange = numba.prange

FUSED_MAX_ROWS = 12  # measured crossover with the tiled path (4096x4096, 2 cores)
TILE_ROWS = 256
# from this many input rows on, the tiles are multiplied as x @ W_tileᵀ (packed.tiled_matmul): measured at 1 / 2
# threads (Rocket Lake, Q8_0), 256x1024 @ 1024x1024 9.2 / 11.7 -> 8.0 / 5.8 ms, 1024x384 @ 384x1536 30 / 28 -> 15 / 9;
# 32 and 128 rows of 4096x4096 were faster as W_tile @ xᵀ
WIDE_ROWS = 256

# every fp16 bit pattern as float32 (256 KiB, stays in L2): one load per block scale instead of a branchy
# decode; exact, since float16 -> float32 is (numpy's conversion keeps subnormals, infinities and NaN)
_HALF_TO_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


@numba.njit(cache=True, inline="always")
def _half(lo, hi):
    return _HALF_TO_F32[np.int32(lo) | (np.int32(hi) << 8)]


# Reassociation (and multiply-add contraction) is all the fused dot kernels need to vectorize; numba's
# fastmath=True would also promise LLVM that no NaN or Inf ever occurs, which makes the result for an
# input holding NaN/Inf undefined (it differs between CPUs). These flags keep IEEE NaN/Inf semantics.
_DOT_MATH = {"reassoc", "contract"}

# The fused kernels keep 32 independent accumulator lanes per input row (acc[m, i]) instead of a
# scalar reduction per block: LLVM turns the lane loop into plain SIMD multiply-adds (measured 2x
# faster than a per-block dot on AVX-512), and lanes are summed once per output.


# Q8_0, TQ2_0, Q4_0/1 and Q5_0/1 rows go through the explicit-vector intrinsics of simd.py (numba's vectorizer left
# these loops scalar or half-vectorized), chosen per row by `kind` (a branch per row costs nothing measurable):
# parallel over output rows for the fused dot, one thread for a row tile.
@numba.njit(cache=True, inline="always")
def _simd_dot(kind, row, x):
    if kind == 0:
        return q8_0_row_dot(row, x)
    if kind == 1:
        return tq2_0_row_dot(row, x)
    if kind == 2:
        return q4_0_row_dot(row, x)
    if kind == 3:
        return q4_1_row_dot(row, x)
    if kind == 4:
        return q5_0_row_dot(row, x)
    return q5_1_row_dot(row, x)


@numba.njit(cache=True, inline="always")
def _simd_decode(kind, row, out):
    if kind == 0:
        q8_0_row_decode(row, out)
    elif kind == 1:
        tq2_0_row_decode(row, out)
    elif kind == 2:
        q4_0_row_decode(row, out)
    elif kind == 3:
        q4_1_row_decode(row, out)
    elif kind == 4:
        q5_0_row_decode(row, out)
    else:
        q5_1_row_decode(row, out)


@numba.njit(cache=True, parallel=True)
def _simd_fused(x, pk, out, kind):  # x (M,K) f32; pk (N, packed row bytes) u8
    for n in prange(pk.shape[0]):
        for m in range(x.shape[0]):
            out[m, n] = _simd_dot(kind, pk[n], x[m])


# Tile decoding runs on one thread: BLAS uses the cores for the GEMM right after, and a parallel decode
# measured slower (20-21 ms vs 17.6 ms for a batch-32 4096^2 DequantMatMul here).
@numba.njit(cache=True, nogil=True)
def _simd_rows(pk, n0, n1, buf, kind):  # decode rows n0..n1 into buf[:n1-n0]
    for r in range(n1 - n0):
        _simd_decode(kind, pk[n0 + r], buf[r])


def _simd_kernels(kind: int) -> tuple:
    return (lambda x2, pk, out: parallel_call(_simd_fused, x2, pk, out, kind),
            lambda pk, n0, n1, buf: _simd_rows(pk, n0, n1, buf, kind))


# the names the codec registry gives (Codec.cpu_fused / cpu_rows)
q8_0_fused, q8_0_rows = _simd_kernels(0)
tq2_0_fused, tq2_0_rows = _simd_kernels(1)
q4_0_fused, q4_0_rows = _simd_kernels(2)
q4_1_fused, q4_1_rows = _simd_kernels(3)
q5_0_fused, q5_0_rows = _simd_kernels(4)
q5_1_fused, q5_1_rows = _simd_kernels(5)


# Block decoders for the types without hand-written kernels: decode block `o` (byte offset) of a packed
# row into t[:block] as the reference does (d * q, then + m); _decoder_kernels builds the fused and
# row-tile kernels of a type around its decoder.
_POW3 = np.array([1, 3, 9, 27, 81], np.int32)


@numba.njit(cache=True, inline="always")
def _dec_tq1_0(p, o, t):
    d = _half(p[o + 52], p[o + 53])
    for base, n, width, at in ((0, 5, 32, 0), (160, 5, 16, 32), (240, 4, 4, 48)):
        for i in range(n):
            for m in range(width):
                q = (((np.int32(p[o + at + m]) * _POW3[i]) & 255) * 3) >> 8  # top base-3 digit after i shifts
                t[base + i * width + m] = np.float32(q - 1) * d


@numba.njit(cache=True, inline="always")
def _tq1_0_lanes(prow, at, p3, d, x, xo, width, M, acc):
    """acc[m, l] += d * q * x[m, xo + l] for the trits of bytes at..at+width after `p3` base-3 shifts."""
    for m in range(M):
        for l in range(width):
            q = np.float32((((np.int32(prow[at + l]) * p3) & 255) * 3) >> 8) - np.float32(1.0)
            acc[m, l] += d * (q * x[m, xo + l])


@numba.njit(cache=True, parallel=True, fastmath=_DOT_MATH)
def _tq1_0_fused(x, pk, out):
    M, K = x.shape
    nb = K // 256
    for n in prange(pk.shape[0]):
        prow = pk[n]
        acc = np.zeros((M, 32), np.float32)
        for b in range(nb):
            o, xb = b * 54, b * 256
            d = _half(prow[o + 52], prow[o + 53])
            for i in range(5):
                _tq1_0_lanes(prow, o, _POW3[i], d, x, xb + i * 32, 32, M, acc)
                _tq1_0_lanes(prow, o + 32, _POW3[i], d, x, xb + 160 + i * 16, 16, M, acc)
            for i in range(4):
                _tq1_0_lanes(prow, o + 48, _POW3[i], d, x, xb + 240 + i * 4, 4, M, acc)
        for m in range(M):
            out[m, n] = acc[m].sum()


def tq1_0_fused(x2, pk, out):
    parallel_call(_tq1_0_fused, x2, pk, out)


_MX_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


@numba.njit(cache=True, inline="always")
def _dec_mxfp4(p, o, t):
    d = np.float32(math.ldexp(1.0, np.int64(p[o]) - 128))  # the E8M0 byte, halved: 2^(e - 128), exact in f32
    for j in range(16):
        b = p[o + 1 + j]
        t[j] = _MX_VALUES[b & 15] * d
        t[j + 16] = _MX_VALUES[b >> 4] * d


# The block decoders by index: one compiled (and cached) kernel serves them all through a branch per
# block; a function-typed argument would be recompiled in every process (numba cannot cache it).
_BLOCK_DECODERS = ("_dec_tq1_0", "_dec_mxfp4", "_dec_q4_k", "_dec_q5_k", "_dec_q6_k")


@numba.njit(cache=True, inline="always")
def _decode_block(kind, p, o, t):
    if kind == 0:
        _dec_tq1_0(p, o, t)
    elif kind == 1:
        _dec_mxfp4(p, o, t)
    elif kind == 2:
        _dec_q4_k(p, o, t)  # (defined at the end of the module)
    elif kind == 3:
        _dec_q5_k(p, o, t)
    else:
        _dec_q6_k(p, o, t)


@numba.njit(cache=True, parallel=True, fastmath=_DOT_MATH)
def _block_fused(x, pk, out, kind, block, nbytes):
    """The fused dot kernel on a block decoder: decode a block into `t`, then 32 accumulator lanes."""
    M, K = x.shape
    nb = K // block
    for n in prange(pk.shape[0]):
        prow = pk[n]
        t = np.empty(block, np.float32)
        acc = np.zeros((M, 32), np.float32)
        for b in range(nb):
            _decode_block(kind, prow, b * nbytes, t)
            for c in range(block // 32):
                for m in range(M):
                    for i in range(32):
                        acc[m, i] += t[c * 32 + i] * x[m, b * block + c * 32 + i]
        for m in range(M):
            out[m, n] = acc[m].sum()


@numba.njit(cache=True, nogil=True)
def _block_rows(pk, n0, n1, buf, kind, block, nbytes):
    nb = buf.shape[1] // block
    for r in range(n1 - n0):
        prow, brow = pk[n0 + r], buf[r]
        for b in range(nb):
            _decode_block(kind, prow, b * nbytes, brow[b * block:(b + 1) * block])


def _decoder_kernels(dec: str, block: int, nbytes: int) -> tuple:
    """(fused, rows) kernels on the numba block decoder named `dec`."""
    kind = _BLOCK_DECODERS.index(dec)
    return (lambda x2, pk, out: parallel_call(_block_fused, x2, pk, out, kind, block, nbytes),
            lambda pk, n0, n1, buf: _block_rows(pk, n0, n1, buf, kind, block, nbytes))


def _array_rows(encoding: str):
    """Row-tile decoder for a codec without a numba one: the registry's array-op decoder on numpy."""
    def rows(pk, n0, n1, buf):
        with np.errstate(invalid="ignore", over="ignore"):  # NaN / Inf as in dequantize()
            dequantize_fields(np, block_fields(np, pk[n0:n1], encoding), encoding, buf[: n1 - n0])
    return rows


def _cpu_kernels(name: str, c) -> tuple:
    """(fused dot kernel or None, row-tile decoder) of a codec, from the kernels it names; a codec that names
    none gets the array-op decoder (so a new codec runs at once)."""
    if c.cpu_rows:  # hand-written kernels
        return globals()[c.cpu_fused] if c.cpu_fused else None, globals()[c.cpu_rows]
    if c.cpu_block:
        fused, rows = _decoder_kernels(c.cpu_block, c.block, c.nbytes)
        return (globals()[c.cpu_fused] if c.cpu_fused else fused), rows
    return None, _array_rows(name)


_CPU = {name: _cpu_kernels(name, c) for name, c in CODECS.items()}


def dequant_matmul(x: np.ndarray, packed: np.ndarray, encoding: str, n: int, k: int) -> np.ndarray:
    """x[..., K] f32 @ W.T where W (N, K) is given as packed GGML rows -> [..., N] f32."""
    fused, rows = _CPU[get_codec(encoding, "DequantMatMul").name]
    lead = x.shape[:-1]
    x2 = np.ascontiguousarray(x.reshape(-1, k), dtype=np.float32)
    pk = np.ascontiguousarray(packed)
    if x2.shape[0] <= FUSED_MAX_ROWS and fused is not None:
        out = np.empty((x2.shape[0], n), np.float32)
        fused(x2, pk, out)
    else:
        def decode(r0, r1, buf):
            rows(pk, r0, r1, buf)
            return buf
        out = tiled_matmul(np, x2, decode, n, k, TILE_ROWS, matmul, WIDE_ROWS)
    return out.reshape(*lead, n)


def dequantize_cpu(packed: np.ndarray, encoding: str, shape: list[int]) -> np.ndarray:
    return dequantize(packed, encoding).reshape(shape)


__all__ = ["dequant_matmul", "dequantize_cpu"]


# K-quant block decoders (256 values a block), in the reference's f32 operations: (d * scale) * q, minus
# dmin * min for Q4_K/Q5_K. _decode_block reaches them by name when it is compiled (at the first call).


@numba.njit(cache=True, inline="always")
def _k_scale_min(p, s, j):
    """6-bit scale and min of sub-block j from the 12 bytes at p[s:] (GGML's get_scale_min_k4)."""
    if j < 4:
        return np.float32(p[s + j] & 63), np.float32(p[s + j + 4] & 63)
    return (np.float32((p[s + j + 4] & 15) | ((p[s + j - 4] >> 6) << 4)),
            np.float32((p[s + j + 4] >> 4) | ((p[s + j] >> 6) << 4)))


@numba.njit(cache=True, inline="always")
def _dec_q4_k(p, o, t):
    d, dmin = _half(p[o], p[o + 1]), _half(p[o + 2], p[o + 3])
    for j in range(8):
        sc, m = _k_scale_min(p, o + 4, j)
        d1, m1 = d * sc, dmin * m
        at, sh = o + 16 + 32 * (j >> 1), 4 * (j & 1)
        for i in range(32):
            t[32 * j + i] = d1 * np.float32((p[at + i] >> sh) & 15) - m1


@numba.njit(cache=True, inline="always")
def _dec_q5_k(p, o, t):
    d, dmin = _half(p[o], p[o + 1]), _half(p[o + 2], p[o + 3])
    for j in range(8):
        sc, m = _k_scale_min(p, o + 4, j)
        d1, m1 = d * sc, dmin * m
        at, sh = o + 48 + 32 * (j >> 1), 4 * (j & 1)
        for i in range(32):
            q = ((p[at + i] >> sh) & 15) | (((p[o + 16 + i] >> j) & 1) << 4)
            t[32 * j + i] = d1 * np.float32(q) - m1


@numba.njit(cache=True, inline="always")
def _dec_q6_k(p, o, t):
    d = _half(p[o + 208], p[o + 209])
    for h in range(2):
        for k in range(4):
            at, sh = o + 64 * h + 32 * (k & 1), 4 * (k >> 1)
            for i in range(32):
                e = 128 * h + 32 * k + i
                sc = np.float32(np.int8(p[o + 192 + e // 16]))
                q = ((p[at + i] >> sh) & 15) | (((p[o + 128 + 32 * h + i] >> (2 * k)) & 3) << 4)
                t[e] = d * sc * np.float32(np.int32(q) - 32)
