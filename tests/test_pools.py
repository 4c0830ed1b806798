"""MaxPool folds np.maximum over each window one axis at a time (kernels/nn.py): bit for bit the fold over the
whole window in its (ky, kx) order, which the test spells out window by window. Windows hold NaNs of both signs
(the first in window order must win) and -0.0/0.0 ties (the later one must win), with strides, dilations,
padding, ceil_mode and 1-D/3-D inputs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from rlx_runtime import threads
from rlx_runtime.backend import CPU
from rlx_runtime.kernels import KERNELS
from rlx_runtime.kernels.registry import prepare_attrs

RNG = np.random.default_rng(3)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def _window_fold(x, k, strides, dil, pads, out_sp):
    """Each output: np.maximum folded over its window in row-major order from the first tap, -inf padding."""
    nsp = len(k)
    y = np.empty(x.shape[:2] + tuple(out_sp), x.dtype)
    for pos in itertools.product(*(range(o) for o in out_sp)):
        acc = None
        for tap in itertools.product(*(range(kk) for kk in k)):
            idx = [pos[d] * strides[d] + tap[d] * dil[d] - pads[d] for d in range(nsp)]
            inside = all(0 <= idx[d] < x.shape[2 + d] for d in range(nsp))
            v = x[(slice(None), slice(None)) + tuple(idx)] if inside else np.full(x.shape[:2], -np.inf, x.dtype)
            acc = v.copy() if acc is None else np.maximum(acc, v)
        y[(slice(None), slice(None)) + pos] = acc
    return y


def _specials(shape, dtype=np.float32):
    x = RNG.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    flat[::11] = np.nan
    flat[3::13] = -np.nan
    flat[5::7] = -0.0
    flat[6::7] = 0.0
    flat[8::17] = np.inf
    return x


@pytest.mark.parametrize("xs,attrs", [
    ((1, 3, 12, 12), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),  # ResNet's stem pool
    ((2, 4, 9, 10), {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}),  # YOLO's SPPF
    ((1, 2, 9, 11), {"kernel_shape": [2, 3], "strides": [2, 1], "pads": [0, 1, 1, 1], "dilations": [1, 2],
                     "ceil_mode": 1}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 2], "strides": [3, 3], "ceil_mode": 1}),
    ((2, 3, 13), {"kernel_shape": [4], "strides": [3], "pads": [1, 2]}),
    ((1, 2, 5, 6, 7), {"kernel_shape": [2, 3, 2], "strides": [1, 2, 2], "pads": [0, 1, 1, 1, 0, 1]}),
], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", ["generic", "cpu"])
def test_maxpool_is_the_whole_window_fold_bit_for_bit(xs, attrs, dtype, backend, monkeypatch):
    """The generic kernel (whole-array passes) and the CPU one (2-D float32: conv_kernels.maxpool_planes' vector
    folds, its planes split over two threads)."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the CPU kernel's numba path is taken once it is loaded
    monkeypatch.setattr(threads, "_MIN_SPLIT_WORK", 0)  # split these small pools too
    nsp = len(xs) - 2
    a = prepare_attrs("MaxPool", {"strides": [1] * nsp, "pads": [0] * (2 * nsp), "dilations": [1] * nsp,
                                  "ceil_mode": 0, "storage_order": 0, **attrs})
    x = _specials(xs, dtype)
    fold = KERNELS["MaxPool"] if backend == "generic" else CPU.kernel("MaxPool")
    from rlx_runtime import conv_kernels
    planes = []
    real = conv_kernels.maxpool_planes
    monkeypatch.setattr(conv_kernels, "maxpool_planes", lambda *args: planes.append(args[2:4]) or real(*args))
    with threadpool_limits(2, "blas"), threads.forward_threads():
        got = fold(np, a, x)
    # the vector folds ran exactly for the CPU's 2-D float32 cases, in two chunks of planes
    assert len(planes) == (2 if backend == "cpu" and nsp == 2 and dtype == np.float32 else 0)
    want = _window_fold(x, a["kernel_shape"], a["strides"], a["dilations"], a["pads"], got.shape[2:])
    bits = np.uint32 if dtype == np.float32 else np.uint64
    np.testing.assert_array_equal(got.view(bits), want.view(bits))
