"""Relu, Clip and LeakyRelu on the CPU (rlx_runtime/clamp.py and the kernels' CPU overrides): the same function as
the generic kernels (numpy's maximum/minimum against a scalar, np.where), bit for bit: signed zeros and NaN
payloads included, across the chunk boundaries of clamp's bound runs."""

from __future__ import annotations

import numpy as np
import pytest

from rlx_runtime import clamp
from rlx_runtime.backend import CPU
from rlx_runtime.kernels import KERNELS

RNG = np.random.default_rng(11)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")


def _bits(a: np.ndarray) -> np.ndarray:
    """The array's bit patterns (the test compares signed zeros and NaN payloads too)."""
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def _specials(n: int, dtype=np.float32) -> np.ndarray:
    x = (RNG.standard_normal(n) * 3).astype(dtype)
    x[::7] = np.nan
    x[1::11] = -np.nan  # x86's default NaN has its sign bit set
    x[2::13] = np.inf
    x[3::17] = -np.inf
    x[4::5] = -0.0
    x[5::19] = 0.0
    return x


SIZES = [0, 1, 31, clamp.CHUNK - 1, clamp.CHUNK, clamp.CHUNK + 1, 3 * clamp.CHUNK + 17]
BOUNDS = [(0.0, None), (None, 6.0), (0.0, 6.0), (-0.5, 0.75), (0.0, -0.0), (1.0, -1.0), (np.nan, 1.0),
          (None, np.nan), (-0.0, None)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("lo,hi", BOUNDS, ids=str)
def test_clamp_is_numpys_maximum_then_minimum_with_scalars(n, lo, hi):
    x = _specials(n)
    want = x
    if lo is not None:
        want = np.maximum(want, np.float32(lo))
    if hi is not None:
        want = np.minimum(want, np.float32(hi))
    got = clamp.clamp(x, lo, hi)
    np.testing.assert_array_equal(_bits(got), _bits(want))
    inplace = x.copy()
    assert clamp.clamp(inplace, lo, hi, out=inplace) is inplace
    np.testing.assert_array_equal(_bits(inplace), _bits(want))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_clamp_other_float_dtypes(dtype):
    x = _specials(clamp.CHUNK + 5, dtype)
    np.testing.assert_array_equal(_bits(clamp.clamp(x, 0.0, 6.0)),
                                  _bits(np.minimum(np.maximum(x, dtype(0.0)), dtype(6.0))))


def test_clamp_of_a_strided_view_and_without_bounds():
    x = _specials(3 * clamp.CHUNK + 9).reshape(-1, 3)[:, 1]
    assert not x.flags.c_contiguous
    np.testing.assert_array_equal(_bits(clamp.relu(x)), _bits(np.maximum(x, np.float32(0))))
    y = clamp.clamp(x, None, None)
    assert y is not x
    np.testing.assert_array_equal(_bits(y), _bits(x))
    z = _specials(40)
    np.testing.assert_array_equal(_bits(clamp.clamp(z, None, None)), _bits(z))


def test_clamp_bound_runs_are_read_only_and_shared():
    a = clamp._run(np.dtype(np.float32), np.float32(6.0))
    assert a is clamp._run(np.dtype(np.float32), np.float32(6.0)) and not a.flags.writeable
    assert a.size == clamp.CHUNK and (a == 6).all()
    assert np.signbit(clamp._run(np.dtype(np.float32), np.float32(-0.0))).all()  # not the cached 0.0 run
    assert not np.signbit(clamp._run(np.dtype(np.float32), np.float32(0.0))).any()


@pytest.mark.parametrize("shape", [(3, 5, 7), (2, clamp.CHUNK + 3), ()])
def test_cpu_relu_kernel_is_the_generic_one(shape):
    x = _specials(int(np.prod(shape))).reshape(shape)
    np.testing.assert_array_equal(_bits(np.asarray(CPU.kernel("Relu")(np, {}, x))),
                                  _bits(np.asarray(KERNELS["Relu"](np, {}, x))))


@pytest.mark.parametrize("attrs,ins", [({"min": 0.0, "max": 6.0}, ()),
                                       ({"min": None, "max": None}, (np.float32(-1), np.float32(2))),
                                       ({"min": None, "max": None}, (np.array(0.5, np.float32),)),
                                       ({"min": None, "max": None}, (None, np.array([1.5], np.float32))),
                                       ({"min": -1.0, "max": None}, ())])
def test_cpu_clip_kernel_is_the_generic_one(attrs, ins):
    x = _specials(3 * clamp.CHUNK + 3).reshape(3, -1)
    got = CPU.kernel("Clip")(np, attrs, x, *ins)
    np.testing.assert_array_equal(_bits(got), _bits(KERNELS["Clip"](np, attrs, x, *ins)))


def test_cpu_clip_of_integers_and_without_bounds():
    x = np.arange(-5, 6, dtype=np.int32)
    np.testing.assert_array_equal(CPU.kernel("Clip")(np, {"min": -2, "max": 3}, x), np.clip(x, -2, 3))
    y = _specials(10)
    assert CPU.kernel("Clip")(np, {"min": None, "max": None}, y) is y  # an alias, as the generic kernel


@pytest.mark.parametrize("alpha", [0.0, 0.01, 0.2, 1.0, 1.5, -0.3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_cpu_leaky_relu_is_the_generic_one(alpha, dtype):
    x = _specials(1000, dtype)
    got = CPU.kernel("LeakyRelu")(np, {"alpha": alpha}, x)
    np.testing.assert_array_equal(_bits(got), _bits(KERNELS["LeakyRelu"](np, {"alpha": alpha}, x)))


def test_large_arrays_go_through_the_bound_runs_and_small_ones_do_not(monkeypatch):
    """The runs are the point (numpy's maximum with a scalar ran ~4x slower); below SMALL elements finding the
    run costs more than it saves."""
    calls = []
    real = clamp._run
    monkeypatch.setattr(clamp, "_run", lambda *a: calls.append(1) or real(*a))
    clamp.relu(np.ones(1000, np.float32))  # a squeeze-excite block's
    assert not calls
    clamp.relu(np.ones(64 * 56 * 56, np.float32))  # a ResNet stage's activation
    assert calls


# ------------------------------------------------------------------ Mul: a tensor times one value per row
def _same_up_to_nan_payloads(got, want):
    """Bit for bit, but which NaN an operation on two NaNs gives (IEEE leaves it open: numpy's broadcast loop takes
    the broadcast operand's, a plain product the first's; a compiled sum's operand order is LLVM's, which may
    commute an add, and differed between two compilations of the same row kernel on Zen 3)."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(_bits(got[keep]), _bits(want[keep]))


def _nan_payloads(shape, seed):
    """float32 values with NaNs of two payloads (and both signs), zeros of both signs and infinities."""
    r = np.random.default_rng(seed)
    x = r.standard_normal(shape).astype(np.float32)
    bits = x.reshape(-1).view(np.uint32)
    bits[::5] = 0x7FC00001
    bits[2::7] = 0xFFC00123
    bits[3::11] = 0x80000000
    bits[4::13] = 0x7F800000
    bits[6::17] = 0
    return x


@pytest.mark.parametrize("big,small", [((1, 24, 7, 7), (1, 24, 1, 1)), ((2, 5, 4, 8), (2, 5, 1, 1)),
                                       ((3, 40), (3, 1)), ((1, 6, 9, 9), (1, 1, 1, 1)), ((2, 3, 16), (2, 3, 1))],
                         ids=str)
@pytest.mark.parametrize("small_first", [False, True])
def test_row_scale_multiply_is_numpys_bit_for_bit(big, small, small_first):
    from rlx_format.numba_setup import numba  # noqa: F401 - the row kernel runs once numba is loaded
    from rlx_runtime.kernels.elementwise import multiply_cpu
    a, s = _nan_payloads(big, 1), _nan_payloads(small, 2)
    x, y = (s, a) if small_first else (a, s)
    want = np.multiply(x, y)
    _same_up_to_nan_payloads(multiply_cpu(x, y), want)
    _same_up_to_nan_payloads(CPU.kernel("Mul")(np, {}, x, y), want)
    if not small_first:
        inplace = a.copy()
        assert multiply_cpu(inplace, s, out=inplace) is inplace
        _same_up_to_nan_payloads(inplace, want)


def test_row_scale_multiply_takes_the_kernel_only_where_it_applies(monkeypatch):
    from rlx_format.numba_setup import numba  # noqa: F401
    from rlx_runtime import conv_kernels
    from rlx_runtime.kernels import elementwise
    calls = []
    real = conv_kernels.scale_rows
    monkeypatch.setattr(conv_kernels, "scale_rows", lambda *a: calls.append(1) or real(*a))
    f = np.ones((1, 24, 7, 7), np.float32)
    cases = [(f, np.ones((1, 24, 1, 1), np.float32), True),
             (np.ones((2, 24, 7, 7), np.float32), np.ones((1, 24, 1, 1), np.float32), False),  # batch broadcast
             (f, np.ones((1, 1, 7, 7), np.float32), False),  # not one value per row
             (f, np.ones((1, 24, 7, 1), np.float32), False),  # rows of 7: shorter than MIN_ROW
             (f.astype(np.float64), np.ones((1, 24, 1, 1)), False),
             (f, np.float32(2), False)]
    for x, y, taken in cases:
        calls.clear()
        np.testing.assert_array_equal(elementwise.multiply_cpu(x, y), np.multiply(x, y))
        assert bool(calls) == taken, (x.shape, np.shape(y))
    monkeypatch.setitem(__import__("sys").modules, "numba", None)
    calls.clear()
    elementwise.multiply_cpu(*cases[0][:2])
    assert not calls  # numba not loaded: numpy's multiply


def test_a_squeeze_excite_mul_in_a_plan_takes_the_row_kernel(monkeypatch):
    """Mul(x, s) computed in place on a dying x in the generated code, and by the kernel otherwise."""
    from rlx_format import GraphBuilder
    from rlx_format.numba_setup import numba  # noqa: F401
    from rlx_runtime import Session, conv_kernels
    calls = []
    real = conv_kernels.scale_rows
    monkeypatch.setattr(conv_kernels, "scale_rows", lambda *a: calls.append(1) or real(*a))
    g = GraphBuilder("se")
    x = g.input("x", "f32", [1, 16, 8, 8])
    s = g.input("s", "f32", [1, 16, 1, 1])
    y = g.op("Neg", x, name="y")  # a fresh buffer that dies at the Mul: multiplied in place
    g.output(g.op("Mul", y, s, name="out"))
    g.output(g.op("Mul", s, x, name="out2"))  # x is an input: the kernel
    xv, sv = _nan_payloads((1, 16, 8, 8), 3), _nan_payloads((1, 16, 1, 1), 4)
    got = Session().compile(g.build()).run({"x": xv, "s": sv})
    assert len(calls) == 2
    _same_up_to_nan_payloads(got["out"], np.multiply(-xv, sv))
    _same_up_to_nan_payloads(got["out2"], np.multiply(sv, xv))


@pytest.mark.parametrize("shape", [(1, 24, 7, 7), (2, 13, 5, 9), (1, 3, 40, 40)], ids=str)
def test_split_scale_and_channel_means_are_the_unsplit_ones(shape, monkeypatch):
    """At 2 threads with every split taken (threads.stream_rows: native rows, a run of channels per thread), a
    squeeze-excite scale (out of place and in place) and GlobalAveragePool give the one-thread bits."""
    from threadpoolctl import threadpool_limits

    from rlx_format.numba_setup import numba  # noqa: F401 - the row kernels run once numba is loaded
    from rlx_runtime import pool_kernels, threads
    from rlx_runtime.kernels.elementwise import multiply_cpu
    a, s = _nan_payloads(shape, 5), _nan_payloads(shape[:2] + (1, 1), 6)
    gap = CPU.kernel("GlobalAveragePool")
    with threadpool_limits(1, "blas"), threads.forward_threads():
        want, want_means = multiply_cpu(a, s), gap(np, {}, a)
    monkeypatch.setattr(threads, "_MIN_SPLIT_WORK", 0)
    rows = []
    for name in ("put_scale", "put_means"):
        real = getattr(pool_kernels, name)
        monkeypatch.setattr(pool_kernels, name, lambda *args, _r=real, _n=name: rows.append(_n) or _r(*args))
    with threadpool_limits(2, "blas"), threads.forward_threads():
        got, means = multiply_cpu(a, s), gap(np, {}, a)
        inplace = a.copy()
        assert multiply_cpu(inplace, s, out=inplace) is inplace
    assert rows.count("put_scale") == 4 and rows.count("put_means") == 2  # two chunks each
    _same_up_to_nan_payloads(got, want)
    _same_up_to_nan_payloads(inplace, want)
    _same_up_to_nan_payloads(means, want_means)
