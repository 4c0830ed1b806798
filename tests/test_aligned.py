"""Outputs of the CPU's numba conv and GEMM kernels start on a 64-byte cache line (aligned.py) where their rows or
planes are whole lines, and keep their values (checked against numpy's arrays and plain numpy arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from rlx_runtime import aligned, conv_direct, conv_pointwise, conv_taps, threads
from rlx_runtime.kernels import elementwise, nn

RNG = np.random.default_rng(11)
LINE = 64


def _start(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0] % LINE


@pytest.mark.parametrize("shape,run", [((3, 16), None), ((1, 8, 4, 4), 16), ((2, 5, 32), None), ((0, 16), None),
                                       ((1, 64, 56, 56), 3136)], ids=str)
def test_whole_line_runs_start_on_a_line(shape, run):
    # numba's own arrays start 32 bytes past a line half the time: many tries find a start left unmoved
    for _ in range(24):
        a = aligned.empty(shape, run)
        assert (a.shape, a.dtype, a.flags.c_contiguous, a.flags.writeable) == (shape, np.float32, True, True)
        assert _start(a) == 0
        a[...] = 1.5  # the whole extent is ours to write
        assert np.all(a == 1.5)


def test_other_runs_take_numpys_array():
    a = aligned.empty((4, 7, 7), 49)
    assert (a.shape, a.dtype, a.flags.c_contiguous) == ((4, 7, 7), np.float32, True)
    assert a.base is None  # not a view into a larger buffer


def test_arrays_do_not_overlap():
    arrays = [aligned.empty((5, 32)) for _ in range(8)]
    for i, a in enumerate(arrays):
        a[...] = i
    assert all(np.all(a == i) for i, a in enumerate(arrays))


def _conv(x, w, attrs, epilogue=None):
    return nn._conv_nobias_cpu({"group": 1, **attrs}, x, w, epilogue)


@pytest.fixture
def split_small(monkeypatch):
    monkeypatch.setattr(threads, "_MIN_SPLIT_WORK", 0)


@pytest.mark.parametrize("nthreads", [1, 2])
def test_conv_outputs_start_on_a_line(nthreads, split_small, monkeypatch):
    monkeypatch.setattr(conv_pointwise, "MIN_PIXELS", 1)
    monkeypatch.setattr(conv_pointwise, "MIN_OUTPUTS", 1)
    x = RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)
    cases = [  # (module whose path the conv takes, weights, attrs)
        (conv_pointwise, RNG.standard_normal((16, 8, 1, 1)), {}),
        (conv_direct, RNG.standard_normal((16, 8, 3, 3)), {"pads": [1, 1, 1, 1]}),
        (conv_taps, RNG.standard_normal((8, 1, 3, 3)), {"pads": [1, 1, 1, 1], "group": 8}),
    ]
    with threadpool_limits(nthreads, "blas"), threads.forward_threads():
        for module, w, attrs in cases:
            w = w.astype(np.float32)
            ys = [_conv(x, w, attrs) for _ in range(12)]
            assert all(_start(y) == 0 for y in ys), module.__name__
            if module is conv_pointwise:
                want = np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64))
                np.testing.assert_allclose(ys[0], want, rtol=1e-5, atol=1e-5)


def test_split_gemm_outputs_start_on_a_line(split_small):
    a = RNG.standard_normal((64, 48)).astype(np.float32)
    b = RNG.standard_normal((48, 32)).astype(np.float32)
    with threadpool_limits(2, "blas"), threads.forward_threads():
        outs = [threads.matmul(a, b) for _ in range(12)]
    assert all(_start(o) == 0 for o in outs)
    np.testing.assert_allclose(outs[0], a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_row_scale_and_max_pool_outputs_start_on_a_line():
    x = RNG.standard_normal((1, 8, 8, 8)).astype(np.float32)
    s = RNG.standard_normal((1, 8, 1, 1)).astype(np.float32)
    scaled = [elementwise.multiply_cpu(x, s) for _ in range(12)]
    assert all(_start(y) == 0 for y in scaled)
    np.testing.assert_array_equal(scaled[0], x * s)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 0], "ceil_mode": 0}
    x = RNG.standard_normal((1, 4, 16, 16)).astype(np.float32)
    pooled = [nn._maxpool_cpu(np, attrs, x) for _ in range(12)]
    assert all(_start(y) == 0 for y in pooled)  # 8x8 planes: 64 elements, whole lines
    np.testing.assert_array_equal(pooled[0], x.reshape(1, 4, 8, 2, 8, 2).max(axis=(3, 5)))


@pytest.mark.parametrize("shape", [(3, 16), (2, 5, 7), (1,)], ids=str)
def test_zeros_and_array_start_on_a_line(shape):
    for _ in range(8):  # numpy's own start is off a line three times in four: eight tries find a start unmoved
        z = aligned.zeros(shape)
        assert (z.shape, z.dtype, z.flags.c_contiguous, z.flags.writeable) == (shape, np.float32, True, True)
        assert _start(z) == 0 and not np.any(z)
        src = RNG.standard_normal(shape)[..., ::-1]  # float64, not contiguous
        a = aligned.array(src)
        assert a.shape == shape and a.dtype == np.float32 and a.flags.c_contiguous and _start(a) == 0
        np.testing.assert_array_equal(a, src.astype(np.float32))


@pytest.mark.parametrize("shape", [(1, 1), (3, 200), (130, 65), (64, 64), (65, 129)], ids=str)
def test_array_of_a_transposed_matrix_copies_every_column_block(shape):
    """aligned.array copies a transposed matrix (an F-ordered view) COPY_BLOCK columns at a time: every block, the
    last partial one included, holds the source's values; float64 and float32 sources alike."""
    for dtype in (np.float32, np.float64):
        src = RNG.standard_normal(shape).astype(dtype)
        a = aligned.array(src.T)
        assert a.shape == shape[::-1] and a.flags.c_contiguous and _start(a) == 0
        np.testing.assert_array_equal(a, src.T.astype(np.float32))


def test_packed_weights_start_on_a_line():
    """The weights kernels pack once per compile and load as vectors: an LSTM's Rᵀ panels, a dense conv's channel
    blocks, a depthwise conv's tap blocks, a 1x1-pixel conv's transpose (the same values as the plain layouts)."""
    from rlx_runtime import conv_kernels, recurrent_kernels
    for k in (5, 64, 256):
        rt = RNG.standard_normal((k, 4 * k)).astype(np.float32)
        panels, offsets = recurrent_kernels.pack_panels(rt)
        assert _start(panels) == 0
        flat = panels.reshape(-1)
        assert all(np.array_equal(flat[offsets[c // recurrent_kernels.PANEL, i] + c], rt[i, c])
                   for i in range(0, k, 3) for c in range(0, 4 * k, 7))
        w = RNG.standard_normal((k + 3, 18)).astype(np.float32)
        blocks = conv_kernels.pack_channel_blocks(w)
        assert _start(blocks) == 0
        b = blocks.reshape(blocks.shape[0], 18, -1)  # (block, step, channel in block)
        np.testing.assert_array_equal(b.transpose(0, 2, 1).reshape(-1, 18)[:k + 3], w)
        wd = RNG.standard_normal((k, 1, 3, 3)).astype(np.float32)
        plan = conv_taps.BlockPlan((1, k, 8, 8), wd, (1, 1), (1, 1), (1, 1, 1, 1), (8, 8))
        assert _start(plan.taps) == 0
        t = plan.taps.reshape(plan.blocks, 9, -1).transpose(0, 2, 1).reshape(-1, 9)[:k]
        np.testing.assert_array_equal(t, wd.reshape(k, 9))
        wp = RNG.standard_normal((k, k + 1, 1, 1)).astype(np.float32)
        wt = nn._pixel_weights(wp)
        assert _start(wt) == 0
        np.testing.assert_array_equal(wt, wp[:, :, 0, 0].T)


def test_column_major_weights_start_on_a_line():
    """The MatMul weights compile holds in column-major order (plan.matmul_weights) are float32 copies starting on
    a cache line, with the weights' values; the model's result is unchanged."""
    import sys

    from rlx_format import GraphBuilder
    from rlx_runtime import Session
    g = GraphBuilder("columns")
    h = g.input("x", "f32", [1, 64])
    # (64, 640) wider than tall and (480, 64) small: kept row-major; the four between: column-major (numpy's own
    # start is off a line three times in four: four copies find a start left unmoved)
    sizes = [64, 640, 600, 560, 520, 480, 64]
    ws = [RNG.standard_normal((k, n)).astype(np.float32) * 0.05 for k, n in zip(sizes, sizes[1:])]
    for i, w in enumerate(ws):
        h = g.op("MatMul", h, g.constant(w, name=f"w{i}"), name=f"m{i}")
    g.output(h)
    numba_before = "numba" in sys.modules
    compiled = Session().compile(g.build())
    assert ("numba" in sys.modules) == numba_before  # aligning the copies loads nothing
    held = [v for v in compiled._plan.base if isinstance(v, np.ndarray) and v.ndim == 2]
    columns = [v for v in held if v.flags.f_contiguous and not v.flags.c_contiguous]
    assert len(columns) == 4 and all(_start(v) == 0 and v.dtype == np.float32 for v in columns)
    assert sorted(map(np.shape, columns)) == [(520, 480), (560, 520), (600, 560), (640, 600)]
    for v in columns:
        np.testing.assert_array_equal(v, next(w for w in ws if w.shape == v.shape))
    x = RNG.standard_normal((1, 64)).astype(np.float32)
    want = x.astype(np.float64)
    for w in ws:
        want = want @ w
    np.testing.assert_allclose(compiled.run({"x": x})["m5"], want, rtol=1e-4, atol=1e-5)
