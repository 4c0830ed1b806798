"""GGML Q8_0 / TQ2_0 codecs vs the gguf package's reference quantizer (byte for byte)."""

import gguf.quants as gq
import numpy as np
import pytest
from conftest import run_op
from gguf import GGMLQuantizationType as T

from rlx_format import QuantError
from rlx_format.quants import dequantize_q8_0, dequantize_tq2_0, is_lossless_ternary, quantize_q8_0, quantize_tq2_0

R = np.random.default_rng(0)


def _cases(block):
    yield "normal", R.standard_normal((8, 4 * block)).astype(np.float32)
    z = R.standard_normal((3, 2 * block)).astype(np.float32)
    z[1, :block] = 0
    yield "zero_blocks", z
    # halves of the row maximum; the per-block scale leaves no exact tie (those: test_known_answers.py)
    half = (np.arange(4 * block, dtype=np.float32) - 2 * block + 0.5) / 2
    yield "halfway", np.tile(np.float32(127) * half / np.abs(half).max(), (2, 1)).astype(np.float32)
    below = np.float32(0.5) - np.float32(2.0 ** -25)  # just below .5: floor(x + 0.5) gets this wrong
    yield "just_below_half", (np.tile(np.r_[np.float32(1.0), np.full(block - 1, below, np.float32)], (2, 1))
                              * np.float32(2439.357421875)).astype(np.float32)
    # blocks with a subnormal scale (the reference's bytes depend on the CPU there) are checked by
    # dequantized value and by rlx's rule in test_defined_results.py
    yield "small_normal_scale", (R.standard_normal((2, block)) * 1e-30).astype(np.float32)
    yield "fp16_max", (R.standard_normal((2, block)) * 65504).clip(-65504, 65504).astype(np.float32)
    yield "one_row", R.standard_normal((block,)).astype(np.float32)
    yield "many_rows", R.standard_normal((300, block)).astype(np.float32)
    yield "3d", R.standard_normal((2, 3, block)).astype(np.float32)


@pytest.mark.parametrize("name,x", list(_cases(32)))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the oracle warns on subnormal scales
def test_q8_0_bytes_match_gguf(name, x):
    ours = quantize_q8_0(x)
    ref = gq.quantize(x, T.Q8_0)
    assert ours.shape == ref.shape and ours.dtype == np.uint8
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(dequantize_q8_0(ours), gq.dequantize(ref, T.Q8_0))


@pytest.mark.parametrize("name,x", list(_cases(256)))
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_tq2_0_bytes_match_gguf(name, x):
    ours = quantize_tq2_0(x)
    ref = gq.quantize(x, T.TQ2_0)
    np.testing.assert_array_equal(ours, ref)
    np.testing.assert_array_equal(dequantize_tq2_0(ours), gq.dequantize(ref, T.TQ2_0))


def test_errors():
    with pytest.raises(QuantError, match="last dim is 33; expected a multiple of 32"):
        quantize_q8_0(np.zeros((2, 33), np.float32))
    with pytest.raises(QuantError, match="NaN or Inf"):
        quantize_tq2_0(np.full((256,), np.nan, np.float32))
    with pytest.raises(QuantError, match="expected a float array"):
        quantize_q8_0(np.zeros(32, np.int32))
    with pytest.raises(QuantError, match="expected uint8"):
        dequantize_q8_0(np.zeros(33, np.uint8))


def _ternary(shape, a):
    return (np.sign(R.standard_normal(shape)) * (R.random(shape) < 0.7) * a).astype(np.float32)


@pytest.mark.parametrize("w", [
    _ternary((4, 512), 1.0),
    _ternary((3, 256), 0.0234375),  # fp16-exact scale
    np.concatenate([_ternary((2, 256), 0.5), _ternary((2, 256), 3.0), np.zeros((2, 256), np.float32)], axis=1),
])
def test_lossless_ternary_yes(w):
    assert is_lossless_ternary(w)
    np.testing.assert_array_equal(dequantize_tq2_0(quantize_tq2_0(w)), w)


@pytest.mark.parametrize("w", [
    _ternary((2, 256), 0.1),  # 0.1 is not fp16-exact
    np.where(np.arange(256) == 5, 0.5, _ternary((1, 256), 1.0)).astype(np.float32),  # 0.5a
    np.where(np.arange(256) == 5, np.nan, _ternary((1, 256), 1.0)).astype(np.float32),
    _ternary((2, 100), 1.0),  # not a multiple of 256
])
def test_lossless_ternary_no(w):
    assert not is_lossless_ternary(w)


@pytest.mark.parametrize("enc,q,dq", [("gguf_q8_0", quantize_q8_0, dequantize_q8_0),
                                      ("gguf_tq2_0", quantize_tq2_0, dequantize_tq2_0)])
@pytest.mark.parametrize("m", [1, 5, 40])
def test_dequant_matmul_matches_dequantize_then_matmul(enc, q, dq, m):
    n, k = 48, 512
    w = R.standard_normal((n, k)).astype(np.float32)
    packed = q(w)
    x = R.standard_normal((m, k)).astype(np.float32)
    ref = x @ dq(packed).T
    out = run_op("DequantMatMul", [x, packed], {"encoding": enc, "N": n, "K": k}, consts=(1,))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    deq = run_op("Dequantize", [packed], {"encoding": enc, "shape": [n, k]}, consts=(0,))
    np.testing.assert_array_equal(deq, dq(packed))


def test_dequant_matmul_batched_leading_dims():
    w = R.standard_normal((8, 64)).astype(np.float32)
    x = R.standard_normal((2, 3, 64)).astype(np.float32)
    out = run_op("DequantMatMul", [x, quantize_q8_0(w)], {"encoding": "gguf_q8_0", "N": 8, "K": 64}, consts=(1,))
    np.testing.assert_allclose(out, x @ dequantize_q8_0(quantize_q8_0(w)).T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("enc,q,dq", [("gguf_q8_0", quantize_q8_0, dequantize_q8_0),
                                      ("gguf_tq2_0", quantize_tq2_0, dequantize_tq2_0)])
def test_dequant_gather_equals_gather_of_dequantized_table(enc, q, dq):
    table = R.standard_normal((50, 256)).astype(np.float32)
    packed = q(table)
    idx = np.array([[3, 0, 49], [7, 7, 1]], np.int64)
    out = run_op("DequantGather", [packed, idx], {"encoding": enc, "N": 50, "K": 256}, consts=(0,))
    np.testing.assert_array_equal(out, dq(packed)[idx])


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.floats(1e-6, 6e4), st.data())
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_property_codecs_match_gguf(rows, blocks, scale, data):
    """Random shapes and magnitudes (ties and zeros included) against the reference, both codecs."""
    for block, ours, qt in ((32, quantize_q8_0, T.Q8_0), (256, quantize_tq2_0, T.TQ2_0)):
        x = data.draw(hnp.arrays(np.float32, (rows, block * blocks),
                                 elements=st.floats(-1, 1, width=32) | st.sampled_from([0.0, 0.5, -0.5, 1.0]))) * scale
        x = x.astype(np.float32)
        np.testing.assert_array_equal(ours(x), gq.quantize(x, qt))
