"""Dense 2-D float32 convs (group 1, a kernel larger than 1x1) computed straight from the stride phases of the
padded input, without an im2col matrix (CPU, once numba is loaded).

The input's channels are split into stride phases once (conv_kernels.fill_phases, as the tap convs do), so
every (channel, kernel offset) pair reads a shifted contiguous view of them: for a 3x3 conv that is 9 views
per channel instead of an im2col matrix 9x the input's size written and read back. The output is computed on
the phases' grid (rows Wq wide, the last few columns of each row wasted and dropped), the view order (channel, ky,
kx) (conv_kernels.direct_rows). On AVX-512 by simd.gather_f32: 8 output channels at a time, a register tile of 8
of them x 32 grid columns, each view's vector feeding a multiply-add per channel. Without AVX-512 by
simd.channels_f32 (CHANNEL_BLOCKS): 32 output channels in the vector lanes, a tile of 3 grid columns x 4 vectors,
each view's element broadcast to a multiply-add per vector of channels (conv_kernels.channel_rows). The epilogue
of a FusedConv runs on each block while it is in cache.

Each output is its products added by fma in (channel, ky, kx) order from 0.0: the same bits on every CPU, with
either kernel, and at any thread count (threads split the output rows in bands, or the output channels in blocks
of 8, or of 32 for the channel blocks). Conv and
FusedConv take this path alike, so a fused conv still gives the unfused ops' values.
"""

from __future__ import annotations

import functools
import math
import threading
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


# without AVX-512 the direct kernel computes blocks of 32 output channels in the vector lanes (simd.channels_f32:
# 3 grid columns x 4 vectors a tile), not gather_f32's 4 x 16 tile of channels x columns. Measured on Zen 3, 1 thread,
# YOLO-like's 192->64 3x3 at 40x40: 47 GMAC/s against ~30 (onnxruntime's NCHWc kernel 48); per conv 0.54-0.97x the
# time on YOLO-like's and ResNet-50's convs at 1 and 2 threads. Convs of fewer than 32 output channels keep gather_f32
# (a block of 16 filled half of every vector: 1.2-2x its time on 16->16 3x3 at 112x112, 24->24 at 56x56, 3->16 stems).
# The same bits either way. None: by the CPU and the conv (read when a DirectPlan is made; tests set True or False to
# take either kernel on any CPU and for any conv)
CHANNEL_BLOCKS: bool | None = None


@functools.cache
def _numba_side() -> tuple:
    """(conv_kernels, simd, aligned) (numba), imported on the first direct conv (an import statement per call cost
    ~1 us)."""
    from . import aligned, conv_kernels, simd
    return conv_kernels, simd, aligned


# without AVX-512, strided convs of fewer than CHANNEL_BLOCK output channels (gather_f32's tile: no channel blocks)
# from this inner dimension take im2col and the BLAS GEMM instead: on a stride's phases that tile (then two passes of
# 4 x 16 per block of 8 output channels) ran 1.2-2x OpenBLAS's Haswell GEMM (Zen 3, 1 / 2 threads: 32->64 3x3/2 at
# 80x80 0.75x / 0.86x, 64->128 at 40x40 0.70x / 0.73x, ResNet-50's 128->128 at 56x56 0.68x / 0.76x, 256->256 at 28x28
# 0.58x / 0.57x, 512->512 at 14x14 0.50x / 0.51x; the 3-channel stems 1.2-1.5x stay direct). Convs of CHANNEL_BLOCK
# outputs and more take the channel blocks at any stride: session 31 measured them against the GEMM per conv (Zen 3,
# the same five convs, two runs each, in one process) at 1 thread 0.76-1.11x the time (sums 0.93-0.97x), at 2
# threads 0.73-1.20x (sums 0.90-0.95x; the GEMM's im2col does not split: YOLO-like's 32->64 at 80x80 1.40 ms at 2
# threads, 1.39 at one), and YOLO-like's whole forward in alternating processes 1.27-1.30x onnxruntime's against
# 1.28-1.60x at 2 threads.
AVX2_STRIDED_GEMM_INNER = 288


def _channel_blocks(o: int) -> bool:
    """Whether a direct conv of `o` output channels takes the channel blocks (CHANNEL_BLOCKS)."""
    simd = _numba_side()[1]
    return not simd.AVX512 and o >= simd.CHANNEL_BLOCK if CHANNEL_BLOCKS is None else CHANNEL_BLOCKS


def use_direct(shape: tuple, dtype, w: np.ndarray, group: int, epilogue, strides=(1, 1)) -> bool:
    """A group-1 float32 2-D conv (inputs of `shape`) with a kernel larger than 1x1, `epilogue` None or a one-group
    conv_kernels.BiasActivation; without AVX-512, not a strided one of AVX2_STRIDED_GEMM_INNER inputs or more
    unless it takes the channel blocks (numba loaded: the caller checks)."""
    inner = w.shape[1] * w.shape[2] * w.shape[3] if w.ndim == 4 else 0
    return (len(shape) == 4 and dtype == np.float32 and w.dtype == np.float32 and group == 1
            and w.shape[2] * w.shape[3] > 1 and inner <= MAX_INNER
            and (epilogue is None or getattr(epilogue, "flags", (0,))[0] == 1)
            and (all(s == 1 for s in strides) or inner < AVX2_STRIDED_GEMM_INNER or _numba_side()[1].AVX512
                 or _channel_blocks(w.shape[0])))


class DirectPlan:
    """What direct2d derives from a conv's geometry and weights alone (the stride-phase layout, each (channel,
    kernel offset) view's offset, the weight matrix, the piece height), for run_direct: built once per plan step
    by a bound kernel (kernels/nn.py), per call by direct2d."""

    __slots__ = ("shape", "out_shape", "wq", "hq", "stride", "offsets", "wk", "packed", "piece_rows", "fill")

    def __init__(self, x_shape: tuple, w: np.ndarray, strides, dil, pads, out_sp):
        from .conv_taps import phase_layout, phase_offsets
        simd = _numba_side()[1]
        n, c, h, wd = x_shape
        o, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        (sh, sw), (dh, dw) = strides, dil
        oh, ow = out_sp
        self.shape, self.out_shape = tuple(x_shape), (n, o, oh, ow)
        self.wq, self.hq, plane, self.stride = phase_layout(h, wd, pads, sh, sw, simd.LANES)
        self.offsets = phase_offsets(c, kh, kw, sh, sw, dh, dw, plane, self.wq, self.stride)
        self.wk = np.ascontiguousarray(w.reshape(o, -1))
        self.packed = _channel_blocks(o)
        if self.packed:
            self.wk = _numba_side()[0].pack_channel_blocks(self.wk)
        row_bytes = 4 * c * sh * sw * self.wq  # a grid row's phase rows, every channel
        self.piece_rows = max(1, min(oh, PIECE_COLUMNS // self.wq, PIECE_BYTES // row_bytes - (kh - 1) * dh // sh))
        self.fill = (sh, sw, pads[0], pads[1], self.hq, self.wq)

    def fill_threads(self) -> int:
        """Threads the phase fill splits over (threads_for its share of the work)."""
        return threads.threads_for(math.prod(self.shape) * FILL_COST)

    def chunks(self) -> list[tuple[int, int, int, int]]:
        """(first, last + 1 output channel, first, last + 1 output row) per chunk at the forward's thread count:
        bands of output rows, each thread reading only its band's phases (by blocks of output channels each
        thread streamed all of them: YOLO-like's 16->32 3x3/2 at 160x160 was slower at 2 threads than at 1),
        unless the bands would be short."""
        n, o, oh = self.out_shape[:3]
        nthreads = threads.threads_for(n * o * len(self.offsets) * oh * self.wq)
        if oh >= MIN_BAND_ROWS * nthreads:
            return [(0, o, g0, g1) for g0, g1 in pairwise(threads.chunk_edges(oh, nthreads, MIN_BAND_ROWS))]
        simd = _numba_side()[1]
        if not self.packed:
            return [(r0, r1, 0, oh) for r0, r1 in pairwise(threads.block_edges(o, nthreads, simd.SKINNY_ROWS))]
        blocks = -(-o // simd.CHANNEL_BLOCK)  # whole blocks of channel_rows, at least one a chunk
        edges = [min(o, simd.CHANNEL_BLOCK * e) for e in threads.chunk_edges(blocks, nthreads, 1)]
        return [(r0, r1, 0, oh) for r0, r1 in pairwise(edges)]


def direct2d(x: np.ndarray, w: np.ndarray, strides, dil, pads, out_sp, epilogue=None) -> np.ndarray:
    """Conv without bias (n, c, h, w) * (o, c, kh, kw) -> fresh (n, o, oh, ow) float32, then `epilogue` (see
    use_direct) on each output block."""
    return run_direct(DirectPlan(x.shape, w, strides, dil, pads, out_sp), x, epilogue)


def run_direct(dp: DirectPlan, x: np.ndarray, epilogue=None) -> np.ndarray:
    """direct2d of x (of dp's input shape) by dp's conv."""
    ck, _, aligned = _numba_side()
    x = np.ascontiguousarray(x)
    n, c = dp.shape[:2]
    phases = np.zeros((n, c, dp.stride), np.float32)
    fill_threads = dp.fill_threads()
    if fill_threads == 1:
        ck.fill_phases(x, phases, *dp.fill, 0, dp.hq)
    else:  # the phase planes' rows in bands, one per thread (a stem's 3 channels do not split evenly)
        with threads.Steps(fill_threads, True) as steps:
            write_fill(steps, dp, x, phases, fill_threads)
            steps.run()
    phases = phases.reshape(n, c * dp.stride)
    y = aligned.empty(dp.out_shape, dp.out_shape[2] * dp.out_shape[3])
    chunks = dp.chunks()
    if len(chunks) == 1:  # one chunk: the calls themselves
        ep = threads.epilogue_fields(epilogue)
        for b in range(n):
            ck.direct_rows(phases, dp.wk, dp.offsets, y, b, 0, dp.out_shape[1], 0, dp.out_shape[2], dp.wq,
                           dp.piece_rows, *ep)
        return y
    with threads.Steps(n * len(chunks), True) as steps:
        write_direct(steps, dp, phases, y, epilogue, chunks)
        steps.run()
    return y


def write_fill(steps: threads.Steps, dp: DirectPlan, x: np.ndarray, phases: np.ndarray, fill_threads: int) -> None:
    """The phase fill of x into phases (n, c, stride) as steps of `steps`: a band of phase rows per chunk."""
    ck = _numba_side()[0]
    steps.keep += (x, phases)
    for q0, q1 in pairwise(threads.chunk_edges(dp.hq, fill_threads, 1)):
        if steps.native:
            k, ints, floats, r = steps.tables()
            k.put_fill(ints, floats, r, x, phases, *dp.fill, q0, q1)
            steps.added()
        else:
            steps.added(functools.partial(ck.fill_phases, x, phases, *dp.fill, q0, q1))
        steps.end_chunk()


def write_direct(steps: threads.Steps, dp: DirectPlan, phases: np.ndarray, y: np.ndarray, epilogue,
                 chunks: list[tuple[int, int, int, int]]) -> None:
    """The direct rows of every image as steps of `steps`, a chunk per DirectPlan.chunks entry."""
    ck = _numba_side()[0]
    ep = threads.epilogue_fields(epilogue)
    bias, has_bias, act, alpha, beta, has_lo, lo, has_hi, hi, res, has_res = ep
    steps.keep += (phases, dp.wk, dp.offsets, y, ep)  # the rows hold only their addresses
    for r0, r1, g0, g1 in chunks:
        for b in range(dp.shape[0]):
            if steps.native:
                k, ints, floats, r = steps.tables()
                k.put_direct(ints, floats, r, phases, dp.wk, dp.offsets, y, b, r0, r1, g0, g1, dp.wq, dp.piece_rows,
                             bias, has_bias, act, has_lo, has_hi, alpha, beta, lo, hi, res, has_res)
                steps.added()
            else:
                steps.added(functools.partial(ck.direct_rows, phases, dp.wk, dp.offsets, y, b, r0, r1, g0, g1, dp.wq,
                                              dp.piece_rows, *ep))
        steps.end_chunk()


class PreparedDirect:
    """run_direct of a DirectPlan's conv as two threads.Prepared jobs (the phase fill, then the direct rows) that
    share a phase scratch of their own (its padding stays zero: every call writes the same elements); run with
    (x, y) or, with a residual, (x, y, residual) like a Prepared job."""

    def __init__(self, dp: DirectPlan, epilogue, residual: bool):
        n, c = dp.shape[:2]
        self.phases = np.zeros((n, c, dp.stride), np.float32)
        flat = self.phases.reshape(n, c * dp.stride)
        fill_threads = dp.fill_threads()
        chunks = dp.chunks()
        self.fill = threads.Prepared(fill_threads, lambda steps, a: write_fill(steps, dp, a[0], self.phases,
                                                                               fill_threads), (dp.shape,))

        def direct(steps, arrays):
            ep = epilogue.with_residual(arrays[1]) if residual else epilogue
            write_direct(steps, dp, flat, arrays[0], ep, chunks)

        self.direct = threads.Prepared(n * len(chunks), direct, (dp.out_shape,) * (1 + residual))
        self._using = threading.Lock()

    def run(self, x: np.ndarray, *out: np.ndarray) -> bool:
        if not self._using.acquire(blocking=False):
            return False
        try:
            return self.fill.run(x) and self.direct.run(*out)
        finally:
            self._using.release()
