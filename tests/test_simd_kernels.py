"""The explicit-vector Q8_0 / TQ2_0 kernels (rlx_runtime/simd.py) behind DequantMatMul and Dequantize.

Oracles: the numpy reference decoders (bit-exact for decoding) and a float64 matmul of the decoded weight (for
the dots). Sizes are chosen to hit every loop of the kernels: fewer blocks than one scale group, whole groups
only, groups plus a remainder, and a tiled matmul whose last tile is short.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlx_format.quants import dequantize, quantize
from rlx_runtime import quant_kernels
from rlx_runtime.simd import GROUP, Q8_0_BYTES, TQ2_0_BYTES

R = np.random.default_rng(11)
# block, bytes, d offset (Q4_1's m follows its d)
CODECS = {"gguf_q8_0": (32, Q8_0_BYTES, 0), "gguf_tq2_0": (256, TQ2_0_BYTES, 64), "gguf_q4_0": (32, 18, 0),
          "gguf_q4_1": (32, 20, 0), "gguf_q5_0": (32, 22, 0), "gguf_q5_1": (32, 24, 0)}


def _every_scale(enc: str) -> np.ndarray:
    """Packed rows whose blocks carry every fp16 bit pattern as d (subnormals, Inf, NaN included), one per row,
    with all codes +1."""
    block, nbytes, at = CODECS[enc]
    h = np.arange(1 << 16, dtype=np.uint32)
    p = np.zeros((h.size, nbytes), np.uint8)
    # codes: Q8_0 int8 +1; TQ2_0 code 2 (= +1) in all 4 slots; Q4_0 nibbles 9 (= +1); Q4_1 nibbles 1 and its m
    # the same pattern as d (0x11 bytes: every element is d + d)
    # Q5_0: nibbles 1 with every fifth bit set (17 - 16 = +1); Q5_1: nibbles 1, fifth bits clear, m as for Q4_1
    codes = {"gguf_q8_0": 1, "gguf_tq2_0": 0b10101010, "gguf_q4_0": 0x99, "gguf_q4_1": 0x11, "gguf_q5_0": 0x11,
             "gguf_q5_1": 0x11}[enc]
    p[:] = codes
    if enc == "gguf_q5_0":
        p[:, 2:6] = 0xFF
    if enc == "gguf_q5_1":
        p[:, 4:8] = 0
    p[:, at], p[:, at + 1] = h & 255, h >> 8
    if enc in ("gguf_q4_1", "gguf_q5_1"):
        p[:, at + 2], p[:, at + 3] = h & 255, h >> 8
    return p


@pytest.mark.parametrize("enc", list(CODECS))
def test_row_decoder_is_bit_exact_for_every_fp16_scale(enc):
    """The decoder converts each block's fp16 scale from its bits (no table): every pattern must give what the
    reference decoder gives, to the bit (NaN payloads too)."""
    block = CODECS[enc][0]
    p = _every_scale(enc)
    buf = np.empty((p.shape[0], block), np.float32)
    quant_kernels._CPU[enc][1](p, 0, p.shape[0], buf)
    with np.errstate(invalid="ignore"):
        ref = dequantize(p, enc).reshape(p.shape[0], block)
    np.testing.assert_array_equal(buf.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("enc", list(CODECS))
@pytest.mark.parametrize("blocks", [1, 3, GROUP, 2 * GROUP, GROUP + 5, 3 * GROUP + 1])
def test_row_decoder_matches_the_reference_on_every_loop(enc, blocks):
    block = CODECS[enc][0]
    w = (R.standard_normal((7, blocks * block)) * np.exp(R.standard_normal((7, 1)) * 4)).astype(np.float32)
    p = quantize(w, enc)
    buf = np.full((4, blocks * block), np.nan, np.float32)
    quant_kernels._CPU[enc][1](p, 2, 6, buf)  # rows 2..5 of the packed weight into the tile's first rows
    np.testing.assert_array_equal(buf, dequantize(p, enc).reshape(7, -1)[2:6])


def _dot_tolerance(x: np.ndarray, wd: np.ndarray) -> np.ndarray:
    """A float32 sum's error bound scale: sum |x| |w| times a few ulps per term of the reduction depth."""
    return (np.abs(x).astype(np.float64) @ np.abs(wd).T.astype(np.float64)) * 2e-6 * np.log2(x.shape[1] + 2)


@pytest.mark.parametrize("enc", list(CODECS))
@pytest.mark.parametrize("blocks", [1, 3, GROUP, GROUP + 5, 3 * GROUP + 1])
@pytest.mark.parametrize("m", [1, 4, quant_kernels.FUSED_MAX_ROWS])
def test_fused_dot_matches_a_float64_matmul(enc, blocks, m):
    block = CODECS[enc][0]
    n, k = 37, blocks * block
    w = R.standard_normal((n, k)).astype(np.float32)
    w[3] *= 1e-3  # blocks of very different scales in one output
    p = quantize(w, enc)
    wd = dequantize(p, enc).reshape(n, k)
    x = R.standard_normal((m, k)).astype(np.float32)
    out = quant_kernels.dequant_matmul(x, p, enc, n, k)
    ref = x.astype(np.float64) @ wd.T.astype(np.float64)
    assert np.all(np.abs(out - ref) <= _dot_tolerance(x, wd)), np.abs(out - ref).max()


@pytest.mark.parametrize("enc", list(CODECS))
def test_tiled_path_with_a_short_last_tile(enc):
    """More rows than the fused kernel takes: the weight is decoded in row tiles (the last one short) and each
    tile multiplied through BLAS into its block of the output."""
    block = CODECS[enc][0]
    n, k, m = quant_kernels.TILE_ROWS + 45, 2 * block, quant_kernels.FUSED_MAX_ROWS + 9
    w = R.standard_normal((n, k)).astype(np.float32)
    p = quantize(w, enc)
    wd = dequantize(p, enc).reshape(n, k)
    x = R.standard_normal((m, k)).astype(np.float32)
    out = quant_kernels.dequant_matmul(x, p, enc, n, k)
    assert out.flags.c_contiguous and out.shape == (m, n)
    np.testing.assert_allclose(out, x.astype(np.float64) @ wd.T.astype(np.float64), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("enc", list(CODECS))
def test_fused_dot_propagates_nan_and_inf(enc):
    block = CODECS[enc][0]
    w = R.standard_normal((4, 2 * block)).astype(np.float32)
    p = quantize(w, enc)
    x = R.standard_normal((3, 2 * block)).astype(np.float32)
    x[0, 5], x[1, block + 1] = np.nan, np.inf
    out = quant_kernels.dequant_matmul(x, p, enc, 4, 2 * block)
    wd = dequantize(p, enc).reshape(4, -1)
    with np.errstate(invalid="ignore"):
        ref = x.astype(np.float64) @ wd.T.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
    assert np.all(np.isfinite(out[2]))


# ---------------------------------------------------------------- copy_f32 (the tap convs' row copies)
@pytest.fixture(scope="module")
def copy_rows():
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import copy_f32

    @numba.njit(error_model="numpy")
    def run(dst, at, src, start, count, step):
        copy_f32(dst, at, src, start, count, step)
    return run


@pytest.mark.parametrize("step", [1, 2, 3])
def test_copy_f32_copies_exactly_the_strided_elements(copy_rows, step):
    """Every count up to past two 32-lane vectors (so each of the 32/16/8/4-lane steps and the element tail runs
    alone and in combination), three source offsets: the copied elements are src[start::step][:count], and
    nothing else in dst changes."""
    src = R.standard_normal(400).astype(np.float32)
    for count in range(0, 100):
        for start in (0, 1, 7):
            dst = np.full(120, -3.0, np.float32)
            copy_rows(dst, 5, src, start, count, step)
            want = np.full(120, -3.0, np.float32)
            want[5:5 + count] = src[start::step][:count]
            np.testing.assert_array_equal(dst, want, err_msg=f"count {count} start {start}")


def _guarded(count: int):
    """A float32 array of `count` elements ending exactly at a page that is neither readable nor writable (an
    access past its end crashes), and the mapping to keep alive."""
    import ctypes
    import mmap
    page = mmap.PAGESIZE
    m = mmap.mmap(-1, 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + page, page, 0) == 0
    arr = np.frombuffer(m, np.float32, count, page - 4 * count)
    return arr, m


def _in_a_child(body: str) -> None:
    """Run `body` (Python, after importing numpy as np, numba, this module as t and the simd module as simd) in a
    child process, so that a fault from an access past a guarded buffer fails the test instead of pytest; it must
    print ok."""
    import subprocess
    import sys
    here = str(Path(__file__).parent)
    code = (f"import sys\nsys.path.insert(0, {here!r})\n"
            "import numpy as np\nimport test_simd_kernels as t\nfrom rlx_format.numba_setup import numba\n"
            "from rlx_runtime import simd\n" + body + "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def test_copy_f32_reads_and_writes_nothing_past_the_row(copy_rows):
    """The vector steps may only touch the elements copied: source and destination each end right before an
    inaccessible page, so a read or write one element past them would kill the process."""
    _in_a_child(
        "@numba.njit(error_model='numpy')\n"
        "def run(dst, at, src, start, count, step):\n"
        "    simd.copy_f32(dst, at, src, start, count, step)\n"
        "for step in (1, 2):\n"
        "    for count in range(1, 80):\n"
        "        src, m1 = t._guarded((count - 1) * step + 1)\n"
        "        src[:] = np.arange(src.size, dtype=np.float32)\n"
        "        dst, m2 = t._guarded(count)\n"
        "        run(dst, 0, src, 0, count, step)\n"
        "        assert np.array_equal(dst, src[::step]), (step, count)\n")


# ---------------------------------------------------------------- sum_f32 (GlobalAveragePool's channel sums)
@pytest.fixture(scope="module")
def row_sum():
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import sum_f32

    @numba.njit(error_model="numpy")
    def run(src, start, count):
        return sum_f32(src, start, count)
    return run


def test_sum_f32_is_exact_on_integers_for_every_count_and_offset(row_sum):
    """Small integers sum exactly in float32 in any order: every count through three 128-element blocks and a
    partial tail (each of the four accumulators' tail vectors, whole and masked), at three offsets."""
    src = R.integers(-50, 50, 600).astype(np.float32)
    for count in range(0, 420):
        for start in (0, 3, 17):
            assert row_sum(src, start, count) == src[start:start + count].astype(np.int64).sum(), (count, start)


def test_sum_f32_zeros_nan_and_inf(row_sum):
    neg = np.full(45, -0.0, np.float32)
    assert row_sum(neg, 0, 45) == 0 and np.signbit(row_sum(neg, 0, 45))  # -0.0 + -0.0 stays -0.0
    mixed = neg.copy()
    mixed[7] = 0.0
    assert not np.signbit(row_sum(mixed, 0, 45))
    assert np.signbit(row_sum(neg, 0, 0))  # the empty sum is IEEE's additive identity
    x = np.ones(200, np.float32)
    x[150] = np.nan
    assert np.isnan(row_sum(x, 0, 200)) and row_sum(x, 0, 150) == 150
    x[150] = np.inf
    assert row_sum(x, 0, 200) == np.inf
    x[3] = -np.inf
    assert np.isnan(row_sum(x, 0, 200))


def test_sum_f32_reads_nothing_past_the_row(row_sum):
    """The masked tail loads only the elements summed: a row ending right before an inaccessible page."""
    _in_a_child(
        "@numba.njit(error_model='numpy')\n"
        "def run(src, start, count):\n"
        "    return simd.sum_f32(src, start, count)\n"
        "for count in range(1, 300):\n"
        "    src, m = t._guarded(count)\n"
        "    src[:] = 1\n"
        "    assert run(src, 0, count) == count, count\n")


def test_global_average_pool_by_the_vector_sums_matches_float64():
    from rlx_format.numba_setup import numba  # noqa: F401 - the vector path is taken once numba is loaded
    from rlx_runtime.kernels import nn
    for shape in [(2, 3, 7, 5), (1, 96, 112, 112), (1, 5, 131), (1, 4, 2, 3, 4)]:
        x = R.standard_normal(shape).astype(np.float32)
        got = nn._gap_cpu(np, {}, x)
        want = x.astype(np.float64).mean(axis=tuple(range(2, x.ndim)), keepdims=True)
        assert got.shape == want.shape and got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-7)
