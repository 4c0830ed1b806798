"""The quant codec registry: every registered GGML type against the gguf package (the oracle) byte for
byte, its decoders value for value, the runtime ops on every type, and clear errors for unknown ones."""

import gguf.quants as gq
import numpy as np
import pytest
from conftest import run_op
from gguf import GGMLQuantizationType as T
from test_quants import _cases

from rlx_format import GraphBuilder, QuantError, RlxError, Weight
from rlx_format.codecs import CODECS, get_codec, ternary_codecs
from rlx_format.constants import QUANT_ENCODINGS
from rlx_format.container import _check_weight_in_memory
from rlx_format.quants import dequantize, is_lossless_ternary, quantize

R = np.random.default_rng(23)
NAMES = list(CODECS)


def _gguf_quantizes(enc: str) -> bool:
    """gguf-py has no quantizer for some types (the K-quants): their bytes are checked in test_kquants.py."""
    try:
        gq.quantize(np.zeros((1, CODECS[enc].block), np.float32), T[CODECS[enc].ggml])
    except NotImplementedError:
        return False
    return True


ORACLE_NAMES = [e for e in NAMES if _gguf_quantizes(e)]


def _edge_cases(block: int):
    """Blocks where the layouts' rounding rules differ: truncation ties, sign of the largest value,
    signed zeros, constant blocks (max == min), one-signed blocks, wide ranges."""
    yield from _cases(block)
    reps = block // 32
    ties = np.tile(np.r_[np.float32(-8.0), (np.arange(31, dtype=np.float32) - 15) / 2], reps)  # d = 1 for Q4_0
    yield "trunc_ties_q4", np.stack([ties, ties * 2, ties * np.float32(0.375)]).astype(np.float32)  # *2: Q5_0
    both = np.full(block, 0.25, np.float32)
    both[3], both[10] = -2.0, 2.0  # equal magnitudes: the first one's sign makes d
    yield "equal_magnitudes", np.stack([both, -both])
    z = np.zeros((3, block), np.float32)
    z[1] = -0.0
    z[2, ::2] = -0.0
    yield "signed_zeros", z
    yield "constant", np.stack([np.full(block, 0.7, np.float32), np.full(block, -3.0, np.float32)])
    yield "one_signed", np.stack([np.abs(R.standard_normal(block)), -np.abs(R.standard_normal(block)) - 5]).astype(
        np.float32)
    yield "wide", (R.standard_normal((2, block)) * 3e4).clip(-6e4, 6e4).astype(np.float32)
    t = (np.sign(R.standard_normal((3, block))) * (R.random((3, block)) < 0.6)).astype(np.float32)
    yield "ternary", t * np.float32([[1.0], [0.125], [3.0]])
    # amax just below a power of two (MXFP4's exponent comes from a rounded log2), halfway between codes
    near = np.float32(1) - np.arange(1, 9, dtype=np.float32) * np.float32(2.0**-24)
    pw = (near[:, None] * np.float32(2.0) ** np.arange(-100, 120, 9, dtype=np.float32)[None, :]).reshape(-1, 1)
    half = np.tile((np.arange(32, dtype=np.float32) - 16) / 4, reps)  # s = 1/2 for amax 4: many exact halves
    yield "near_powers_of_two", (pw * np.tile(np.r_[np.float32(1), half[1:32] / 4], reps)[None, :]).astype(np.float32)
    yield "code_halves", np.stack([half, half * np.float32(2.0**-60), half * np.float32(2.0**60)]).astype(np.float32)
    yield "many_ternary", R.integers(-1, 2, (64, 4096)).astype(np.float32)  # every TQ1_0 byte value, w.h.p.


CASES = [(enc, name, x) for enc in ORACLE_NAMES for name, x in _edge_cases(CODECS[enc].block)]


@pytest.mark.parametrize("enc,name,x", CASES, ids=[f"{e}-{n}" for e, n, _ in CASES])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the oracle warns on zero / tiny scales
def test_bytes_match_gguf(enc, name, x):
    c = CODECS[enc]
    qt = T[c.ggml]
    ours, ref = quantize(x, enc), gq.quantize(x, qt)
    assert ours.dtype == np.uint8 and ours.shape == ref.shape
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(dequantize(ours, enc), gq.dequantize(ref, qt).reshape(x.shape))
    if name == "signed_zeros" and len(c.scale_offsets) == 2:
        # min/max of a block of +0 and -0: gguf-py's numpy reduction may pick either zero (SIMD order);
        # rlx takes the first in the block, as GGML's C reference loop does. Same values either way.
        m = ours.reshape(-1, c.nbytes)[:, 2:4].copy().view(np.float16)[:, 0]
        np.testing.assert_array_equal(np.signbit(m), np.signbit(x[:, 0]))
        return
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("enc", NAMES)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_dequantize_of_any_bytes_matches_gguf(enc):
    """Random bytes hit every code pattern (TQ1_0 bytes >= 243 included) and NaN/Inf scales."""
    c = CODECS[enc]
    p = R.integers(0, 256, (40, 3 * c.nbytes), dtype=np.uint8)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(dequantize(p, enc), gq.dequantize(p, T[c.ggml]))


def test_registry_facts_match_gguf():
    from gguf.constants import GGML_QUANT_SIZES

    for c in CODECS.values():
        assert (c.block, c.nbytes) == GGML_QUANT_SIZES[T[c.ggml]]
        assert QUANT_ENCODINGS[c.name] == (c.block, c.nbytes)
        assert c.name == f"gguf_{c.short}"
    assert [c.ggml for c in ternary_codecs()] == ["TQ1_0", "TQ2_0"]  # smallest first


@pytest.mark.parametrize("enc", [e for e in NAMES if CODECS[e].ternary])
def test_ternary_codecs_are_lossless_on_ternary_weights(enc):
    w = np.concatenate([(np.sign(R.standard_normal((4, 256))) * (R.random((4, 256)) < 0.7) * a).astype(np.float32)
                        for a in (1.0, 0.0234375, 3.0, 0.0)], axis=1)
    assert is_lossless_ternary(w)
    np.testing.assert_array_equal(dequantize(quantize(w, enc), enc), w)
    many = R.integers(-1, 2, (64, 256 * 16)).astype(np.float32)  # 1024 blocks: every 5-trit byte value, w.h.p.
    np.testing.assert_array_equal(dequantize(quantize(many, enc), enc), many)


def test_tq1_0_is_smaller_than_tq2_0():
    assert CODECS["gguf_tq1_0"].bits_per_weight == pytest.approx(1.6875)
    assert CODECS["gguf_tq2_0"].bits_per_weight == pytest.approx(2.0625)


@pytest.mark.parametrize("enc", NAMES)
@pytest.mark.parametrize("m", [1, 5, 40])  # the fused kernels (<= 12 rows, where a codec has one) and the tiles
def test_runtime_ops_on_every_type(enc, m):
    n, k = 40, 512
    packed = quantize(R.standard_normal((n, k)).astype(np.float32), enc)
    wf = dequantize(packed, enc)
    x = R.standard_normal((m, k)).astype(np.float32)
    out = run_op("DequantMatMul", [x, packed], {"encoding": enc, "N": n, "K": k}, consts=(1,))
    np.testing.assert_allclose(out, x @ wf.T, rtol=1e-4, atol=1e-4)
    deq = run_op("Dequantize", [packed.reshape(4, 10, -1)], {"encoding": enc, "shape": [4, 10, k]}, consts=(0,))
    np.testing.assert_array_equal(deq, wf.reshape(4, 10, k))
    idx = np.array([[3, 0, 39], [7, 7, 1]], np.int64)
    rows = run_op("DequantGather", [packed, idx], {"encoding": enc, "N": n, "K": k}, consts=(0,))
    np.testing.assert_array_equal(rows, wf[idx])


def test_dequant_matmul_many_tiles():
    """More rows than one CPU tile (256): every tile of the array-op decoder lands in its columns."""
    n, k = 600, 64
    packed = quantize(R.standard_normal((n, k)).astype(np.float32), "gguf_q5_1")
    x = R.standard_normal((20, k)).astype(np.float32)
    out = run_op("DequantMatMul", [x, packed], {"encoding": "gguf_q5_1", "N": n, "K": k}, consts=(1,))
    np.testing.assert_allclose(out, x @ dequantize(packed, "gguf_q5_1").T, rtol=1e-4, atol=1e-4)


def test_unknown_encoding_is_a_clear_error_everywhere():
    x = np.zeros((2, 32), np.float32)
    for call in (lambda: quantize(x, "gguf_q9_0"), lambda: dequantize(np.zeros(34, np.uint8), "gguf_q9_0"),
                 lambda: get_codec("gguf_q9_0")):
        with pytest.raises(QuantError, match="unknown quant encoding 'gguf_q9_0'; expected one of gguf_q8_0"):
            call()
    g = GraphBuilder("u")
    p = g.input("p", "u8", [2, 34])
    g.output(g.op("Dequantize", p, encoding="gguf_q9_0", shape=[2, 32], name="y"))
    with pytest.raises(RlxError, match="attr 'encoding' is 'gguf_q9_0'; expected one of .*gguf_tq1_0"):
        g.build()
    with pytest.raises(RlxError, match="unknown encoding 'gguf_q9_0'"):
        _check_weight_in_memory(Weight("w", "gguf_q9_0", (2, 32), np.zeros((2, 34), np.uint8)))


def test_container_round_trip_of_every_type(tmp_path):
    from rlx_format import RlxFile, read_rlx, write_rlx

    g = GraphBuilder("rt")
    xs, ws = {}, {}
    for enc in NAMES:
        k = CODECS[enc].block * 2
        xs[enc] = R.standard_normal((3, k)).astype(np.float32)
        ws[enc] = Weight(f"w_{enc}", enc, (3, k), quantize(xs[enc], enc))
    g.output(g.input("x", "f32", [1]))
    write_rlx(tmp_path / "a.rlx", RlxFile(g.build(), {w.name: w for w in ws.values()}, {}))
    back = read_rlx(tmp_path / "a.rlx", verify=True)
    for enc in NAMES:
        np.testing.assert_array_equal(back.weights[f"w_{enc}"].dense(), dequantize(quantize(xs[enc], enc), enc))


@pytest.mark.parametrize("enc", ["gguf_q4_1", "gguf_tq1_0"])
def test_a_codec_naming_no_cpu_kernels_runs_on_the_array_op_decoder(enc, monkeypatch):
    """A new codec needs no numba kernels: DequantMatMul falls back to array-op tiles + BLAS."""
    import dataclasses

    from rlx_runtime import quant_kernels

    bare = dataclasses.replace(CODECS[enc], cpu_fused=None, cpu_rows=None, cpu_block=None)
    fused, rows = quant_kernels._cpu_kernels(enc, bare)
    assert fused is None
    monkeypatch.setitem(quant_kernels._CPU, enc, (fused, rows))
    n, k = 300, 512  # more rows than one tile
    packed = quantize(R.standard_normal((n, k)).astype(np.float32), enc)
    x = R.standard_normal((3, k)).astype(np.float32)
    out = quant_kernels.dequant_matmul(x, packed, enc, n, k)
    np.testing.assert_allclose(out, x @ dequantize(packed, enc).T, rtol=1e-4, atol=1e-4)
    buf = np.empty((n, k), np.float32)
    rows(packed, 0, n, buf)
    np.testing.assert_array_equal(buf, dequantize(packed, enc))


@pytest.mark.parametrize("enc", NAMES)
def test_cpu_row_tile_decoders_equal_dequantize_bit_for_bit(enc):
    from rlx_runtime import quant_kernels

    p = R.integers(0, 256, (20, 2 * CODECS[enc].nbytes), dtype=np.uint8)
    p.reshape(20, 2, -1)[:, :, [o + 1 for o in CODECS[enc].scale_offsets]] &= 0x3F  # fp16 exponent < 16: finite
    n0, n1 = 3, 17
    buf = np.empty((n1 - n0, 2 * CODECS[enc].block), np.float32)
    quant_kernels._CPU[enc][1](p, n0, n1, buf)
    np.testing.assert_array_equal(buf, dequantize(p[n0:n1], enc))


def test_named_kernels_exist():
    """Every kernel a codec names is there: numba quantizers and CPU kernels (looked up at import) and the
    CUDA entry points in kernels.cu."""
    from rlx_format import quants
    from rlx_runtime import quant_kernels
    from rlx_runtime.cuda import fused

    src = fused.source()
    for c in CODECS.values():
        assert callable(getattr(quants, c.kernel))
        for name in (c.cpu_fused, c.cpu_rows, c.cpu_block):
            assert name is None or callable(getattr(quant_kernels, name))
        assert c.cuda_gemv is None or f"void {c.cuda_gemv}(" in src
        assert fused.supports(c.name) == (c.cuda_gemv is not None)
