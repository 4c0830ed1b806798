"""The CPU's row kernels (LayerNorm, Softmax, MaxPool's planes) split their rows over a forward's threads
(threads.rows_in_chunks) and give the same bits as on one thread, odd rows (an infinite max) included."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from rlx_runtime import threads, ufuncs  # noqa: F401 - ufuncs loads numba: the row kernels apply once it is
from rlx_runtime.kernels import elementwise, nn

RNG = np.random.default_rng(17)


def _both(fn, monkeypatch):
    """fn() outside a forward (one thread) and inside a 2-thread forward, with the chunk counts of the latter."""
    one = fn()
    counts = []
    real = threads.run_chunks
    monkeypatch.setattr(threads, "run_chunks", lambda count, f: counts.append(count) or real(count, f))
    with threadpool_limits(2, "blas"), threads.forward_threads():
        two = fn()
    return one, two, counts


@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_rows_split_with_the_same_bits(with_bias, monkeypatch):
    x = RNG.standard_normal((3, 50, 768)).astype(np.float32)
    x[1, 7] = np.nan
    s, b = RNG.standard_normal(768).astype(np.float32), RNG.standard_normal(768).astype(np.float32)
    args = (x, s, b) if with_bias else (x, s)
    one, two, counts = _both(lambda: nn._layernorm_cpu(np, {"axis": -1, "epsilon": 1e-5}, *args), monkeypatch)
    np.testing.assert_array_equal(two, one)
    assert counts == [2]
    want = nn._layernorm(np, {"axis": -1, "epsilon": 1e-5}, *(a.astype(np.float64) for a in args))
    np.testing.assert_allclose(one, want, rtol=2e-5, atol=2e-5)


def test_softmax_rows_split_with_the_same_bits(monkeypatch):
    x = (RNG.standard_normal((256, 384)) * 4).astype(np.float32)
    x[3, 5] = np.inf  # rows the row kernel leaves to the generic steps, on either side of the split
    x[200, :] = -np.inf
    x[201, 9] = np.nan
    with np.errstate(invalid="ignore"):
        one, two, counts = _both(lambda: elementwise._softmax_cpu(np, {"axis": -1}, x), monkeypatch)
        np.testing.assert_array_equal(two, one)
        assert counts == [2]
        want = elementwise._softmax(np, {"axis": -1}, x.astype(np.float64))
    np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-7)


def test_max_pool_planes_split_with_the_same_bits(monkeypatch):
    x = RNG.standard_normal((1, 64, 56, 56)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 0}
    one, two, counts = _both(lambda: nn._maxpool_cpu(np, attrs, x), monkeypatch)
    np.testing.assert_array_equal(two, one)
    assert counts == [2]
    np.testing.assert_array_equal(one, nn._maxpool(np, attrs, x))


@pytest.mark.parametrize("numba_rows", [True, False], ids=["row-kernel", "generic"])
def test_layer_norm_takes_the_models_epsilon(numba_rows):
    """Rows whose variance (~1e-8) is far below a common epsilon floor (1e-5): the result depends on the model's
    own epsilon (MiniLM's is 1e-12), on the CPU row kernel and on the generic steps alike."""
    x = (1.0 + RNG.standard_normal((4, 384)) * 1e-4).astype(np.float32)
    s = np.ones(384, np.float32)
    a = {"axis": -1, "epsilon": 1e-12}
    got = nn._layernorm_cpu(np, a, x, s) if numba_rows else nn._layernorm(np, a, x, s)
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(axis=-1, keepdims=True)
    want = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-12)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    assert np.abs(got).max() > 2  # unit variance: a 1e-5 floor would shrink these rows ~30-fold
