"""The worker pool behind rlx_runtime.threads: native jobs (threads.Steps rows that pool_kernels runs without the
GIL) and Python jobs (run_chunks) through one set of workers. Native and Python forms of a job give the same
bits; every chunk runs exactly once however jobs follow each other; workers asleep are woken; a second caller
while the pool is busy runs alone; without numba nothing loads it and splits still run."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numba  # noqa: F401 - the pool's native path needs numba loaded (threads._kernels)
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from conftest import numpy_blas_threads as _blas_threads
from rlx_runtime import conv_direct, conv_pointwise, conv_taps, linear, threads
from rlx_runtime.conv_kernels import bias_activation
from rlx_runtime.kernels import elementwise, nn
from rlx_runtime.pool_layout import WORKED
from rlx_runtime.threads import Steps, forward_threads, matmul, run_chunks

R = np.random.default_rng(7)


def _f(*shape):
    return R.standard_normal(shape).astype(np.float32)


@pytest.fixture
def split_small(monkeypatch):
    monkeypatch.setattr(threads, "_MIN_SPLIT_WORK", 0)


def _worked() -> int:
    return int(threads._pool.ctrl[WORKED]) if threads._pool is not None else 0


_F = {"pw_w": _f(16, 40), "pw_x": _f(2, 40, 900), "col_b": _f(300), "col_res": _f(700, 300), "scale": _f(2, 24, 1, 1)}


def _ops():
    """name -> a float32 computation that splits into pool jobs: one of each kind of native step (pool_layout's
    ROW_ kinds: GEMM, GEMV, conv epilogue, matmul bias columns, direct rows and their phase fill, tap planes,
    channel blocks, few-rows GEMM, row scales, row means)."""
    a, b, x1 = _f(700, 96), _f(96, 300), _f(1, 900)
    wide, w_t, a_t = _f(96, 2400), _f(2000, 900), _f(96, 700).T
    ep = bias_activation(_f(700), "HardSwish", 1 / 6, None, None, 1, 0.5)
    sig = bias_activation(_f(64), "Sigmoid", 0.0, None, None)
    clip = bias_activation(_f(64), "Clip", 0.0, -0.5, 0.25)
    xs, wd, wdw = _f(2, 3, 41, 37), _f(16, 3, 3, 3), _f(24, 1, 5, 5)
    xdw = _f(2, 24, 19, 23)
    dw_ep = bias_activation(_f(24), "Silu", 0.0, None, None, 24)
    hs = bias_activation(_f(16), "HardSwish", 0.2, None, None)
    return {
        "rows split": lambda: matmul(a, b),
        "columns split": lambda: matmul(a[:64], wide),
        "transposed operand": lambda: matmul(a_t, b),
        "strided operand (copied for the BLAS)": lambda: matmul(a[:, ::2], b[::2]),
        "one-row GEMV": lambda: matmul(x1, w_t.T),
        "one-row GEMV, row-major": lambda: matmul(x1, w_t[:900, :1500]),
        "epilogue, rows": lambda: matmul(a, b, ep),
        "epilogue, columns, Sigmoid": lambda: matmul(a[:64], wide, sig),
        "epilogue, Clip": lambda: matmul(a[:64], wide, clip),
        "direct stem + HardSwish": lambda: conv_direct.direct2d(xs, wd, (2, 2), (1, 1), [1, 1, 1, 1], (21, 19), hs),
        "depthwise taps + Silu": lambda: conv_taps.taps2d(xdw, wdw, (1, 1), (1, 1), [2, 2, 2, 2], (19, 23), dw_ep),
        "depthwise channel blocks + Silu": lambda: conv_taps.run_blocked(
            conv_taps.BlockPlan(xdw.shape, wdw, (1, 1), (1, 1), [2, 2, 2, 2], (19, 23)), xdw, dw_ep),
        "pointwise + HardSwish": lambda: conv_pointwise.pointwise(_F["pw_w"], _F["pw_x"], hs),
        "bias columns + residual": lambda: matmul(a, b, linear.ColumnBias(_F["col_b"], _F["col_res"])),
        "row scales": lambda: elementwise.scaled_rows(xdw, _F["scale"], 19 * 23),
        "row means": lambda: nn._channel_means(xdw, 19 * 23),
    }


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_native_jobs_give_the_python_jobs_bits(split_small, monkeypatch):
    ops = _ops()
    with threadpool_limits(2, "blas"), forward_threads():
        native = {k: op() for k, op in ops.items()}
        assert threads._pool is not None and _worked() > 0  # the workers ran native chunks
        with monkeypatch.context() as m:
            m.setattr(threads.Steps, "native", property(lambda self: False))  # each step a Python call
            # ...of the same chunks: not whole GEMMs on the BLAS's own threads, which split them otherwise (OpenBLAS's
            # Haswell kernels, chosen on some AMD CPUs, round elements at its chunk edges differently; that path
            # has its own tests)
            m.setattr(threads, "blas_threads_instead", lambda n: False)
            python = {k: op() for k, op in ops.items()}
    for k in ops:
        np.testing.assert_array_equal(native[k], python[k], err_msg=k)


def _accumulating_job(count: int, out: np.ndarray, eye: np.ndarray, native: bool = True) -> None:
    """count chunks; chunk i adds row i + 1 to out[i] (out[i] += [i + 1, 0, 0, 0] @ I): a chunk run twice or
    not at all shows."""
    with Steps(count, native) as steps:
        for i in range(count):
            steps.gemm(np.array([[i + 1, 0, 0, 0]], np.float32), eye, out[i:i + 1], beta=1.0)
            steps.end_chunk()
        steps.run()


def _within(seconds: float, fn) -> None:
    """fn() on another thread; fail (instead of hanging the run) if it has not returned in time."""
    error = []

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            error.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"did not finish in {seconds} s: a job that never completes")
    if error:
        raise error[0]


def test_back_to_back_jobs_run_every_chunk_exactly_once():
    _within(120, _back_to_back_jobs)


def _back_to_back_jobs():
    eye = np.eye(4, dtype=np.float32)
    rng = np.random.default_rng(3)
    with threadpool_limits(2, "blas"), forward_threads():
        for job in range(3000):
            count = int(rng.integers(1, 10))
            out = np.zeros((count, 4), np.float32)
            if job % 5 == 4:  # a Python job in between
                seen = []
                run_chunks(count, seen.append)
                assert sorted(seen) == list(range(count))
                continue
            _accumulating_job(count, out, eye)
            np.testing.assert_array_equal(out[:, 0], np.arange(1, count + 1, dtype=np.float32), err_msg=str(job))
            assert not out[:, 1:].any()


def test_a_sleeping_worker_is_woken_for_the_next_job(split_small):
    a, b = _f(4000, 256), _f(256, 256)  # two chunks of ~2 ms: the woken worker takes the second
    with threadpool_limits(2, "blas"), forward_threads():
        matmul(a, b)
        for _ in range(20):
            time.sleep(0.05)  # far past the workers' polling window: they are asleep
            before = _worked()
            got = matmul(a, b)
            if _worked() > before:
                break
        else:
            pytest.fail("no worker took a chunk after sleeping")
    with threadpool_limits(1, "blas"):
        want = a @ b
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_second_caller_runs_alone_while_the_pool_is_busy(split_small):
    eye = np.eye(4, dtype=np.float32)
    a, b = _f(600, 128), _f(128, 200)
    holding, release = threading.Event(), threading.Event()
    result = {}

    def holder():
        with threadpool_limits(2, "blas"), forward_threads():
            with Steps(8) as steps:
                assert steps.native
                holding.set()
                release.wait(10)  # holds the pool meanwhile
                out = np.zeros((3, 4), np.float32)
                for i in range(3):
                    steps.gemm(np.array([[i + 1, 0, 0, 0]], np.float32), eye, out[i:i + 1], beta=1.0)
                    steps.end_chunk()
                steps.run()
                result["holder"] = out

    t = threading.Thread(target=holder)
    t.start()
    assert holding.wait(10)
    with threadpool_limits(2, "blas"), forward_threads():
        with Steps(8) as steps:
            assert not steps.native  # the pool is taken: this job runs on its own thread
        result["second"] = matmul(a, b)
    release.set()
    t.join(10)
    with threadpool_limits(1, "blas"):
        np.testing.assert_allclose(result["second"], a @ b, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(result["holder"][:, 0], [1, 2, 3])


def test_more_threads_start_a_larger_pool_and_retire_the_old_one(split_small):
    a, b = _f(900, 128), _f(128, 300)
    with threadpool_limits(1, "blas"):
        want = a @ b
    for n in (2, 3):
        with threadpool_limits(n, "blas"), forward_threads():
            got = matmul(a, b)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        assert threads._pool.size >= n - 1
    size = threads._pool.size
    for _ in range(100):  # the old pool's workers leave once they see it closed
        if sum(t.name == "rlx" for t in threading.enumerate()) == size:
            break
        time.sleep(0.02)
    assert sum(t.name == "rlx" for t in threading.enumerate()) == size


def test_one_thread_makes_one_chunk():
    assert threads.chunk_edges(1000, 1) == [0, 1000]
    assert threads.chunk_edges(1000, 2) == [0, 500, 1000]
    assert threads.chunk_edges(20, 2) == [0, 20]  # chunks of at least _MIN_CHUNK


_NO_NUMBA = """
import sys, threading
sys.modules["numba"] = None  # any import of numba fails
import numpy as np
from threadpoolctl import threadpool_limits
from rlx_runtime import threads
threads._MIN_SPLIT_WORK = 0
r = np.random.default_rng(0)
a, b = r.standard_normal((800, 64)).astype(np.float32), r.standard_normal((64, 300)).astype(np.float32)
who = set()
with threadpool_limits(2, "blas"), threads.forward_threads():
    got = threads.matmul(a, b)
    for _ in range(50):
        threads.run_chunks(4, lambda i: (who.add(threading.get_ident()), __import__("time").sleep(0.002)))
with threadpool_limits(1, "blas"):
    want = a @ b
assert np.allclose(got, want, rtol=1e-5, atol=1e-4)
assert threads._pool_kernels is None and len(who) == 2
print("ok")
"""


def test_without_numba_splits_run_as_python_jobs():
    out = subprocess.run([sys.executable, "-c", _NO_NUMBA], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ------------------------------------------------------------------ without native hand-offs: the BLAS's threads


def _spy(monkeypatch, name: str) -> list[int]:
    """Record the BLAS's thread count at each call of threads.<name>, then call it."""
    seen, real = [], getattr(threads, name)

    def spy(*args, **kwargs):
        seen.append(_blas_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(threads, name, spy)
    return seen


def test_without_native_hand_offs_a_large_gemm_runs_on_the_blas_threads(monkeypatch):
    """numba not loaded: a split GEMM is one BLAS call with the BLAS at the forward's thread count (its threads
    spin; a hand-off to rlx's sleeping workers costs a futex wake each way), then single-threaded again."""
    monkeypatch.setattr(threads, "_kernels", lambda: None)
    seen = _spy(monkeypatch, "_whole")
    a, b = _f(256, 576), _f(576, 784)
    with threadpool_limits(2, "blas"):
        with forward_threads():
            got = matmul(a, b)
            assert _blas_threads() == 1
        with threadpool_limits(1, "blas"), forward_threads():
            want = matmul(a, b)  # one thread: not split
        assert _blas_threads() == 2  # the caller's setting, restored when the forward ends
    assert seen == [2, 1]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_with_native_hand_offs_the_blas_stays_single_threaded(monkeypatch):
    seen = _spy(monkeypatch, "_whole")
    with threadpool_limits(2, "blas"), forward_threads():
        matmul(_f(256, 576), _f(576, 784))
    assert seen == []  # split into single-threaded BLAS calls that rlx's workers take


def test_blas_thread_scopes_nest_and_the_last_to_end_restores_one_thread():
    with threadpool_limits(2, "blas"), forward_threads():
        with threads.blas_threads(2):
            with threads.blas_threads(2):
                assert _blas_threads() == 2
            assert _blas_threads() == 2  # the outer scope is still open
            with pytest.raises(ValueError), threads.blas_threads(2):
                raise ValueError("boom")
            assert _blas_threads() == 2
        assert _blas_threads() == 1


def test_without_native_hand_offs_a_shifted_view_conv_runs_its_gemms_on_the_blas_threads(monkeypatch):
    from rlx_runtime import conv_shifted

    x, w = _f(1, 64, 56, 56), _f(64, 64, 3, 3)
    assert conv_shifted.use_shifted(x.shape, x.dtype, w, (1, 1), 1, (56, 56))
    with threadpool_limits(1, "blas"), forward_threads():
        want = conv_shifted.conv2d_shifted(x, w, (1, 1), (1, 1, 1, 1), (56, 56))
    monkeypatch.setattr(threads, "_kernels", lambda: None)
    seen = _spy(monkeypatch, "gemm_into")
    with threadpool_limits(2, "blas"), forward_threads():
        got = conv_shifted.conv2d_shifted(x, w, (1, 1), (1, 1, 1, 1), (56, 56))
    assert seen == [2] * 9  # one GEMM per kernel offset over the whole output, not one per row block
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_a_gemv_splits_from_a_mebibyte_of_weights(monkeypatch):
    """A one-row MatMul streams its matrix from memory: split from 1 MiB of it, though its multiply-adds are
    below the GEMM split threshold."""
    a, b = _f(1, 512), _f(512, 512)
    assert b.size * 4 >= 1 << 20 and b.size < threads._MIN_SPLIT_WORK
    chunks, real_run = [], Steps.run

    def run(steps):  # which worker takes a chunk is timing (the caller takes any not yet taken): count them posted
        chunks.append(len(steps.starts) - 1)
        return real_run(steps)

    monkeypatch.setattr(Steps, "run", run)
    with threadpool_limits(2, "blas"), forward_threads():
        got = matmul(a, b)
        smaller = matmul(a[:, :256], b[:256])  # half a MiB: one call
    assert chunks == [2]
    assert threads.threads_for(b.size) == 1
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(smaller, a[:, :256] @ b[:256], rtol=1e-5, atol=1e-4)


_NO_NUMBA_RESNET = """
import sys
sys.modules["numba"] = None  # any import of numba fails: compile and the forward go on without it
import numpy as np
from threadpoolctl import threadpool_limits
from rlx_format import read_rlx
from rlx_runtime import Session, threads
entered, real = [], threads.blas_threads
threads.blas_threads = lambda n: (entered.append(n), real(n))[1]
compiled = Session().compile(read_rlx(sys.argv[1]))
x = np.load(sys.argv[2])
with threadpool_limits(2, "blas"):
    out = compiled.run({compiled.input_names[0]: x})[compiled.output_names[0]]
assert threads._pool_kernels is None and entered and set(entered) == {2}, entered
np.save(sys.argv[3], out)
"""


def test_without_numba_a_real_resnet_on_the_blas_threads_matches_onnxruntime(tmp_path):
    """The onnx package's ResNet-50 (random weights), baked here, then read and run at 2 threads in a process
    where numba cannot be imported (compile, which loads numba for a float32 CNN, goes on without it): its GEMMs
    run on OpenBLAS's threads, and the result is onnxruntime's."""
    import onnxruntime as ort
    from test_partial_eval import _light_resnet_with_random_weights

    from rlx_bake import BakeOptions, bake
    from rlx_bake.onnx import import_onnx
    from rlx_format import write_rlx

    path = _light_resnet_with_random_weights(tmp_path)
    rf, _ = bake(*import_onnx(path), BakeOptions.from_profile("exact"))
    write_rlx(tmp_path / "model.rlx", rf)
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    out = subprocess.run([sys.executable, "-c", _NO_NUMBA_RESNET, str(tmp_path / "model.rlx"), str(tmp_path / "x.npy"),
                          str(tmp_path / "out.npy")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert ref.std() > 1e-4  # not a constant softmax
    # the tolerance test_partial_eval holds the same model to at one thread (measured 6.9e-7 there)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), ref, rtol=1e-5, atol=3e-6)


# ------------------------------------------------------------------ the few-rows GEMM (simd.skinny_f32)

FEW_ROWS = [(2, 16, 64), (5, 300, 203), (8, 256, 1024), (9, 40, 97), (16, 512, 130), (3, 17, 64)]


@pytest.mark.parametrize("m,k,n", FEW_ROWS, ids=str)
def test_few_rows_matmul_sums_each_dot_in_order(m, k, n):
    """Each output is its k products added by fma in order from 0.0: within a dot product's rounding of the
    float64 value, and the same bits at one and two threads (the column blocks never split a dot product)."""
    a, b = _f(m, k), _f(k, n)
    with threadpool_limits(1, "blas"), forward_threads():
        one = threads.few_rows_matmul(a, b)
    with threadpool_limits(2, "blas"), forward_threads():
        two = threads.few_rows_matmul(a, b)
    np.testing.assert_array_equal(one, two)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = k * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    assert np.all(np.abs(one - exact) <= bound)


def test_few_rows_matmul_propagates_nan_and_inf_like_a_dot_product():
    a, b = _f(4, 64), _f(64, 96)
    a[1, 3], a[2, 5], b[7, 40] = np.nan, np.inf, np.inf
    got = threads.few_rows_matmul(a, b)
    with np.errstate(invalid="ignore"):
        want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))


@pytest.mark.parametrize("shapes", [((1, 64), (64, 96)), ((17, 64), (64, 96)), ((4, 8), (8, 96)), ((4, 64), (64, 32))],
                         ids=str)
def test_few_rows_matmul_declines_what_it_does_not_cover(shapes):
    a, b = _f(*shapes[0]), _f(*shapes[1])
    assert threads.few_rows_matmul(a, b) is None
    assert threads.few_rows_matmul(a.astype(np.float64), b.astype(np.float64)) is None
    assert threads.few_rows_matmul(_f(4, 64), _f(96, 64).T) is None  # b not C-contiguous


def test_matmul_ops_and_gru_steps_take_the_few_rows_kernel(monkeypatch, tmp_path):
    from rlx_format import GraphBuilder
    from rlx_runtime import Session

    calls = []
    real = threads.few_rows_matmul
    monkeypatch.setattr(threads, "few_rows_matmul", lambda a, b: calls.append(a.shape) or real(a, b))
    g = GraphBuilder("m")
    x = g.input("x", "f32", [2, 3, 128])
    w = _f(128, 300)
    g.output(g.op("MatMul", x, g.constant(w), name="y"))
    xv = _f(2, 3, 128)
    got = Session().compile(g.build()).run({"x": xv})["y"]
    assert calls == [(6, 128)]
    np.testing.assert_allclose(got, xv @ w, rtol=1e-5, atol=1e-4)
    calls.clear()
    # a GRU with clip, which keeps the generic steps (through the ONNX import): each step's state times Rᵀ (twice:
    # the gates, then the candidate), checked against onnxruntime (other LSTMs' and GRUs' steps run in
    # recurrent_kernels.py, on the same kernel)
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from rlx_bake import BakeOptions, bake
    from rlx_bake.onnx import import_onnx

    hid, seq = 64, 5
    inits = [numpy_helper.from_array(_f(1, 3 * hid, 32) * 0.3, "W"),
             numpy_helper.from_array(_f(1, 3 * hid, hid) * 0.3, "R")]
    node = helper.make_node("GRU", ["x", "W", "R"], ["Y"], hidden_size=hid, clip=50.0)
    m = helper.make_model(helper.make_graph([node], "l", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                        [seq, 8, 32])],
                                            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "gru.onnx"
    path.write_bytes(m.SerializeToString())
    rf, _ = bake(*import_onnx(path), BakeOptions.from_profile("exact"))
    xv = _f(seq, 8, 32)
    got = Session().compile(rf).run({"x": xv})["Y"]
    assert calls == [(8, hid)] * 2 * seq  # two per step
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": xv})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ numba's parallel kernels inside a forward


def test_numba_parallel_kernels_run_on_the_forwards_thread_count():
    from rlx_runtime.numba_parallel import parallel_call

    before = numba.get_num_threads()
    seen = []
    for n in (1, 2):
        with threadpool_limits(n, "blas"), forward_threads():
            parallel_call(lambda: seen.append(numba.get_num_threads()))
    parallel_call(lambda: seen.append(numba.get_num_threads()))  # outside a forward: numba's own setting
    assert seen == [1, min(2, numba.config.NUMBA_NUM_THREADS), before]
    assert numba.get_num_threads() == before


def test_a_numba_parallel_kernel_sends_the_polling_workers_to_sleep(split_small, monkeypatch):
    from rlx_runtime.numba_parallel import parallel_call
    from rlx_runtime.pool_layout import YIELD

    a, b = _f(600, 128), _f(128, 300)
    assert threads._kernels() is not None  # its first call measures _polls: before the patch, not over it
    monkeypatch.setattr(threads, "_polls", 1 << 50)  # idle workers would poll for days: only YIELD stops them
    with threadpool_limits(2, "blas"), forward_threads():
        matmul(a, b)  # the pool exists from here
        pool = threads._pool
        # a worker still polling with the budget it had before the patch (jobs kept coming within it) would keep
        # that budget: first every worker to sleep, then each wakes at a job and polls on with the long one
        parallel_call(lambda: None)
        for _ in range(200):
            if pool.sleeping == pool.size:
                break
            time.sleep(0.005)
        for _ in range(3):
            matmul(a, b)
            time.sleep(0.01)
        time.sleep(0.05)
        assert pool.sleeping == 0  # still polling
        parallel_call(lambda: None)
        for _ in range(200):
            if pool.sleeping == pool.size:
                break
            time.sleep(0.005)
        assert pool.sleeping == pool.size and pool.ctrl[YIELD] == 1
        before = _worked()
        for _ in range(20):  # the next jobs wake them again
            got = matmul(a, b)
            if _worked() > before:
                break
        assert _worked() > before and pool.ctrl[YIELD] == 0
        parallel_call(lambda: None)  # and to sleep again, before _polls is restored
    with threadpool_limits(1, "blas"):
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-4)
