"""The explicit-vector Q8_0 / TQ2_0 kernels (rlx_runtime/simd.py) behind DequantMatMul and Dequantize.

Oracles: the numpy reference decoders (bit-exact for decoding) and a float64 matmul of the decoded weight (for
the dots). Sizes are chosen to hit every loop of the kernels: fewer blocks than one scale group, whole groups
only, groups plus a remainder, and a tiled matmul whose last tile is short.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from vector_code import MASKED_STORE, stores_back_a_select_of_the_load
from exact_fma import fma32

from rlx_format.quants import dequantize, quantize
from rlx_runtime import packed, quant_kernels
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
@pytest.mark.parametrize("tile_rows", [None, 40])
def test_wide_batches_multiply_the_long_input_by_weight_tiles(enc, tile_rows, monkeypatch):
    """From WIDE_ROWS input rows on, each weight tile is multiplied as x @ W_tileᵀ into its columns of y: the
    whole weight in one tile, or (a smaller tile budget) tiles with a short last one."""
    block = CODECS[enc][0]
    n, k, m = 107, 2 * block, quant_kernels.WIDE_ROWS
    if tile_rows is not None:
        monkeypatch.setattr(packed, "TILE_BYTES", tile_rows * 4 * k)
    w = R.standard_normal((n, k)).astype(np.float32)
    p = quantize(w, enc)
    wd = dequantize(p, enc).reshape(n, k)
    x = R.standard_normal((m, k)).astype(np.float32)
    calls = []
    monkeypatch.setattr(quant_kernels, "matmul", lambda a, b: calls.append(a.shape) or np.matmul(a, b))
    out = quant_kernels.dequant_matmul(x, p, enc, n, k)
    assert out.flags.c_contiguous and out.shape == (m, n)
    assert calls == [(m, k)] * (1 if tile_rows is None else 3)  # x is the left operand, once per tile
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
    """{masked_tail: run(dst, at, src, start, count, step)}: both ways of ending a row (the CPU picks one)."""
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import copy_intrinsic

    runs = {}
    for masked in (True, False):
        copy = copy_intrinsic(masked)
        runs[masked] = numba.njit(lambda dst, at, src, start, count, step, f=copy: f(dst, at, src, start, count, step))
    return runs


@pytest.mark.parametrize("masked", [True, False], ids=["masked-tail", "vectors-of-8"])
@pytest.mark.parametrize("step", [1, 2, 3])
def test_copy_f32_copies_exactly_the_strided_elements(copy_rows, step, masked):
    """Every count up to past three 32-lane vectors (so the 32-lane vectors, the 8-lane ones or the masked one
    and the element tail run alone and in combination), three source offsets: the copied elements are
    src[start::step][:count], and nothing else in dst changes."""
    src = R.standard_normal(400).astype(np.float32)
    for count in range(0, 100):
        for start in (0, 1, 7):
            dst = np.full(120, -3.0, np.float32)
            copy_rows[masked](dst, 5, src, start, count, step)
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


@pytest.mark.parametrize("masked", [True, False], ids=["masked-tail", "vectors-of-8"])
def test_copy_f32_reads_and_writes_nothing_past_the_row(masked):
    """The vector steps may only touch the elements copied: source and destination each end right before an
    inaccessible page, so a read or write one element past them would kill the process."""
    _in_a_child(
        f"copy = simd.copy_intrinsic({masked})\n"
        "@numba.njit(error_model='numpy')\n"
        "def run(dst, at, src, start, count, step):\n"
        "    copy(dst, at, src, start, count, step)\n"
        "for step in (1, 2):\n"
        "    for count in range(1, 80):\n"
        "        src, m1 = t._guarded((count - 1) * step + 1)\n"
        "        src[:] = np.arange(src.size, dtype=np.float32)\n"
        "        dst, m2 = t._guarded(count)\n"
        "        run(dst, 0, src, 0, count, step)\n"
        "        assert np.array_equal(dst, src[::step]), (step, count)\n")


@pytest.mark.parametrize("masked", [True, False], ids=["masked-tail", "vectors-of-8"])
def test_max_fold_f32_stores_computed_vectors(masked):
    """MaxPool's fold stores np.maximum(dst, src) back into dst: written as a select whose NaN side was dst's own
    loaded vector, every vector store became a masked store of the other side (a 3x3/2 MaxPool of 64x112x112, 1
    thread on Zen 3: 0.86-1.37 ms, 0.48-0.84 ms since). The NaN side is now dst + dst (the same NaN). Without masked
    tails (AVX2) the code has no masked store at all; the values are test_pools.py's."""
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import _np_maximum, copy_intrinsic

    fold = copy_intrinsic(masked, _np_maximum)
    run = numba.njit(lambda dst, at, src, start, count, step: fold(dst, at, src, start, count, step))
    dst = np.array([np.nan, -np.nan, -0.0, 0.0, 1.0, -2.0] * 20, np.float32)
    src = np.array([0.0, 1.0, 0.0, -0.0, np.nan, -np.nan] * 20, np.float32)
    want = np.maximum(dst, src)
    run(dst, 0, src, 0, dst.size, 1)
    np.testing.assert_array_equal(dst.view(np.uint32), want.view(np.uint32))
    sig = run.signatures[0]
    assert stores_back_a_select_of_the_load(run.inspect_llvm(sig)) == 0
    if not masked:
        assert not MASKED_STORE.findall(run.inspect_asm(sig))


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


# ------------------------------------------------------- the few-rows GEMM's register tiles (skinny_f32, gather_f32)

# AVX-512's, AVX-512's panels' (the recurrent steps), AVX2's, AVX2's before, one whose passes do not divide SKINNY_ROWS,
# one of 2 vectors a pass
_TILES = [(8, 16, 3), (8, 32), (4, 8, 3), (4, 16), (3, 8), (4, 8, 2)]


@pytest.fixture(scope="module")
def few_rows_by_tile():
    """{tile: (skinny(out, x, wt, rows, k, n, c0, c1), gather(out, x, src, offsets, rows, k, n, c0, c1),
    skinny_epilogue(out, x, wt, rows, k, n, c0, c1, bias, res, mode, has_bias, has_res))}, njit wrappers of the
    intrinsics built with that tile."""
    from rlx_format.numba_setup import numba
    from rlx_runtime import simd

    built = {}
    for tile in _TILES:
        sk, ga, ep = simd.few_rows_intrinsics(tile)
        built[tile] = (numba.njit(lambda out, x, wt, rows, k, n, c0, c1, f=sk: f(out, x, wt, rows, k, n, c0, c1)),
                       numba.njit(lambda out, x, src, offs, rows, k, n, c0, c1, f=ga: f(out, x, src, offs, rows, k,
                                                                                            n, c0, c1)),
                       numba.njit(lambda out, x, wt, rows, k, n, c0, c1, bias, res, mode, hb, hr, f=ep: f(
                           out, x, wt, rows, k, n, c0, c1, bias, res, mode, hb, hr)))
    return built


@pytest.mark.parametrize("rows,k,n,c0,c1", [(1, 7, 50, 0, 50), (3, 64, 96, 5, 93), (4, 33, 40, 0, 40),
                                            (5, 100, 130, 17, 130), (8, 256, 97, 0, 97), (8, 9, 32, 0, 31),
                                            (7, 1, 16, 3, 4), (1, 13, 600, 3, 597), (2, 40, 520, 0, 520),
                                            (3, 20, 777, 1, 777), (6, 17, 300, 10, 290), (8, 5, 513, 0, 513)],
                         ids=str)
def test_every_register_tile_gives_the_same_bits(few_rows_by_tile, rows, k, n, c0, c1):
    """The tile (rows per pass over k, columns per vector) is picked by the CPU: each output must still be its own
    fma chain in order of k, so every tile gives the same bits, each within a dot's rounding of float64; outputs
    outside [c0, c1) and rows past `rows` are left alone."""
    from rlx_runtime.simd import SKINNY_ROWS

    x = R.standard_normal(rows * k).astype(np.float32)
    wt = R.standard_normal(k * n).astype(np.float32)
    offsets = np.arange(k, dtype=np.int64) * n  # gather over the rows of wt: the same GEMM
    outs = []
    for tile, (sk, ga, _) in few_rows_by_tile.items():
        for fn, extra in ((sk, ()), (ga, (offsets,))):
            out = np.full(SKINNY_ROWS * n, 7.0, np.float32)
            fn(out, x, wt, *extra, rows, k, n, c0, c1)
            outs.append((tile, out))
    ref = outs[0][1]
    for tile, out in outs[1:]:
        np.testing.assert_array_equal(out, ref, err_msg=f"tile {tile}")
    got = ref.reshape(SKINNY_ROWS, n)
    assert np.all(got[rows:] == 7.0) and np.all(got[:, :c0] == 7.0) and np.all(got[:, c1:] == 7.0)
    a, b = x.reshape(rows, k).astype(np.float64), wt.reshape(k, n).astype(np.float64)
    bound = k * np.finfo(np.float32).eps * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(got[:rows, c0:c1] - (a @ b)[:, c0:c1]) <= bound[:, c0:c1])


@pytest.mark.parametrize("rows,k,n,c0,c1", [(1, 7, 50, 0, 50), (3, 64, 96, 5, 93), (8, 16, 130, 0, 130),
                                            (5, 100, 130, 17, 130), (8, 9, 32, 0, 31), (6, 17, 300, 10, 290),
                                            (8, 5, 513, 0, 513)], ids=str)
def test_the_epilogue_in_the_stores_gives_the_separate_passes_bits(few_rows_by_tile, rows, k, n, c0, c1):
    """skinny_epilogue_f32, for every tile: mode 0 stores skinny_f32's outputs; mode 1 (acc + bias[row]) +
    residual, mode 2 then np.maximum(v, 0) (Relu), each sum rounded as the unfused Conv, Add and Relu round it;
    without has_bias the bias array is not read (a one-element stand-in) and -0.0 is added (a -0.0 output stays
    -0.0); NaN, inf, exact cancellations and -0.0 keep numpy's bits (compared as bits); outputs outside [c0, c1)
    and rows past `rows` are left alone (the residual there is NaN, so a read at a wrong offset shows)."""
    from rlx_runtime.simd import SKINNY_ROWS

    x = R.standard_normal(rows * k).astype(np.float32)
    wt = R.standard_normal(k * n).astype(np.float32)
    # row 0's first three outputs underflow to -0.0: each product of 1e-30 and -1e-20 rounds to -0.0
    x[:k] = 1e-30
    wt.reshape(k, n)[:, c0:c0 + 3] = -1e-20
    sk, _, _ = next(iter(few_rows_by_tile.values()))
    plain = np.full(SKINNY_ROWS * n, 7.0, np.float32)
    sk(plain, x, wt, rows, k, n, c0, c1)
    acc = plain.reshape(SKINNY_ROWS, n)[:rows, c0:c1]
    assert np.all(np.signbit(acc[0, :3])) and np.all(acc[0, :3] == 0)
    bias = R.standard_normal(SKINNY_ROWS).astype(np.float32)
    bias[0] = -0.0
    res = np.full((SKINNY_ROWS, n), np.nan, np.float32)  # outside the outputs: NaN, so a stray read shows
    inner = R.standard_normal(acc.shape).astype(np.float32)
    inner.flat[::7] = -(acc + bias[:rows, None]).flat[::7]  # exact cancellations: +0.0
    inner.flat[3::11], inner.flat[5::13], inner.flat[6::17] = np.nan, np.inf, -0.0
    inner[0, :3] = -0.0  # with no bias: -0.0 + -0.0, still -0.0 before the Relu
    res[:rows, c0:c1] = inner
    for tile, (_, _, ep) in few_rows_by_tile.items():
        for mode in (0, 1, 2):
            for has_bias in (False, True):
                for has_res in (False, True):
                    out = np.full(SKINNY_ROWS * n, 7.0, np.float32)
                    ep(out, x, wt, rows, k, n, c0, c1, bias if has_bias else np.full(1, np.nan, np.float32),
                       res.reshape(-1) if has_res else np.full(1, np.nan, np.float32), mode, has_bias, has_res)
                    want = plain.reshape(SKINNY_ROWS, n).copy()
                    if mode:
                        v = acc + bias[:rows, None] if has_bias else acc.copy()
                        if has_res:
                            v = v + inner
                        want[:rows, c0:c1] = np.maximum(v, np.float32(0)) if mode == 2 else v
                    np.testing.assert_array_equal(out.reshape(SKINNY_ROWS, n).view(np.uint32), want.view(np.uint32),
                                                  err_msg=f"tile {tile} mode {mode} bias {has_bias} res {has_res}")



@pytest.mark.parametrize("rows,count,pitch,src_pitch", [(1, 5, 9, 11), (3, 32, 40, 35), (4, 29, 29, 31),
                                                        (5, 64, 70, 66), (9, 45, 50, 47), (6, 100, 131, 120)],
                         ids=str)
def test_tap_rows_sum_each_output_by_fma_in_tap_order(rows, count, pitch, src_pitch):
    """tap_rows_f32 (the depthwise conv's taps): row r's output i is weights[t] * src[start + r * src_pitch +
    offsets[t] + i] added by fma in order of t from 0.0, bit for bit; nothing at or past `count` in a row (the
    masked last vector), before `at` or past the last row is written."""
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import tap_rows_f32

    run = numba.njit(lambda *a: tap_rows_f32(*a))
    weights = R.standard_normal(7).astype(np.float32)
    offsets = np.array([0, 1, 2, src_pitch, src_pitch + 2, 2 * src_pitch + 1, 3], np.int64)
    start, at = 3, 5
    src = R.standard_normal(start + (rows + 2) * src_pitch + count).astype(np.float32)
    dst = np.full(at + rows * pitch + 40, 7.0, np.float32)
    run(dst, at, pitch, src, start, src_pitch, rows, count, weights, offsets)
    want = np.zeros((rows, count), np.float32)
    lines = start + np.arange(rows)[:, None] * src_pitch + np.arange(count)[None, :]
    for w, off in zip(weights, offsets):
        want = fma32(np.full((rows, count), w, np.float32), src[lines + off], want)
    got = np.stack([dst[at + r * pitch:at + r * pitch + count] for r in range(rows)])
    np.testing.assert_array_equal(got, want)
    written = np.zeros(dst.size, bool)
    for r in range(rows):
        written[at + r * pitch:at + r * pitch + count] = True
    assert np.all(dst[~written] == 7.0)

# ------------------------------------------------ the channel-blocked depthwise kernel's tiles (conv_kernels.dw_blocks)
@pytest.fixture(scope="module", params=[16, 8], ids=["16-channel-blocks", "8-channel-blocks"])
def blocked_tiles(request):
    """(block, transpose, transpose_to, taps): njit wrappers of the tile intrinsics built for blocks of 16
    channels (AVX-512's) and of 8 (AVX2's), whichever this CPU takes."""
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import block_intrinsics

    transpose, transpose_to, taps = block_intrinsics(request.param)
    return (request.param, numba.njit(lambda *a: transpose(*a)), numba.njit(lambda *a: transpose_to(*a)),
            numba.njit(lambda *a: taps(*a)))


@pytest.mark.parametrize("scattered", [False, True])
def test_transpose_block_moves_exactly_the_tile(blocked_tiles, scattered):
    """transpose_block_f32 / transpose_block_to_f32: dst[at + j * pitch + i] (or at + where[w_at + j]) = src[start +
    i * src_pitch + j] for every i < rows, j < cols (0-block each: the full tile's plain moves and the masked
    ones), NaN payloads kept; nothing else written."""
    block, transpose, transpose_to, _ = blocked_tiles
    pitch, src_pitch, at, start, w_at = 19, 23, 4, 6, 3
    where = R.permutation(np.arange(block, dtype=np.int64) * pitch)  # each column its own place
    where = np.concatenate([np.full(w_at, -10**9, np.int64), where])  # nothing before w_at is read
    for rows in range(block + 1):
        for cols in range(block + 1):
            src = R.standard_normal(start + block * src_pitch + block).astype(np.float32)
            src[start + 2] = np.frombuffer(np.uint32(0x7FC01234).tobytes(), np.float32)[0]  # a NaN with a payload
            dst = np.full(at + block * pitch + block, 7.0, np.float32)
            if scattered:
                transpose_to(dst, at, where, w_at, src, start, src_pitch, rows, cols)
            else:
                transpose(dst, at, pitch, src, start, src_pitch, rows, cols)
            want = np.full_like(dst, 7.0)
            for j in range(cols):
                to = at + (where[w_at + j] if scattered else j * pitch)
                want[to:to + rows] = src[start + np.arange(rows) * src_pitch + j]
            np.testing.assert_array_equal(dst.view(np.uint32), want.view(np.uint32), err_msg=f"{rows}x{cols}")


@pytest.mark.parametrize("count", [0, 1, 5, 8, 9, 15, 16, 23])
def test_taps_block_sums_each_lane_by_fma_in_tap_order(blocked_tiles, count):
    """taps_block_f32: lane l of output pixel p is weights[w_at + B t + l] * src[start + step p + offsets[t] + l]
    added by fma in order of t from 0.0 (B = BLOCK), bit for bit (the tiles of 8 pixels and every rest); nothing else
    written."""
    B, taps = blocked_tiles[0], blocked_tiles[3]
    ntaps, step, start, at, w_at = 7, 3 * B, 5, B, 2 * B
    weights = R.standard_normal(w_at + B * ntaps).astype(np.float32)
    offsets = np.array([0, 1, 2, 10, 11, 21, 3], np.int64) * B
    src = R.standard_normal(start + step * max(count, 1) + 25 * B).astype(np.float32)
    dst = np.full(at + B * 24 + B, 7.0, np.float32)
    taps(dst, at, src, start, step, count, weights, w_at, offsets)
    want = np.zeros((count, B), np.float32)
    lanes = start + step * np.arange(count)[:, None] + np.arange(B)[None, :]
    for t in range(ntaps):
        want = fma32(np.broadcast_to(weights[w_at + B * t:w_at + B * (t + 1)], (count, B)),
                     src[lanes + offsets[t]], want)
    np.testing.assert_array_equal(dst[at:at + B * count].reshape(count, B), want)
    assert np.all(dst[:at] == 7.0) and np.all(dst[at + B * count:] == 7.0)


# ---------------------------------------------------------------- sigmoid_f32 (Sigmoid, SiLU, their conv epilogues)
def _exp_neg_abs_steps(x: np.ndarray) -> np.ndarray:
    """exp(-|x|) by the documented float32 steps (simd.py, above EXP_ABS_MAX) in numpy, one IEEE operation at a time
    (fma emulated exactly); NaN gives exp(-EXP_ABS_MAX) = 0."""
    f = np.float32
    from rlx_runtime import simd as u
    with np.errstate(all="ignore"):
        n = -np.abs(x)
        n = np.where(n > -u.EXP_ABS_MAX, n, -u.EXP_ABS_MAX).astype(f)
        k = np.rint(n * u.EXP_INV_LN2).astype(f)
        s = fma32(k, -u.EXP_LN2_LO, fma32(k, -u.EXP_LN2_HI, n))
        p = np.full_like(s, u.EXP_TERMS[0])
        for t in u.EXP_TERMS[1:]:
            p = fma32(p, s, t)
        e = fma32(p, s * s, s) + f(1.0)
        ki = k.astype(np.int32)
        k1 = np.maximum(ki, u.SCALE_MIN)
        return e * ((k1 + 127) << 23).astype(np.int32).view(f) * (((ki - k1) + 127) << 23).astype(np.int32).view(f)


def _sigmoid_steps(x: np.ndarray, silu: bool) -> np.ndarray:
    """sigmoid_f32's documented float32 steps (simd.py, above EXP_ABS_MAX) in numpy."""
    f = np.float32
    t = _exp_neg_abs_steps(x)
    with np.errstate(all="ignore"):
        r = np.where(x >= 0, f(1.0), t) / (f(1.0) + t)
        r = np.where(np.isnan(x), x, r).astype(f)
        return (x * r).astype(f) if silu else r


def test_fma32_is_exact_where_float64_lands_on_a_float32_midpoint():
    """a * b = +-(2^-24 - 2^-70) added to 1 + 2^-23: float64 rounds the sums to float32 midpoints (2^-70 is
    lost), and the lost part decides the side; rounding the float64 sum alone ties to even, the wrong side both
    times."""
    f = np.float32
    a = np.array([1 + 2.0 ** -23, -(1 + 2.0 ** -23)], f)
    b = np.full(2, (1 - 2.0 ** -23) * 2.0 ** -24, f)
    c = f(1 + 2.0 ** -23)
    np.testing.assert_array_equal(fma32(a, b, c), np.array([1 + 2.0 ** -23] * 2, f))
    naive = (a.astype(np.float64) * b + np.float64(c)).astype(f)
    assert not np.array_equal(naive, fma32(a, b, c))
    x = R.standard_normal(1000).astype(f)  # and away from midpoints, the float64 sum rounded once
    np.testing.assert_array_equal(fma32(x, x[::-1], f(0.25)), (x.astype(np.float64) * x[::-1] + 0.25).astype(f))


@pytest.fixture(scope="module")
def sigmoid_run():
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import sigmoid_f32

    @numba.njit(error_model="numpy")
    def run(dst, at, src, start, count, bias, silu):
        sigmoid_f32(dst, at, src, start, count, bias, silu)
    return run


@pytest.mark.parametrize("silu", [False, True], ids=["sigmoid", "silu"])
def test_sigmoid_f32_is_the_documented_steps_to_the_bit(sigmoid_run, silu):
    """Every value class (NaN, ±Inf, ±0, subnormals, the clamp at 104, random bit patterns) through the vector
    loop, the single vectors and the tail: the bits of the numpy float32 steps, with the bias added first (one
    rounding) and -0.0 as no bias (so -0.0 stays -0.0). Sorted runs too, so that whole vectors take the exponent-add
    scaling (every lane above about -86.6), whole vectors the two-factor one, and vectors across -86.6 mix them."""
    from cpu_target_probe import special_floats

    x = np.concatenate([special_floats(), R.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32), np.sort(R.uniform(-110, 110, 20_000)).astype(np.float32),
                        np.linspace(-88, -85, 3001, dtype=np.float32),
                        (R.standard_normal(5000) * 9).astype(np.float32)])
    for bias in (np.float32(-0.0), np.float32(0.75), np.float32(-3e38)):
        out = np.empty_like(x)
        sigmoid_run(out, 0, x, 0, x.size, bias, silu)
        with np.errstate(over="ignore", invalid="ignore"):
            want = _sigmoid_steps((x + bias).astype(np.float32), silu)
        np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32), err_msg=f"bias {bias}")


def test_sigmoid_f32_in_place_and_every_count_touches_only_its_elements(sigmoid_run):
    x = (R.standard_normal(200) * 8).astype(np.float32)
    for count in range(0, 90):
        for start in (0, 3):
            dst = np.full(120, 7.0, np.float32)
            sigmoid_run(dst, 5, x, start, count, np.float32(0.5), True)
            want = np.full(120, 7.0, np.float32)
            want[5:5 + count] = _sigmoid_steps(x[start:start + count] + np.float32(0.5), True)
            np.testing.assert_array_equal(dst, want, err_msg=f"count {count}")
            y = x.copy()
            sigmoid_run(y, start, y, start, count, np.float32(-0.0), False)
            np.testing.assert_array_equal(y[start:start + count], _sigmoid_steps(x[start:start + count], False))
            np.testing.assert_array_equal(y[:start], x[:start])
            np.testing.assert_array_equal(y[start + count:], x[start + count:])


@pytest.mark.parametrize("silu", [False, True], ids=["sigmoid", "silu"])
def test_sigmoid_f32_in_place_without_a_bias_stores_computed_vectors(silu):
    """In place with no bias (an epilogue after a residual, an elementwise Sigmoid over its dead input), a NaN
    lane's value is x + x, not the x loaded from where it is stored (the back end made every such store a masked
    one: tests/vector_code.py); its tail vector is masked by design."""
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import sigmoid_f32

    @numba.njit(error_model="numpy")
    def in_place(y, silu):
        sigmoid_f32(y, 0, y, 0, y.size, np.float32(-0.0), silu)

    y = np.array([np.nan, -np.nan, -0.0, 3.0, -1.0] * 9, np.float32)
    want = _sigmoid_steps(y, silu)
    in_place(y, silu)
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    assert stores_back_a_select_of_the_load(in_place.inspect_llvm(in_place.signatures[0])) == 0


def test_sigmoid_f32_reads_and_writes_nothing_past_the_end():
    _in_a_child(
        "from rlx_runtime.simd import sigmoid_f32\n"
        "@numba.njit(error_model='numpy')\n"
        "def run(dst, src, count):\n"
        "    sigmoid_f32(dst, 0, src, 0, count, np.float32(1.0), True)\n"
        "for count in range(1, 80):\n"
        "    src, m1 = t._guarded(count)\n"
        "    src[:] = np.arange(count, dtype=np.float32) - 40\n"
        "    dst, m2 = t._guarded(count)\n"
        "    run(dst, src, count)\n"
        "    assert np.array_equal(dst, t._sigmoid_steps(src + np.float32(1.0), True)), count\n")


# ---------------------------------------------------------------- max_f32 and exp_shifted_f32 (the row softmax)
@pytest.fixture(scope="module")
def row_max():
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import max_f32

    @numba.njit(error_model="numpy")
    def run(src, start, count):
        return max_f32(src, start, count)
    return run


def _max_ignoring_nan(x: np.ndarray) -> np.float32:
    ok = x[~np.isnan(x)]
    return np.float32(ok.max()) if ok.size else np.float32(-np.inf)


def test_max_f32_skips_nan_for_every_count_and_offset(row_max):
    """The largest non-NaN value (-inf when there is none) for every count through whole vectors and the masked
    tail, at three offsets; the maximum anywhere in the row (first, middle, last lane of the tail) is found."""
    src = (R.standard_normal(400) * 10).astype(np.float32)
    src[R.random(400) < 0.1] = np.nan
    for count in range(0, 130):
        for start in (0, 5, 33):
            assert row_max(src, start, count) == _max_ignoring_nan(src[start:start + count]), (count, start)
    for where in (0, 31, 32, 63, 64, 70):
        x = np.full(71, -5.0, np.float32)
        x[where] = 3.0
        assert row_max(x, 0, 71) == 3.0, where
    assert row_max(np.full(40, np.nan, np.float32), 0, 40) == -np.inf
    x = np.array([np.nan, -np.inf, 1.0, np.inf, 2.0], np.float32)
    assert row_max(x, 0, 5) == np.inf and row_max(x, 0, 3) == 1.0 and row_max(x, 0, 2) == -np.inf


def test_max_f32_reads_nothing_past_the_row():
    _in_a_child(
        "from rlx_runtime.simd import max_f32\n"
        "@numba.njit(error_model='numpy')\n"
        "def run(src, count):\n"
        "    return max_f32(src, 0, count)\n"
        "for count in range(1, 100):\n"
        "    src, m = t._guarded(count)\n"
        "    src[:] = np.arange(count, dtype=np.float32)\n"
        "    assert run(src, count) == count - 1, count\n")


@pytest.fixture(scope="module")
def exp_run():
    from rlx_format.numba_setup import numba
    from rlx_runtime.simd import exp_shifted_f32

    @numba.njit(error_model="numpy")
    def run(dst, at, src, start, count, shift):
        exp_shifted_f32(dst, at, src, start, count, shift)
    return run


def _exp_shifted_steps(x: np.ndarray, shift: np.float32) -> np.ndarray:
    with np.errstate(all="ignore"):
        d = (x - shift).astype(np.float32)
    return np.where(np.isnan(d), d, _exp_neg_abs_steps(d)).astype(np.float32)


def test_exp_shifted_f32_is_the_sigmoid_exp_to_the_bit_and_within_one_ulp(exp_run):
    """exp(x - shift) for x <= shift: the difference rounded once, then the sigmoid's exp steps (every value class
    and random bit patterns through the vector loop and the tail), NaN kept; and within 1 ulp of the correctly
    rounded exp of that difference."""
    from cpu_target_probe import special_floats

    x = np.concatenate([special_floats(), R.integers(0, 2**32, 50_000, dtype=np.uint64).astype(np.uint32)
                        .view(np.float32)])
    for shift in (np.float32(np.inf), np.float32(3e38), np.float32(0.0)):
        src = x[~(x > shift)]  # the kernel's contract: shift is at least every non-NaN element
        out = np.empty_like(src)
        exp_run(out, 0, src, 0, src.size, shift)
        np.testing.assert_array_equal(out.view(np.uint32), _exp_shifted_steps(src, shift).view(np.uint32))
    d = -(R.random(100_000) * 103).astype(np.float32)  # every result normal or subnormal, none flushed
    out = np.empty_like(d)
    exp_run(out, 0, d, 0, d.size, np.float32(0.0))
    want = np.exp(d.astype(np.float64)).astype(np.float32)
    normal = want >= np.finfo(np.float32).tiny
    ulps = np.abs(out.view(np.int32).astype(np.int64) - want.view(np.int32))
    assert ulps[normal].max() <= 1 and ulps[~normal].max() <= 1


def test_exp_shifted_f32_in_place_and_every_count_touches_only_its_elements(exp_run):
    x = -(R.random(200) * 20).astype(np.float32)
    for count in range(0, 70):
        dst = np.full(100, 7.0, np.float32)
        exp_run(dst, 5, x, 3, count, np.float32(0.5))
        want = np.full(100, 7.0, np.float32)
        want[5:5 + count] = _exp_shifted_steps(x[3:3 + count], np.float32(0.5))
        np.testing.assert_array_equal(dst, want, err_msg=f"count {count}")
        y = x.copy()
        exp_run(y, 3, y, 3, count, np.float32(0.0))
        np.testing.assert_array_equal(y[3:3 + count], _exp_shifted_steps(x[3:3 + count], np.float32(0.0)))
        np.testing.assert_array_equal(np.delete(y, np.s_[3:3 + count]), np.delete(x, np.s_[3:3 + count]))
