"""numba ufuncs for CPU kernels where numpy is slow or lacks the function: erf, sigmoid/SiLU, the fused exact GELU.

float32 erf is evaluated in double precision from shipped tables (erf_tables.py): a Taylor series for
|x| < 0.25 (odd, so tiny and subnormal inputs keep full relative precision) and degree-11 Chebyshev
interpolants of erf on 23 intervals of width 0.25 up to 6 (erf rounds to ±1 beyond). Every fit is
within ~1e-15 of erf, so the float32 result is the correctly rounded erf: checked against
scipy's double erf for all 1.09e9 non-negative float32 inputs below 6.5 (0 differences; the
function is odd by construction), and on samples in the tests. Those tables are the
exact path. The fast path runs first: a double estimate from two fixed polynomials (no table lookup,
Estrin's scheme, so the loop vectorizes with short dependency chains), within FAST_TOL (1e-10) relative
of erf. Where every value within that margin rounds to one float32, that float32 is the correctly
rounded erf; the rest (~0.3% of inputs, and NaN) are redone on the exact path. The fast path is ~5x
faster than the tables alone, and the results are identical (checked exhaustively as above).
float64 inputs use libm's erf.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from rlx_format.numba_setup import numba  # first: numba's import goes through rlx's set-up
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from . import threads
from .erf_tables import (DEG, FAST_BIG_HEX, FAST_ONE, FAST_SMALL_HEX, FAST_SPLIT, FAST_TOL, HI, LO, POLYS_HEX,
                         TAYLOR_HEX, TAYLOR_TERMS, WIDTH)
from .simd import EXP_ABS_MAX as _ABS_MAX
from .simd import EXP_INV_LN2 as _INV_LN2
from .simd import EXP_LN2_HI as _LN2_HI
from .simd import EXP_LN2_LO as _LN2_LO
from .simd import EXP_TERMS, exp_shifted_f32, max_f32, sigmoid_array, sum_f32

_LO, _HI, _WIDTH, _DEG, _TAYLOR_TERMS = LO, HI, WIDTH, DEG, TAYLOR_TERMS
_INTERVALS = int(round((_HI - _LO) / _WIDTH))


@functools.cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """The shipped erf tables (scripts/fit_erf_tables.py fitted them) as float64 arrays."""
    polys = np.array([[float.fromhex(v) for v in row] for row in POLYS_HEX])
    return polys, np.array([float.fromhex(v) for v in TAYLOR_HEX])


@numba.njit(cache=True, inline="always")
def _erf64(v, polys, taylor):  # pragma: no cover - compiled
    """erf(v) for a double v, both branches computed and one selected (vectorizable)."""
    a = abs(v)
    x2 = v * v
    s = taylor[_TAYLOR_TERMS - 1]
    for j in range(_TAYLOR_TERMS - 2, -1, -1):
        s = s * x2 + taylor[j]
    small = v * s
    ac = a if a < _HI else _HI  # NaN -> _HI: the float->int index below never sees NaN (undefined in LLVM)
    k = min(max(int((ac - _LO) * (1.0 / _WIDTH)), 0), _INTERVALS - 1)
    t = (ac - (_LO + (k + 0.5) * _WIDTH)) * (2.0 / _WIDTH)
    p = polys[k, _DEG]
    for j in range(_DEG - 1, -1, -1):
        p = p * t + polys[k, j]
    big = p if a < _HI else 1.0
    r = small if a < _LO else (big if v >= 0 else -big)
    return v if v != v else r  # NaN stays NaN


# the fast estimate's coefficients: global tuples, so numba compiles them in as constants
_P = tuple(float.fromhex(v) for v in FAST_SMALL_HEX)
_Q = tuple(float.fromhex(v) for v in FAST_BIG_HEX)
assert len(_P) == 13 and len(_Q) == 15, "_erf_estimate's Estrin terms are written for degrees 12 and 14"
_P_SCALE = 2.0 / FAST_SPLIT ** 2
_Q_SCALE = 2.0 / (FAST_ONE - FAST_SPLIT)


@numba.njit(cache=True, inline="always")
def _erf_estimate(v):  # pragma: no cover - compiled
    """erf(v) within FAST_TOL relative for a double v: both polynomials evaluated, one selected."""
    a = abs(v)
    s = a * a * _P_SCALE - 1.0
    s2 = s * s
    s4 = s2 * s2
    p = (((_P[0] + _P[1] * s) + (_P[2] + _P[3] * s) * s2) + ((_P[4] + _P[5] * s) + (_P[6] + _P[7] * s) * s2) * s4
         + (((_P[8] + _P[9] * s) + (_P[10] + _P[11] * s) * s2) + _P[12] * s4) * (s4 * s4))
    t = (a - FAST_SPLIT) * _Q_SCALE - 1.0
    t2 = t * t
    t4 = t2 * t2
    q = (((_Q[0] + _Q[1] * t) + (_Q[2] + _Q[3] * t) * t2) + ((_Q[4] + _Q[5] * t) + (_Q[6] + _Q[7] * t) * t2) * t4
         + (((_Q[8] + _Q[9] * t) + (_Q[10] + _Q[11] * t) * t2) + ((_Q[12] + _Q[13] * t) + _Q[14] * t2) * t4)
         * (t4 * t4))
    big = q if a < FAST_ONE else 1.0
    r = v * p if a < FAST_SPLIT else (big if v >= 0 else -big)
    return r if v == v else v  # NaN stays NaN (and is then redone on the exact path, which keeps it)


@numba.njit(cache=True, inline="always")
def _unsure(r):  # pragma: no cover - compiled
    """False when every value within FAST_TOL of r rounds to the same float32 (so erf itself does); NaN: True."""
    m = FAST_TOL * abs(r)
    return np.float32(r - m) != np.float32(r + m)


# error_model="numpy" as for the sigmoid below: no exception branch in the loop, so it vectorizes. The estimate
# may contract its multiply-adds into fma ("contract", as every fast-path loop here): it only decides which results
# are certain, its margin FAST_TOL is ~1e5 times the double rounding error either way, and the exhaustive check
# (erf and GELU, every float32 input) found 0 differences with it. GELU on [8,128,1536] at 1 thread (Rocket Lake):
# 6.0-6.4 ms with separate multiplies and adds, 3.4-4.7 ms contracted.
_FAST_MATH = {"contract"}

_SQRT2_F32 = np.float32(math.sqrt(2.0))
# elements per block of the fast path: its flags (and their uint64 words) stay in L1 for the redo that follows
BLOCK = 1024
# an element's cost in GEMM multiply-adds (what threads.threads_for counts): the fast path took ~2.2 ns an element
# at 1 thread, a GEMM ~0.025 ns a multiply-add, so inputs of ~32 K elements (~70 us) and up split over the threads
ELEMENT_COST = 64


# Serial blocks in chunks over rlx's threads, not a numba prange loop: compiled for prange, the same loop ran 1.5x
# slower on one thread (GELU on 8x128x1536: 5.2 ms against 3.5, Xeon AVX-512), and the flags of a whole array
# (then a second pass over them) are a block's here
@numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=_FAST_MATH)
def _fast_blocks(x, out, start, stop, polys, taylor, gelu):  # pragma: no cover - compiled
    """erf(x) (or GELU's steps when `gelu`) on elements start..stop: the fast path on a block, then the exact path
    (_redo) on the block's elements it was unsure of."""
    flags = np.zeros(BLOCK, np.bool_)
    words = flags.view(np.uint64)
    for b0 in range(start, stop, BLOCK):
        b1 = min(stop, b0 + BLOCK)
        if b1 - b0 < BLOCK:
            flags[:] = False  # no stale flag past the block's end (_redo would test those words for nothing)
        xs, outs = x[b0:b1], out[b0:b1]
        if gelu:
            for i in range(b1 - b0):
                v = xs[i]
                r = _erf_estimate(np.float64(v / _SQRT2_F32))
                outs[i] = np.float32(0.5) * v * (np.float32(1.0) + np.float32(r))
                flags[i] = _unsure(r)
        else:
            for i in range(b1 - b0):
                r = _erf_estimate(np.float64(xs[i]))
                outs[i] = np.float32(r)
                flags[i] = _unsure(r)
        _redo(xs, outs, flags, words, polys, taylor, gelu)


# not contracted (no fastmath): the exact path's multiply-adds are those the tables were checked with
@numba.njit(cache=True, nogil=True)
def _redo(x, out, unsure, words, polys, taylor, gelu):  # pragma: no cover - compiled
    """The exact path for the elements the fast path was unsure of: erf(x), or GELU's steps when `gelu`."""
    for w in range(words.size):
        if words[w]:
            for i in range(8 * w, min(8 * w + 8, x.size)):
                if unsure[i]:
                    v = x[i]
                    if gelu:
                        e = np.float32(_erf64(np.float64(v / _SQRT2_F32), polys, taylor))
                        out[i] = np.float32(0.5) * v * (np.float32(1.0) + e)
                    else:
                        out[i] = np.float32(_erf64(np.float64(v), polys, taylor))


def _erf_pass(x: np.ndarray, gelu: bool) -> np.ndarray:
    """_fast_blocks over float32 x, split in chunks over the forward's threads."""
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)
    polys, taylor = _tables()
    threads.rows_in_chunks(flat.size, flat.size * ELEMENT_COST,
                           lambda s, e: _fast_blocks(flat, out, s, e, polys, taylor, gelu))
    return out.reshape(x.shape)


@numba.njit(cache=True)
def _erf_f64_loop(x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = math.erf(x[i])


def _erf_f64(x: np.ndarray) -> np.ndarray:
    """libm's erf per element. A loop, not a numba.vectorize ufunc: an eager ufunc is compiled (or read
    from the cache) at import, ~0.2 s per process; a cached njit function loads when first called."""
    flat = np.ascontiguousarray(x, dtype=np.float64).reshape(-1)
    out = np.empty_like(flat)
    _erf_f64_loop(flat, out)
    return out.reshape(np.shape(x))


def erf(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.float64:
        return _erf_f64(x)
    if x.dtype != np.float32:  # float16: through float32
        return erf(x.astype(np.float32)).astype(x.dtype)
    return _erf_pass(x, False)


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """0.5·x·(1 + erf(x / √2)) in one pass; float32 results equal the unfused op sequence (Div -> Erf -> Add -> Mul
    -> Mul, erf as in erf(): the fast path, then the exact one where the fast one is unsure)."""
    if x.dtype != np.float32:
        xf = x.astype(np.float64)
        return (0.5 * xf * (1.0 + _erf_f64(xf / math.sqrt(2.0)))).astype(x.dtype)
    return _erf_pass(x, True)


# ------------------------------------------------------------------ tanh's exponential
# The sigmoid and SiLU are explicit vector IR in simd.py (sigmoid_f32, its comment gives their steps). tanh (below)
# keeps the exponential those steps used before they moved to fma: float32 arithmetic, one fixed sequence of IEEE
# operations with separate multiplies and adds: t = exp(-a) by range reduction with ln 2 split in two (Cody and
# Waite: k * _LN2_HI is exact), e^s = 1 + s + s^2 P(s) on |s| <= ln2/2 with Cephes expf's degree-5 P (Estrin's
# form), 2^-k from its IEEE bits in two normal factors (so a subnormal t is rounded once).
# (the constants: simd.EXP_*, shared with simd.sigmoid_f32)


@intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose IEEE-754 bits are the low 32 bits of integer `bits` (a bitcast; vectorizes, unlike a
    lookup)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low = builder.trunc(args[0], ir.IntType(32)) if bits.bitwidth > 32 else args[0]
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits), codegen


@numba.njit(cache=True, inline="always", error_model="numpy")
def _exp_neg(a, p0, p1, p2, p3, p4, p5):  # pragma: no cover - compiled
    """exp(-a) for float32 a >= 0 (or NaN), in float32: tanh's exponential (see above).
    Inlined into the calling loop by numba before LLVM sees it, so the loops still vectorize."""
    a = a if a < _ABS_MAX else _ABS_MAX  # NaN -> _ABS_MAX: the float->int below never sees NaN
    kf = np.floor(a * _INV_LN2 + np.float32(0.5))  # in [0, 150]
    k = np.int32(kf)
    s = (kf * _LN2_HI - a) + kf * _LN2_LO  # exp(-a) = 2^-k e^s
    s2 = s * s
    q = ((p5 + p4 * s) + (p3 + p2 * s) * s2) + (p1 + p0 * s) * (s2 * s2)
    e = (q * s2 + s) + np.float32(1.0)
    k1 = k if k < 125 else np.int32(125)  # e * 2^-k1 stays normal; the second factor rounds once
    return e * _f32_from_bits((127 - k1) << 23) * _f32_from_bits((127 - (k - k1)) << 23)


# float32 tanh in float32 arithmetic, for the recurrent kernels' gates (recurrent_kernels.py; the Tanh op itself
# is numpy's): one fixed sequence of IEEE operations, so every CPU gives the same bits. |x| < 0.625: Cephes
# tanhf's odd polynomial a + a^3 P(a^2); above, (1 - e) / (1 + e) with e = exp(-2|x|) by the exponential above
# (2|x| is exact; no cancellation: e <= exp(-1.25)); the sign copied back (so -0 stays -0), NaN kept.
# Checked over every float32 in [-20, 20]: at most TANH_ULPS ulp from the correctly rounded tanh.
TANH_TERMS = np.array([-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
                       -3.33332819422e-1], np.float32)  # P's coefficients, highest power first (Cephes tanhf)
TANH_ULPS = 2
_TANH_SPLIT = np.float32(0.625)


@numba.njit(cache=True, error_model="numpy", nogil=True)
def tanh_f32_loop(x, out, terms, exp_terms):  # pragma: no cover - compiled
    """out[i] = tanh(x[i]) for float32 x (both branches computed and one selected, so the loop vectorizes)."""
    t0, t1, t2, t3, t4 = terms[0], terms[1], terms[2], terms[3], terms[4]
    p0, p1, p2, p3, p4, p5 = exp_terms[0], exp_terms[1], exp_terms[2], exp_terms[3], exp_terms[4], exp_terms[5]
    one = np.float32(1.0)
    for i in range(x.size):
        xv = x[i]
        a = abs(xv)
        z = a * a
        small = ((((t0 * z + t1) * z + t2) * z + t3) * z + t4) * z * a + a
        e = _exp_neg(a + a, p0, p1, p2, p3, p4, p5)  # 2|x| is exact
        big = (one - e) / (one + e)
        r = small if a < _TANH_SPLIT else big
        r = -r if xv < 0 else r
        r = r if xv != 0 else xv  # -0 stays -0
        out[i] = xv if xv != xv else r


def tanh_f32(x: np.ndarray) -> np.ndarray:
    """tanh of a float32 array by tanh_f32_loop (a fresh array of x's shape)."""
    flat = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.empty_like(flat)
    tanh_f32_loop(flat, out, TANH_TERMS, EXP_TERMS)
    return out.reshape(np.shape(x))


def _sigmoid_f32(x: np.ndarray, silu: bool) -> np.ndarray:
    flat = np.ascontiguousarray(x).reshape(-1)
    out = np.empty_like(flat)
    sigmoid_array(flat, out, silu)
    return out.reshape(x.shape)


def _sigmoid_wide(x: np.ndarray) -> np.ndarray:
    """Sigmoid in x's own dtype (float64 and wider) without overflow: exp only ever sees -|x|."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)); float32 (and float16, through float32) by the vectorized kernel above."""
    if x.dtype == np.float32:
        return _sigmoid_f32(x, False)
    if x.dtype == np.float16:
        return _sigmoid_f32(x.astype(np.float32), False).astype(np.float16)
    return _sigmoid_wide(x)


def silu(x: np.ndarray) -> np.ndarray:
    """x · sigmoid(x) in one pass; float32 results equal Mul(x, Sigmoid(x)) with the kernel above."""
    if x.dtype == np.float32:
        return _sigmoid_f32(x, True)
    return x * sigmoid(x)


# ------------------------------------------------------------------ LayerNorm, a row at a time
# an element's cost in a row kernel's passes (LayerNorm, softmax), in GEMM multiply-adds (what threads.threads_for
# counts): MiniLM's 8x128x384 LayerNorm took ~0.33 ms at 1 thread (~0.8 ns an element, ~32 multiply-adds of a
# GEMM), so tensors of ~64 K elements and up split their rows over the forward's threads
ROW_PASS_COST = 32


@numba.njit(cache=True, nogil=True, error_model="numpy")
def layer_norm_rows(x, scale, bias, has_bias, out, width, eps):  # pragma: no cover - compiled
    """LayerNorm of flat float32 x's rows of `width` into out, with scale (and bias) of `width` each: per row
    mean = sum / width, d = x - mean, var = sum(d * d) / width, out = d / sqrt(var + eps) * scale (+ bias), each
    sum by simd.sum_f32 (one vector order: the same bits on every CPU), the rest the generic kernel's steps in
    float32 (no fma). A row stays in L1 through its passes: MiniLM's 8x128x384 0.33 ms, numpy's eight passes over
    the whole tensor (pairwise reductions and broadcasts) 1.6 ms warm, 3.6 ms inside a forward (Rocket Lake)."""
    count = np.float32(width)
    sq = np.empty(width, np.float32)  # d * d, then d / root: a scratch row apart from out (the loops vectorize)
    for at in range(0, x.size, width):
        row, dst = x[at:at + width], out[at:at + width]
        mean = np.float32(sum_f32(x, at, width) / count)
        for i in range(width):
            d = row[i] - mean
            dst[i] = d
            sq[i] = d * d
        root = np.float32(np.sqrt(np.float32(np.float32(sum_f32(sq, 0, width) / count) + eps)))
        for i in range(width):
            sq[i] = dst[i] / root
        if has_bias:
            for i in range(width):
                dst[i] = sq[i] * scale[i] + bias[i]
        else:
            for i in range(width):
                dst[i] = sq[i] * scale[i]


# ------------------------------------------------------------------ softmax, a row at a time
@numba.njit(cache=True, nogil=True, error_model="numpy")
def softmax_rows(x, out, width, odd):  # pragma: no cover - compiled
    """Softmax of flat float32 x's rows of `width` into out (which may be x): per row m = the largest non-NaN
    value (simd.max_f32), e = exp(x - m) (simd.exp_shifted_f32: the difference rounded once, the sigmoid's exp),
    den = sum(e) by simd.sum_f32 (one vector order), out = e / den; every step the same bits on every CPU. A row
    stays in L1 through its passes. A row whose m is not finite (an element is +inf, or none is above -inf) is left
    for the caller's generic steps, flagged in odd; a NaN elsewhere makes its row's sum, so the whole row, NaN."""
    for r in range(x.size // width):
        at = r * width
        m = max_f32(x, at, width)
        if not abs(m) < np.inf:
            odd[r] = True
            continue
        exp_shifted_f32(out, at, x, at, width, m)
        den = sum_f32(out, at, width)  # >= 1 (the max's own exp(0)), or NaN
        row = out[at:at + width]  # indices from 0 (the loop over at..at + width stayed scalar: 5x slower)
        for i in range(width):
            row[i] = row[i] / den


def softmax_last(x: np.ndarray, out: np.ndarray, generic) -> np.ndarray:
    """out = softmax of float32 x over its last axis by softmax_rows (out C-contiguous, x's shape; it may be x);
    the rows softmax_rows leaves (a non-finite max) by `generic`, the caller's own steps on a (rows, width) array."""
    if x.size == 0:
        return out
    width = x.shape[-1]
    flat = np.ascontiguousarray(x).reshape(-1)
    rows = flat.size // width
    odd = np.zeros(rows, np.bool_)
    dst = out.reshape(-1)
    work = flat.size * ROW_PASS_COST
    if threads.one_chunk(rows, work):
        softmax_rows(flat, dst, width, odd)
    else:
        threads.rows_in_chunks(rows, work, lambda r0, r1: softmax_rows(
            flat[r0 * width:r1 * width], dst[r0 * width:r1 * width], width, odd[r0:r1]))
    if np.count_nonzero(odd):  # (odd.any() took 1.2 us, this 0.3)
        out.reshape(rows, width)[odd] = generic(flat.reshape(rows, width)[odd])
    return out


