"""Pointwise 2-D convs (1x1, stride 1, unpadded, group 1) in float32 by simd.skinny_epilogue_f32 (the few-rows GEMM
skinny_f32 with the FusedConv epilogue's bias, residual and Relu applied to each output vector as it is stored);
another activation then runs as a pass over each block of 8 output channels while it is in cache.

Why not the BLAS GEMM (W (O, C) @ X (C, H*W)): OpenBLAS packs both operands on every call, which costs most
where the inner dimension (the input channels) is short, as in the expansion and projection convs of
MobileNet/EfficientNet blocks. skinny_f32 streams X's rows in 32-pixel vectors, each feeding a multiply-add
into 8 output channels' accumulators (the weights broadcast from W), and masks the last vector. Measured at 1
thread against OpenBLAS's SkylakeX kernels (Zen 5): 16->72 at 56x56 47 -> 32 us, 24->144 at 56x56 122 -> 93 us,
64->255 at 40x40 255 -> 220 us; on Rocket Lake 144 channels from 24 at 56x56 0.82x, 96 from 16 at 112x112 0.87x
the BLAS's time. Planes under MIN_PIXELS go to the BLAS: the masked vector there is most of a row. The
epilogue's pass over the output, separate after a BLAS GEMM, then reads rows still in L1/L2.

Each output is its products added by fma in order of the input channel from 0.0 (the same bits on every CPU);
Conv and FusedConv take this path alike, so a fused conv still gives the unfused ops' values.
"""

from __future__ import annotations

import functools

import numpy as np

from . import threads

# inner dimensions (input channels) this path takes: measured faster or level up to here (MobileNetV3's and
# EfficientNet's pointwise convs have 16-1152); ResNet-50's 1024/2048-channel convs were at parity (the BLAS)
MAX_CHANNELS = 1152
# and outputs (channels x pixels) above this many: a squeeze-excite block's 1x1-pixel convs go through the
# unfused kernels (kernels/nn.py TINY_OUTPUT), where one BLAS call has the least Python around it
MIN_OUTPUTS = 4096
# and planes of at least this many pixels (7x7: the smallest measured). Below, the masked last 32-pixel vector is most
# of each row and the BLAS takes them. Planes under SMALL_PLANE pixels (7x7 and 14x14, whose last vector is 17 or 4
# of 32 lanes) all went to the BLAS too until session 21, when, with the prepared jobs and the fused epilogue, this
# kernel measured faster there for weight matrices under SMALL_PLANE_WEIGHTS: whole forwards, A/B in one process
# (Rocket Lake) at 1 / 2 threads, MobileNetV3-small 0.917x / 0.877x the time, EfficientNet-B0 0.973x / 0.923x (a
# 576x96 conv at 49 pixels hot, 1 thread: 44 us alone against the BLAS's 52 and its epilogue pass). ResNet-50's
# 1024x256 ones at 14x14 stay with the BLAS (hot, 1 thread: 686 us against 770; 2048x512 at 7x7 level)
MIN_PIXELS = 49
SMALL_PLANE, SMALL_PLANE_WEIGHTS = 256, 1 << 18


@functools.cache
def _numba_side() -> tuple:
    """(pool_kernels, simd, aligned) (numba), imported once a forward takes this path (an import statement per call
    cost ~1 us)."""
    from . import aligned, pool_kernels, simd
    return pool_kernels, simd, aligned


# Without AVX-512 (skinny_f32's tile there: two passes of 4 x 16 per 8 output channels, each over all of x) convs on
# planes under AVX2_BLAS_PIXELS pixels (7x7) go to the BLAS, at one thread only while their multiply-adds are under
# AVX2_BLAS_ALWAYS (at more this kernel, split: see blas_up_to). Measured per step inside whole forwards, A/B in one
# process (Zen 3, OpenBLAS's Haswell kernels), the BLAS's time / this kernel's: at 1 thread MobileNetV3-small's 7x7
# convs 0.58-0.86, EfficientNet-B0's 0.60-0.71; at 2 threads MobileNetV3-small's (576x96 weights, 2.7 M
# multiply-adds) 1.16-1.38 split and 1.23-1.49 unsplit, EfficientNet-B0's (1152x192, 10.8 M) 0.71-0.89 split. 14x14
# planes were mixed (0.78-1.24 at 1 thread, 0.87-1.31 at 2) and larger ones slower (1.1-1.5, to 2.6 split): they
# stay here.
AVX2_BLAS_PIXELS = 100
AVX2_BLAS_ALWAYS = 1 << 22


def blas_up_to(shape: tuple, w: np.ndarray) -> int:
    """For a conv that use_pointwise takes (numba loaded): the most threads at which the BLAS takes it instead
    (0: never; 1: at one thread; a large number: always). See AVX2_BLAS_PIXELS."""
    n, c, h, wd = shape
    if h * wd >= AVX2_BLAS_PIXELS or _numba_side()[1].AVX512:
        return 0
    return 1 if n * c * h * wd * w.shape[0] < AVX2_BLAS_ALWAYS else 1 << 30


def use_pointwise(shape: tuple, dtype, w: np.ndarray, epilogue) -> bool:
    """For a pointwise 2-D conv (the caller checked its attrs and that numba is loaded) of float32 inputs of `shape`
    (n, c, h, w) and w (o, c, 1, 1), with `epilogue` None or a one-group conv_kernels.BiasActivation: at most
    MAX_CHANNELS input channels, more than MIN_OUTPUTS outputs per image, at least MIN_PIXELS pixels, and on planes
    under SMALL_PLANE pixels fewer than SMALL_PLANE_WEIGHTS weights (without AVX-512 see blas_up_to too)."""
    pixels, c, o = shape[2] * shape[3], shape[1], w.shape[0]
    return (dtype == np.float32 and w.dtype == np.float32 and c <= MAX_CHANNELS
            and o * pixels > MIN_OUTPUTS and pixels >= MIN_PIXELS
            and (pixels >= SMALL_PLANE or o * c < SMALL_PLANE_WEIGHTS)
            and (epilogue is None or getattr(epilogue, "flags", (0,))[0] == 1))


def pointwise(w: np.ndarray, x: np.ndarray, epilogue=None) -> np.ndarray:
    """(n, o, p) float32 = w (o, c) @ x[b] (c, p) for each image b, then `epilogue` (see use_pointwise) on each
    block. Split over the forward's threads by pixels (whole passes of the tile) when there are enough of them,
    else by output channels (whole blocks of SKINNY_ROWS)."""
    kernels, simd, aligned = _numba_side()
    w = np.ascontiguousarray(w)
    x = np.ascontiguousarray(x)
    n, c, p = x.shape
    o = w.shape[0]
    y = aligned.empty((n, o, p))
    nthreads = threads.threads_for(n * o * c * p)
    if nthreads == 1:  # the calls themselves, without a job around them (Steps' set-up: ~5 us)
        skinny_rows = kernels.skinny_rows
        for b in range(n):
            skinny_rows(y[b].reshape(-1), w.reshape(-1), x[b].reshape(-1), o, c, p, 0, p, 0, o,
                        *threads.epilogue_fields(epilogue, b, o * p))
        return y
    with threads.Steps(n * nthreads, True) as steps:
        write_pointwise(steps, w, x, y, epilogue, nthreads)
        steps.run()
    return y


def write_pointwise(steps: threads.Steps, w: np.ndarray, x: np.ndarray, y: np.ndarray, epilogue, nthreads: int) -> None:
    """pointwise's job over `nthreads` threads as steps and chunks of `steps`: by pixels (whole passes of the tile,
    simd.FEW_ROWS_UNIT) when there are enough of them, else by output channels (whole blocks of SKINNY_ROWS)."""
    simd = _numba_side()[1]
    n, c, p = x.shape
    o = w.shape[0]
    by_columns = p >= 2 * simd.LANES * nthreads
    edges = (threads.block_edges(p, nthreads, simd.FEW_ROWS_UNIT) if by_columns
             else threads.block_edges(o, nthreads, simd.SKINNY_ROWS))
    for e0, e1 in zip(edges, edges[1:]):
        for b in range(n):
            if by_columns:
                threads.skinny_step(steps, w, x[b], y[b], e0, e1, 0, o, epilogue, b)
            else:
                threads.skinny_step(steps, w, x[b], y[b], 0, p, e0, e1, epilogue, b)
        steps.end_chunk()


def prepare_pointwise(w: np.ndarray, shape: tuple, epilogue, residual: bool) -> threads.Prepared:
    """pointwise of w (o, c) for float32 inputs of `shape` (n, c, p) as a threads.Prepared job run with (x, y) or,
    with `residual`, (x, y, residual): split over the forward's threads as pointwise splits, `epilogue` (its
    residual this call's) on each block."""
    w = np.ascontiguousarray(w)  # the rows hold its address
    n, c, p = shape
    o = w.shape[0]
    nthreads = threads.threads_for(n * o * c * p)
    return threads.prepared_conv(n * nthreads, lambda steps, x, y, ep: write_pointwise(steps, w, x, y, ep, nthreads),
                                 epilogue, residual, shape, (n, o, p))
