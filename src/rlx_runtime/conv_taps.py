"""Depthwise 2-D convs (group == input channels == outputs), their taps summed straight from stride phases of the
padded input by a numba kernel (conv_kernels.tap_planes) instead of im2col + GEMM (one 1-row GEMM per channel).

Dense convs with few weights (an RGB stem's 3->16 3x3) took this kernel too until it measured slower than the
direct path (conv_direct.py) in whole forwards (A/B in one process, Rocket Lake, 1 / 2 threads: MobileNetV3-small
0.97 / 0.98x the time, the YOLO-like detector 0.97 / 0.95x with the stem direct).
"""

from __future__ import annotations

import functools
from functools import partial

import numpy as np

from . import threads

# a tap's multiply-add with its share of the phase fill and the row copies, in GEMM multiply-adds (what
# threads_for's threshold counts): a 88-channel 3x3 depthwise conv at 28x28 (0.6 M taps) took 48 us at 1 thread,
# a GEMM of 2 M multiply-adds ~20 us. Counted as GEMM work, convs of 40-100 us never split; split, MobileNetV3's
# took 0.65-0.85x as long at 2 threads (measured one by one, 1 worker polling)
TAP_COST = 8


def use_depthwise(shape: tuple, dtype, w: np.ndarray, group: int) -> bool:
    """A float32 2-D depthwise conv (inputs of `shape`): one input channel per group and output channel."""
    return (len(shape) == 4 and dtype == np.float32 and w.dtype == np.float32 and group > 1
            and group == shape[1] == w.shape[0] and w.shape[1] == 1)


# AVX2 (8-channel blocks): 3x3 stride-1 convs to output rows at least this wide keep the phase kernel. Measured
# per conv at 1 thread (Zen 3, hot), blocked against phases: 3x3/1 at 56x56 1.12x (144 channels), at 112x112 1.07x
# (32), at 28x28 0.92x (88), at 14x14 0.74x (480), at 7x7 0.58x (1152); 3x3/2 from 112x112 0.79x (96 channels),
# 0.96x (16), from 56x56 0.82x (72), from 28x28 0.49x (240); 5x5 0.59-0.67x at stride 1 (7x7 to 28x28 planes),
# 0.40-0.65x at stride 2
AVX2_PHASE_ROWS = 56


def use_blocked(w_shape: tuple, out_sp, strides) -> bool:
    """Whether a depthwise conv (use_depthwise) takes the channel-blocked kernel (BlockPlan) rather than the
    stride-phase one (TapPlan). On AVX-512 (16-channel blocks), unless it has at most 9 taps and output rows of
    conv_kernels.MIN_ROW_WIDTH or more (the phase kernel computes those rows straight into the output; the blocked
    one's two transposes per element, four input pixels per output at stride 2, cost as much as 9 taps there).
    Measured per conv at 1 thread (Rocket Lake), blocked against phases: 5x5 0.39-0.85x (stride 2 and 7x7 / 14x14
    planes least), 3x3 on 14x14 0.86x, 3x3/2 to 14x14 0.62x; 3x3/1 at 28x28-112x112 1.07-1.16x, 3x3/2 from 112x112
    with 16 channels 1.11x, from 56x56 with 72 1.07x (with 96 from 112x112, 4.8 MB, 0.77x). Whole forwards with
    3x3/2 convs to rows of 28 and more on the phase kernel: MobileNetV3-small 0.98x / 0.98-0.99x at 1 / 2 threads,
    YOLO-like 0.99x, EfficientNet-B0 level. On AVX2 (8-channel blocks; its phase kernel always works on the grid
    and copies rows out), unless it has at most 9 taps, stride 1 and output rows of AVX2_PHASE_ROWS or more. Both
    kernels give the same bits."""
    from .conv_kernels import MIN_ROW_WIDTH
    from .simd import AVX512
    few_taps = w_shape[2] * w_shape[3] <= 9
    if AVX512:
        return not (few_taps and out_sp[1] >= MIN_ROW_WIDTH)
    return not (few_taps and tuple(strides) == (1, 1) and out_sp[1] >= AVX2_PHASE_ROWS)


@functools.cache
def _numba_side() -> tuple:
    """(conv_kernels, simd.LANES, aligned): numba's side, imported on the first tap conv (an import statement per
    call cost ~1 us)."""
    from . import aligned, conv_kernels, simd
    return conv_kernels, simd.LANES, aligned


def phase_layout(h: int, w: int, pads, sh: int, sw: int, lanes: int) -> tuple[int, int, int, int]:
    """(wq, hq, plane, stride) of an (h, w) input's stride phases: each phase plane holds every padded row and
    column (so no kept output column wraps into the next row: ow - 1 + (kw-1)*dw // sw < ceil(wp / sw)), plus one
    spare row for the last grid row's reads past the kept columns; a channel's phases take `stride` floats, with
    `lanes` of slack for the grid's last vector."""
    wq = -(-(w + pads[1] + pads[3]) // sw)
    hq = -(-(h + pads[0] + pads[2]) // sh) + 1
    plane = hq * wq
    return wq, hq, plane, sh * sw * plane + lanes


@functools.lru_cache(maxsize=256)
def phase_offsets(channels: int, kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, plane: int, wq: int,
                  stride: int) -> np.ndarray:
    """Where each tap reads, relative to an output's grid position: per channel read (a dense conv's output sums
    over every input channel, then its taps: (c, ky, kx) order), the tap's phase plane, row and column offset."""
    kernel = [((ky * dh % sh) * sw + kx * dw % sw) * plane + (ky * dh // sh) * wq + kx * dw // sw
              for ky in range(kh) for kx in range(kw)]
    found = np.array([ci * stride + k for ci in range(channels) for k in kernel], np.int64)
    found.flags.writeable = False
    return found


class TapPlan:
    """What taps2d derives from a conv's geometry and weights alone (its stride-phase layout, tap offsets and
    weight rows, its work), for run_taps: built once per plan step by a bound kernel (kernels/nn.py), per call by
    taps2d."""

    __slots__ = ("shape", "out_shape", "wq", "stride", "size", "offsets", "taps", "fill", "work")

    def __init__(self, x_shape: tuple, w: np.ndarray, strides, dil, pads, out_sp):
        lanes = _numba_side()[1]
        n, c, h, wd = x_shape
        kh, kw = w.shape[2], w.shape[3]
        (sh, sw), (dh, dw) = strides, dil
        oh, ow = out_sp
        self.shape, self.out_shape = tuple(x_shape), (n, c, oh, ow)
        self.wq, hq, plane, self.stride = phase_layout(h, wd, pads, sh, sw, lanes)
        # the grid rounded up to whole 32-lane vectors (no scalar tail: a 7x7 plane has 77 outputs; the phases'
        # slack covers those extra reads)
        self.size = -(-(oh * self.wq) // lanes) * lanes
        self.offsets = phase_offsets(1, kh, kw, sh, sw, dh, dw, plane, self.wq, self.stride)
        self.taps = np.ascontiguousarray(w.reshape(c, -1))
        self.fill = (sh, sw, pads[0], pads[1], hq)
        self.work = c * len(self.offsets) * oh * self.wq * TAP_COST


def taps2d(x: np.ndarray, w: np.ndarray, strides, dil, pads, out_sp, epilogue=None) -> np.ndarray:
    """Depthwise conv without bias ((n, c, h, w) * (c, 1, kh, kw), group c) -> fresh (n, c, oh, ow) float32.
    `epilogue`, a conv_kernels.BiasActivation, is applied to each output channel by the kernel as soon as that
    channel is done."""
    return run_taps(TapPlan(x.shape, w, strides, dil, pads, out_sp), x, epilogue)


def run_taps(tp: TapPlan, x: np.ndarray, epilogue=None) -> np.ndarray:
    """taps2d of x (of tp's input shape) by tp's conv."""
    ck, _, aligned = _numba_side()
    x = np.ascontiguousarray(x)  # the kernels read it as one flat (N, C, H, W) buffer
    n, c, oh, ow = tp.out_shape
    y = aligned.empty(tp.out_shape, oh * ow)
    edges = threads.chunk_edges(c, threads.threads_for(n * tp.work), min_chunk=8)
    ep = threads.epilogue_fields(epilogue)

    if len(edges) == 2:  # one chunk: the same calls in the same order, on this thread, without a job around them
        grid, phases = np.empty(tp.size, np.float32), np.zeros(tp.stride, np.float32)
        for b in range(n):
            ck.tap_planes(x, phases, tp.taps, tp.offsets, y, b, 0, c, grid, tp.wq, *tp.fill, *ep)
        return y
    with threads.Steps(n * (len(edges) - 1), True) as steps:
        write_taps(steps, tp, x, y, epilogue, edges)
        steps.run()
    return y


def write_taps(steps: threads.Steps, tp: TapPlan, x: np.ndarray, y: np.ndarray, epilogue, edges: list[int]) -> None:
    """run_taps' job as steps and chunks of `steps`: a chunk per run of channels edges[i]..edges[i + 1], each
    with its own scratch (its grid and its channel's phases), every image's planes of those channels."""
    ck = _numba_side()[0]
    n = x.shape[0]
    ep = threads.epilogue_fields(epilogue)
    bias, has_bias, act, alpha, beta, has_lo, lo, has_hi, hi, res, has_res = ep
    steps.keep += (x, tp.taps, tp.offsets, y, ep)  # the rows hold only their addresses
    for c0, c1 in zip(edges, edges[1:]):
        grid, phases = np.empty(tp.size, np.float32), np.zeros(tp.stride, np.float32)
        steps.keep += (grid, phases)
        for b in range(n):
            if steps.native:
                k, ints, floats, r = steps.tables()
                k.put_taps(ints, floats, r, x, phases, tp.taps, tp.offsets, y, b, c0, c1, grid, tp.wq, *tp.fill,
                           bias, has_bias, act, has_lo, has_hi, alpha, beta, lo, hi, res, has_res)
                steps.added()
            else:
                steps.added(partial(ck.tap_planes, x, phases, tp.taps, tp.offsets, y, b, c0, c1, grid, tp.wq,
                                    *tp.fill, *ep))
        steps.end_chunk()


def prepare_taps(tp: TapPlan, epilogue, residual: bool) -> threads.Prepared:
    """run_taps of tp's conv as a threads.Prepared job run with (x, y) or, with `residual`, (x, y, residual):
    split by channels as run_taps splits, `epilogue` (its residual this call's) on each run of channels."""
    n, c = tp.shape[:2]
    edges = threads.chunk_edges(c, threads.threads_for(n * tp.work), min_chunk=8)

    return threads.prepared_conv(n * (len(edges) - 1), lambda steps, x, y, ep: write_taps(steps, tp, x, y, ep, edges),
                                 epilogue, residual, tp.shape, tp.out_shape)


# bytes of a channel-blocked conv's input buffer per band of output rows (the band's input rows, BLOCK channels
# each): a band's rows stay in L2 between their transpose, their taps and the next band's overlap
BAND_BYTES = 256 << 10


class BlockPlan:
    """What run_blocked derives from a depthwise conv's geometry and weights alone (conv_kernels.dw_blocks): the
    weights as (blocks, taps x BLOCK) vectors, the tap offsets in the padded (row, column, BLOCK) buffer, the band
    of output rows per pass and the scratch sizes."""

    __slots__ = ("shape", "out_shape", "blocks", "taps", "offsets", "where", "geometry", "buf_size", "rows_size",
                 "work")

    def __init__(self, x_shape: tuple, w: np.ndarray, strides, dil, pads, out_sp):
        from .simd import BLOCK
        n, c, h, wd = x_shape
        kh, kw = w.shape[2], w.shape[3]
        (sh, sw), (dh, dw) = strides, dil
        oh, ow = out_sp
        self.shape, self.out_shape = tuple(x_shape), (n, c, oh, ow)
        self.blocks = -(-c // BLOCK)
        padded = np.zeros((self.blocks * BLOCK, kh * kw), np.float32)
        padded[:c] = w.reshape(c, -1)
        # on a cache line: each tap's BLOCK weights are a whole vector, loaded once per tap and band
        self.taps = _numba_side()[2].array(padded.reshape(self.blocks, BLOCK, -1).transpose(0, 2, 1)).reshape(
            self.blocks, -1)
        wp = wd + pads[1] + pads[3]
        reach = (kh - 1) * dh + 1
        self.offsets = np.array([(ky * dh * wp + kx * dw) * BLOCK for ky in range(kh) for kx in range(kw)], np.int64)
        rows, cols = np.divmod(np.arange(h * wd, dtype=np.int64), wd)
        self.where = (rows * wp + pads[1] + cols) * BLOCK
        row_bytes = wp * BLOCK * 4
        band = max(1, min(oh, (BAND_BYTES // row_bytes - reach) // sh + 1))  # output rows per pass
        self.geometry = (sh, sw, pads[0], wp, reach, band)
        self.buf_size = ((band - 1) * sh + reach) * wp * BLOCK
        self.rows_size = band * ow * BLOCK
        self.work = c * kh * kw * oh * ow * TAP_COST

    def scratch(self) -> tuple[np.ndarray, np.ndarray]:
        """(buf, out_rows) for a dw_blocks call: on cache lines (every vector a whole line: a vector across two
        lines costs two loads, and the taps run at the loads' pace), buf zeroed (its padding stays zero)."""
        aligned = _numba_side()[2]
        line = aligned.LINE // 4  # floats: a start on a cache line keeps every BLOCK-float vector inside one
        buf = aligned.empty((self.buf_size,), line)
        buf[:] = 0.0
        return buf, aligned.empty((self.rows_size,), line)

    def edges(self, nthreads: int) -> tuple[list[int], list[int]]:
        """(block edges, output row edges) of the chunks for `nthreads`: by blocks while there are at least two
        per thread, else by output rows."""
        oh = self.out_shape[2]
        if nthreads <= 1:
            return [0, self.blocks], [0, oh]
        if self.blocks >= 2 * nthreads:
            return threads.chunk_edges(self.blocks, nthreads, min_chunk=1), [0, oh]
        return [0, self.blocks], threads.chunk_edges(oh, nthreads, min_chunk=1)


def run_blocked(bp: BlockPlan, x: np.ndarray, epilogue=None) -> np.ndarray:
    """taps2d of x (of bp's input shape) by bp's conv, channel-blocked (conv_kernels.dw_blocks)."""
    ck, _, aligned = _numba_side()
    x = np.ascontiguousarray(x)
    n, c, oh, ow = bp.out_shape
    y = aligned.empty(bp.out_shape, oh * ow)
    kedges, gedges = bp.edges(threads.threads_for(n * bp.work))
    ep = threads.epilogue_fields(epilogue)
    if len(kedges) == 2 and len(gedges) == 2:
        buf, rows = bp.scratch()
        for b in range(n):
            ck.dw_blocks(x, bp.taps, bp.offsets, bp.where, y, b, 0, bp.blocks, 0, oh, buf, rows, *bp.geometry, *ep)
        return y
    with threads.Steps(n * (len(kedges) - 1) * (len(gedges) - 1), True) as steps:
        write_blocked(steps, bp, x, y, epilogue, kedges, gedges)
        steps.run()
    return y


def write_blocked(steps: threads.Steps, bp: BlockPlan, x: np.ndarray, y: np.ndarray, epilogue, kedges: list[int],
                  gedges: list[int]) -> None:
    """run_blocked's job as steps and chunks of `steps`: a chunk per run of blocks and of output rows, each with
    its own scratch, every image's planes there."""
    ck = _numba_side()[0]
    n = x.shape[0]
    ep = threads.epilogue_fields(epilogue)
    steps.keep += (x, bp.taps, bp.offsets, bp.where, y, ep)  # the rows hold only their addresses
    for k0, k1 in zip(kedges, kedges[1:]):
        for g0, g1 in zip(gedges, gedges[1:]):
            buf, rows = bp.scratch()
            steps.keep += (buf, rows)
            for b in range(n):
                if steps.native:
                    k, ints, floats, r = steps.tables()
                    k.put_blocked(ints, floats, r, x, bp.taps, bp.offsets, bp.where, y, b, k0, k1, g0, g1, buf, rows,
                                  *bp.geometry, *ep)
                    steps.added()
                else:
                    steps.added(partial(ck.dw_blocks, x, bp.taps, bp.offsets, bp.where, y, b, k0, k1, g0, g1, buf,
                                        rows, *bp.geometry, *ep))
            steps.end_chunk()


def prepare_blocked(bp: BlockPlan, epilogue, residual: bool) -> threads.Prepared:
    """run_blocked of bp's conv as a threads.Prepared job run with (x, y) or, with `residual`, (x, y, residual):
    split as run_blocked splits, `epilogue` (its residual this call's) on each chunk."""
    n = bp.shape[0]
    kedges, gedges = bp.edges(threads.threads_for(n * bp.work))

    chunks = (len(kedges) - 1) * (len(gedges) - 1)
    return threads.prepared_conv(n * chunks, lambda steps, x, y, ep: write_blocked(steps, bp, x, y, ep, kedges, gedges),
                                 epilogue, residual, bp.shape, bp.out_shape)
