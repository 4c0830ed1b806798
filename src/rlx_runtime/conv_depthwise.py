"""Depthwise 2-D convs on the CPU (group == input channels == output channels): a numba kernel over stride
phases of the padded input (conv_kernels.depthwise_planes), instead of im2col and one 1-row GEMM per channel.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def use_depthwise(x: np.ndarray, w: np.ndarray, group: int) -> bool:
    return (x.ndim == 4 and x.dtype == np.float32 and w.dtype == np.float32 and group > 1
            and group == x.shape[1] == w.shape[0] and w.shape[1] == 1)


def depthwise2d(x: np.ndarray, w: np.ndarray, strides, dil, pads, out_sp,
                epilogue: Callable[..., None] | None = None) -> np.ndarray:
    """Conv without bias: (n, c, h, w) * (c, 1, kh, kw), group c -> fresh (n, c, oh, ow) float32. `epilogue` as
    in threads.matmul, on each finished block of channels of the output viewed as (n*c, 1, oh*ow)."""
    from .conv_kernels import depthwise_planes
    from .simd import LANES
    from .threads import chunk_edges, run_chunks, threads_for

    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    (sh, sw), (dh, dw) = strides, dil
    oh, ow = out_sp
    hp, wp = h + pads[0] + pads[2], wd + pads[1] + pads[3]
    # phase planes hold every padded row and column (so no kept output column wraps into the next row: ow - 1 +
    # (kw-1)*dw // sw < ceil(wp / sw)), plus one spare row for the last grid row's reads past the kept columns
    wq = -(-wp // sw)
    hq = -(-hp // sh) + 1
    # the grid rounded up to whole 32-lane vectors (no scalar tail: a 7x7 plane has 77 outputs), and as much
    # slack after each channel's phases for those extra reads
    size = -(-(oh * wq) // LANES) * LANES
    plane = hq * wq
    phases = np.zeros((n, c, sh * sw * plane + LANES), np.float32)
    planes = phases[:, :, :sh * sw * plane].reshape(n, c, sh, sw, hq, wq)
    for p in range(sh):
        for q in range(sw):
            # padded row i = p + sh*r is input row i - top; phase rows r where that lies in [0, h)
            ra, ca = max(0, -(-(pads[0] - p) // sh)), max(0, -(-(pads[1] - q) // sw))
            rb, cb = min(hq, -(-(h + pads[0] - p) // sh)), min(wq, -(-(wd + pads[1] - q) // sw))
            if rb > ra and cb > ca:
                planes[:, :, p, q, ra:rb, ca:cb] = x[:, :, p + sh * ra - pads[0]:p + sh * (rb - 1) - pads[0] + 1:sh,
                                                     q + sw * ca - pads[1]:q + sw * (cb - 1) - pads[1] + 1:sw]
    taps = np.ascontiguousarray(w.reshape(c, kh * kw))
    offsets = np.array([((ky * dh % sh) * sw + kx * dw % sw) * plane + (ky * dh // sh) * wq + kx * dw // sw
                        for ky in range(kh) for kx in range(kw)], np.int64)
    y = np.empty((n, c, oh, ow), np.float32)
    y3 = y.reshape(n * c, 1, oh * ow)
    work = c * kh * kw * oh * wq
    edges = chunk_edges(c, threads_for(n * work), work, min_chunk=8)

    def chunk(i: int) -> None:
        grid = np.empty(size, np.float32)
        for b in range(n):
            depthwise_planes(phases, taps, offsets, y, b, edges[i], edges[i + 1], grid, wq)
            if epilogue is not None:
                epilogue(y3, b * c + edges[i], b * c + edges[i + 1], 0, 1, 0, oh * ow)

    run_chunks(len(edges) - 1, chunk)
    return y
