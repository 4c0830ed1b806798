"""GGML block quantization: Q8_0 and TQ2_0, byte-identical to GGML's reference quantizer.

Layouts (spec/ops.md, "Quantized encodings"):
- Q8_0: blocks of 32 values -> 34 bytes: fp16 scale d = amax/127, then 32 int8 q = round(x/d).
- TQ2_0: blocks of 256 values -> 66 bytes: 64 bytes of 2-bit codes (q+1 in {0,1,2}), element
  j*128 + l*32 + m in byte j*32 + m at bit 2*l, then fp16 scale d = amax.
Rounding is half away from zero, computed in float32, as the reference does.
The hot loops are numba kernels (one pass per block instead of ~10 numpy passes).

Every intermediate is defined, so the bytes are the same on every CPU (spec/ops.md, "Defined results"):
when the reciprocal scale 1/d overflows to inf (d below ~2^-128, a subnormal float32), the reference
would cast inf or NaN to an integer, which C and numpy leave to the CPU; here every code of such a
block is 0 (its fp16 scale is 0, so any code dequantizes to 0 and 0 is the exact value's nearest).
Rounded codes are clamped to the code range as a second guard (never reached for finite input).
"""

from __future__ import annotations

import numpy as np

from .errors import QuantError
from .numba_setup import numba

Q8_0_BLOCK, Q8_0_BYTES = 32, 34
TQ2_0_BLOCK, TQ2_0_BYTES = 256, 66
ENCODINGS = {"gguf_q8_0": (Q8_0_BLOCK, Q8_0_BYTES), "gguf_tq2_0": (TQ2_0_BLOCK, TQ2_0_BYTES)}

_F0 = np.float32(0.0)
_F1 = np.float32(1.0)
_F127 = np.float32(127.0)
_FM128 = np.float32(-128.0)
_HALF = np.float32(0.5)


@numba.njit(cache=True, inline="always")
def _roundf(v):
    """C roundf (half away from zero) in float32. floor(|v| + 0.5) would be wrong just below .5:
    0.49999997 + 0.5 rounds to 1.0 in float32."""
    a = abs(v)
    fl = np.floor(a)
    r = fl + _F1 if a - fl >= _HALF else fl  # a - fl is exact, so this is the reference's floor(2(a - fl))
    return r if v >= _F0 else -r


@numba.njit(cache=True, nogil=True)
def _q8_0_blocks(x, d_out, q_out):  # x: (nb, 32) f32
    for b in range(x.shape[0]):
        amax = _F0
        for i in range(32):
            v = abs(x[b, i])
            if v > amax:
                amax = v
        d = amax / _F127
        inv = _F1 / d if d != _F0 else _F0
        if inv == np.inf:  # subnormal d: the reference's inf/NaN -> int8 cast is CPU-dependent
            inv = _F0
        d_out[b] = d
        for i in range(32):
            q_out[b, i] = np.int8(min(max(_roundf(x[b, i] * inv), _FM128), _F127))


@numba.njit(cache=True, nogil=True)
def _tq2_0_blocks(x, d_out, codes_out):  # x: (nb, 256) f32, codes_out: (nb, 64) u8
    for b in range(x.shape[0]):
        amax = _F0
        for i in range(256):
            v = abs(x[b, i])
            if v > amax:
                amax = v
        inv = _F1 / amax if amax != _F0 else _F0
        if inv == np.inf:  # as in Q8_0: codes of a block whose 1/amax overflows are 0 (stored as 1)
            inv = _F0
        d_out[b] = amax
        for j in range(2):
            for m in range(32):
                byte = 0
                for l in range(4):
                    q = np.int32(min(max(_roundf(x[b, j * 128 + l * 32 + m] * inv), -_F1), _F1)) + 1
                    byte |= (q & 3) << (2 * l)
                codes_out[b, j * 32 + m] = byte


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


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float array (..., K), K % 32 == 0 -> uint8 (..., K/32*34) of GGML Q8_0 blocks."""
    x = _check(x, Q8_0_BLOCK, "quantize_q8_0")
    blocks = x.reshape(-1, Q8_0_BLOCK)
    d = np.empty(blocks.shape[0], np.float32)
    out = np.empty((blocks.shape[0], Q8_0_BYTES), np.uint8)
    _q8_0_blocks(blocks, d, out[:, 2:].view(np.int8))  # quants written straight into the block bytes
    with np.errstate(over="ignore"):  # amax / 127 > 65504 stores an infinite scale, as the reference does
        out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return out.reshape(*x.shape[:-1], x.shape[-1] // Q8_0_BLOCK * Q8_0_BYTES)


def quantize_tq2_0(x: np.ndarray) -> np.ndarray:
    """float array (..., K), K % 256 == 0 -> uint8 (..., K/256*66) of GGML TQ2_0 blocks."""
    x = _check(x, TQ2_0_BLOCK, "quantize_tq2_0")
    blocks = x.reshape(-1, TQ2_0_BLOCK)
    d = np.empty(blocks.shape[0], np.float32)
    out = np.empty((blocks.shape[0], TQ2_0_BYTES), np.uint8)
    _tq2_0_blocks(blocks, d, out[:, :64])  # codes written straight into the block bytes
    with np.errstate(over="ignore"):
        out[:, 64:] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return out.reshape(*x.shape[:-1], x.shape[-1] // TQ2_0_BLOCK * TQ2_0_BYTES)


def _packed(p: np.ndarray, nbytes: int, name: str) -> np.ndarray:
    p = np.asarray(p)
    if p.dtype != np.uint8 or p.ndim == 0 or p.shape[-1] % nbytes:
        raise QuantError(f"{name}: got {p.dtype}{list(p.shape)}; expected uint8 with last dim a multiple "
                         f"of {nbytes}")
    return np.ascontiguousarray(p)


def block_fields(xp, rows, encoding: str) -> tuple:
    """Packed rows [R, nb * BYTES] -> (codes, scales) without copying the codes: a strided view of int8
    [R, nb, 32] (Q8_0) or uint8 [R, nb, 64] (TQ2_0), and the fp16 block scales as f32 [R, nb, 1].

    Array-module generic (`xp` = numpy or cupy): the one decoder of the block layouts, used here and by
    the CUDA runtime (rlx_runtime/cuda/blocks.py)."""
    nbytes = ENCODINGS[encoding][1]
    b = rows.reshape(rows.shape[0], rows.shape[1] // nbytes, nbytes)
    if encoding == "gguf_q8_0":
        codes, scale_bytes = b[:, :, 2:Q8_0_BYTES].view(xp.int8), b[:, :, :2]
    else:
        codes, scale_bytes = b[:, :, :64], b[:, :, 64:TQ2_0_BYTES]
    return codes, xp.ascontiguousarray(scale_bytes).view(xp.float16).astype(xp.float32)


def dequantize_fields(xp, codes, scales, encoding: str, out):
    """Decode block_fields' (codes, scales) for R rows into `out` (f32 [R, nb * BLOCK], contiguous): d * q."""
    rows, nb = codes.shape[:2]
    if encoding == "gguf_q8_0":
        xp.multiply(codes, scales, out=out.reshape(rows, nb, Q8_0_BLOCK))
        return out
    # TQ2_0: value j*128 + l*32 + m is bits 2l..2l+1 of byte j*32 + m, stored as q + 1
    shifts = xp.arange(0, 8, 2, dtype=xp.uint8).reshape(1, 1, 1, 4, 1)
    q = (codes.reshape(rows, nb, 2, 1, 32) >> shifts) & 3
    xp.multiply(xp.subtract(q, 1, dtype=xp.float32), scales.reshape(rows, nb, 1, 1, 1),
                out=out.reshape(rows, nb, 2, 4, 32))
    return out


def _dequantize(p: np.ndarray, encoding: str, name: str) -> np.ndarray:
    block, nbytes = ENCODINGS[encoding]
    p = _packed(p, nbytes, name)
    rows = p.reshape(-1, p.shape[-1])
    codes, scales = block_fields(np, rows, encoding)
    out = np.empty((rows.shape[0], rows.shape[1] // nbytes * block), np.float32)
    with np.errstate(invalid="ignore"):  # an infinite scale times code 0 is NaN (IEEE, as in the reference)
        return dequantize_fields(np, codes, scales, encoding, out).reshape(*p.shape[:-1], out.shape[1])


def dequantize_q8_0(p: np.ndarray) -> np.ndarray:
    return _dequantize(p, "gguf_q8_0", "dequantize_q8_0")


def dequantize_tq2_0(p: np.ndarray) -> np.ndarray:
    return _dequantize(p, "gguf_tq2_0", "dequantize_tq2_0")


def is_lossless_ternary(w: np.ndarray) -> bool:
    """True if every 256-block of the last axis holds only {-a, 0, +a} with `a` fp16-exact.

    Then TQ2_0 round-trips the tensor bit-exactly. Vectorized; NaN/Inf answer False.
    """
    w = np.asarray(w)
    if w.dtype.kind != "f" or w.ndim == 0 or w.shape[-1] % TQ2_0_BLOCK or w.size == 0:
        return False
    b = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, TQ2_0_BLOCK)
    mag = np.abs(b)
    a = mag.max(axis=1)
    if not np.isfinite(a).all():
        return False
    if not (a.astype(np.float16).astype(np.float32) == a).all():
        return False
    return bool(((mag == 0) | (mag == a[:, None])).all())


def quantize(x: np.ndarray, encoding: str) -> np.ndarray:
    if encoding == "gguf_q8_0":
        return quantize_q8_0(x)
    if encoding == "gguf_tq2_0":
        return quantize_tq2_0(x)
    raise QuantError(f"unknown encoding {encoding!r}; expected one of {sorted(ENCODINGS)}")


def dequantize(p: np.ndarray, encoding: str) -> np.ndarray:
    if encoding == "gguf_q8_0":
        return dequantize_q8_0(p)
    if encoding == "gguf_tq2_0":
        return dequantize_tq2_0(p)
    raise QuantError(f"unknown encoding {encoding!r}; expected one of {sorted(ENCODINGS)}")
