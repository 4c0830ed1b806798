"""Packed GGML blocks as array operations, written against an array module `xp` (cupy on a GPU).

A packed [N, nb * BYTES] weight is split once into a strided view of its codes and a small f32 copy
of its per-block scales; each forward then dequantizes row tiles of at most TILE_BYTES into one
buffer and multiplies them with BLAS (cuBLAS on CUDA), so the whole f32 weight never exists at once.
Values are bit-identical to rlx_format.quants.dequantize (same f32 products).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx_format.quants import ENCODINGS, Q8_0_BYTES, TQ2_0_BYTES

TILE_BYTES = 16 << 20  # f32 tile buffer per DequantMatMul call: 16 MiB (1024 rows at K = 4096)


@dataclass
class SplitWeight:
    """`codes`: strided view of the packed bytes (int8 [N, nb, 32] for Q8_0, uint8 [N, nb, 64] for
    TQ2_0); `scales`: f32 [N, nb, 1]. `packed` is kept so a cache can check it is the same array."""

    packed: object
    encoding: str
    codes: object
    scales: object


def split(xp, packed, encoding: str) -> SplitWeight:
    _, nbytes = ENCODINGS[encoding]
    rows = packed.reshape(-1, packed.shape[-1])
    b = rows.reshape(rows.shape[0], rows.shape[1] // nbytes, nbytes)
    if encoding == "gguf_q8_0":
        codes, scale_bytes = b[:, :, 2:Q8_0_BYTES].view(xp.int8), b[:, :, :2]
    else:
        codes, scale_bytes = b[:, :, :64], b[:, :, 64:TQ2_0_BYTES]
    scales = xp.ascontiguousarray(scale_bytes).view(xp.float16).astype(xp.float32)
    return SplitWeight(packed, encoding, codes, scales)


def dequantize_rows(xp, w: SplitWeight, r0: int, r1: int, out) -> object:
    """Rows r0:r1 of the weight, dequantized into `out` (f32 [r1 - r0, K], contiguous)."""
    rows = r1 - r0
    codes, d = w.codes[r0:r1], w.scales[r0:r1]
    nb = codes.shape[1]
    if w.encoding == "gguf_q8_0":
        xp.multiply(codes, d, out=out.reshape(rows, nb, 32))
        return out
    # TQ2_0: value j*128 + l*32 + m is bits 2l..2l+1 of byte j*32 + m, stored as q + 1
    shifts = xp.arange(0, 8, 2, dtype=xp.uint8).reshape(1, 1, 1, 4, 1)
    q = (codes.reshape(rows, nb, 2, 1, 32) >> shifts) & 3
    xp.multiply(xp.subtract(q, 1, dtype=xp.float32), d.reshape(rows, nb, 1, 1, 1),
                out=out.reshape(rows, nb, 2, 4, 32))
    return out


def dequantize_all(xp, packed, encoding: str, shape) -> object:
    """The Dequantize op: the whole tensor as f32 of `shape`."""
    w = split(xp, packed, encoding)
    n, nb = w.codes.shape[:2]
    out = xp.empty((n, nb * ENCODINGS[encoding][0]), dtype=xp.float32)
    return dequantize_rows(xp, w, 0, n, out).reshape(tuple(shape))


def dequant_gather(xp, packed, idx, encoding: str, K: int) -> object:
    """Rows `idx` of a packed [N, K] table, dequantized: only the gathered rows are decoded."""
    rows = xp.take(packed, idx.reshape(-1).astype(xp.int64), axis=0)
    return dequantize_all(xp, rows, encoding, (*idx.shape, K))


def tiled_matmul(xp, x2, w: SplitWeight, N: int, K: int) -> object:
    """x2 [M, K] @ dequant(w).T -> [M, N], one row tile (<= TILE_BYTES) of the weight at a time."""
    tile = max(1, min(N, TILE_BYTES // (4 * K)))
    buf = xp.empty((tile, K), dtype=xp.float32)
    if tile == N:
        return xp.matmul(x2, dequantize_rows(xp, w, 0, N, buf).T)
    y = xp.empty((x2.shape[0], N), dtype=xp.float32)
    for r0 in range(0, N, tile):
        r1 = min(N, r0 + tile)
        y[:, r0:r1] = xp.matmul(x2, dequantize_rows(xp, w, r0, r1, buf[: r1 - r0]).T)
    return y
