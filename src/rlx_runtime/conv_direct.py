"""Dense 2-D float32 convs (group 1, a kernel larger than 1x1) computed straight from the stride phases of the
padded input, without an im2col matrix (CPU, once numba is loaded).

The input's channels are split into stride phases once (conv_kernels.fill_phases, as the tap convs do), so
every (channel, kernel offset) pair reads a shifted contiguous view of them: for a 3x3 conv that is 9 views
per channel instead of an im2col matrix 9x the input's size written and read back. The output is computed on
the phases' grid (rows Wq wide, the last few columns of each row wasted and dropped) by simd.gather_f32: 8
output channels at a time, a register tile of them x grid columns (simd.FEW_ROWS_TILE: 8 x 32 on AVX-512, two
passes of 4 x 16 on AVX2), each view's vector feeding a multiply-add per channel, the view order
(channel, ky, kx) (conv_kernels.direct_rows). The epilogue of a FusedConv runs on each block while it is in cache.

Each output is its products added by fma in (channel, ky, kx) order from 0.0: the same bits on every CPU, and
at any thread count (threads split the output rows in bands, or the output channels in blocks of 8). Conv and
FusedConv take this path alike, so a fused conv still gives the unfused ops' values.
"""

from __future__ import annotations

import functools
from itertools import pairwise

import numpy as np

from . import threads

# grid columns per piece of the output that all 8-channel blocks compute in turn (the piece's input views then
# stay in L2 between the blocks)
PIECE_COLUMNS = 1024
# and at most this many bytes of input phases read by a piece (every channel's phases over the piece's rows and
# the kernel's extra rows): a stride-2 conv reads 4 phases a channel, so 1024 columns of ResNet-50's 128->128
# 3x3/2 conv at 56x56 spanned all 1.8 MB of its phases (34 GMAC/s at 1 thread), 7 rows of them 46 GMAC/s
PIECE_BYTES = 512 << 10
# split over threads by bands of output rows when each band gets at least this many rows, else by blocks of 8
# output channels. Measured at 2 threads (A/B per conv, Emerald Rapids), rows against channels: YOLO-like's and
# ResNet-50's convs with 28-160 output rows 0.81-0.94x the time; 256->256 3x3 at 14x14 1.13x
MIN_BAND_ROWS = 8
# an input element's share of the phase fill (a copy, every other element at stride 2), in GEMM multiply-adds (what
# threads_for's threshold counts): inputs of ~350 K elements and up fill their phases on every thread. Measured per
# conv at 2 threads (Rocket Lake), split against serial fill: YOLO-like's 16->32 3x3/2 at 320x320 0.84x the time,
# 32->64 at 160x160 0.91-0.96x, ResNet-50's 128->128 3x3/2 at 56x56 0.89-0.92x; 256 channels at 28x28 level, a
# 3-channel 224x224 stem 1.1x (its fill is ~50 us, the hand-off a good part of that)
FILL_COST = 6
# the largest inner dimension (channels x kernel) taken: a weight row of the 8-channel block is read for every
# 32-column vector, and the input views of a piece must fit in L2
MAX_INNER = 4608


@functools.cache
def _numba_side() -> tuple:
    """(conv_kernels, simd, aligned) (numba), imported on the first direct conv (an import statement per call cost
    ~1 us)."""
    from . import aligned, conv_kernels, simd
    return conv_kernels, simd, aligned


def use_direct(x: np.ndarray, w: np.ndarray, group: int, epilogue) -> bool:
    """A group-1 float32 2-D conv with a kernel larger than 1x1, `epilogue` None or a one-group
    conv_kernels.BiasActivation."""
    return (x.ndim == 4 and x.dtype == np.float32 and w.dtype == np.float32 and group == 1
            and w.shape[2] * w.shape[3] > 1 and w.shape[1] * w.shape[2] * w.shape[3] <= MAX_INNER
            and (epilogue is None or getattr(epilogue, "flags", (0,))[0] == 1))


def direct2d(x: np.ndarray, w: np.ndarray, strides, dil, pads, out_sp, epilogue=None) -> np.ndarray:
    """Conv without bias (n, c, h, w) * (o, c, kh, kw) -> fresh (n, o, oh, ow) float32, then `epilogue` (see
    use_direct) on each output block."""
    from .conv_taps import phase_layout, phase_offsets
    ck, simd, aligned = _numba_side()
    x = np.ascontiguousarray(x)
    n, c, h, wd = x.shape
    o, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    (sh, sw), (dh, dw) = strides, dil
    oh, ow = out_sp
    wq, hq, plane, stride = phase_layout(h, wd, pads, sh, sw, simd.LANES)
    phases = np.zeros((n, c, stride), np.float32)
    fill_threads = threads.threads_for(x.size * FILL_COST)
    if fill_threads == 1:
        ck.fill_phases(x, phases, sh, sw, pads[0], pads[1], hq, wq, 0, hq)
    else:  # the phase planes' rows in bands, one per thread (a stem's 3 channels do not split evenly)
        with threads.Steps(fill_threads, True) as steps:
            steps.keep += (x, phases)
            for q0, q1 in pairwise(threads.chunk_edges(hq, fill_threads, 1)):
                if steps.native:
                    k, ints, floats, r = steps.tables()
                    k.put_fill(ints, floats, r, x, phases, sh, sw, pads[0], pads[1], hq, wq, q0, q1)
                    steps.added()
                else:
                    steps.added(functools.partial(ck.fill_phases, x, phases, sh, sw, pads[0], pads[1], hq, wq, q0, q1))
                steps.end_chunk()
            steps.run()
    phases = phases.reshape(n, c * stride)
    offsets = phase_offsets(c, kh, kw, sh, sw, dh, dw, plane, wq, stride)
    wk = np.ascontiguousarray(w.reshape(o, -1))
    y = aligned.empty((n, o, oh, ow), oh * ow)
    row_bytes = 4 * c * sh * sw * wq  # a grid row's phase rows, every channel
    piece_rows = max(1, min(oh, PIECE_COLUMNS // wq, PIECE_BYTES // row_bytes - (kh - 1) * dh // sh))
    ep = threads.epilogue_fields(epilogue)
    nthreads = threads.threads_for(n * o * wk.shape[1] * oh * wq)
    # chunks: bands of output rows, each thread reading only its band's phases (by blocks of output channels each
    # thread streamed all of them: YOLO-like's 16->32 3x3/2 at 160x160 was slower at 2 threads than at 1), unless
    # the bands would be short
    if oh >= MIN_BAND_ROWS * nthreads:
        chunks = [(0, o, g0, g1) for g0, g1 in pairwise(threads.chunk_edges(oh, nthreads, MIN_BAND_ROWS))]
    else:
        chunks = [(r0, r1, 0, oh) for r0, r1 in pairwise(threads.block_edges(o, nthreads, simd.SKINNY_ROWS))]
    if len(chunks) == 1:  # one chunk: the calls themselves
        for b in range(n):
            ck.direct_rows(phases, wk, offsets, y, b, 0, o, 0, oh, wq, piece_rows, *ep)
        return y
    bias, has_bias, act, alpha, beta, has_lo, lo, has_hi, hi, res, has_res = ep
    with threads.Steps(n * len(chunks), True) as steps:
        steps.keep += (phases, wk, offsets, y, ep)  # the rows hold only their addresses
        for r0, r1, g0, g1 in chunks:
            for b in range(n):
                if steps.native:
                    k, ints, floats, r = steps.tables()
                    k.put_direct(ints, floats, r, phases, wk, offsets, y, b, r0, r1, g0, g1, wq, piece_rows, bias,
                                 has_bias, act, has_lo, has_hi, alpha, beta, lo, hi, res, has_res)
                    steps.added()
                else:
                    steps.added(functools.partial(ck.direct_rows, phases, wk, offsets, y, b, r0, r1, g0, g1, wq,
                                                  piece_rows, *ep))
            steps.end_chunk()
        steps.run()
    return y
