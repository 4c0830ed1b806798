"""rlx_runtime.ufuncs: the float32 erf is the correctly rounded erf (checked exhaustively once over
all 1.09e9 non-negative float32 inputs below 6.5 when it was written; here on samples across the
whole float32 range, every sample run in CI), and GELU's fused kernel equals the unfused op sequence."""

import math

import numpy as np
import pytest
import scipy.special as sp

from threadpoolctl import threadpool_limits

from rlx_format.numba_setup import numba
from rlx_runtime import threads, ufuncs
from rlx_runtime.ufuncs import BLOCK, ELEMENT_COST, erf, gelu_erf


def _correctly_rounded(x: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # NaN inputs
        return sp.erf(x.astype(np.float64)).astype(np.float32)


@pytest.mark.parametrize("seed", range(3))
def test_erf_f32_is_correctly_rounded_on_random_bit_patterns(seed):
    bits = np.random.default_rng(seed).integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    np.testing.assert_array_equal(erf(x), _correctly_rounded(x))  # NaN positions must match too


def test_erf_f32_on_a_dense_stride_of_the_fast_paths_range():
    """Every 97th float32 from 1e-4 to 4 (1.3e6 inputs, where the fast estimate decides or hands over), both
    signs: an estimate that is less accurate than its margin, or a skipped redo, shows here."""
    lo, hi = int(np.float32(1e-4).view(np.int32)), int(np.float32(4.0).view(np.int32))
    x = np.arange(lo, hi, 97, dtype=np.int32).view(np.float32)
    x = np.concatenate([x, -x])
    np.testing.assert_array_equal(erf(x), _correctly_rounded(x))
    np.testing.assert_array_equal(gelu_erf(x * np.float32(np.sqrt(2.0))), _unfused_gelu(x * np.float32(np.sqrt(2.0))))


def _unfused_gelu(x):
    return np.float32(0.5) * x * (np.float32(1) + _correctly_rounded(x / np.float32(np.sqrt(2.0))))


@numba.njit
def _estimates(x, out, unsure):
    for i in range(x.size):
        r = ufuncs._erf_estimate(np.float64(x[i]))
        out[i] = np.float32(r)
        unsure[i] = ufuncs._unsure(r)


def test_erf_fast_path_hands_over_few_and_the_redo_fixes_them():
    x = np.random.default_rng(1).uniform(-4, 4, 100_000).astype(np.float32)
    out, unsure = np.empty_like(x), np.zeros(x.size, np.bool_)
    _estimates(x, out, unsure)
    assert 0 < unsure.mean() < 0.01  # the redo path runs, and rarely
    want = _correctly_rounded(x)
    assert (out[unsure] != want[unsure]).any()  # some estimates alone would misround
    ufuncs._redo(x, out, unsure, unsure.view(np.uint64), *ufuncs._tables(), False)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(erf(x), want)  # the blocks' own fast path and redo


def test_erf_f32_dense_near_every_interval_edge():
    edges = np.arange(0.0, 6.75, 0.25, dtype=np.float32)
    x = np.concatenate([np.nextafter(edges, np.float32(-1)), edges, np.nextafter(edges, np.float32(9))]
                       + [np.linspace(e - 1e-3, e + 1e-3, 2001, dtype=np.float32) for e in edges])
    x = np.concatenate([x, -x])
    np.testing.assert_array_equal(erf(x), _correctly_rounded(x))


def test_erf_special_values_and_dtypes():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-38, 3.9192, 5.99, 6.0, 1e30], np.float32)
    got = erf(x)
    np.testing.assert_array_equal(got, _correctly_rounded(x))
    assert np.signbit(got[4]) and not np.signbit(got[3])
    assert erf(np.float32(0.5) * np.ones((), np.float32)).shape == ()
    xs = np.linspace(-3, 3, 7)
    np.testing.assert_array_equal(erf(xs), [math.erf(v) for v in xs])  # float64: libm
    assert erf(np.ones(3, np.float16)).dtype == np.float16


# inside one block, whole blocks, blocks and a part (a last block shorter than its flags), enough to split
SIZES = [100, BLOCK, BLOCK + 3, 2 * BLOCK - 1, (threads._MIN_SPLIT_WORK // ELEMENT_COST) * 3 + 5]


@pytest.mark.parametrize("n", SIZES)
def test_gelu_fused_equals_op_sequence(n):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32) * 4
    e = erf(x / np.float32(np.sqrt(2.0)))
    unfused = np.float32(0.5) * x * (np.float32(1.0) + e)
    np.testing.assert_array_equal(gelu_erf(x), unfused)
    np.testing.assert_array_equal(erf(x), _correctly_rounded(x))


@pytest.mark.parametrize("n", SIZES)
def test_a_forwards_threads_split_erf_and_gelu_into_chunks_with_the_same_bits(n, monkeypatch):
    x = np.random.default_rng(n + 1).uniform(-5, 5, n).astype(np.float32)
    x[::97] = np.nan
    want_erf, want_gelu = erf(x), gelu_erf(x)  # outside a forward: one thread
    counts = []
    real = threads.run_chunks
    monkeypatch.setattr(threads, "run_chunks", lambda count, fn: counts.append(count) or real(count, fn))
    with threadpool_limits(2, "blas"), threads.forward_threads():
        got_erf, got_gelu = erf(x), gelu_erf(x)
    np.testing.assert_array_equal(got_erf, want_erf)
    np.testing.assert_array_equal(got_gelu, want_gelu)
    # split in two when the work pays for it; else the kernel called once, without a job
    assert counts == ([2, 2] if n * ELEMENT_COST >= threads._MIN_SPLIT_WORK else [])
