"""The CPU speed paths: numba Sigmoid/SiLU (float32 arithmetic, at most 2 ulp from the correctly rounded
sigmoid), the Mul(x, Sigmoid(x)) -> Silu fusion (bit-equal results), and the 1x1 convolution that uses its
input as the column matrix (equal to the im2col path)."""

import numpy as np
import pytest

from rlx_format import GraphBuilder
from rlx_runtime import CompileOptions, Session
from rlx_runtime.kernels import KERNELS
from rlx_runtime.passes import PassReport, fuse
from rlx_runtime.ufuncs import sigmoid, silu


def _reference(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in float32 steps (finite, same-sign-aware ordering of the bit patterns)."""
    def order(v):
        i = v.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(order(a) - order(b))


def _samples(seed: int) -> np.ndarray:
    r = np.random.default_rng(seed)
    bits = r.integers(0, 2**32, 300_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.4e38, -3.4e38, 17.3, -17.3, 40.0, -40.0,
                      88.7, -88.7, 103.9, -103.9, 104.0, -104.0, 110.0, -110.0], np.float32)
    return np.concatenate([bits, (r.standard_normal(700_000) * 20).astype(np.float32),
                           np.linspace(-110, 110, 200_001, dtype=np.float32), edges])


def _ulps_from_rounded(x: np.ndarray) -> np.ndarray:
    got, ref = sigmoid(x), _reference(x)
    nan = np.isnan(x)
    assert np.isnan(got[nan]).all()
    assert got[~nan].min() >= 0 and got[~nan].max() <= 1
    d = _ulps(got[~nan], ref[~nan])
    assert d.max() <= 2
    return d


@pytest.mark.parametrize("seed", range(2))
def test_sigmoid_f32_within_two_ulp_of_the_correctly_rounded_value(seed):
    d = _ulps_from_rounded(_samples(seed))
    assert (d > 1).mean() < 0.01  # measured 0.13% of these samples (0.01% of all float32 in [-110, 110])


@pytest.mark.slow
def test_sigmoid_f32_within_two_ulp_on_a_third_of_all_floats_in_range():
    """Every third float32 bit pattern in [-110, 110] (beyond, the result is exactly 0 or 1)."""
    top = int(np.float32(110).view(np.int32))
    for sign in (0, 1 << 31):
        for start in range(0, top + 1, 3 << 22):
            bits = np.arange(start, min(start + (3 << 22), top + 1), 3, dtype=np.uint32) | np.uint32(sign)
            _ulps_from_rounded(bits.view(np.float32))


def test_sigmoid_special_values():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 200.0, -200.0, -103.9], np.float32)
    got = sigmoid(x)
    np.testing.assert_array_equal(got[:4], [0.5, 0.5, 1.0, 0.0])
    assert np.isnan(got[4]) and got[5] == 1.0 and got[6] == 0.0
    assert got[7] == np.float32(1e-45)  # the subnormal result, not flushed to zero
    assert sigmoid(np.float32(1.0) * np.ones((), np.float32)).shape == ()


def test_strided_inputs_and_silu_is_x_times_sigmoid():
    x = (np.random.default_rng(4).standard_normal((3, 5000)) * 10).astype(np.float32)
    whole = sigmoid(x)
    np.testing.assert_array_equal(sigmoid(x[:, ::3]), whole[:, ::3])
    np.testing.assert_array_equal(sigmoid(x.T), whole.T)
    np.testing.assert_array_equal(silu(x), x * whole)
    assert silu(x).dtype == np.float32 and sigmoid(x).shape == x.shape


def test_other_dtypes_match_scipy_within_an_ulp():
    import scipy.special as sp  # the oracle only: rlx itself does not use scipy

    # the exact value, in extended precision (scipy's expit flushes to 0 below -709: exp(-x) overflows)
    x = np.concatenate([np.linspace(-700, 700, 2801), [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300, -1e-300]])
    exact = (1 / (1 + np.exp(-x.astype(np.longdouble)))).astype(np.float64)
    got = sigmoid(x)
    assert got.dtype == np.float64
    np.testing.assert_array_max_ulp(got[np.isfinite(x)], exact[np.isfinite(x)], maxulp=2)
    np.testing.assert_array_max_ulp(got[np.isfinite(x)], sp.expit(x)[np.isfinite(x)], maxulp=2)
    assert got[-5] == 1.0 and got[-4] == 0.0 and np.isnan(got[-3])
    assert sigmoid(np.array([-745.0]))[0] > 0  # no premature underflow to 0
    np.testing.assert_array_max_ulp(silu(x[:2801]), x[:2801] * exact[:2801], maxulp=2)
    h = np.linspace(-12, 12, 97).astype(np.float16)
    assert sigmoid(h).dtype == np.float16
    np.testing.assert_array_equal(sigmoid(h), sp.expit(h.astype(np.float32)).astype(np.float16))


def _sigmoid_mul_graph(extra_use: bool, swap: bool):
    g = GraphBuilder()
    x = g.input("x", "f32", [2, 64])
    s = g.sigmoid(x)
    y = g.mul(s, x, name="y") if swap else g.mul(x, s, name="y")
    g.output(y)
    if extra_use:
        g.output(g.neg(s, name="z"))
    return g.build()


@pytest.mark.parametrize("swap", [False, True])
def test_sigmoid_mul_fuses_to_silu_with_equal_results(swap):
    graph = _sigmoid_mul_graph(False, swap)
    fused = fuse(graph.copy(), PassReport())
    assert [n.op for n in fused.nodes] == ["Silu"]
    x = (np.random.default_rng(3).standard_normal((2, 64)) * 8).astype(np.float32)
    plain = Session().compile(graph).run({"x": x})["y"]  # compile() does not optimize
    opt = Session().compile_with(graph, CompileOptions())
    assert opt.plan_ops() == ["Silu"]
    np.testing.assert_array_equal(opt.run({"x": x})["y"], plain)


def test_sigmoid_with_another_consumer_or_of_another_tensor_is_not_fused():
    fused = fuse(_sigmoid_mul_graph(True, False).copy(), PassReport())
    assert sorted(n.op for n in fused.nodes) == ["Mul", "Neg", "Sigmoid"]
    g = GraphBuilder()
    x, z = g.input("x", "f32", [4]), g.input("z", "f32", [4])
    g.output(g.mul(x, g.sigmoid(z), name="y"))
    assert sorted(n.op for n in fuse(g.build().copy(), PassReport()).nodes) == ["Mul", "Sigmoid"]


@pytest.mark.parametrize("strides,n,g", [([1, 1], 1, 1), ([2, 3], 2, 1), ([1, 1], 2, 2), ([2, 1], 1, 4)])
def test_1x1_conv_equals_the_im2col_path(strides, n, g):
    r = np.random.default_rng(len(strides) + n + g)
    x = r.standard_normal((n, 8, 7, 9)).astype(np.float32)
    w = r.standard_normal((12, 8 // g, 1, 1)).astype(np.float32)
    b = r.standard_normal(12).astype(np.float32)
    a = {"strides": strides, "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": g}
    got = KERNELS["Conv"](np, a, x, w, b)
    # the same conv through im2col: a 1x1 kernel padded to 1x2 with a zero column is the same sum
    w2 = np.concatenate([w, np.zeros_like(w)], axis=3)
    xpad = np.concatenate([x, np.zeros_like(x[..., :1])], axis=3)
    ref = KERNELS["Conv"](np, a, xpad, w2, b)
    assert got.shape == ref.shape and got.flags.c_contiguous
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    x64 = x.astype(np.float64)
    direct = np.einsum("nchw,oc->nohw", x64[:, :, ::strides[0], ::strides[1]], w[:, :, 0, 0].astype(np.float64)) \
        if g == 1 else None
    if direct is not None:
        np.testing.assert_allclose(got, direct + b.reshape(1, -1, 1, 1), rtol=1e-5, atol=1e-5)


def test_the_runtime_never_imports_scipy_and_sigmoid_alone_never_loads_the_erf_tables():
    """scipy is not a runtime dependency: graphs with Erf, Gelu, Sigmoid and Silu in float32 and float64
    run without it; the erf tables wait for the first Erf/Gelu."""
    import subprocess
    import sys

    code = ("import sys, importlib.abc\n"
            "class NoScipy(importlib.abc.MetaPathFinder):\n"  # as if scipy were not installed
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'scipy' or name.startswith('scipy.'):\n"
            "            raise ImportError('scipy is blocked in this test')\n"
            "sys.meta_path.insert(0, NoScipy())\n"
            "import numpy as np\n"
            "from rlx_runtime import ufuncs as u\n"
            "u.silu(u.sigmoid(np.ones(8, np.float32)))\n"
            "assert u._tables.cache_info().currsize == 0\n"
            "u.erf(np.ones(8, np.float32))\n"
            "assert u._tables.cache_info().currsize == 1\n"
            "from rlx_format import GraphBuilder\n"
            "from rlx_runtime import Session\n"
            "for dt, npdt in (('f32', np.float32), ('f64', np.float64)):\n"
            "    g = GraphBuilder()\n"
            "    x = g.input('x', dt, [4, 8])\n"
            "    g.output(g.add(g.add(g.erf(x), g.gelu(x)), g.add(g.sigmoid(x), g.silu(x)), name='y'))\n"
            "    v = np.linspace(-3, 3, 32).reshape(4, 8).astype(npdt)\n"
            "    y = Session().compile(g.build()).run({'x': v})['y']\n"
            "    e = np.array([__import__('math').erf(t) for t in v.ravel().tolist()]).reshape(4, 8)\n"
            "    s = 1 / (1 + np.exp(-v.astype(np.float64)))\n"
            "    half = np.array([__import__('math').erf(t / 2 ** 0.5) for t in v.ravel()]).reshape(4, 8)\n"
            "    want = e + 0.5 * v * (1 + half) + s + v * s\n"
            "    assert np.allclose(y, want, rtol=1e-5, atol=1e-6), (dt, abs(y - want).max())\n"
            "assert 'scipy' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def _conv_reference(x, w, b, strides, dil, pads, g):
    """Direct float64 convolution on an explicitly padded input (any rank)."""
    nsp = x.ndim - 2
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)])
    k = w.shape[2:]
    out = [(xp.shape[2 + i] - (k[i] - 1) * dil[i] - 1) // strides[i] + 1 for i in range(nsp)]
    n, c = x.shape[:2]
    o = w.shape[0]
    y = np.zeros((n, o, *out))
    for pos in np.ndindex(*k):
        win = xp[(slice(None), slice(None)) + tuple(
            slice(pos[i] * dil[i], pos[i] * dil[i] + (out[i] - 1) * strides[i] + 1, strides[i]) for i in range(nsp))]
        for gi in range(g):
            xs = win[:, gi * (c // g):(gi + 1) * (c // g)]
            ws = w[(slice(gi * (o // g), (gi + 1) * (o // g)), slice(None)) + pos].astype(np.float64)
            y[:, gi * (o // g):(gi + 1) * (o // g)] += np.einsum("nc...,oc->no...", xs, ws)
    return y + b.reshape((1, o) + (1,) * nsp)


@pytest.mark.parametrize("seed", range(40))
def test_im2col_with_pads_up_to_twice_the_kernel_matches_direct_convolution(seed):
    """Pads larger than the window (kernel offsets that read only padding), strides, dilations, groups."""
    r = np.random.default_rng(seed)
    nsp = int(r.integers(1, 4))
    g = int(r.choice([1, 2]))
    k = [int(r.integers(1, 4)) for _ in range(nsp)]
    dil = [int(r.integers(1, 3)) for _ in range(nsp)]
    strides = [int(r.integers(1, 4)) for _ in range(nsp)]
    pads = [int(r.integers(0, 2 * k[i % nsp] + 1)) for i in range(2 * nsp)]
    sp = [int(r.integers(1, 7)) for _ in range(nsp)]
    if any(sp[i] + pads[i] + pads[i + nsp] < (k[i] - 1) * dil[i] + 1 for i in range(nsp)):
        pads = [p + (k[i % nsp] - 1) * dil[i % nsp] + 1 for i, p in enumerate(pads)]  # the window must fit
    x = r.standard_normal([2, 2 * g] + sp).astype(np.float32)
    w = r.standard_normal([3 * g, 2] + k).astype(np.float32)
    b = r.standard_normal(3 * g).astype(np.float32)
    a = {"strides": strides, "dilations": dil, "pads": pads, "group": g}
    got = KERNELS["Conv"](np, a, x, w, b)
    np.testing.assert_allclose(got, _conv_reference(x, w, b, strides, dil, pads, g), rtol=1e-5, atol=1e-5)


def _pow_onnx(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    import onnxruntime as ort
    from onnx import TensorProto, helper
    g = helper.make_graph([helper.make_node("Pow", ["x", "y"], ["z"])], "p",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y.shape))],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "y": y})[0]


@pytest.mark.parametrize("e", [2.0, 3.0])
@pytest.mark.parametrize("yshape", [(), (1,), (1, 1)])
def test_pow_by_two_or_three_is_onnxruntimes_products(e, yshape):
    """x*x and (x*x)*x: onnxruntime's values to the bit, negatives, subnormals, Inf and NaN included (numpy's
    float pow differs in the last place and differs between SIMD paths)."""
    r = np.random.default_rng(3)
    x = np.concatenate([r.standard_normal(5000) * 10, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -3e12, 5e-39]])
    x = x.astype(np.float32).reshape(2, -1)
    y = np.full(yshape, e, np.float32)
    with np.errstate(all="ignore"):
        got = _run_pow(x, y)
    ref = _pow_onnx(x, y)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))


def _run_pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    g = GraphBuilder("pow")
    g.output(g.op("Pow", g.input("x", "f32", list(x.shape)), g.input("y", "f32", list(y.shape)), name="z"))
    return Session().compile(g.build()).run({"x": x, "y": y})["z"]


@pytest.mark.parametrize("y", [np.float32(2.5), np.float32(-1.0), np.array([2.0, 3.0], np.float32),
                               np.full((1, 1, 1), 3.0, np.float32)])
def test_other_exponents_are_numpys_power(y):
    x = np.abs(np.random.default_rng(4).standard_normal((3, 2)).astype(np.float32)) + 0.5
    got = _run_pow(x, np.asarray(y))
    np.testing.assert_array_equal(got, np.power(x, np.asarray(y)))


# ---------------------------------------------------------------- float32 tanh (ufuncs.tanh_f32_loop)
def _tanh_ulps(x: np.ndarray) -> np.ndarray:
    from rlx_runtime.ufuncs import tanh_f32
    got = tanh_f32(x)
    ref = np.tanh(x.astype(np.float64)).astype(np.float32)
    return np.abs(got.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))


def test_tanh_f32_is_within_its_ulp_bound_on_samples():
    """Within TANH_ULPS of the correctly rounded tanh (float64's, rounded) on 2M samples across both branches,
    the split at 0.625, tiny and subnormal inputs and the saturated tail."""
    from rlx_runtime.ufuncs import TANH_ULPS
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(1 << 20) * 3, rng.uniform(-0.7, 0.7, 1 << 19),
                        rng.uniform(-1e-3, 1e-3, 1 << 17), np.float32(2.0) ** -rng.uniform(20, 149, 1 << 16),
                        rng.uniform(-40, 40, 1 << 17)]).astype(np.float32)
    assert _tanh_ulps(x).max() <= TANH_ULPS


@pytest.mark.slow
def test_tanh_f32_is_within_its_ulp_bound_on_every_third_float32_up_to_20():
    from rlx_runtime.ufuncs import TANH_ULPS
    bits = np.arange(0, np.float32(20).view(np.uint32) + 1, 3, dtype=np.uint32)
    for part in np.array_split(bits, 8):
        x = part.view(np.float32)
        assert _tanh_ulps(x).max() <= TANH_ULPS and _tanh_ulps(-x).max() <= TANH_ULPS


def test_tanh_f32_special_values():
    from rlx_runtime.ufuncs import tanh_f32
    from rlx_runtime.ufuncs import TANH_ULPS
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 200.0, -200.0], np.float32)
    got = tanh_f32(x)
    assert np.isnan(got[0])
    np.testing.assert_array_equal(got[1:], np.array([1, -1, 0, -0.0, 1e-45, -1e-45, 1, -1], np.float32))
    split = (np.float32(0.625).view(np.int32) + np.arange(-4, 5, dtype=np.int32)).view(np.float32)
    assert _tanh_ulps(split).max() <= TANH_ULPS and _tanh_ulps(-split).max() <= TANH_ULPS
    assert np.signbit(got[4]) and not np.signbit(got[3])  # -0 keeps its sign
