"""rlx_runtime.threads: the forward's own threads. Split GEMMs equal the unsplit ones up to the BLAS kernel's own
summation order (bitwise with OpenBLAS's SkylakeX kernels, within a dot product's rounding bound on its Haswell
ones), the BLAS is single-threaded inside a forward and restored after it, and chunks are pulled dynamically (a
stalled thread does not hold the rest)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from conftest import assert_same_dot_products
from conftest import numpy_blas_threads as _blas_threads
from rlx_runtime import threads
from rlx_runtime.threads import forward_threads, matmul, run_chunks, threads_in_use


R = np.random.default_rng(0)


def _f(*shape, dtype=np.float32):
    return R.standard_normal(shape).astype(dtype)


CASES = {
    "tall 2-D (rows split)": (_f(1024, 96), _f(96, 200)),
    "wide 2-D (columns split)": (_f(64, 300), _f(300, 2000)),
    "conv-like: 2-D weights times one image's columns": (_f(48, 150), _f(1, 1, 150, 3000)),
    "row blocks times one matrix (collapsed)": (_f(8, 128, 96), _f(96, 384)),
    "batched, both with the leading axis": (_f(6, 4, 128, 64), _f(6, 4, 64, 128)),
    "batched, weights broadcast": (_f(64, 100), _f(5, 1, 100, 700)),
    "batched, size-1 leading axis broadcast": (_f(1, 3, 200, 64), _f(4, 3, 64, 300)),
    "transposed view operand": (_f(700, 256).T, _f(700, 512)),
    "float64": (_f(300, 200, dtype=np.float64), _f(200, 400, dtype=np.float64)),
    "small (not split)": (_f(4, 8), _f(8, 5)),
    # one row: the split runs GEMVs over column blocks (b row-major, and b a transposed view)
    "one row times a wide matrix": (_f(1, 900), _f(900, 3000)),
    "one row times a transposed matrix": (_f(1, 900), _f(3000, 900).T),
    "one strided row": (_f(1, 1800)[:, ::2], _f(900, 3000)),
    "one row, float64": (_f(1, 900, dtype=np.float64), _f(900, 3000, dtype=np.float64)),
    # a GEMV's x must advance: a broadcast row (stride 0) and a reversed one are copied first
    "one broadcast row": (np.broadcast_to(_f(1, 1), (1, 900)), _f(900, 3000)),
    "one reversed row times a transposed matrix": (_f(1, 900)[:, ::-1], _f(3000, 900).T),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("numba_loaded", [False, True])
def test_split_matmul_equals_numpy(case, n, numba_loaded, monkeypatch):
    if numba_loaded:
        from rlx_format.numba_setup import numba  # noqa: F401 - the native pool's jobs and compiled calls
    else:
        monkeypatch.setattr(threads, "_kernels", lambda: None)  # as before numba is loaded: Python jobs, numpy calls
    a, b = CASES[case]
    with threadpool_limits(limits=1, user_api="blas"):
        want = np.matmul(a, b)  # one single-threaded BLAS call (OpenBLAS's own split can change the bits)
    with threadpool_limits(limits=n, user_api="blas"), forward_threads():
        assert threads_in_use() == n
        got = matmul(a, b)
    assert_same_dot_products(got, want, a, b)


def _halves_want(a, b):
    """a (1, k) @ b as the sum of the two GEMVs over b's halves of rows (each one single-threaded BLAS call)."""
    h = b.shape[0] // 2
    with threadpool_limits(limits=1, user_api="blas"):
        return np.matmul(a[:, :h], b[:h]) + np.matmul(a[:, h:], b[h:])


@pytest.mark.parametrize("case", ["one row times a wide matrix", "one strided row", "odd inner size"])
def test_a_one_row_product_over_row_major_weights_sums_their_halves_at_any_thread_count(case, monkeypatch):
    from rlx_format.numba_setup import numba  # noqa: F401 - the native pool and the one-thread compiled call
    from rlx_runtime.linear import ColumnBias
    a, b = CASES["one row times a wide matrix"] if case == "odd inner size" else CASES[case]
    if case == "odd inner size":
        a, b = a[:, :899], b[:899]
    bias = _f(b.shape[1])
    want = _halves_want(a, b)
    for n in (1, 2, 3):  # the same two GEMVs, run here or by the pool: the same bits
        with threadpool_limits(limits=n, user_api="blas"), forward_threads():
            np.testing.assert_array_equal(matmul(a, b), want, err_msg=f"{n} threads")
            np.testing.assert_array_equal(matmul(a, b, ColumnBias(bias)), want + bias, err_msg=f"{n} threads")
    with threadpool_limits(limits=4, user_api="blas"), forward_threads():
        # each half split by columns too (OpenBLAS's Haswell kernels round some elements at the edges differently)
        assert_same_dot_products(matmul(a, b), want, a, b)
    gemvs = []
    monkeypatch.setattr(threads.Steps, "gemv", lambda self, x, w, out: gemvs.append((self.rows, w.shape, w.base)))
    with threadpool_limits(limits=2, user_api="blas"), forward_threads():
        matmul(a, b)
    # two threads: each chunk one GEMV over a whole half of b's rows (contiguous memory), not a strip of every row
    k, n = b.shape
    assert [s for _, s, _ in gemvs] == [(k // 2, n), (k - k // 2, n)]


def test_a_one_row_product_sums_the_same_halves_without_numba(monkeypatch):
    a, b = CASES["one row times a wide matrix"]
    want = _halves_want(a, b)
    monkeypatch.setattr(threads, "_kernels", lambda: None)
    for n in (1, 2):  # numpy's matmul on each half (two threads: on the BLAS's own threads)
        with threadpool_limits(limits=n, user_api="blas"), forward_threads():
            assert_same_dot_products(matmul(a, b), want, a, b)


def test_int_and_mixed_dtypes_fall_back_to_numpy():
    a, b = R.integers(-5, 5, (300, 200)), R.integers(-5, 5, (200, 300))
    with threadpool_limits(limits=2, user_api="blas"), forward_threads():
        np.testing.assert_array_equal(matmul(a, b), a @ b)
        np.testing.assert_array_equal(matmul(a.astype(np.float32), b.astype(np.float64)), a.astype(np.float32) @ b)


def test_blas_is_single_threaded_inside_and_restored_after():
    with threadpool_limits(limits=2, user_api="blas"):
        with forward_threads():
            assert _blas_threads() == 1 and threads_in_use() == 2
            with forward_threads():  # nested (a control-flow body's plan)
                assert _blas_threads() == 1 and threads_in_use() == 2
            assert _blas_threads() == 1
        assert _blas_threads() == 2 and threads_in_use() == 1
    with threadpool_limits(limits=2, user_api="blas"):  # restored after an exception too
        with pytest.raises(ValueError), forward_threads():
            raise ValueError("boom")
        assert _blas_threads() == 2


def test_concurrent_forwards_restore_the_blas_once_the_last_ends():
    inside, release = threading.Barrier(3), threading.Event()
    seen = []

    def forward():
        with forward_threads():
            seen.append(threads_in_use())
            inside.wait()
            release.wait()

    with threadpool_limits(limits=2, user_api="blas"):
        ts = [threading.Thread(target=forward) for _ in range(2)]
        for t in ts:
            t.start()
        inside.wait()
        assert _blas_threads() == 1
        release.set()
        for t in ts:
            t.join()
        assert seen == [2, 2] and _blas_threads() == 2


def test_chunks_run_once_each_and_a_stalled_thread_does_not_hold_the_rest():
    done, who = [], {}
    lock = threading.Lock()

    def fn(i):
        if i == 0:
            time.sleep(0.3)  # this thread stalls: the other takes every remaining chunk meanwhile
        with lock:
            done.append(i)
            who.setdefault(threading.get_ident(), []).append(i)

    with threadpool_limits(limits=2, user_api="blas"), forward_threads():
        run_chunks(40, fn)
    assert sorted(done) == list(range(40))
    assert len(who) == 2
    stalled = next(ids for ids in who.values() if 0 in ids)
    assert stalled == [0]


def test_the_first_error_is_raised_after_every_chunk_finished():
    finished = []

    def fn(i):
        if i == 3:
            raise RuntimeError("chunk 3")
        time.sleep(0.001)
        finished.append(i)

    with threadpool_limits(limits=2, user_api="blas"), forward_threads():
        with pytest.raises(RuntimeError, match="chunk 3"):
            run_chunks(8, fn)
    assert 3 not in finished and len(set(finished)) == len(finished)


def test_outside_a_forward_nothing_is_split():
    assert threads_in_use() == 1
    calls = []
    run_chunks(3, calls.append)
    assert calls == [0, 1, 2]


def test_a_conv_and_attention_graph_agrees_at_one_and_two_threads():
    from rlx_format import GraphBuilder
    from rlx_runtime import Session

    g = GraphBuilder("t")
    x = g.input("x", "f32", [2, 8, 40, 40])
    y = g.op("Conv", x, g.constant(_f(32, 8, 3, 3)), pads=[1, 1, 1, 1])
    r = g.op("Reshape", y, g.constant(np.array([2, 32, 1600], np.int64)))
    q = g.op("Transpose", r, perm=[0, 2, 1])
    att = g.op("ScaledDotProductAttention", q, q, q)
    g.output(g.op("MatMul", att, g.constant(_f(32, 48))))
    feeds = {"x": _f(2, 8, 40, 40)}
    compiled = Session().compile(g.build())
    outs = []
    for n in (1, 2):
        with threadpool_limits(limits=n, user_api="blas"):
            outs.append(compiled.run(feeds)[compiled.output_names[0]])
    # split GEMMs may sum in another order (OpenBLAS's Haswell kernels), the rest is the same computation
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5 * float(np.abs(outs[0]).max()))
    assert threads._active == 0


@pytest.mark.parametrize("case", ["tall 2-D (rows split)", "wide 2-D (columns split)",
                                  "conv-like: 2-D weights times one image's columns", "batched, weights broadcast",
                                  "small (not split)"])
def test_the_epilogue_sees_every_block_once(case):
    from rlx_format.numba_setup import numba  # noqa: F401 - without numba the BLAS's own threads take a split GEMM
    a, b = CASES[case]
    m = a.shape[-2]
    row_bias = np.arange(m, dtype=np.float32) * np.float32(0.5)
    seen = []

    def epilogue(out3, b0, b1, r0, r1, c0, c1):
        assert out3.flags.c_contiguous and out3.shape[1] == m
        seen.append((b0, b1, r0, r1, c0, c1))
        out3[b0:b1, r0:r1, c0:c1] += row_bias[r0:r1, None]

    with threadpool_limits(limits=1, user_api="blas"):
        want = np.matmul(a, b) + row_bias[:, None]
    with threadpool_limits(limits=2, user_api="blas"), forward_threads():
        got = matmul(a, b, epilogue)
    assert_same_dot_products(got, want, a, b)
    assert sum((b1 - b0) * (r1 - r0) * (c1 - c0) for b0, b1, r0, r1, c0, c1 in seen) == want.size
    assert (len(seen) > 1) == (case != "small (not split)")


def _attention_cases():
    r = np.random.default_rng(5)

    def f(*s):
        return r.standard_normal(s).astype(np.float32)

    yield "batch blocks, float mask per batch", f(8, 12, 128, 64), f(8, 12, 128, 64), f(8, 12, 128, 64), \
        np.where(r.random((8, 1, 1, 128)) < 0.2, np.float32(-np.inf), np.float32(0)), False
    yield "batch blocks, bool mask broadcast", f(6, 4, 96, 32), f(6, 4, 160, 32), f(6, 4, 160, 48), \
        r.random((96, 160)) < 0.7, False
    yield "causal", f(4, 8, 128, 32), f(4, 8, 128, 32), f(4, 8, 128, 32), None, True
    yield "head blocks (one sequence)", f(1, 16, 128, 64), f(1, 16, 128, 64), f(1, 16, 128, 64), None, False
    yield "3-D", f(16, 256, 64), f(16, 256, 64), f(16, 256, 64), None, False
    yield "shared keys (size-1 batch axis)", f(8, 4, 128, 32), f(1, 4, 128, 32), f(1, 4, 128, 32), None, False
    fully = r.random((8, 1, 1, 128)) < 0.7
    fully[2] = False  # batch 2 attends to nothing: its rows give zeros
    yield "a fully masked batch", f(8, 4, 128, 32), f(8, 4, 128, 32), f(8, 4, 128, 32), fully, False
    plus = np.zeros((8, 1, 1, 128), np.float32)
    plus[5, 0, 0, 7] = np.inf  # an +inf score: its rows' max is not finite
    yield "an +inf score", f(8, 4, 128, 32), f(8, 4, 128, 32), f(8, 4, 128, 32), plus, False


@pytest.mark.parametrize("case", list(_attention_cases()), ids=lambda c: c[0])
@pytest.mark.parametrize("n", [1, 2])
def test_blocked_attention_equals_the_whole_tensor_bitwise(case, n):
    """The CPU kernel's blocks (along the batch or head axis, over the threads) give the bits of one unblocked
    _sdpa_block_cpu call on the whole tensor at one thread; that (its row softmax once numba is loaded) is the
    generic kernel's values within float32 rounding, and float64's."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the row softmax runs once numba is loaded
    from rlx_runtime.kernels import nn

    _, q, k, v, mask, causal = case
    a = {"scale": None, "causal": causal}
    with threadpool_limits(limits=1, user_api="blas"), np.errstate(all="ignore"):
        want = nn._sdpa_block_cpu(a, q, k, v, mask)
        generic = nn._sdpa(np, a, q, k, v, mask)
        exact = nn._sdpa(np, a, q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask)
    blocks = []
    real = nn._sdpa_block_cpu

    def spy(a_, q_, *rest):
        blocks.append(q_.shape)
        return real(a_, q_, *rest)

    with threadpool_limits(limits=n, user_api="blas"), forward_threads(), np.errstate(all="ignore"):
        try:
            nn._sdpa_block_cpu = spy
            got = nn._sdpa_cpu(np, a, q, k, v, mask)
        finally:
            nn._sdpa_block_cpu = real
    np.testing.assert_array_equal(got, want)
    assert len(blocks) > 1  # these cases are large enough to be split
    np.testing.assert_array_equal(np.isnan(want), np.isnan(generic))
    np.testing.assert_allclose(want, generic, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(want, exact, rtol=1e-5, atol=2e-6)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_runs_split_forwards_with_fresh_workers():
    """A child forked after the pool started has none of its threads: its forwards must not wait for them."""
    import os

    a, b = CASES["tall 2-D (rows split)"]
    with threadpool_limits(limits=2, user_api="blas"):
        with forward_threads():
            want = matmul(a, b)  # the parent's pool now exists
        pid = os.fork()
        if pid == 0:  # the child: exit code 0 only if the split forward finishes and is right
            code = 1
            try:
                with forward_threads():
                    code = 0 if np.array_equal(matmul(a, b), want) else 3
            finally:
                os._exit(code)
        deadline = time.time() + 30
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's forward hung")
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_batched_matmul_splits_as_a_python_job_only_when_its_work_pays_for_the_hand_offs(monkeypatch):
    """A stack of row blocks that cannot be one tall GEMM (a strided view, or with an epilogue) splits as a Python
    job, whose chunks take the GIL in turn: from _MIN_PYTHON_SPLIT multiply-adds only (an LSTM model's (8, 64, 256)
    @ (256, 16) took 130 us split at 2 threads, 50 whole)."""
    jobs = []
    real = threads.run_chunks
    monkeypatch.setattr(threads, "run_chunks", lambda count, fn: jobs.append(count) or real(count, fn))
    small = _f(64, 8, 256).transpose(1, 0, 2), _f(256, 16)  # 2^21 multiply-adds
    big = _f(64, 8, 256).transpose(1, 0, 2), _f(256, 64)  # 2^23
    for (a, b), splits in ((small, False), (big, True)):
        assert (a.size // a.shape[-1] * b.size >= threads._MIN_PYTHON_SPLIT) == splits
        jobs.clear()
        with threadpool_limits(limits=1, user_api="blas"):
            want = np.matmul(a, b)
        with threadpool_limits(limits=2, user_api="blas"), forward_threads():
            got = matmul(a, b)
        assert_same_dot_products(got, want, a, b)
        assert jobs == ([2] if splits else [])


def test_an_empty_product_still_gets_its_epilogue_block():
    """An empty GEMM (no rows) with an epilogue: the whole-call path viewed it as (-1, M, N), which an empty array
    cannot give; the epilogue gets the empty block."""
    seen = []
    with threadpool_limits(limits=2, user_api="blas"), forward_threads():
        got = matmul(_f(0, 6), _f(6, 20), lambda out3, *block: seen.append((out3.shape, block)))
    assert got.shape == (0, 20) and seen == [((1, 0, 20), (0, 1, 0, 0, 0, 20))]
