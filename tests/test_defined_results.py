"""Defined results where C and numpy leave the answer to the CPU (spec/ops.md, "Defined results").

Float -> integer conversions of NaN, ±Inf and out-of-range values are undefined behaviour in C and
differ between SIMD paths (an AVX2 and an AVX-512 machine gave different Q8_0 bytes for a block with a
subnormal scale). rlx defines each case; these tests check the rule, and check that the compiled
kernels give the same bytes when numba targets another CPU and numpy's SIMD dispatch is lowered.
"""

import math
import os
import platform
import subprocess
import sys
from pathlib import Path

import gguf.quants as gq
import numpy as np
import pytest
from conftest import run_op
from cpu_target_probe import codec_inputs, compute, dot_inputs, special_floats
from test_codecs import ORACLE_NAMES
from gguf import GGMLQuantizationType as T
from hypothesis import given, settings
from hypothesis import strategies as st

from rlx_bake import BakeOptions, bake
from rlx_format import GraphBuilder, RlxError
from rlx_format.codecs import CODECS
from rlx_format.quants import dequantize, dequantize_q8_0, dequantize_tq2_0, quantize, quantize_q8_0, quantize_tq2_0

HERE = Path(__file__).parent
INT_TYPES = {"i8": np.int8, "u8": np.uint8, "i16": np.int16, "i32": np.int32, "i64": np.int64}

# ---------------------------------------------------------------------------------------- codecs

# Blocks where the reference's float -> int cast of inf/NaN is CPU-dependent: compared by dequantized
# values (and our bytes by the rule), not byte for byte with gguf.
CPU_DEPENDENT = {"subnormal", "just_below_overflow", "min_subnormal"}


@pytest.mark.parametrize("name", sorted(codec_inputs()))
@pytest.mark.parametrize("enc", ORACLE_NAMES)  # the K-quants' edge blocks: test_kquants.py
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the oracle overflows / casts inf on these blocks
def test_codec_edge_blocks(name, enc):
    x = codec_inputs()[name]
    c = CODECS[enc]
    qt = T[c.ggml]
    ours = quantize(x, enc)
    blocks = ours.reshape(-1, c.nbytes)
    if not c.scale_offsets:  # MXFP4: below amax 2^-125 the reference casts a negative exponent to uint8
        if name in CPU_DEPENDENT:  # the rule: scale byte 0 (2^-128), codes the nearest there (first on ties)
            assert not blocks[:, 0].any()
            vals = np.float32(2.0**-128) * np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                                                    np.float32)
            idx = np.abs(vals - x.reshape(-1, 2, 16)[..., None]).argmin(-1).astype(np.uint8)
            np.testing.assert_array_equal(blocks[:, 1:], idx[:, 0] | (idx[:, 1] << 4))
            return
    with np.errstate(all="ignore"):
        ref = gq.quantize(x, qt)
        np.testing.assert_array_equal(dequantize(ours, enc), gq.dequantize(ref, qt).reshape(x.shape))
    if name == "wide_range" and len(c.scale_offsets) == 2:
        # max - min overflows: d is inf, 1/d is 0 and (x - min) * 0 is NaN for x = max, which the reference
        # casts to an integer (CPU-dependent). The rule: a NaN code is 0, so every code here is 0.
        assert not np.delete(ours.reshape(-1, c.nbytes), range(4), axis=1).any()
        return
    if name not in CPU_DEPENDENT:
        np.testing.assert_array_equal(ours, ref)  # well defined in the reference: the same bytes
        return
    # the rule: 1/d overflowed, so every code is the code of 0 (Q4_0 stores 8, TQ2_0 stores 1, ...) and
    # the fp16 scale d is 0
    codes = np.ones(c.nbytes, bool)
    for off in c.scale_offsets:
        codes[off:off + 2] = False
    zero = quantize(np.zeros((1, c.block), np.float32), enc).reshape(-1)
    np.testing.assert_array_equal(blocks[:, codes], np.broadcast_to(zero[codes], blocks[:, codes].shape))
    d = blocks[:, c.scale_offsets[0]:c.scale_offsets[0] + 2].copy().view(np.float16)
    assert (d == 0).all()
    if enc == "gguf_q8_0":
        assert not blocks.any()
    if enc == "gguf_tq2_0":
        assert not blocks[:, 64:].any() and (blocks[:, :64] == 0b01010101).all()


def test_codec_overflow_threshold_is_where_the_reciprocal_overflows():
    """Just above the threshold the codes follow the reference exactly (1/d is finite, even for a
    subnormal d); the rule only takes over where the reference itself is undefined."""
    for scale, defined in ((2.0**-126, True), (2.0**-127.9, True), (2.0**-128.5, False)):
        d = np.float32(scale)
        x = np.array([d * 127] + [d * k for k in range(-15, 16)], np.float32)  # amax / 127 == d
        with np.errstate(all="ignore"):
            inv = np.float32(1) / (x.max() / np.float32(127))
        assert math.isfinite(inv) == defined
        ours = quantize_q8_0(x)
        if defined:
            with np.errstate(all="ignore"):
                np.testing.assert_array_equal(ours, gq.quantize(x, T.Q8_0))
        else:
            assert not ours.any()


def test_q8_0_pass_keeps_weights_whose_scale_overflows_fp16_dense():
    """A block with amax / 127 > 65504 stores an infinite fp16 scale (as the reference does): the bake's
    Q8_0 pass must not use it (it would dequantize to Inf/NaN) and says why in the report."""
    g = GraphBuilder("big")
    x = g.input("x", "f32", ["b", 32])
    g.output(g.matmul(x, g.param("w", "f32", [32, 4]), name="y"))
    w = np.ones((32, 4), np.float32)
    w[3, 1] = 1e7
    rf, report = bake(g.build(), {"w": w}, BakeOptions.from_profile("size"))
    assert all(n.op != "DequantMatMul" for n in rf.graph.nodes)
    assert any("'w'" in note and "kept dense" in note for note in report.notes)
    w[3, 1] = 1e5  # representable: quantized as usual
    rf, _ = bake(g.build(), {"w": w}, BakeOptions.from_profile("size"))
    assert any(n.op == "DequantMatMul" for n in rf.graph.nodes)


# ------------------------------------------------------------------------------------ DequantMatMul


@pytest.mark.parametrize("enc,q,dq", [("gguf_q8_0", quantize_q8_0, dequantize_q8_0),
                                      ("gguf_tq2_0", quantize_tq2_0, dequantize_tq2_0)])
@pytest.mark.parametrize("m", [3, 20])
def test_dequant_matmul_keeps_ieee_nan_and_inf(enc, q, dq, m):
    """NaN/Inf in the activations give NaN/Inf exactly where the f64 reference has them (the fused
    kernels may reassociate, but must not assume finite inputs)."""
    x, w = dot_inputs()
    packed = q(w)
    out = run_op("DequantMatMul", [x[:m], packed], {"encoding": enc, "N": 24, "K": 256}, consts=(1,))
    with np.errstate(invalid="ignore", over="ignore"):
        ref = x[:m].astype(np.float64) @ dq(packed).astype(np.float64).T
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(ref))
    fin = np.isfinite(ref)
    assert np.isnan(ref).any() and np.isinf(ref).any()  # the cases are really there
    np.testing.assert_allclose(out[fin], ref[fin], rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------- Cast


def _saturate(v: float, to: str) -> int:
    info = np.iinfo(INT_TYPES[to])
    if math.isnan(v):
        return 0
    if math.isinf(v):
        return info.max if v > 0 else info.min
    return min(max(math.trunc(v), info.min), info.max)


@pytest.mark.parametrize("to", sorted(INT_TYPES))
@pytest.mark.parametrize("fdt", [np.float16, np.float32, np.float64])
def test_cast_float_to_int_rule_on_edges(to, fdt):
    with np.errstate(over="ignore"):
        f = special_floats().astype(fdt)
    out = run_op("Cast", [f], {"to": to})
    assert out.dtype == INT_TYPES[to]
    expect = np.array([_saturate(float(v), to) for v in f], INT_TYPES[to])
    np.testing.assert_array_equal(out, expect)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=1, max_size=40),
       st.sampled_from(sorted(INT_TYPES)), st.sampled_from(["f16", "f32", "f64"]))
def test_property_cast_float_to_int(vals, to, fdt):
    npdt = {"f16": np.float16, "f32": np.float32, "f64": np.float64}[fdt]
    with np.errstate(over="ignore"):
        x = np.array(vals, np.float64).astype(npdt)
    g = GraphBuilder("cast")
    g.output(g.op("Cast", g.input("x", fdt, [len(vals)]), to=to, name="y"))
    from rlx_runtime import Session

    out = Session().compile(g.build()).run({"x": x})["y"]
    np.testing.assert_array_equal(out, [_saturate(float(v), to) for v in x])


def test_cast_folded_at_bake_follows_the_same_rule():
    g = GraphBuilder("fold")
    c = g.constant(np.array([np.nan, np.inf, -np.inf, 1e10, -3.7], np.float32), name="c")
    x = g.input("x", "i32", [5])
    g.output(g.add(x, g.op("Cast", c, to="i32"), name="y"))
    rf, _ = bake(g.build(), {}, BakeOptions.from_profile("exact"))
    assert all(n.op != "Cast" for n in rf.graph.nodes)  # folded into a constant
    from rlx_runtime import Session

    out = Session().compile(rf).run({"x": np.zeros(5, np.int32)})["y"]
    np.testing.assert_array_equal(out, [0, 2**31 - 1, -(2**31), 2**31 - 1, -3])


# -------------------------------------------------------------------------------------------- Range


def _range_graph(dtype: str):
    g = GraphBuilder("range")
    s, l, d = (g.input(n, dtype, []) for n in ("s", "l", "d"))
    g.output(g.op("Range", s, l, d, name="y"))
    from rlx_runtime import Session

    return Session().compile(g.build())


@settings(max_examples=150, deadline=None)
@given(st.integers(-2**62, 2**62), st.integers(-50, 50), st.integers(-2**62, 2**62).filter(bool))
def test_property_integer_range_is_exact(start, length_hint, delta):
    """The element count is computed with integers (Python's range is the oracle), never through a
    float division that rounds past 2^53."""
    limit = start + length_hint * delta + int(np.sign(delta)) * (abs(delta) // 3)
    if not -2**63 <= limit < 2**63:
        return
    out = _range_graph("i64").run({k: np.array(v, np.int64) for k, v in zip("sld", (start, limit, delta))})["y"]
    expect = list(range(start, limit, delta))
    assert out.dtype == np.int64 and out.tolist() == expect


def test_integer_range_past_2_to_53():
    c = _range_graph("i64")
    out = c.run({"s": np.array(0, np.int64), "l": np.array(2**53 + 1, np.int64), "d": np.array(2**53, np.int64)})
    assert out["y"].tolist() == [0, 2**53]  # float division would give one element


@settings(max_examples=100, deadline=None)
@given(st.floats(-1e3, 1e3), st.floats(-1e3, 1e3), st.floats(0.01, 100) | st.floats(-100, -0.01))
def test_property_float_range_matches_numpy(start, limit, delta):
    c = _range_graph("f64")
    out = c.run({"s": np.array(start), "l": np.array(limit), "d": np.array(delta)})["y"]
    np.testing.assert_allclose(out, np.arange(start, limit, delta), rtol=0, atol=1e-9 * (abs(start) + abs(limit)))


@pytest.mark.parametrize("s,l,d", [(0.0, np.inf, 1.0), (np.nan, 1.0, 1.0), (0.0, 5.0, 0.0), (0.0, 1.0, np.nan),
                                   (-np.inf, np.inf, 1.0), (0.0, 1.0, np.inf)])
def test_float_range_without_a_finite_length_is_refused(s, l, d):
    c = _range_graph("f32")
    with pytest.raises(RlxError, match=r"node 'y' \(Range\).*(expected finite values|delta is 0)"):
        c.run({"s": np.float32(s), "l": np.float32(l), "d": np.float32(d)})


def test_integer_range_with_zero_delta_is_refused():
    c = _range_graph("i32")
    with pytest.raises(RlxError, match=r"node 'y' \(Range\).*delta is 0"):
        c.run({"s": np.int32(0), "l": np.int32(4), "d": np.int32(0)})


# ------------------------------------------------------------------ other CPU targets, same results


def _targets() -> dict[str, dict[str, str]]:
    """Environment per emulated CPU: numba's target and numpy's dispatch lowered to what that CPU has."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    present = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)]

    def without(pred):
        return " ".join(f for f in present if pred(f))

    return {
        "avx2": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "",
                 "NPY_DISABLE_CPU_FEATURES": without(lambda f: "512" in f or f == "X86_V4")},
        "sse2": {"NUMBA_CPU_NAME": "generic",
                 "NPY_DISABLE_CPU_FEATURES": without(lambda f: f not in ("SSE", "SSE2", "SSE3", "SSSE3",
                                                                         "SSE41", "SSE42", "POPCNT",
                                                                         "X86_V2"))},
    }


# the fused Q8_0 / TQ2_0 / Q4_x / Q5_x dots are explicit vector IR (rlx_runtime/simd.py): one summation order everywhere
_SAME_BITS_DQMM = tuple(f"dqmm/gguf_{t}/3" for t in ("q8_0", "tq2_0", "q4_0", "q4_1", "q5_0", "q5_1"))


@pytest.fixture(scope="module")
def host_results():
    return compute()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="emulated targets are x86-64 CPUs")
@pytest.mark.parametrize("target", ["avx2", "sse2"])
def test_kernels_give_the_same_results_on_other_cpu_targets(target, host_results, tmp_path):
    env = {**os.environ, **_targets()[target], "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    out = tmp_path / "probe.npz"
    subprocess.run([sys.executable, str(HERE / "cpu_target_probe.py"), str(out)], env=env, check=True,
                   timeout=300, capture_output=True)
    with np.load(out) as z:
        other = {k.replace("__", "/"): z[k] for k in z.files}
    assert other.keys() == host_results.keys()
    for name, host in host_results.items():
        if name.startswith("dqmm/") and name not in _SAME_BITS_DQMM:  # BLAS or numba's vectorizer: the
            # summation order may differ: same NaN/Inf pattern, close values
            np.testing.assert_array_equal(np.isnan(other[name]), np.isnan(host), err_msg=name)
            np.testing.assert_array_equal(np.isinf(other[name]), np.isinf(host), err_msg=name)
            fin = np.isfinite(host)
            np.testing.assert_allclose(other[name][fin], host[fin], rtol=1e-5, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(other[name], host, err_msg=f"{name} differs on {target}")
