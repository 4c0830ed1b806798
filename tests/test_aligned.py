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
