"""Packed GGML blocks on any array module `xp`: the generic Dequantize / DequantGather / DequantMatMul path
(every backend; the CPU overrides the first and last with numba kernels from quant_kernels.py).

A packed [N, nb * BYTES] weight is split once (rlx_format.quants.block_fields, from the codec
registry: strided views of its codes and small f32 copies of its per-block scales); each forward then
dequantizes row tiles of at most TILE_BYTES into one buffer and multiplies them with BLAS (cuBLAS on
CUDA), so the whole f32 weight never exists at once. Values are bit-identical to
rlx_format.quants.dequantize (the same decoder).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx_format.codecs import get_codec

TILE_BYTES = 16 << 20  # f32 tile buffer per DequantMatMul call: 16 MiB (1024 rows at K = 4096)


@dataclass
class SplitWeight:
    """block_fields of a packed weight; `packed` is kept so a cache can check it is the same array."""

    packed: object
    encoding: str
    fields: tuple  # the codec's fields, each [N, nb, ...]


def split(xp, packed, encoding: str) -> SplitWeight:
    from rlx_format.quants import block_fields  # quants loads numba: only when a quantized op runs
    return SplitWeight(packed, encoding, block_fields(xp, packed.reshape(-1, packed.shape[-1]), encoding))


def dequantize_rows(xp, w: SplitWeight, r0: int, r1: int, out) -> object:
    """Rows r0:r1 of the weight, dequantized into `out` (f32 [r1 - r0, K], contiguous)."""
    from rlx_format.quants import dequantize_fields
    return dequantize_fields(xp, tuple(f[r0:r1] for f in w.fields), w.encoding, out)


def dequantize_all(xp, packed, encoding: str, shape) -> object:
    """The Dequantize op: the whole tensor as f32 of `shape`."""
    w = split(xp, packed, encoding)
    n, nb = w.fields[0].shape[:2]
    out = xp.empty((n, nb * get_codec(encoding).block), dtype=xp.float32)
    return dequantize_rows(xp, w, 0, n, out).reshape(tuple(shape))


def dequant_gather(xp, packed, idx, encoding: str, K: int) -> object:
    """Rows `idx` of a packed [N, K] table, dequantized: only the gathered rows are decoded."""
    rows = xp.take(packed, idx.reshape(-1).astype(xp.int64), axis=0)
    return dequantize_all(xp, rows, encoding, (*idx.shape, K))


def tiled_matmul(xp, x2, decode_rows, N: int, K: int, tile: int | None = None, matmul=None,
                 wide_rows: int | None = None) -> object:
    """x2 [M, K] @ W.T -> [M, N], one row tile of W at a time: `decode_rows(r0, r1, buf)` writes rows r0:r1 of
    W as f32 into `buf` and returns them (at most `tile` rows; default: TILE_BYTES worth). Every backend's
    tiled DequantMatMul is this loop (the CPU's decoder is a numba kernel, the others the array-op one).

    From `wide_rows` input rows on (None: never) x2 is the long operand: tiles of TILE_BYTES, each multiplied as
    x2 @ W_tileᵀ into its columns of y (one GEMM when the whole weight fits), so x2 is packed once per tile,
    not once per `tile` rows of W (MiniLM's 1024-row batch: 384->1536 at 1 thread 30 -> 15 ms)."""
    wide = wide_rows is not None and x2.shape[0] >= wide_rows
    tile = max(1, min(N, (None if wide else tile) or TILE_BYTES // (4 * K)))
    buf = xp.empty((tile, K), dtype=xp.float32)
    matmul = matmul or xp.matmul  # the CPU passes threads.matmul (split over the forward's threads)
    if wide:
        if tile == N:
            return matmul(x2, decode_rows(0, N, buf).T)
        y = xp.empty((x2.shape[0], N), dtype=xp.float32)
        for r0 in range(0, N, tile):
            r1 = min(N, r0 + tile)
            y[:, r0:r1] = matmul(x2, decode_rows(r0, r1, buf[: r1 - r0]).T)
        return y
    xt = x2.T
    # W_tile @ x.T into rows of y.T, not x @ W_tile.T: measured 1.3x faster on OpenBLAS for a 32-row batch
    # (the weight tile is the long operand), and each tile's result is a contiguous block of y.T
    yt = xp.empty((N, x2.shape[0]), dtype=xp.float32)
    for r0 in range(0, N, tile):
        r1 = min(N, r0 + tile)
        yt[r0:r1] = matmul(decode_rows(r0, r1, buf[: r1 - r0]), xt)
    return xp.ascontiguousarray(yt.T)


def split_rows(xp, w: SplitWeight):
    """The decode_rows of a split weight, for tiled_matmul."""
    return lambda r0, r1, buf: dequantize_rows(xp, w, r0, r1, buf)
