"""GGML block quantization, byte-identical to GGML's reference quantizer (the `gguf` package; for the
K-quants, which gguf cannot quantize, GGML's C reference built without multiply-add contraction).

The facts of every type (sizes, scale offsets, decoders) live in the codec registry (codecs.py);
this module holds the quantizers: one numba kernel per type (one pass per block instead of ~10 numpy
passes), each computing in float32 exactly what the reference computes. Layouts: spec/ops.md,
"Quantized". Rounding is the reference's: half away from zero (roundf) for Q8_0 and the
ternary types, truncation of x/d + offset (then a clamp to the code range) for Q4_x and Q5_x, the
nearest code (the first on ties) for MXFP4, half to even (GGML's nearest_int) for the K-quants.

Every intermediate is defined, so the bytes are the same on every CPU (spec/ops.md, "Defined results"):
when the reciprocal scale 1/d overflows to inf (d below ~2^-128, a subnormal float32), the reference
would cast inf or NaN to an integer, which C and numpy leave to the CPU; here every code of such a
block is the code of 0 (its fp16 scale is 0, so any code dequantizes to 0 and 0 is the exact value's
nearest; for Q4_1/Q5_1 the stored code is 0 and the value is the block min). A code computed from NaN
(Q4_1/Q5_1 with an infinite d, where (x - min) * 0 is NaN) is 0, and rounded codes are clamped to the
code range as a second guard (never reached for finite input). MXFP4 has no reciprocal; below amax
2^-125 the reference casts a negative exponent to uint8, here the scale byte is 0.
"""

from __future__ import annotations

import math

import numpy as np

from .codecs import CODECS, get_codec
from .errors import QuantError
from .numba_setup import numba

Q8_0_BLOCK, Q8_0_BYTES = 32, 34
TQ2_0_BLOCK, TQ2_0_BYTES = 256, 66
ENCODINGS = {c.name: (c.block, c.nbytes) for c in CODECS.values()}

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_F127 = np.float32(127.0)
_FM128 = np.float32(-128.0)
_HALF = np.float32(0.5)
_FM8, _F8H, _F15 = np.float32(-8.0), np.float32(8.5), np.float32(15.0)
_FM16, _F16H, _F31 = np.float32(-16.0), np.float32(16.5), np.float32(31.0)


@numba.njit(cache=True, inline="always")
def _roundf(v):
    """C roundf (half away from zero) in float32. floor(|v| + 0.5) would be wrong just below .5:
    0.49999997 + 0.5 rounds to 1.0 in float32."""
    a = abs(v)
    fl = np.floor(a)
    r = fl + _F1 if a - fl >= _HALF else fl  # a - fl is exact, so this is the reference's floor(2(a - fl))
    return r if v >= _F0 else -r


@numba.njit(cache=True, inline="always")
def _trunc_code(v, hi):
    """The reference's trunc(v) -> uint8, clip(0, hi); NaN (and anything below 0) gives 0."""
    t = np.trunc(v)
    if not t >= _F0:
        return np.uint8(0)
    return np.uint8(min(t, hi))


@numba.njit(cache=True, inline="always")
def _recip(d):
    """1/d, 0 for d == 0, and 0 where 1/d overflows (subnormal d): the "Defined results" rule."""
    inv = _F1 / d if d != _F0 else _F0
    return _F0 if abs(inv) == np.inf else inv


@numba.njit(cache=True, inline="always")
def _signed_absmax(x, b, n):
    """The element of largest magnitude (the first one on ties), sign kept: the reference's argmax(|x|)."""
    mx = x[b, 0]
    amax = abs(mx)
    for i in range(1, n):
        v = abs(x[b, i])
        if v > amax:
            amax = v
            mx = x[b, i]
    return mx


# max(|x|) is exact in any order and the input is checked finite, so these flags change nothing but
# let LLVM vectorize the reduction (a separate, not inlined function: the flags stay local to it).
@numba.njit(cache=True, fastmath={"reassoc", "nnan", "nsz"})
def _absmax_row(r):
    amax = _F0
    for i in range(r.shape[0]):
        amax = max(amax, abs(r[i]))
    return amax


@numba.njit(cache=True, inline="always")
def _absmax(x, b, n):
    return _absmax_row(x[b, :n])


# Kernels: x f32 [nb, block], s f32 [nb, n_scales] (written here, stored as fp16 by quantize()),
# out u8 [nb, block bytes] (the code bytes are written here; the scale bytes are left to quantize()).

@numba.njit(cache=True, nogil=True)
def _q8_0_blocks(x, s, out):  # d = amax / 127, q = roundf(x / d) as int8
    for b in range(x.shape[0]):
        d = _absmax(x, b, 32) / _F127
        inv = _recip(d)
        s[b, 0] = d
        for i in range(32):
            out[b, 2 + i] = np.uint8(np.int32(min(max(_roundf(x[b, i] * inv), _FM128), _F127)) & 0xFF)


@numba.njit(cache=True, nogil=True)
def _q4_0_blocks(x, s, out):  # d = max / -8 (max: signed value of largest |x|), q = trunc(x/d + 8.5)
    for b in range(x.shape[0]):
        d = _signed_absmax(x, b, 32) / _FM8
        inv = _recip(d)
        s[b, 0] = d
        for j in range(16):
            lo = _trunc_code(x[b, j] * inv + _F8H, _F15)
            hi = _trunc_code(x[b, j + 16] * inv + _F8H, _F15)
            out[b, 2 + j] = lo | (hi << 4)


@numba.njit(cache=True, inline="always")
def _min_max(x, b):
    """Signed min and max of block b (32 values); ties, +0 against -0 included, keep the first, as GGML's loop."""
    mn = x[b, 0]
    mx = x[b, 0]
    for i in range(1, 32):
        v = x[b, i]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
    return mn, mx


@numba.njit(cache=True, nogil=True)
def _q4_1_blocks(x, s, out):  # d = (max - min) / 15, m = min, q = trunc((x - min)/d + 0.5)
    for b in range(x.shape[0]):
        mn, mx = _min_max(x, b)
        d = (mx - mn) / _F15
        inv = _recip(d)
        s[b, 0] = d
        s[b, 1] = mn
        for j in range(16):
            lo = _trunc_code((x[b, j] - mn) * inv + _HALF, _F15)
            hi = _trunc_code((x[b, j + 16] - mn) * inv + _HALF, _F15)
            out[b, 4 + j] = lo | (hi << 4)


@numba.njit(cache=True, inline="always")
def _q5_pack(out, b, j, lo, hi, h, qs_at):
    """Codes j and j + 16: low nibbles share byte j; bit 4 of code j goes to bit j of a LE u32 (returned)."""
    out[b, qs_at + j] = (lo & 15) | ((hi & 15) << 4)
    return h | (np.int64(lo >> 4) << j) | (np.int64(hi >> 4) << (j + 16))


@numba.njit(cache=True, inline="always")
def _q5_high(out, b, h, qh_at):
    for k in range(4):
        out[b, qh_at + k] = np.uint8((h >> (8 * k)) & 0xFF)


@numba.njit(cache=True, nogil=True)
def _q5_0_blocks(x, s, out):  # d = max / -16, q = trunc(x/d + 16.5)
    for b in range(x.shape[0]):
        d = _signed_absmax(x, b, 32) / _FM16
        inv = _recip(d)
        s[b, 0] = d
        h = np.int64(0)
        for j in range(16):
            lo = _trunc_code(x[b, j] * inv + _F16H, _F31)
            hi = _trunc_code(x[b, j + 16] * inv + _F16H, _F31)
            h = _q5_pack(out, b, j, lo, hi, h, 6)
        _q5_high(out, b, h, 2)


@numba.njit(cache=True, nogil=True)
def _q5_1_blocks(x, s, out):  # d = (max - min) / 31, m = min, q = trunc((x - min)/d + 0.5)
    for b in range(x.shape[0]):
        mn, mx = _min_max(x, b)
        d = (mx - mn) / _F31
        inv = _recip(d)
        s[b, 0] = d
        s[b, 1] = mn
        h = np.int64(0)
        for j in range(16):
            lo = _trunc_code((x[b, j] - mn) * inv + _HALF, _F31)
            hi = _trunc_code((x[b, j + 16] - mn) * inv + _HALF, _F31)
            h = _q5_pack(out, b, j, lo, hi, h, 8)
        _q5_high(out, b, h, 4)


@numba.njit(cache=True, inline="always")
def _ternary(v):
    """roundf(v) clamped to {-1, 0, 1}, stored as q + 1: the same as comparing with +-0.5 (roundf rounds
    [0.5, 1.5) to 1 and (-0.5, 0.5) to 0), written without branches so that the loops vectorize."""
    return np.int32(v >= _HALF) - np.int32(v <= -_HALF) + 1


@numba.njit(cache=True, nogil=True)
def _tq2_0_blocks(x, s, out):  # d = amax; element j*128 + l*32 + m at bits 2l of byte j*32 + m
    for b in range(x.shape[0]):
        d = _absmax(x, b, 256)
        inv = _recip(d)  # codes of a block whose 1/amax overflows are 0 (stored as 1)
        s[b, 0] = d
        for j in range(2):
            o = j * 128
            for m in range(32):
                out[b, j * 32 + m] = np.uint8(_ternary(x[b, o + m] * inv) | (_ternary(x[b, o + 32 + m] * inv) << 2)
                                              | (_ternary(x[b, o + 64 + m] * inv) << 4)
                                              | (_ternary(x[b, o + 96 + m] * inv) << 6))


@numba.njit(cache=True, inline="always")
def _tq1_0_group(x, b, inv, out, base, n, width, at):
    """Bytes at..at+width of a TQ1_0 block: byte m holds elements base + i*width + m (i < n) as base-3
    digits (the first one most significant, 5 digits a byte), stored as ceil(v * 256 / 243)."""
    for m in range(width):
        v = 0
        for i in range(5):
            v *= 3
            if i < n:
                v += _ternary(x[b, base + i * width + m] * inv)
        out[b, at + m] = np.uint8((v * 256 + 242) // 243)


@numba.njit(cache=True, nogil=True)
def _tq1_0_blocks(x, s, out):  # d = amax; 48 bytes of 5 trits, 4 bytes of 4 trits, then fp16 d
    for b in range(x.shape[0]):
        d = _absmax(x, b, 256)
        inv = _recip(d)
        s[b, 0] = d
        _tq1_0_group(x, b, inv, out, 0, 5, 32, 0)
        _tq1_0_group(x, b, inv, out, 160, 5, 16, 32)
        _tq1_0_group(x, b, inv, out, 240, 4, 4, 48)


# MXFP4: e2m1 code values, doubled (the scale is 2^(e - 128), half of OCP MX's 2^(e - 127))
_MX_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)


@numba.njit(cache=True, nogil=True)
def _mxfp4_blocks(x, s, out):  # e = floor(log2(amax)) + 125, then the nearest code (first on ties)
    errs = np.empty(16, np.float32)
    for b in range(x.shape[0]):
        amax = _absmax(x, b, 32)
        e = 0
        if amax > _F0:
            # log2 rounded to f32 (as the reference's f32 log2 does near powers of two), floored; below
            # 2^-125 the reference casts a negative number to uint8 (CPU-dependent): the scale byte is 0
            e = max(int(np.floor(np.float32(np.log2(np.float64(amax))))) + 125, 0)
        out[b, 0] = np.uint8(e)
        d = np.float32(math.ldexp(1.0, e - 128))  # the E8M0 byte, halved: 2^(e - 128), exact in f32
        for k in range(16):
            errs[k] = d * _MX_VALUES[k]
        for j in range(32):
            v = x[b, j]
            best, idx = abs(errs[0] - v), 0
            for k in range(1, 16):
                err = abs(errs[k] - v)
                if err < best:
                    best, idx = err, k
            if j < 16:
                out[b, 1 + j] = np.uint8(idx)
            else:
                out[b, 1 + j - 16] |= np.uint8(idx << 4)


# ----------------------------------------------------------------------------------------- K-quants
# Super-blocks of 256 in sub-blocks with 6-bit (Q4_K, Q5_K) or int8 (Q6_K) scales relative to fp16 super-scales,
# chosen by GGML's weighted least-squares search (make_qkx2_quants / make_qx_quants). Every expression keeps
# the reference's float32 operation order, with no multiply-add contraction; the fp16 rounding of d and dmin is
# done here because the codes are computed from the rounded scales. Division is IEEE (error_model "numpy"):
# a zero or subnormal range gives Inf or NaN as in C, never an exception.
_F32 = np.float32(32.0)
_F63 = np.float32(63.0)
_F01 = np.float32(0.1)
_FM128K = np.float32(-128.0)
_GROUP_EPS = np.float32(1e-15)
_NEAREST_MAX = np.float32(4194303.0)
_HALF_MAX = 65520.0  # fp16 rounds this and above to Inf


@numba.njit(cache=True, inline="always", error_model="numpy")
def _nearest(v):
    """The reference's nearest_int (a float magic-number trick): v rounded half to even. Defined where the trick
    is not (the reference asserts |v| <= 2^22 - 1): NaN gives 0 (what the trick gives for a default NaN),
    anything beyond saturates at +-(2^22 - 1); callers clamp to the code range."""
    if abs(v) <= _NEAREST_MAX:
        return np.int64(np.rint(v))
    if v != v:
        return np.int64(0)
    return np.int64(4194303) if v > _F0 else np.int64(-4194303)


@numba.njit(cache=True, inline="always", error_model="numpy")
def _fp16(f):
    """float32 -> (fp16 bits, the fp16 value as float32), rounded to nearest even as GGML_FP32_TO_FP16."""
    a = abs(np.float64(f))
    sign = 0x8000 if f < _F0 or (f == _F0 and math.copysign(1.0, f) < 0) else 0
    if a != a:
        return np.int64(0x7E00), np.float32(np.nan)
    if a >= _HALF_MAX:
        bits = 0x7C00
        val = np.float32(np.inf)
    elif a < 2.0 ** -14:  # subnormal: multiples of 2^-24 (scaling by 2^24 is exact)
        m = np.rint(a * 2.0 ** 24)
        bits = np.int64(m)
        val = np.float32(m * 2.0 ** -24)
    else:
        e = math.frexp(a)[1] - 1  # a in [2^e, 2^(e+1))
        m = np.rint(math.ldexp(a, 10 - e))  # 1024..2048; 2048 carries into the exponent below
        bits = np.int64((e + 15) << 10) + np.int64(m) - 1024
        val = np.float32(math.ldexp(m, e - 10))
    return bits | sign, (-val if sign else val)


@numba.njit(cache=True, inline="always", error_model="numpy")
def _put_fp16(out, b, at, bits):
    out[b, at] = np.uint8(bits & 0xFF)
    out[b, at + 1] = np.uint8((bits >> 8) & 0xFF)


@numba.njit(cache=True, inline="always", error_model="numpy")
def _clampi(v, lo, hi):
    return min(max(v, lo), hi)


@numba.njit(cache=True, inline="always", error_model="numpy")
def _qkx2(x, b, o, w, nmax, rmin, rdelta, nstep, L, laux):
    """make_qkx2_quants on the 32 values x[b, o:o+32] with weights w: codes (0..nmax) into L[o:o+32];
    returns (scale, m) with value ~ scale * code - m (m >= 0)."""
    mn = x[b, o]
    mx = x[b, o]
    sum_w = w[0]
    sum_x = sum_w * x[b, o]
    for i in range(1, 32):
        v = x[b, o + i]
        if v < mn:
            mn = v
        if v > mx:
            mx = v
        sum_w += w[i]
        sum_x += w[i] * v
    if mn > _F0:
        mn = _F0
    if mx == mn:
        for i in range(32):
            L[o + i] = 0
        return _F0, -mn
    fn = np.float32(nmax)
    iscale = fn / (mx - mn)
    scale = _F1 / iscale
    best = _F0
    for i in range(32):
        q = _clampi(_nearest(iscale * (x[b, o + i] - mn)), 0, nmax)
        L[o + i] = q
        diff = scale * np.float32(q) + mn - x[b, o + i]
        best += w[i] * (diff * diff)
    for s in range(nstep + 1):
        iscale = (rmin + rdelta * np.float32(s) + fn) / (mx - mn)
        sl = _F0
        sl2 = _F0
        sxl = _F0
        for i in range(32):
            q = _clampi(_nearest(iscale * (x[b, o + i] - mn)), 0, nmax)
            laux[i] = q
            wl = w[i] * np.float32(q)
            sl += wl
            sl2 += wl * np.float32(q)
            sxl += wl * x[b, o + i]
        det = sum_w * sl2 - sl * sl
        if det > _F0:
            this_scale = (sum_w * sxl - sum_x * sl) / det
            this_min = (sl2 * sum_x - sl * sxl) / det
            if this_min > _F0:
                this_min = _F0
                this_scale = sxl / sl2
            mad = _F0
            for i in range(32):
                diff = this_scale * np.float32(laux[i]) + this_min - x[b, o + i]
                mad += w[i] * (diff * diff)
            if mad < best:
                for i in range(32):
                    L[o + i] = laux[i]
                best = mad
                scale = this_scale
                mn = this_min
    return scale, -mn


@numba.njit(cache=True, inline="always", error_model="numpy")
def _k_scale_min(out, b, j):
    """The 6-bit scale and min of sub-block j from the 12 bytes at 4..16 (GGML's get_scale_min_k4)."""
    s = 4
    if j < 4:
        return np.int64(out[b, s + j] & 63), np.int64(out[b, s + j + 4] & 63)
    return (np.int64((out[b, s + j + 4] & 15) | ((out[b, s + j - 4] >> 6) << 4)),
            np.int64((out[b, s + j + 4] >> 4) | ((out[b, s + j] >> 6) << 4)))


@numba.njit(cache=True, inline="always", error_model="numpy")
def _k_superblock(x, b, out, nmax, rmin, rdelta, nstep, L, laux, w, sc, mins):
    """Q4_K / Q5_K except the code packing: d, dmin (bytes 0..4), the 6-bit scales and mins (4..16) and the
    codes 0..nmax of the 256 values into L."""
    max_scale = _F0
    max_min = _F0
    for j in range(8):
        o = 32 * j
        sum_x2 = _F0
        for i in range(32):
            sum_x2 += x[b, o + i] * x[b, o + i]
        av_x = np.sqrt(sum_x2 / _F32)
        for i in range(32):
            w[i] = av_x + abs(x[b, o + i])
        sc[j], mins[j] = _qkx2(x, b, o, w, nmax, rmin, rdelta, nstep, L, laux)
        if sc[j] > max_scale:
            max_scale = sc[j]
        if mins[j] > max_min:
            max_min = mins[j]
    inv_scale = _F63 / max_scale if max_scale > _F0 else _F0
    inv_min = _F63 / max_min if max_min > _F0 else _F0
    for j in range(8):
        # the reference stores nearest_int in a uint8_t (mod 256), then takes the MIN with 63
        ls = min(63, _nearest(inv_scale * sc[j]) & 0xFF)
        lm = min(63, _nearest(inv_min * mins[j]) & 0xFF)
        if j < 4:
            out[b, 4 + j] = np.uint8(ls)
            out[b, 8 + j] = np.uint8(lm)
        else:  # low 4 bits in byte 8 + j (scale low, min high), top 2 bits in bits 6..7 of bytes j - 4 and j
            out[b, 8 + j] = np.uint8((ls & 15) | ((lm & 15) << 4))
            out[b, j] |= np.uint8((ls >> 4) << 6)
            out[b, 4 + j] |= np.uint8((lm >> 4) << 6)
    dbits, d = _fp16(max_scale / _F63)
    mbits, dmin = _fp16(max_min / _F63)
    _put_fp16(out, b, 0, dbits)
    _put_fp16(out, b, 2, mbits)
    for j in range(8):
        s, m = _k_scale_min(out, b, j)
        dj = d * np.float32(s)
        if dj == _F0:  # the reference's `if (!d) continue`: keep the search's codes (NaN goes on)
            continue
        dm = dmin * np.float32(m)
        for i in range(32):
            L[32 * j + i] = _clampi(_nearest((x[b, 32 * j + i] + dm) / dj), 0, nmax)


@numba.njit(cache=True, inline="always")
def _k_scratch():
    """Per-call work arrays of the Q4_K/Q5_K searches: codes, search codes, weights, scales, mins."""
    return (np.zeros(256, np.int64), np.zeros(32, np.int64), np.empty(32, np.float32), np.empty(8, np.float32),
            np.empty(8, np.float32))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _q4_k_blocks(x, s, out):  # d, dmin @0, 6-bit scales/mins @4..16, qs @16..144
    L, laux, w, sc, mins = _k_scratch()
    for b in range(x.shape[0]):
        out[b, 4:16] = 0
        _k_superblock(x, b, out, 15, np.float32(-1.0), _F01, 20, L, laux, w, sc, mins)
        for c in range(4):  # chunk c of 64: sub-block 2c in the low nibbles, 2c + 1 in the high
            for i in range(32):
                out[b, 16 + 32 * c + i] = np.uint8(L[64 * c + i] | (L[64 * c + 32 + i] << 4))


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _q5_k_blocks(x, s, out):  # d, dmin @0, scales/mins @4..16, qh @16..48 (bit j: sub-block j), qs @48..176
    L, laux, w, sc, mins = _k_scratch()
    for b in range(x.shape[0]):
        out[b, 4:48] = 0
        _k_superblock(x, b, out, 31, np.float32(-0.5), _F01, 15, L, laux, w, sc, mins)
        for c in range(4):
            for i in range(32):
                lo = L[64 * c + i]
                hi = L[64 * c + 32 + i]
                out[b, 16 + i] |= np.uint8(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)))
                out[b, 48 + 32 * c + i] = np.uint8((lo & 15) | ((hi & 15) << 4))


@numba.njit(cache=True, inline="always", error_model="numpy")
def _qx(x, b, o, nmax, L):
    """make_qx_quants (16 values at x[b, o:], weights x^2): codes l + nmax (l in -nmax..nmax-1) into L[o:];
    returns the scale (value ~ scale * l)."""
    mx = _F0
    amax = _F0
    for i in range(16):
        ax = abs(x[b, o + i])
        if ax > amax:
            amax = ax
            mx = x[b, o + i]
    if amax < _GROUP_EPS:
        for i in range(16):
            L[o + i] = 0
        return _F0
    fn = np.float32(nmax)
    iscale = -fn / mx
    sumlx = _F0
    suml2 = _F0
    for i in range(16):
        v = x[b, o + i]
        q = _clampi(_nearest(iscale * v), -nmax, nmax - 1)
        L[o + i] = q + nmax
        w = v * v
        sumlx += w * v * np.float32(q)
        suml2 += w * np.float32(q) * np.float32(q)
    scale = sumlx / suml2 if suml2 != _F0 else _F0
    best = scale * sumlx
    for k in range(-9, 10):
        if k == 0:
            continue
        iscale = -(fn + _F01 * np.float32(k)) / mx
        sumlx = _F0
        suml2 = _F0
        for i in range(16):
            v = x[b, o + i]
            q = np.float32(_clampi(_nearest(iscale * v), -nmax, nmax - 1))
            sumlx += v * v * v * q
            suml2 += v * v * q * q
        if suml2 > _F0 and sumlx * sumlx > best * suml2:
            for i in range(16):
                L[o + i] = _clampi(_nearest(iscale * x[b, o + i]), -nmax, nmax - 1) + nmax
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _q6_k_blocks(x, s, out):  # ql @0..128, qh @128..192, int8 scales @192..208, d @208
    L = np.zeros(256, np.int64)
    sc = np.empty(16, np.float32)
    for b in range(x.shape[0]):
        out[b, :] = 0
        max_scale = _F0
        max_abs = _F0
        for j in range(16):
            sc[j] = _qx(x, b, 16 * j, 32, L)
            if abs(sc[j]) > max_abs:
                max_abs = abs(sc[j])
                max_scale = sc[j]
        if max_abs < _GROUP_EPS:  # the whole block is zeros
            continue
        iscale = _FM128K / max_scale
        dbits, d = _fp16(_F1 / iscale)
        _put_fp16(out, b, 208, dbits)
        for j in range(16):
            q = _clampi(_nearest(iscale * sc[j]), -128, 127)
            out[b, 192 + j] = np.uint8(q & 0xFF)
            dj = d * np.float32(q)
            if dj == _F0:
                continue
            for i in range(16):
                L[16 * j + i] = _clampi(_nearest(x[b, 16 * j + i] / dj), -32, 31) + 32
        for h in range(2):  # half h of 128: element 128h + 32k + i -> ql nibble, 2 bits of qh[32h + i] at 2k
            e = 128 * h
            for i in range(32):
                q0, q1, q2, q3 = L[e + i], L[e + 32 + i], L[e + 64 + i], L[e + 96 + i]
                out[b, 64 * h + i] = np.uint8((q0 & 15) | ((q2 & 15) << 4))
                out[b, 64 * h + 32 + i] = np.uint8((q1 & 15) | ((q3 & 15) << 4))
                out[b, 128 + 32 * h + i] = np.uint8((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6))


_KERNELS = {name: globals()[c.kernel] for name, c in CODECS.items()}  # a codec without a kernel fails here


def _check(x: np.ndarray, block: int, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise QuantError(f"{name}: got dtype {x.dtype}; expected a float array")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % block:
        last = x.shape[-1] if x.ndim else "scalar"
        raise QuantError(f"{name}: last dim is {last}; expected a multiple of {block} "
                         f"(pad the rows or keep this tensor dense)")
    if not np.isfinite(x).all():
        raise QuantError(f"{name}: tensor has NaN or Inf values; expected finite values "
                         "(fix the weights or keep this tensor dense)")
    return x


def quantize(x: np.ndarray, encoding: str) -> np.ndarray:
    """float array (..., K), K a multiple of the block -> uint8 (..., K/block*bytes) of GGML blocks."""
    c = get_codec(encoding, "quantize")
    x = _check(x, c.block, f"quantize_{c.short}")
    blocks = x.reshape(-1, c.block)
    nb = blocks.shape[0]
    scales = np.empty((nb, len(c.scale_offsets)), np.float32)
    out = np.empty((nb, c.nbytes), np.uint8)
    _KERNELS[c.name](blocks, scales, out)
    with np.errstate(over="ignore"):  # a scale > 65504 is stored as an infinite fp16, as the reference does
        s16 = scales.astype(np.float16).view(np.uint8)
    for i, off in enumerate(c.scale_offsets):
        out[:, off:off + 2] = s16[:, 2 * i:2 * i + 2]
    return out.reshape(*x.shape[:-1], x.shape[-1] // c.block * c.nbytes)


def _packed(p: np.ndarray, nbytes: int, name: str) -> np.ndarray:
    p = np.asarray(p)
    if p.dtype != np.uint8 or p.ndim == 0 or p.shape[-1] % nbytes:
        raise QuantError(f"{name}: got {p.dtype}{list(p.shape)}; expected uint8 with last dim a multiple "
                         f"of {nbytes}")
    return np.ascontiguousarray(p)


def block_fields(xp, rows, encoding: str) -> tuple:
    """Packed rows [R, nb * BYTES] -> the codec's fields, each [R, nb, ...]: strided views of the codes
    (no copy) and small f32 copies of the fp16 block scales.

    Array-module generic (`xp` = numpy or cupy): the one decoder of the block layouts, used here and by
    the CUDA runtime (rlx_runtime/cuda/blocks.py)."""
    c = get_codec(encoding)
    return c.fields(xp, rows.reshape(rows.shape[0], rows.shape[1] // c.nbytes, c.nbytes))


def dequantize_fields(xp, fields: tuple, encoding: str, out):
    """Decode block_fields' fields for R rows into `out` (f32 [R, nb * BLOCK], contiguous)."""
    c = get_codec(encoding)
    rows, nb = fields[0].shape[:2]
    c.decode(xp, fields, out.reshape(rows, nb, c.block))
    return out


def dequantize(p: np.ndarray, encoding: str) -> np.ndarray:
    """uint8 (..., K/block*bytes) of GGML blocks -> float32 (..., K)."""
    c = get_codec(encoding, "dequantize")
    p = _packed(p, c.nbytes, f"dequantize_{c.short}")
    rows = p.reshape(-1, p.shape[-1])
    out = np.empty((rows.shape[0], rows.shape[1] // c.nbytes * c.block), np.float32)
    # an infinite scale times code 0 is NaN; MXFP4's largest scale times 12 overflows to Inf (IEEE, as in the
    # reference)
    with np.errstate(invalid="ignore", over="ignore"):
        return dequantize_fields(np, block_fields(np, rows, encoding), encoding, out).reshape(*p.shape[:-1],
                                                                                             out.shape[1])


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float array (..., K), K % 32 == 0 -> uint8 (..., K/32*34) of GGML Q8_0 blocks."""
    return quantize(x, "gguf_q8_0")


def quantize_tq2_0(x: np.ndarray) -> np.ndarray:
    """float array (..., K), K % 256 == 0 -> uint8 (..., K/256*66) of GGML TQ2_0 blocks."""
    return quantize(x, "gguf_tq2_0")


def dequantize_q8_0(p: np.ndarray) -> np.ndarray:
    return dequantize(p, "gguf_q8_0")


def dequantize_tq2_0(p: np.ndarray) -> np.ndarray:
    return dequantize(p, "gguf_tq2_0")


def is_lossless_ternary(w: np.ndarray, block: int = TQ2_0_BLOCK) -> bool:
    """True if every `block` of the last axis holds only {-a, 0, +a} with `a` fp16-exact.

    Then the ternary codecs (TQ1_0, TQ2_0) round-trip the tensor bit-exactly. Vectorized; NaN/Inf answer False.
    """
    w = np.asarray(w)
    if w.dtype.kind != "f" or w.ndim == 0 or w.shape[-1] % block or w.size == 0:
        return False
    b = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, block)
    mag = np.abs(b)
    a = mag.max(axis=1)
    if not np.isfinite(a).all():
        return False
    if not (a.astype(np.float16).astype(np.float32) == a).all():
        return False
    return bool(((mag == 0) | (mag == a[:, None])).all())
