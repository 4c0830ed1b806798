"""K-quants (Q4_K, Q5_K, Q6_K): GGML's super-block layouts and reference quantizer.

gguf-py dequantizes these types but has no quantizer, so the quantizer is checked against GGML's C reference
(quantize_row_q{4,5,6}_K_ref of ggml commit 9a4acb374565 (github:ggerganov/ggml, src/ggml-quants.c), built
with `gcc -O2 -ffp-contract=off` into a shared library and called on the inputs of `_golden_inputs`, whose
bits are the same on every machine): GOLDEN holds the first 16 hex digits of the SHA-256 of the reference's
bytes per case, REF_RMSE the RMSE of the reference's bytes (decoded by gguf) on seeded numpy draws. No C
compiler or ggml source is needed at test time. The reference built with default flags (-march=native, which
lets gcc contract a*b+c into FMAs) gives different bytes for some blocks (measured: 120, 597 and 9 of 2000
Gaussian blocks for Q4_K, Q5_K, Q6_K); rlx defines the uncontracted result (spec/ops.md, "Quantized").

The decoders (array-op on numpy and on the cupy stand-in, and the numba block decoder behind the CPU kernels)
are checked bit for bit against gguf.quants.dequantize, on quantized weights and on random bytes.
"""

import hashlib

import fake_cupy
import gguf.quants as gq
import numpy as np
import pytest
from conftest import run_op
from cpu_target_probe import codec_inputs
from gguf import GGMLQuantizationType as T
from test_bake import run_baked
from test_cli import invoke

from rlx_bake.loader import write_bundle
from rlx_format import GraphBuilder, read_rlx
from rlx_format.codecs import CODECS
from rlx_format.quants import _fp16, _nearest, block_fields, dequantize, dequantize_fields, quantize
from rlx_runtime import CompileOptions, Session
from rlx_runtime import quant_kernels

KQ = ["gguf_q4_k", "gguf_q5_k", "gguf_q6_k"]
R = np.random.default_rng(256)


def _lcg_uniform(n_blocks: int, seed: int) -> np.ndarray:
    """Uniform values in [-1, 1), multiples of 2^-23, from 64-bit integer mixing (wraps mod 2^64): the same
    bits on every machine and numpy version."""
    s = np.arange(n_blocks * 256, dtype=np.uint64) + np.uint64(seed * 0x9E3779B97F4A7C15 % 2**64)
    s = s * np.uint64(0xBF58476D1CE4E5B9)
    s ^= s >> np.uint64(31)
    s = s * np.uint64(0x94D049BB133111EB)
    s ^= s >> np.uint64(29)
    k = (s >> np.uint64(40)).astype(np.int64) - 2**23
    return (k.astype(np.float32) / np.float32(2**23)).reshape(n_blocks, 256)


def _golden_inputs() -> dict:
    """float32 [48, 256] per case, built with exact or IEEE-rounded float32 elementwise ops only."""
    u = [_lcg_uniform(48, s) for s in range(6)]
    gauss = ((u[0] + u[1]) + (u[2] + u[3])) * np.float32(0.8660254)  # Irwin-Hall, variance 1
    out = {
        "uniform": u[0],
        "gauss": gauss,
        "heavy": u[4] / (np.abs(u[5]) + np.float32(1 / 64)),
        "outliers": np.where(np.arange(256) % 37 == 5, gauss * np.float32(40), gauss),
        "one_signed": np.abs(gauss) + np.float32(0.5),
        "negative": -np.abs(gauss) - np.float32(2),
        "zero_parts": np.where((np.arange(256) // 32 % 3 == 1) | (np.arange(48)[:, None] % 4 == 0), 0, gauss),
        "constant": np.repeat(u[1][:, :1], 256, axis=1) * np.float32(3),
        "halves": np.round(u[2] * np.float32(64)) / np.float32(2),  # many exact ties of the code grid
        "tiny": gauss * np.float32(2.0**-100),
        "fp16_range": gauss * np.float32(2.0**15),
        "sparse": np.where(np.abs(u[3]) < np.float32(0.9), 0, gauss),
    }
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


GOLDEN = {
    "Q4_K": {"uniform": "fbf1f12989acf137", "gauss": "26879e4c8197a518", "heavy": "f260843a4869d431",
             "outliers": "7849f8ebfe5999f4", "one_signed": "28c0e3bf6134df63", "negative": "c8af5c1fe60b45ba",
             "zero_parts": "1d0ee2b6ba9e9141", "constant": "2e1e87a6cc3c73e9", "halves": "42ba9201482304a2",
             "tiny": "a0e6df8e9379102c", "fp16_range": "7fe2b7c1e7cf8dd5", "sparse": "970ec787b4b5ceb1"},
    "Q5_K": {"uniform": "6fad305cf7f20fb6", "gauss": "7602a773b734f228", "heavy": "e13b51bf1aea0d0f",
             "outliers": "0670494cbd8ade3f", "one_signed": "4a62773ac33331b9", "negative": "e05868363775eee5",
             "zero_parts": "97aa3a2fa13507e8", "constant": "e5cd8634545373cb", "halves": "814408d0b7485836",
             "tiny": "6367c1cb16744189", "fp16_range": "5f1aae84c94086b8", "sparse": "1cde9c3cd55dc736"},
    "Q6_K": {"uniform": "a09cc470b61cf176", "gauss": "329cb70e3e523682", "heavy": "a3882c6a8a42d35b",
             "outliers": "88a9eeec870fe2fe", "one_signed": "1dd082c84269f376", "negative": "cf89f52b64f89a96",
             "zero_parts": "703414e785e49929", "constant": "3767f77b0be82cd0", "halves": "370a93c9f4cf4984",
             "tiny": "d23fe01ee6f2c59f", "fp16_range": "8caad5cc68e228e6", "sparse": "db63b1a815360539"},
}

# RMSE of the C reference's bytes, decoded by gguf, on _rmse_inputs() (1024 blocks each)
REF_RMSE = {
    "Q4_K": {"gauss": 0.0715525, "uniform": 0.0315135, "student_t3": 0.161109, "outlier_rows": 0.299427},
    "Q5_K": {"gauss": 0.0362232, "uniform": 0.0159536, "student_t3": 0.0810884, "outlier_rows": 0.164981},
    "Q6_K": {"gauss": 0.0177764, "uniform": 0.00763728, "student_t3": 0.0441494, "outlier_rows": 0.108533},
}


def _rmse_inputs() -> dict:
    r = np.random.default_rng(0)
    d = {"gauss": r.standard_normal((1024, 256)), "uniform": r.uniform(-1, 1, (1024, 256)),
         "student_t3": r.standard_t(3, (1024, 256)),
         "outlier_rows": np.where(r.random((1024, 256)) < 0.01, 30.0, 1.0) * r.standard_normal((1024, 256))}
    return {k: v.astype(np.float32) for k, v in d.items()}


def _ggml(enc: str) -> str:
    return CODECS[enc].ggml


@pytest.mark.parametrize("case", list(_golden_inputs()))
@pytest.mark.parametrize("enc", KQ)
def test_bytes_equal_the_c_reference(enc, case):
    x = _golden_inputs()[case]
    ours = quantize(x, enc)
    assert ours.shape == (48, CODECS[enc].nbytes) and ours.dtype == np.uint8
    assert hashlib.sha256(ours.tobytes()).hexdigest()[:16] == GOLDEN[_ggml(enc)][case]


@pytest.mark.parametrize("enc", KQ)
def test_rmse_matches_the_reference(enc):
    for name, x in _rmse_inputs().items():
        back = gq.dequantize(quantize(x, enc), T[_ggml(enc)]).reshape(x.shape)
        rmse = float(np.sqrt(np.mean((back.astype(np.float64) - x) ** 2)))
        assert rmse == pytest.approx(REF_RMSE[_ggml(enc)][name], rel=0.01), name


def test_more_bits_less_error():
    x = _rmse_inputs()["gauss"][:256]
    err = [np.abs(dequantize(quantize(x, e), e) - x).mean() for e in ("gguf_q4_0", "gguf_q4_k", "gguf_q5_k",
                                                                       "gguf_q6_k", "gguf_q8_0")]
    assert err == sorted(err, reverse=True)  # the search makes Q4_K beat Q4_0 at about the same size


def _decoders(p: np.ndarray, enc: str) -> dict:
    """Every decoder of packed rows p [N, row bytes] -> f32 [N, K]."""
    n, k = p.shape[0], p.shape[1] // CODECS[enc].nbytes * CODECS[enc].block
    out = {"dequantize": dequantize(p, enc)}
    buf = np.empty((n, k), np.float32)
    out["array-op numpy"] = dequantize_fields(np, block_fields(np, p, enc), enc, buf)
    with fake_cupy.installed() as cp:  # the CUDA runtime's decoder, on the cupy stand-in
        buf = cp.empty((n, k), dtype=cp.float32)
        dequantize_fields(cp, block_fields(cp, cp.asarray(p), enc), enc, buf)
        out["array-op cupy stand-in"] = cp.asnumpy(buf)
    buf = np.empty((n - 3, k), np.float32)
    quant_kernels._CPU[enc][1](p, 3, n, buf)  # the row-tile kernel on the numba block decoder
    out["numba rows"] = np.concatenate([out["dequantize"][:3], buf])
    return out


@pytest.mark.parametrize("enc", KQ)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN / Inf scales in random bytes
def test_every_decoder_equals_gguf_bit_for_bit(enc):
    nb = CODECS[enc].nbytes
    weights = quantize(np.concatenate([x[:8] for x in _golden_inputs().values()]).reshape(-1, 512), enc)
    rand = R.integers(0, 256, (40, 3 * nb), dtype=np.uint8)  # every code and scale pattern, NaN/Inf scales
    for p in (weights, rand):
        with np.errstate(all="ignore"):
            ref = gq.dequantize(p, T[_ggml(enc)])
            got = _decoders(p, enc)
        for name, v in got.items():
            np.testing.assert_array_equal(v, ref, err_msg=name)


def test_scale_and_min_packing_of_every_sub_block():
    """One 6-bit scale and min per sub-block, all 64 values in each slot: each decodes to d * sc * q - dmin * m."""
    for enc, nmax in (("gguf_q4_k", 15), ("gguf_q5_k", 31)):
        p = np.zeros((64, CODECS[enc].nbytes), np.uint8)
        p[:, 0:2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)  # d = 1
        p[:, 2:4] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)  # dmin = 1/2
        sc = (np.arange(64)[:, None] + 7 * np.arange(8)[None, :]) % 64  # row r, sub-block j
        mn = (63 - sc + 5 * np.arange(8)[None, :]) % 64
        s = p[:, 4:16]
        s[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
        s[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
        s[:, 8:12] = (sc[:, 4:] & 15) | ((mn[:, 4:] & 15) << 4)
        v = dequantize(p, enc).reshape(64, 8, 32)  # all codes 0: -dmin * m
        np.testing.assert_array_equal(v, np.broadcast_to(-0.5 * mn[:, :, None], v.shape).astype(np.float32))
        np.testing.assert_array_equal(v, gq.dequantize(p, T[_ggml(enc)]).reshape(v.shape))
        p[:, 16:] = 0xFF  # all codes nmax (Q5_K: every high bit set): sc * nmax - m / 2
        v = dequantize(p, enc).reshape(64, 8, 32)
        np.testing.assert_array_equal(v[:, :, 0], (sc * nmax - 0.5 * mn).astype(np.float32))


@pytest.mark.parametrize("enc", ["gguf_q5_k", "gguf_q6_k"])
def test_high_bits_of_each_element(enc):
    """A single high bit set at every position in turn moves exactly that element by 16 codes (d = 1)."""
    c = CODECS[enc]
    n = 256
    p = np.zeros((n, c.nbytes), np.uint8)
    if enc == "gguf_q5_k":
        p[:, 0:2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
        p[:, 4:8] = 1  # scale 1 for sub-blocks 0..3
        p[:, 12:16] = 1  # and 4..7 (low nibble of bytes 8..11)
        for e in range(256):  # element e: sub-block j = e // 32, index i = e % 32 -> bit j of qh[i]
            p[e, 16 + e % 32] = 1 << (e // 32)
        want = np.eye(256, dtype=np.float32) * 16
    else:
        p[:, 208:210] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
        p[:, 192:208] = 1
        p[:, :128] = 0  # low 4 bits 0: code = 16 * high - 32
        want = np.full((n, 256), -32, np.float32)
        for r in range(n):  # row r sets bit pair k = r % 4 of qh[r // 4] to 1: element 128h + 32k + i
            qh, k = r // 4, r % 4
            p[r, 128 + qh] = 1 << (2 * k)
            want[r, 128 * (qh // 32) + 32 * k + qh % 32] = -16
    np.testing.assert_array_equal(dequantize(p, enc), want)
    np.testing.assert_array_equal(gq.dequantize(p, T[c.ggml]), want)


@pytest.mark.parametrize("enc", KQ)
def test_zero_and_constant_blocks(enc):
    z = np.zeros((2, 256), np.float32)
    z[1, ::3] = -0.0
    assert not quantize(z, enc).any()  # every scale, min and code 0
    const = np.array([0.75, -3.0, 1e-3, 1000.0], np.float32)[:, None] * np.ones((1, 256), np.float32)
    back = dequantize(quantize(const, enc), enc)
    assert np.isfinite(back).all() and (back == back[:, :1]).all()  # one value per block
    # 1e-3 in Q6_K: d = amax / 4096 is an fp16 subnormal (steps of 2^-24), as in the reference
    np.testing.assert_allclose(back[:, 0], const[:, 0], rtol=3e-2)


@pytest.mark.parametrize("enc", KQ)
def test_decoded_values_are_finite_and_near_the_input(enc):
    x = np.concatenate([v for k, v in _golden_inputs().items() if k != "tiny"])  # tiny: d rounds to 0 in fp16
    back = dequantize(quantize(x, enc), enc)
    assert np.isfinite(back).all()
    amax = np.abs(x).max(1, keepdims=True)
    assert (np.abs(back - x) <= np.float32(0.25) * amax).all()


def test_nearest_is_round_half_to_even_and_defined_everywhere():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.49999997, 4194302.5, -4194302.5, 4194303.0, 4194304.0, 1e30,
                  np.inf, -np.inf, np.nan, -0.0], np.float32)
    want = [0, 2, 2, 0, -2, 0, 4194302, -4194302, 4194303, 4194303, 4194303, 4194303, -4194303, 0, 0]
    assert [int(_nearest(a)) for a in v] == want


def test_fp16_rounding_equals_numpy():
    bits = np.concatenate([R.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32),
                           np.arange(0, 2**16, dtype=np.uint32) << 13,  # fp16 values and the ties between them
                           (np.arange(0, 2**16, dtype=np.uint32) << 13) | 0x1000,
                           np.array([0x477FE000, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001, 0x7F800000],
                                    np.uint32)])
    f = bits.view(np.float32)
    f = f[~np.isnan(f)]
    with np.errstate(over="ignore"):
        want = f.astype(np.float16)
    got = np.array([_fp16(a)[0] for a in f], np.uint16).view(np.float16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    vals = np.array([_fp16(a)[1] for a in f], np.float32)
    np.testing.assert_array_equal(vals, want.astype(np.float32))


@pytest.mark.parametrize("enc", KQ)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_edge_blocks_by_rule(enc):
    """codec_inputs' edge blocks (test_defined_results.py). Where a sub-block's range is so small that its
    reciprocal overflows, the reference feeds +Inf / NaN to nearest_int (outside its asserted range; its bit
    trick then gives -2^22 or 0); rlx saturates (NaN: 0), so such codes may differ from the reference's. They
    sit in sub-blocks whose fp16 d * scale is 0, where every code decodes to the same value: checked here as
    the values (0, the input's nearest) and the scales."""
    c = CODECS[enc]
    for name, x in codec_inputs().items():
        with np.errstate(all="ignore"):
            p = quantize(x, enc)
            v = dequantize(p, enc)
            np.testing.assert_array_equal(v, gq.dequantize(p, T[c.ggml]).reshape(x.shape), err_msg=name)
        if name in ("subnormal", "just_below_overflow", "min_subnormal", "just_above_overflow", "zero"):
            assert not v.any(), name
        elif name in ("huge", "wide_range") and enc != "gguf_q6_k":  # a scale above the fp16 range is Inf
            assert not np.isfinite(v).all(), name
        elif name in ("huge", "wide_range"):  # Q6_K: the search's sums overflow, NaN scales are skipped: zeros
            assert not v.any(), name
        else:
            assert np.isfinite(v).all(), name
    # one tiny sub-block in a normal block: its scale and min are 0, its values 0, the rest unaffected
    x = R.standard_normal((1, 256)).astype(np.float32)
    x[0, 64:96] = np.float32(1e-40) * np.sign(R.standard_normal(32)).astype(np.float32)
    v = dequantize(quantize(x, enc), enc)
    assert not v[0, 64:96].any() and np.isfinite(v).all()
    zeroed = dequantize(quantize(np.where(np.arange(256) // 32 == 2, np.float32(0), x), enc), enc)
    np.testing.assert_array_equal(v, zeroed)


def test_q6_k_sub_block_whose_search_overflows_decodes_to_zero():
    """The reference's behaviour, kept (bytes equal to it): x^3 overflows in make_qx_quants' sums, the sub-block's
    scale is NaN, which the max over sub-blocks skips and nearest_int turns into scale code 0. The values are
    finite, so a caller cannot tell from them alone (spec/ops.md, "Quantized")."""
    x = R.standard_normal((1, 256)).astype(np.float32)
    x[0, 16], x[0, 17] = 1e15, 1e13
    with np.errstate(all="ignore"):
        p = quantize(x, "gguf_q6_k")
    v = dequantize(p, "gguf_q6_k")
    assert p[0, 192 + 1] == 0 and not v[0, 16:32].any()
    rest = np.r_[0:16, 32:256]
    assert np.abs(v[0, rest] - x[0, rest]).max() < 0.05  # the other sub-blocks as usual


@pytest.mark.parametrize("enc", KQ)
@pytest.mark.parametrize("m", [1, 7, 30])  # the fused kernel (<= 12 rows) and the row tiles + BLAS
def test_dequant_matmul_equals_dense_matmul(enc, m):
    n, k = 300, 512  # more rows than one tile (256)
    packed = quantize(R.standard_normal((n, k)).astype(np.float32), enc)
    wf = dequantize(packed, enc)
    x = R.standard_normal((m, k)).astype(np.float32)
    out = run_op("DequantMatMul", [x, packed], {"encoding": enc, "N": n, "K": k}, consts=(1,))
    np.testing.assert_allclose(out, x @ wf.T, rtol=1e-4, atol=1e-4)
    idx = np.array([[299, 0], [128, 5]], np.int64)
    rows = run_op("DequantGather", [packed, idx], {"encoding": enc, "N": n, "K": k}, consts=(0,))
    np.testing.assert_array_equal(rows, wf[idx])


@pytest.mark.parametrize("enc", KQ)
def test_unpack_quantized_on_cpu(enc):
    n, k = 24, 256
    packed = quantize(R.standard_normal((n, k)).astype(np.float32), enc)
    g = GraphBuilder("u")
    x = g.input("x", "f32", ["b", k])
    g.output(g.dequant_mat_mul(x, g.constant(packed, name="w"), encoding=enc, N=n, K=k, name="y"))
    c = Session().compile_with(g.build(), CompileOptions(unpack_quantized=True))
    assert "DequantMatMul" not in c.plan_ops()
    xs = R.standard_normal((3, k)).astype(np.float32)
    np.testing.assert_allclose(c.run({"x": xs})["y"], xs @ dequantize(packed, enc).T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("qt", ["q4_k", "q5_k", "q6_k"])
def test_cli_bakes_and_runs_each_k_quant(qt, tmp_path):
    g = GraphBuilder("mm")
    x = g.input("x", "f32", ["b", 512])
    g.output(g.matmul(x, g.param("w", "f32", [512, 16]), name="y"))
    w = R.standard_normal((512, 16)).astype(np.float32)
    write_bundle(tmp_path / "b", g.build(), {"w": w})
    out = tmp_path / "m.rlx"
    r = invoke(tmp_path / "b", "-o", out, "--quant", qt)
    assert r.exit_code == 0, r.output
    enc = f"gguf_{qt}"
    rf = read_rlx(out, verify=True)
    (packed,) = [v for v in rf.weights.values() if v.encoding == enc]
    back = dequantize(packed.data, enc)
    np.testing.assert_array_equal(back, dequantize(quantize(w.T, enc), enc))
    xs = R.standard_normal((4, 512)).astype(np.float32)
    np.testing.assert_allclose(run_baked(rf, {"x": xs})["y"], xs @ back.T, rtol=1e-4, atol=1e-4)
