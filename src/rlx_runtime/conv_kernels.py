"""numba epilogue of the CPU FusedConv: bias and activation applied to the GEMM's result in one pass.

Each (image, channel) row of the GEMM output gets its bias added and its activation applied while it is
still in cache, instead of one whole-tensor pass for the bias and another for the activation. The float32
steps are those of the unfused ops (Conv's `y += b`, then the activation's own CPU kernel: Sigmoid and
Silu run simd.sigmoid_f32 on the row, as the ops do), so the results are bitwise the unfused ones.
"""

from __future__ import annotations

import numpy as np

from rlx_format.numba_setup import numba

from . import aligned
from .simd import (AVX512, BLOCK, CHANNEL_BLOCK, LANES, SKINNY_ROWS, channels_f32, copy_f32, gather_f32, max_fold_f32,
                   sigmoid_f32, skinny_f32,
                   sum_f32, tap_rows_f32, taps_block_f32, transpose_block_f32, transpose_block_to_f32)

# Identity: the bias alone (a plain Conv's, added on blocks in cache instead of a pass over the whole output)
ACTIVATION_CODES = {"Relu": 0, "Sigmoid": 1, "Silu": 2, "LeakyRelu": 3, "Clip": 4, "HardSwish": 5, "Identity": 6}


# error_model="numpy" as in ufuncs.py: no exception branch, so the row loops vectorize. nogil: blocks of one
# conv run on several threads at once (threads.matmul)
@numba.njit(cache=True, error_model="numpy", nogil=True)
def bias_act_block(y, b0, b1, r0, r1, c0, c1, groups, bias, has_bias, act, alpha, beta, has_lo, lo, has_hi,
                   hi, res, has_res):  # pragma: no cover - compiled
    """y: the whole (B, M, N) float32 GEMM output (C-contiguous), changed in place in [b0, b1) x [r0, r1) x
    [c0, c1); row r of matrix b is channel (b % groups) * M + r; bias: (channels,); res: y's residual, flat."""
    bias_act_rows(y.reshape(-1), y.shape[1], y.shape[2], b0, b1, r0, r1, c0, c1, groups, bias, has_bias, act, alpha,
                  beta, has_lo, lo, has_hi, hi, res, has_res)


# bias_act_rows's constant arguments as numpy scalars: numba compiles a callee once per pattern of literal constants
# it is called with (0, 1, 8, True), and the five patterns of its callers cost ~4 s each of a first run on an empty
# kernel cache; typed as plain int64 and bool they share one compiled version.
ZERO, ONE, _SKINNY_ROWS = np.int64(0), np.int64(1), np.int64(SKINNY_ROWS)
TRUE, FALSE = np.bool_(True), np.bool_(False)


@numba.njit(cache=True, error_model="numpy", nogil=True)
def bias_act_rows(flat, m, n, b0, b1, r0, r1, c0, c1, groups, bias, has_bias, act, alpha, beta, has_lo, lo, has_hi,
                  hi, res, has_res):  # pragma: no cover - compiled
    """bias_act_block on the (B, m, n) output given flat (res, with has_res: the residual, indexed as flat).
    Without a residual each row takes its bias as it is loaded for the activation, one pass (a bias pass, then
    an activation pass over a 16->72 conv's 8x2048 blocks took 26 us more of 138 at 56x56); with one, the bias
    and the residual are added in a pass per row, then the activation runs on runs of whole rows (a 7x7 conv's
    49-element rows: the loop set-up per row was most of the cost)."""
    if has_bias and not has_res:
        for bi in range(b0, b1):
            channels = bias[(bi % groups) * m:]  # one modulo per matrix, not per row (~1.5 us of 576 rows of 49)
            for r in range(r0, r1):
                activate(flat, (bi * m + r) * n + c0, c1 - c0, channels[r], act, alpha, beta, has_lo, lo, has_hi, hi)
        return
    if has_res:
        for bi in range(b0, b1):
            channels = bias[(bi % groups) * m:] if has_bias else bias
            for r in range(r0, r1):
                at = (bi * m + r) * n
                bv = channels[r] if has_bias else np.float32(-0.0)  # x + -0.0 is x
                row = flat[at + c0:at + c1]
                added = res[at + c0:at + c1]
                for i in range(c1 - c0):  # (y + b) + r, each sum rounded: Conv's, then the residual Add's
                    row[i] = (row[i] + bv) + added[i]
    if act == 6:  # Identity: nothing left to do
        return
    none = np.float32(-0.0)
    if c0 == 0 and c1 == n and r0 == 0 and r1 == m:  # whole matrices (a depthwise conv's are single rows)
        activate(flat, b0 * m * n, (b1 - b0) * m * n, none, act, alpha, beta, has_lo, lo, has_hi, hi)
        return
    for bi in range(b0, b1):
        if c0 == 0 and c1 == n:
            activate(flat, (bi * m + r0) * n, (r1 - r0) * n, none, act, alpha, beta, has_lo, lo, has_hi, hi)
        else:
            for r in range(r0, r1):
                activate(flat, (bi * m + r) * n + c0, c1 - c0, none, act, alpha, beta, has_lo, lo, has_hi, hi)


@numba.njit(cache=True, error_model="numpy", nogil=True, inline="always")
def activate(flat, start, count, bv, act, alpha, beta, has_lo, lo, has_hi, hi):  # pragma: no cover
    """v = flat[i] + bv (one rounding; -0.0 for no bias: x + -0.0 is x for every x), then the activation
    (ACTIVATION_CODES), in place on flat[start:start + count]."""
    if act == 1 or act == 2:
        sigmoid_f32(flat, start, flat, start, count, bv, act == 2)
        return
    run = flat[start:start + count]
    if act == 6:  # Identity: the bias alone
        for i in range(count):
            run[i] = run[i] + bv
        return
    # np.maximum(v, b) is v if v > b or v is NaN, else b (a tie gives b: -0.0 against 0.0 gives 0.0), and
    # np.minimum(v, b) v if v < b or v is NaN, else b: spelled out so below, as single selects (a short-circuit
    # `or` left branches in the loop: 20-30% slower)
    # Relu and LeakyRelu store a computed value on both sides (v + 0.0 is v where v > 0 or NaN, v * 1.0 is v): with
    # no bias LLVM folds v = run[i] + -0.0 to the load, and a side that stored the loaded value back made every
    # vector store a masked one (simd._nan_or; vmaskmovps on AVX2: 6.5x slower on Zen 3, a residual conv's Relu over
    # 256x56x56 outputs 400 us more than with a bias)
    if act == 0:  # Relu: np.maximum(v, 0); v <= 0 is false for NaN
        for i in range(count):
            v = run[i] + bv
            run[i] = np.float32(0.0) if v <= 0 else v + np.float32(0.0)
    elif act == 3:  # LeakyRelu: where(v >= 0, v, v * alpha); NaN takes the second branch and stays NaN
        for i in range(count):
            v = run[i] + bv
            run[i] = v * (np.float32(1.0) if v >= 0 else alpha)
    elif act == 5:  # HardSwish as lowered: v * Clip(v * alpha + beta, 0, 1), the Clip as below
        for i in range(count):
            v = run[i] + bv
            t = v * alpha  # two roundings, as the unfused Mul and Add (no fma: no fastmath here)
            t = t + beta
            if t <= 0:
                t = np.float32(0.0)
            if t >= 1:
                t = np.float32(1.0)
            run[i] = v * t
    else:  # Clip: np.maximum with lo, then np.minimum with hi (a NaN on either side gives NaN)
        for i in range(count):
            v = run[i] + bv
            if has_lo and not ((v > lo) | (v != v)):
                v = lo
            if has_hi and not ((v < hi) | (v != v)):
                v = hi
            run[i] = v


@numba.njit(cache=True, error_model="numpy", nogil=True)
def pixel_conv(out, x, wt, bias, has_bias, act, alpha, beta, has_lo, lo, has_hi, hi):  # pragma: no cover - compiled
    """A 1x1 conv of one pixel: out (O,) = x (C,) @ wt (C, O) (the weight matrix transposed) by skinny_f32 (each
    output its products added by fma in input-channel order from 0.0, as the pointwise kernel sums them), then,
    with act >= 0, each output's bias (has_bias) and the activation (bias_act_rows' values). One call for a
    squeeze-excite block's conv, whose BLAS GEMV, bias add and activation took three numpy calls (each ~10-20 us
    inside a forward, its caches cold)."""
    o = out.shape[0]
    skinny_f32(out, x, wt.reshape(-1), 1, x.shape[0], o, 0, o)
    if act >= 0:
        if has_bias:
            for j in range(o):
                out[j] = out[j] + bias[j]
        activate(out, 0, o, np.float32(-0.0), act, alpha, beta, has_lo, lo, has_hi, hi)


class BiasActivation:
    """The epilogue threads.matmul runs on each finished block of a conv's float32 GEMM output (B, M, N): Conv's
    bias, then a residual's Add (with_residual), then the activation, in place (matrix b holds group b % groups of
    one image). Called in Python, or written as a table row (`put`) for the worker pool's compiled loop
    (pool_kernels.py)."""

    _NO_RESIDUAL = np.zeros(1, np.float32)

    def __init__(self, bias: np.ndarray | None, activation: str, alpha: float, lo: float | None, hi: float | None,
                 groups: int = 1, beta: float = 0.5):
        self.bias = np.zeros(1, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32).reshape(-1)
        self.flags = (groups, bias is not None, ACTIVATION_CODES[activation], lo is not None, hi is not None)
        self.floats = (float(np.float32(alpha)), float(np.float32(beta)), float(np.float32(0 if lo is None else lo)),
                       float(np.float32(0 if hi is None else hi)))
        self.residual = self._NO_RESIDUAL
        f = [np.float32(v) for v in self.floats]
        groups_, has_bias, act, has_lo, has_hi = self.flags
        self.args = (groups_, self.bias, has_bias, act, f[0], f[1], has_lo, f[2], has_hi, f[3], self.residual, False)

    def with_residual(self, residual: np.ndarray) -> BiasActivation:
        """This epilogue adding `residual` (float32, C-contiguous, the conv output's shape) after the bias: a copy,
        made per call (the cached epilogue is the plan step's; the residual is the forward's)."""
        ep = object.__new__(BiasActivation)  # copy.copy took 2.7 us, as long as a small conv's whole residual Add
        flat = residual.reshape(-1)
        ep.__dict__ = {**self.__dict__, "residual": flat, "args": (*self.args[:-2], flat, True)}
        return ep

    def __call__(self, y3: np.ndarray, b0: int, b1: int, r0: int, r1: int, c0: int, c1: int) -> None:
        if b1 > b0 and r1 > r0 and c1 > c0:
            bias_act_block(y3, b0, b1, r0, r1, c0, c1, *self.args)

    def put(self, k, ints: np.ndarray, floats: np.ndarray, r: int, y3: np.ndarray, b0: int, b1: int, r0: int,
            r1: int, c0: int, c1: int) -> None:
        """Write this block as row r of the worker pool's tables (k: pool_kernels; threads.Steps.epilogue)."""
        groups, has_bias, act, has_lo, has_hi = self.flags
        if not (b1 > b0 and r1 > r0 and c1 > c0):
            b1 = b0  # an empty block: the loop runs no row
        k.put_bias_act(ints, floats, r, y3, b0, b1, r0, r1, c0, c1, groups, self.bias, has_bias, act, has_lo,
                       has_hi, *self.floats, self.residual, self.args[-1])


def bias_activation(bias: np.ndarray | None, activation: str, alpha: float, lo: float | None,
                    hi: float | None, groups: int = 1, beta: float = 0.5) -> BiasActivation:
    """The conv epilogue for `bias` and `activation` (see BiasActivation)."""
    return BiasActivation(bias, activation, alpha, lo, hi, groups, beta)


# Tap convs (conv_taps.py): depthwise 2-D convs (group == channels == outputs). im2col made one a 1-row GEMM per
# channel (8x slower than onnxruntime). Each input channel is split into stride phases (phase (p, q) holds rows p::sh,
# columns q::sw, all phases of a channel in one flat buffer), so every tap reads contiguously: output pixel (oy,
# ox) of tap (ky, kx) is element (oy + ky*dh // sh) * Wq + ox + kx*dw // sw of phase (ky*dh % sh, kx*dw % sw).
# The output is computed on a grid Wq wide, 32 pixels at a time with all taps summed in registers
# (simd.tap_rows_f32: in tap order, each added by fma, the same bits on every CPU); the first OW columns
# of each grid row are kept (or, rows MIN_ROW_WIDTH wide and up, each output row is computed straight into the
# output, its columns past OW never computed). One channel's phases are filled at a time, into a scratch that
# stays in cache between its fill, its taps and its rows' copy (all channels' phases first went through memory twice:
# EfficientNet-B0's 96-channel 112x112 stride-2 conv wrote and read back 5 MB).
EPILOGUE_RUN = 2048  # outputs (8 KiB) tap_planes finishes before it applies the epilogue to them
# output rows at least this wide (AVX-512 only) are computed straight into the output, a row at a time with its
# last vector masked, instead of on the grid and copied out (AVX2's masked stores are slow). Measured per conv at
# 1 thread (Rocket Lake), rows against grid: 0.69x at 144 channels 56x56, 0.79x at 32 channels 112x112, 0.90x for
# 96 channels 3x3/2 from 112x112 and 120 channels 5x5 at 28x28; 14- and 7-wide rows 1.4-1.7x (a masked vector
# of 14 or 7 lanes against a grid row of 18 or 11 columns)
MIN_ROW_WIDTH = 28


@numba.njit(cache=True, nogil=True, error_model="numpy")
def tap_planes(x, phases, taps, offsets, y, n, c0, c1, grid, wq, sh, sw, top, left, hq, bias, has_bias, act, alpha,
               beta, has_lo, lo, has_hi, hi, res, has_res):  # pragma: no cover - compiled
    """A depthwise conv's y (N, C, OH, OW) written for image n, channels c0..c1: channel c reads channel c of
    x (N, C, H, W), whose stride phases are filled here into `phases`, one channel's worth (P * plane + slack
    floats) that arrives zeroed (each channel writes the same elements, so the padding stays zero); taps (C, T)
    f32; offsets (T,) int64 into those phases; grid: scratch of at least OH * wq floats, a whole number of 32-lane
    vectors (the extra outputs are dropped; not used for rows of MIN_ROW_WIDTH and up on AVX-512). With act >= 0
    the channels then get bias_act_block's bias (per channel) and activation while they are in L1/L2, at least
    EPILOGUE_RUN outputs at a time (a separate pass read them back from L2/L3; a call per 7x7 channel cost more
    than that); res (with has_res): the residual of all of y, flat."""
    oh, ow = y.shape[2], y.shape[3]
    size = grid.shape[0]
    out = y[n].reshape(-1)
    image_res = res[n * out.size:] if has_res else res
    h, w = x.shape[2], x.shape[3]
    xf = x.reshape(-1)
    spans = phase_rows(h, w, sh, sw, top, left, hq, wq)
    straight = AVX512 and ow >= MIN_ROW_WIDTH
    done = c0  # channels before this one have had their epilogue
    for c in range(c0, c1):
        fill_channel(xf, (n * x.shape[1] + c) * h * w, w, phases, 0, sh, sw, top, hq, wq, spans, 0, hq)
        if straight:
            tap_rows_f32(out, c * oh * ow, ow, phases, 0, wq, oh, ow, taps[c], offsets)
        else:
            tap_rows_f32(grid, 0, LANES, phases, 0, LANES, size // LANES, LANES, taps[c], offsets)
            for r in range(oh):
                copy_f32(out, (c * oh + r) * ow, grid, r * wq, ow, 1)
        if act >= 0 and ((c + 1 - done) * oh * ow >= EPILOGUE_RUN or c == c1 - 1):
            bias_act_rows(out, y.shape[1], oh * ow, ZERO, ONE, done, c + 1, ZERO, oh * ow, ONE, bias, has_bias, act,
                          alpha, beta, has_lo, lo, has_hi, hi, image_res, has_res)
            done = c + 1


# Channel-blocked depthwise convs (conv_taps.BlockPlan): BLOCK channels at a time are transposed (in registers,
# BLOCK x BLOCK tiles) into a zero-padded buffer of (row, column, BLOCK channels) vectors, band by band of output rows;
# each output pixel's BLOCK channels are then one vector, its taps one fma each with a vector of the BLOCK
# channels' weights, whatever the stride, and transposed back into the (N, C, OH, OW) output. tap_planes' stride
# phases, its grid columns past OW and its per-row copies are gone (a 7x7 plane's channel took ~400 cycles there,
# 75 of them taps). Each output is its taps added by fma in tap order from 0.0, as tap_planes adds them: the
# same bits.
@numba.njit(cache=True, nogil=True, error_model="numpy")
def dw_blocks(x, taps, offsets, where, y, n, k0, k1, g0, g1, buf, out_rows, sh, sw, top, wp, reach, band, bias,
              has_bias, act, alpha, beta, has_lo, lo, has_hi, hi, res, has_res):  # pragma: no cover - compiled
    """A depthwise conv's y (N, C, OH, OW) written for image n, channel blocks k0..k1 (BLOCK channels each, the
    last the rest), output rows g0..g1, from x (N, C, H, W). taps (blocks, T * BLOCK): each block's weights
    tap-major, BLOCK lanes per tap (zero past C); offsets (T,) int64: where each tap reads relative to an output
    pixel's first input pixel, in floats of buf ((ky * dh * wp + kx * dw) * BLOCK); where (H * W,) int64: the
    buffer position of each input pixel (flat) as if the buffer's row 0 were input row 0 ((row * wp + left +
    column) * BLOCK). buf: scratch of at least ((band - 1) * sh + reach) * wp * BLOCK floats whose padding columns
    arrive zero and stay so; out_rows: scratch of band * OW * BLOCK floats. wp: padded width; reach: (kh - 1) * dh
    + 1. A plane's pixels go in and out 16 at a time along the flat plane (a 7x7 plane: 4 tiles, not 7 rows).
    With act >= 0 each band then gets bias_act_rows' bias (per channel) and activation while it is in cache; res
    (with has_res): the residual of all of y, flat."""
    c, h, w = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = y.shape[2], y.shape[3]
    xf, out = x.reshape(-1), y[n].reshape(-1)
    image_res = res[n * out.size:] if has_res else res
    row = wp * BLOCK
    for k in range(k0, k1):
        c0 = k * BLOCK
        count = min(BLOCK, c - c0)
        src = (n * c + c0) * h * w
        for b0 in range(g0, g1, band):
            b1 = min(g1, b0 + band)
            first = b0 * sh - top  # the input row of buf's row 0
            last = first + (b1 - 1 - b0) * sh + reach  # past the last input row read
            for i in range(first, last):
                if not 0 <= i < h:  # a padding row
                    buf[(i - first) * row:(i - first + 1) * row] = 0.0
            p0, p1 = max(first, 0) * w, min(last, h) * w
            for p in range(p0, p1, BLOCK):
                transpose_block_to_f32(buf, -first * row, where, p, xf, src + p, h * w, count, min(BLOCK, p1 - p))
            for g in range(b0, b1):
                taps_block_f32(out_rows, (g - b0) * ow * BLOCK, buf, (g - b0) * sh * row, sw * BLOCK, ow, taps[k], 0,
                               offsets)
            q0, q1 = b0 * ow, b1 * ow
            for q in range(q0, q1, BLOCK):
                transpose_block_f32(out, c0 * oh * ow + q, oh * ow, out_rows, (q - q0) * BLOCK, BLOCK,
                                    min(BLOCK, q1 - q), count)
            if act >= 0:
                bias_act_rows(out, c, oh * ow, ZERO, ONE, c0, c0 + count, q0, q1, ONE, bias, has_bias, act, alpha, beta,
                              has_lo, lo, has_hi, hi, image_res, has_res)


# channel_rows computes a piece's grid columns CHANNEL_COLUMNS at a time (their accumulators, 32 KB, stay in L1 between
# the step ranges) and the steps CHANNEL_STEPS at a time (the block's weights for them, 18 KB, stay in L1 across the
# columns). Measured on Zen 3 (192->64 3x3 at 40x40, 1 thread): 256 x 144 48 GMAC/s, 512 x 72 47, 128 x 36 44, all
# columns x all 1728 steps 42.
CHANNEL_COLUMNS, CHANNEL_STEPS = 256, 144


def pack_channel_blocks(w: np.ndarray) -> np.ndarray:
    """w (O, K) float32 as (ceil(O / CHANNEL_BLOCK), K * CHANNEL_BLOCK): block j's row holds, step by step, the
    weights of output channels j * CHANNEL_BLOCK .. + CHANNEL_BLOCK - 1 (zeros past O): simd.channels_f32's w,
    starting on a cache line (aligned.py: each step's vectors are whole lines)."""
    o, k = w.shape
    blocks = -(-o // CHANNEL_BLOCK)
    padded = np.zeros((blocks * CHANNEL_BLOCK, k), np.float32)
    padded[:o] = w
    return aligned.array(padded.reshape(blocks, CHANNEL_BLOCK, k).transpose(0, 2, 1)).reshape(blocks, -1)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def channel_rows(phases, w, offsets, y, b, r0, r1, g_lo, g_hi, wq, piece_rows, bias, has_bias, act, alpha, beta,
                 has_lo, lo, has_hi, hi, res, has_res):  # pragma: no cover - compiled
    """direct_rows with w in blocks of CHANNEL_BLOCK output channels (pack_channel_blocks) and r0 a multiple of
    CHANNEL_BLOCK: simd.channels_f32 computes a block's outputs on the grid into a scratch of (column, channel) rows
    (the same fma chains in the same order as gather_f32's: the same bits), transpose_block_f32 moves each grid row's
    first OW columns to y, then the epilogue (act >= 0) runs on y's rows of the block."""
    oh, ow, k = y.shape[2], y.shape[3], offsets.shape[0]
    src, out, wf = phases[b], y[b].reshape(-1), w.reshape(-1)
    plane = oh * ow
    image_res = res[b * out.size:] if has_res else res
    scratch = np.empty(piece_rows * wq * CHANNEL_BLOCK, np.float32)
    for g0 in range(g_lo, g_hi, piece_rows):
        g1 = min(g_hi, g0 + piece_rows)
        cols = (g1 - g0) * wq
        for j0 in range(r0, r1, CHANNEL_BLOCK):
            j1 = min(r1, j0 + CHANNEL_BLOCK)
            vectors = 1 if j1 - j0 <= 8 else 2 if j1 - j0 <= 16 else 4
            w_at = j0 // CHANNEL_BLOCK * k * CHANNEL_BLOCK
            for c0 in range(0, cols, CHANNEL_COLUMNS):
                c1 = min(cols, c0 + CHANNEL_COLUMNS)
                for i0 in range(0, k, CHANNEL_STEPS):
                    i1 = min(k, i0 + CHANNEL_STEPS)
                    channels_f32(scratch, c0 * CHANNEL_BLOCK, src, g0 * wq + c0, offsets, i0, i1,
                                 wf, w_at, c1 - c0, i0 == 0, vectors)
            for r in range(g1 - g0):
                for p0 in range(0, ow, BLOCK):
                    for q0 in range(0, j1 - j0, BLOCK):
                        transpose_block_f32(out, ((j0 + q0) * oh + g0 + r) * ow + p0, plane, scratch,
                                            (r * wq + p0) * CHANNEL_BLOCK + q0, CHANNEL_BLOCK, min(BLOCK, ow - p0),
                                            min(BLOCK, j1 - j0 - q0))
            if act >= 0:
                bias_act_rows(out, y.shape[1], plane, ZERO, ONE, j0, j1, g0 * ow, g1 * ow, ONE, bias, has_bias, act,
                              alpha, beta, has_lo, lo, has_hi, hi, image_res, has_res)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def direct_rows(phases, w, offsets, y, b, r0, r1, g_lo, g_hi, wq, piece_rows, bias, has_bias, act, alpha, beta, has_lo,
                lo, has_hi, hi, res, has_res):  # pragma: no cover - compiled
    """y (N, O, OH, OW) float32 for image b, output channels r0..r1, output rows g_lo..g_hi: a dense conv computed
    on the phases' grid
    (conv_direct.py). phases (N, L): image b's stride phases of every input channel, flat (fill_phases); w (O, K)
    with K = channels x kernel in (c, ky, kx) order; offsets (K,): where each of those reads, relative to a grid
    position. piece_rows grid rows at a time (their columns stay in cache), SKINNY_ROWS output channels at a time
    by simd.gather_f32 into a scratch, whose rows then get the epilogue (act >= 0; bias per output channel) and
    have their first OW columns of each grid row copied out. With a residual (has_res; res: all of y's, flat) the
    epilogue runs on those rows once copied out instead (the residual is laid out as the output, not the grid).
    w may instead be the weights in blocks of CHANNEL_BLOCK output channels (pack_channel_blocks: K x CHANNEL_BLOCK
    per row, so w.shape[1] != K): then r0 is a whole number of blocks and channel_rows computes them."""
    if w.shape[1] != offsets.shape[0]:
        channel_rows(phases, w, offsets, y, b, r0, r1, g_lo, g_hi, wq, piece_rows, bias, has_bias, act, alpha, beta,
                     has_lo, lo, has_hi, hi, res, has_res)
        return
    oh, ow, k = y.shape[2], y.shape[3], w.shape[1]
    src, out, wf = phases[b], y[b].reshape(-1), w.reshape(-1)
    image_res = res[b * out.size:] if has_res else res
    piece = piece_rows * wq
    scratch = np.empty(SKINNY_ROWS * piece, np.float32)
    for g0 in range(g_lo, g_hi, piece_rows):
        g1 = min(g_hi, g0 + piece_rows)
        cols = (g1 - g0) * wq
        for j0 in range(r0, r1, SKINNY_ROWS):
            j1 = min(r1, j0 + SKINNY_ROWS)
            gather_f32(scratch, wf[j0 * k:], src[g0 * wq:], offsets, j1 - j0, k, cols, 0, cols)
            if act >= 0 and not has_res:
                bias_act_rows(scratch, _SKINNY_ROWS, cols, ZERO, ONE, ZERO, j1 - j0, ZERO, cols, ONE,
                              bias[j0:] if has_bias else bias, has_bias, act, alpha, beta, has_lo, lo, has_hi, hi, res,
                              FALSE)
            for j in range(j1 - j0):
                for r in range(g1 - g0):
                    copy_f32(out, ((j0 + j) * oh + g0 + r) * ow, scratch, j * cols + r * wq, ow, 1)
            if act >= 0 and has_res:
                bias_act_rows(out, y.shape[1], oh * ow, ZERO, ONE, j0, j1, g0 * ow, g1 * ow, ONE, bias, has_bias, act,
                              alpha, beta, has_lo, lo, has_hi, hi, image_res, TRUE)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def phase_rows(h, w, sh, sw, top, left, hq, wq):  # pragma: no cover - compiled
    """Where fill_channel copies to, the same for every channel: per phase (p, q), in order, its first and last+1
    rows inside the input, its first column inside the input, that column's input column, and how many columns
    (an (sh * sw, 5) int64 table)."""
    spans = np.empty((sh * sw, 5), np.int64)
    for p in range(sh):
        ra, rb = max(0, -((p - top) // sh)), min(hq, -((p - top - h) // sh))  # phase rows inside the input
        for q in range(sw):
            ca, cb = max(0, -((q - left) // sw)), min(wq, -((q - left - w) // sw))
            k = p * sw + q
            spans[k, 0], spans[k, 1], spans[k, 2] = ra, max(ra, rb), ca
            spans[k, 3], spans[k, 4] = q + sw * ca - left, max(0, cb - ca)
    return spans


# inlined, with the input passed flat: a call per channel that reshaped x (numba's reshape is a run-time C call)
# cost 4x the copies on 7x7 planes (576 channels: 27 us, 6 us inlined)
@numba.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def fill_channel(flat, src, w, dst, at, sh, sw, top, hq, wq, spans, q0, q1):  # pragma: no cover - compiled
    """Stride phases of one channel of the zero-padded input, into dst from element `at`: the channel is the w-wide
    rows of flat float32 `flat` from element `src`; phase (p, q), a plane of hq x wq at (p * sw + q) * hq * wq,
    holds padded rows p::sh and columns q::sw (padded `top` rows and `left` columns before; spans =
    phase_rows(...)). Only rows q0..q1 - 1 of each plane, and there only the input's own elements, are written
    (the padding's stay as they are)."""
    for p in range(sh):
        for q in range(sw):
            k = p * sw + q
            base = at + k * hq * wq + spans[k, 2]
            first, cols = spans[k, 3], spans[k, 4]
            for r in range(max(spans[k, 0], q0), min(spans[k, 1], q1)):
                copy_f32(dst, base + r * wq, flat, src + (p + sh * r - top) * w + first, cols, sw)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def fill_phases(x, phases, sh, sw, top, left, hq, wq, q0, q1):  # pragma: no cover - compiled
    """fill_channel for every image and channel, rows q0..q1 - 1 of each phase plane: phases (N, C, L) arrives
    zeroed, channel c of image b at phases[b, c]."""
    n, c, h, w = x.shape
    xf, dst = x.reshape(-1), phases.reshape(-1)
    spans = phase_rows(h, w, sh, sw, top, left, hq, wq)
    for b in range(n):
        for ch in range(c):
            fill_channel(xf, (b * c + ch) * h * w, w, dst, (b * c + ch) * phases.shape[2], sh, sw, top, hq, wq, spans,
                         q0, q1)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def im2col_2d(x, cols, sh, sw, dh, dw, top, left, hp, wp):  # pragma: no cover - compiled
    """cols (N, C, KH, KW, OH, OW) float32 = x (N, C, H, W) float32 at (oy*sh + ky*dh - top, ox*sw + kx*dw - left),
    0.0 where that reads padding (the input padded to hp x wp): a 2-D conv's column matrix. Each channel is first
    copied into a zero-padded plane (fill_channel), so every row of an offset's window is then one copy_f32 with
    no edge to clip (numpy's strided slice copies ran a few elements per inner loop: a third of a 16->32 3x3
    stride-2 conv at 160x160; clipping each row's padding cost 3x the copy itself on 7x7 planes)."""
    n, c = x.shape[0], x.shape[1]
    kh, kw, oh, ow = cols.shape[2], cols.shape[3], cols.shape[4], cols.shape[5]
    dst = cols.reshape(-1)
    padded = np.zeros(hp * wp, np.float32)  # each channel writes the same elements: the padding stays zero
    h, w = x.shape[2], x.shape[3]
    xf = x.reshape(-1)
    spans = phase_rows(h, w, 1, 1, top, left, hp, wp)
    for b in range(n):
        for ch in range(c):
            fill_channel(xf, (b * c + ch) * h * w, w, padded, 0, 1, 1, top, hp, wp, spans, 0, hp)
            for ky in range(kh):
                for kx in range(kw):
                    base = (((b * c + ch) * kh + ky) * kw + kx) * oh * ow
                    for oy in range(oh):
                        copy_f32(dst, base + oy * ow, padded, (oy * sh + ky * dh) * wp + kx * dw, ow, sw)


# an element's cost in a streaming pass over rows (a squeeze-excite block's scale, GlobalAveragePool's means), in
# GEMM multiply-adds: their rows split over the forward's threads (threads.stream_rows) from 128 K elements. One
# thread reading all the channels that the split depthwise conv before wrote took 1.3x as long at 2 threads as at
# 1 (EfficientNet-B0's scales and means: 0.79 -> 1.04 ms). A/B at 2 threads, whole forwards: EfficientNet-B0
# 0.95-0.96x the time, MobileNetV3-small level (from 256 K elements 0.96-0.99x, from 64 K 0.96x / 1.0-1.01x; as
# Python jobs, whose GIL hand-offs cost more than the split saved, 1.05-1.16x). Scaled to threads._MIN_SPLIT_WORK
# (2^19 since session 21) so that the split still starts at 128 K elements: from 32 K it was slower (MobileNetV3-
# small's small squeeze-excite means at 2 threads 18 -> 32 us; whole forwards A/B 128 K against 32 K: 0.953x,
# EfficientNet-B0 level; 256 K 0.98x, 64 K 0.97x / 0.99x)
STREAM_COST = 4


# error_model="numpy": no exception branch, so the row loop vectorizes
@numba.njit(cache=True, nogil=True, error_model="numpy")
def scale_rows(big, small, out, width):  # pragma: no cover - compiled
    """out[r * width + i] = big[r * width + i] * small[r], all flat float32 (a NaN times a NaN gives one of the two,
    as IEEE leaves it; numpy's own loops differ there too)."""
    for r in range(small.size):
        v = small[r]
        at = r * width
        for i in range(width):
            out[at + i] = big[at + i] * v


@numba.njit(cache=True, nogil=True, error_model="numpy")
def row_means(x, out, width):  # pragma: no cover - compiled
    """out[r] = sum(x[r * width:(r + 1) * width]) / width for flat float32 x: GlobalAveragePool's channel means, each
    sum by simd.sum_f32 (numpy's pairwise float32 sum ran at 1-5 G values/s here)."""
    scale = np.float32(width)
    for r in range(out.size):
        out[r] = sum_f32(x, r * width, width) / scale


@numba.njit(cache=True, nogil=True, error_model="numpy")
def squeeze_excite(x, out, width, w1t, b1, w2t, b2, ints, floats, scratch):  # pragma: no cover - compiled
    """A one-image squeeze-excite block on one thread, flat float32 x (C rows of `width`) -> out: the channel means
    (row_means), the squeeze conv (pixel_conv with w1t (C, C1), b1), the gate conv (w2t (C1, C), b2), x's rows
    times the gate (scale_rows): the unfused steps' kernels, so their bits. ints: has_bias, act, has_lo, has_hi of
    each conv; floats: alpha, beta, lo, hi of each; scratch: at least 2 C + C1 elements."""
    c, c1 = w1t.shape[0], w1t.shape[1]
    means, hidden, gate = scratch[:c], scratch[c:c + c1], scratch[c + c1:2 * c + c1]
    row_means(x, means, width)
    pixel_conv(hidden, means, w1t, b1, ints[0] != 0, ints[1], floats[0], floats[1], ints[2] != 0, floats[2],
               ints[3] != 0, floats[3])
    pixel_conv(gate, hidden, w2t, b2, ints[4] != 0, ints[5], floats[4], floats[5], ints[6] != 0, floats[6],
               ints[7] != 0, floats[7])
    scale_rows(x, gate, out, width)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def repeat_planes(x, y, kh, kw):  # pragma: no cover - compiled
    """y (planes, h * kh, w * kw) = every element of x (planes, h, w) repeated kw times along its row and each row
    kh times (a nearest upsample by whole factors), both C-contiguous: each output row is built once (kw == 2 as
    its own loop, which vectorizes), then copied to the next kh - 1 rows."""
    planes, h, w = x.shape
    wo = w * kw
    xf, yf = x.reshape(-1), y.reshape(-1)
    for pr in range(planes * h):  # (plane, input row) pairs, in order
        src = xf[pr * w:(pr + 1) * w]
        first = yf[pr * kh * wo:(pr * kh + 1) * wo]
        if kw == 2:
            for j in range(w):
                v = src[j]
                first[2 * j] = v
                first[2 * j + 1] = v
        else:
            for j in range(w):
                v = src[j]
                for t in range(kw):
                    first[j * kw + t] = v
        for t in range(1, kh):
            dst = yf[(pr * kh + t) * wo:(pr * kh + t + 1) * wo]
            for i in range(wo):
                dst[i] = first[i]


@numba.njit(cache=True, nogil=True, error_model="numpy")
def maxpool_planes(x, y, p0, p1, kh, kw, sh, sw, dh, dw, top, left):  # pragma: no cover - compiled
    """2-D MaxPool of planes p0..p1 of float32 x (planes, h, w) into y (planes, oh, ow): each output starts at
    -inf and takes np.maximum of its window's taps in (ky, kx) order, a tap's as one max_fold_f32 per output row
    over the columns whose tap is inside the input. A padded tap (-inf) would change no value, so skipping it is
    the whole window's fold (kernels/nn.py _maxpool's bits).

    The folds go into a scratch plane whose rows start LANES-aligned apart (then one copy_f32 per row into y):
    a load that overlaps an earlier masked store waits until that store has left the core, and with rows ow
    apart each row's first vector overlapped the previous row's masked tail (40-wide rows: 13 ns a fold, 2.5
    with the padded pitch). Taps outside, rows inside, so a row's next fold is oh folds after its last store."""
    h, w = x.shape[1], x.shape[2]
    oh, ow = y.shape[1], y.shape[2]
    pitch = -(-ow // LANES) * LANES
    xf, yf = x.reshape(-1), y.reshape(-1)
    grid = np.empty(oh * pitch, np.float32)
    for p in range(p0, p1):
        grid[:] = -np.inf
        for ky in range(kh):
            for kx in range(kw):
                off = kx * dw - left  # output column ox reads input column ox * sw + off
                lo = 0 if off >= 0 else (sw - 1 - off) // sw
                hi = min(ow, (w - 1 - off) // sw + 1) if off < w else 0
                if hi <= lo:
                    continue
                for oy in range(oh):
                    iy = oy * sh + ky * dh - top
                    if 0 <= iy < h:
                        max_fold_f32(grid, oy * pitch + lo, xf, (p * h + iy) * w + lo * sw + off, hi - lo, sw)
        for oy in range(oh):
            copy_f32(yf, (p * oh + oy) * ow, grid, oy * pitch, ow, 1)
