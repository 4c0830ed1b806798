"""Stride-1 2-D convs as one GEMM per kernel offset over shifted views of a padded input (CPU, no im2col).

With the input zero-padded into planes of pitch Wp, output pixel (oy, ox) of kernel offset (ky, kx) reads the
padded plane at flat index oy*Wp + ox + (ky*dh*Wp + kx*dw): so for each offset, the whole output, computed on
a grid Wp wide, is W[:, :, ky, kx] @ (the padded planes shifted by that flat offset) -- a strided view BLAS
reads directly, accumulated with beta = 1. The last (kw-1)*dw columns of each output row are wrap-around
garbage and are dropped when the result is copied out. Against im2col this writes and re-reads no column
matrix (k*k times the input: 11 MB for a 192-channel 3x3 conv at 40x40) at the price of (Wp / Wout - 1) extra
columns and k*k smaller GEMMs, so it is only chosen where it measured faster (`use_shifted`).

Each value is the sum over offsets of BLAS dot products over the input channels, in a fixed order; blocks of
output rows may run on several threads (threads.run_chunks), each block's work never splits again.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import numpy as np

from . import threads

# measured (benchmarks of single convs, 1 thread, OpenBLAS SkylakeX kernels on Zen 4): the shifted GEMMs won
# from about 4 MiB of im2col columns when the output is at least 28 wide (192->64 @40: 1.44x, 64->64 @56:
# 1.48x, 128->128 @28: 1.08x) and lost below (256->256 @14: 0.85x, 512->512 @7: 0.53x, 64->128 @20: 0.91x)
MIN_COLUMN_BYTES = 4 << 20
MIN_OUT_WIDTH = 28
# Whether to take this path at more than one thread when rlx's native worker pool is there (numba loaded): its
# chunks are Python jobs (the GIL passed back and forth with the worker) where im2col's GEMM splits into native
# ones. In short bursts of forwards after an idle pause (0.2 s, then 3 forwards, as the benchmarks time them) the
# YOLO-like model took 4.6-23 ms a forward at 2 threads (median ~11) this way, a steady 4.6-5.5 ms without; in
# long runs the shifted GEMMs were 3% faster there. (Without numba the GEMMs run on OpenBLAS's threads instead.)
WITH_NATIVE_POOL = False


def use_shifted(shape: tuple, dtype, w: np.ndarray, strides, group: int, out_sp) -> bool:
    """A stride-1 group-1 float32 2-D conv (inputs of `shape`) whose im2col columns would be large (see above)."""
    if len(shape) != 4 or dtype != np.float32 or w.dtype != np.float32 or group != 1:
        return False
    if any(s != 1 for s in strides) or w.shape[2] * w.shape[3] == 1 or out_sp[1] < MIN_OUT_WIDTH:
        return False
    nthreads = threads.threads_in_use()
    if nthreads > 1 and not threads.blas_threads_instead(nthreads) and not WITH_NATIVE_POOL:
        return False
    columns = shape[0] * shape[1] * w.shape[2] * w.shape[3] * math.prod(out_sp) * 4
    return columns >= MIN_COLUMN_BYTES and threads.float_gemm(np.float32) is not None


def conv2d_shifted(x: np.ndarray, w: np.ndarray, dil, pads, out_sp,
                   epilogue: Callable[..., None] | None = None) -> np.ndarray:
    """Conv without bias, stride 1: (n, c, h, w) * (o, c, kh, kw) -> fresh (n, o, ho, wo) float32. `epilogue`
    as in threads.matmul, run on each finished block of the output viewed as (n, o, ho*wo)."""
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    ho, wo = out_sp
    top, left = pads[0], pads[1]
    hp, wp = h + pads[0] + pads[2], wd + pads[1] + pads[3]
    tail = (kw - 1) * dil[1]  # the last output row's shifted views run this far past the plane
    plane = hp * wp + tail
    span = ho * wp  # the output grid, Wp wide
    offsets = [ky * dil[0] * wp + kx * dil[1] for ky in range(kh) for kx in range(kw)]
    wk = np.ascontiguousarray(w.transpose(2, 3, 0, 1)).reshape(kh * kw, o, c)
    padded = np.zeros((n, c, plane), np.float32)
    padded[:, :, :hp * wp].reshape(n, c, hp, wp)[:, :, top:top + h, left:left + wd] = x
    y = np.empty((n, o, ho, wo), np.float32)
    y3 = y.reshape(n, o, ho * wo)
    # blocks of output rows (the GEMMs' long side): each is `rows` x Wp columns of every channel
    work = o * c * len(offsets) * span
    nthreads = threads.threads_for(n * work)
    scope = contextlib.nullcontext()
    if threads.blas_threads_instead(nthreads):  # the whole output's GEMMs, each on the BLAS's own threads
        scope, nthreads = threads.blas_threads(nthreads), 1
    edges = threads.chunk_edges(ho, nthreads, min_chunk=max(1, -(-64 // wp)))

    def chunk(i: int) -> None:
        y0, y1 = edges[i], edges[i + 1]
        cols = (y1 - y0) * wp
        grid = np.empty((o, cols), np.float32)
        for b in range(n):
            for j, off in enumerate(offsets):
                start = y0 * wp + off
                threads.gemm_into(wk[j], padded[b, :, start:start + cols], grid, beta=0.0 if j == 0 else 1.0)
            y[b, :, y0:y1] = grid.reshape(o, y1 - y0, wp)[:, :, :wo]
            if epilogue is not None:
                epilogue(y3, b, b + 1, 0, o, y0 * wo, y1 * wo)

    with scope:
        threads.run_chunks(len(edges) - 1, chunk)
    return y
