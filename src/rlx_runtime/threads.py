"""rlx's own threads for the CPU forward: large GEMMs split into chunks that the caller and a worker pool pull.

Why not the BLAS's threads: OpenBLAS splits each call statically and waits for every one of its threads, so
on a shared machine a descheduled thread costs a scheduler time slice per call (measured here, 2 cores with
other processes running: a YOLO-like forward took 22 ms with one BLAS thread and 104 ms with two), and small
GEMMs gain nothing from its split even on a quiet machine. Here the calling thread and the workers take
chunks from a shared counter, so whoever runs takes the next one and a late thread delays at most its own
chunk. Inside a forward the BLAS runs single-threaded.

How many threads: as many as the BLAS is set to when the forward starts (OPENBLAS_NUM_THREADS, or
threadpoolctl's `threadpool_limits`), which is how numpy users already choose them. `threads_in_use()`
reports it. While any rlx forward runs, the process's BLAS is single-threaded (restored when the last ends).

Each chunk is one single-threaded BLAS call (cblas_?gemm through ctypes, which drops the GIL; np.matmul with
out= keeps it, so chunks written in place would run one at a time) over the whole inner dimension, so every
output element is the same dot product as in the unsplit call, up to the order the BLAS kernel sums it in:
OpenBLAS's SkylakeX kernels give the same bits however the output is split, its Haswell kernels round some
elements differently at chunk edges (tests/test_threads.py bounds the difference as a dot product's).
Measured on this 2-core machine: with both cores free, single GEMMs split this way
take 0.8-2.1x the time of OpenBLAS's own two threads (each chunk packs its other operand again; small GEMMs
pay the pool's wake-up); with another process busy, a YOLO-like forward at two threads takes 22-26 ms
(best-median) where OpenBLAS's own split took 26-38 ms.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

_MIN_SPLIT_WORK = 1 << 21  # multiply-adds below which one call beats the split (a few tens of us)
_BIG_WORK = 1 << 25        # multiply-adds from which a GEMM splits into one chunk per thread (packs less)
_MIN_CHUNK = 64            # rows or columns per chunk
_CHUNKS_PER_THREAD = 2     # enough chunks that a late thread is covered, few enough to pack operands rarely

_lock = threading.Lock()
_active = 0                # forwards running (any thread); the first saves the BLAS's setting, the last restores
_saved = 1
_blas: list | None = None  # the BLAS libraries rlx holds (_OpenBLAS), found once
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_local = threading.local()


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's worker threads (and no forward running): start afresh."""
    global _lock, _active, _pool, _pool_size
    _lock, _active, _pool, _pool_size = threading.Lock(), 0, None, 0


os.register_at_fork(after_in_child=_after_fork_in_child)


class _OpenBLAS:
    """get/set of an OpenBLAS built with its own pthreads pool (numpy's wheels), whose thread count is
    process-wide. Called directly: threadpoolctl's own setter ignores every thread but the one that first
    set a limit, and a forward may run on any thread."""

    def __init__(self, path: str):
        import ctypes
        lib = ctypes.CDLL(path)
        for prefix, suffix in itertools.product(("", "scipy_"), ("", "64_", "_64")):
            get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            if get is not None:
                self.get, self.set = get, getattr(lib, f"{prefix}openblas_set_num_threads{suffix}")
                # the GEMMs themselves: ctypes drops the GIL for the call (np.matmul with out= keeps it)
                index = ctypes.c_int64 if suffix else ctypes.c_int
                self.gemm = self._cblas(lib, prefix, suffix, "gemm", 3, index)
                self.gemv = self._cblas(lib, prefix, suffix, "gemv", 2, index)
                return
        raise LookupError(path)

    @staticmethod
    def _cblas(lib, prefix: str, suffix: str, op: str, flags: int, index) -> dict:
        """dtype -> cblas_s{op} / cblas_d{op} of lib with argtypes set (absent ones left out): `flags` order /
        transpose ints, then as many sizes, alpha, A, lda, B (or x), ldb (or incx), beta, C (or y), ldc (incy)."""
        import ctypes
        found = {}
        for dtype, letter, scalar in ((np.float32, "s", ctypes.c_float), (np.float64, "d", ctypes.c_double)):
            fn = getattr(lib, f"{prefix}cblas_{letter}{op}{suffix}", None)
            if fn is not None:
                fn.restype = None
                fn.argtypes = ([ctypes.c_int] * flags + [index] * flags + [scalar, ctypes.c_void_p, index,
                               ctypes.c_void_p, index, scalar, ctypes.c_void_p, index])
                found[np.dtype(dtype)] = fn
        return found


def _blas_controllers() -> list[_OpenBLAS]:
    """The process's BLAS libraries rlx can hold single-threaded. Others (an OpenMP-threaded OpenBLAS, MKL, ...)
    have per-thread limits rlx does not manage: with one of those loaded rlx leaves the BLAS alone and does
    not split (the BLAS's own threads are used)."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import threadpool_info
            infos = [i for i in threadpool_info() if i["user_api"] == "blas"]
            ok = all(i["internal_api"] == "openblas" and i.get("threading_layer") == "pthreads" for i in infos)
            _blas = [_OpenBLAS(i["filepath"]) for i in infos] if ok else []
        except Exception:  # noqa: BLE001 - no introspectable BLAS: rlx then runs one thread
            _blas = []
    return _blas


@contextlib.contextmanager
def forward_threads() -> Iterator[None]:
    """The scope of one CPU forward: rlx's thread count is the BLAS's setting at entry; the BLAS runs
    single-threaded inside. Reentrant, and safe for forwards on several threads at once."""
    global _active, _saved
    with _lock:
        if _active == 0:
            libs = _blas_controllers()
            _saved = max([c.get() for c in libs], default=1)
            if _saved > 1:
                for c in libs:
                    c.set(1)
        _active += 1
        threads = _saved
    outer = getattr(_local, "threads", None)
    _local.threads = threads
    try:
        yield
    finally:
        _local.threads = outer
        with _lock:
            _active -= 1
            if _active == 0 and _saved > 1:
                for c in _blas_controllers():
                    c.set(_saved)


def threads_in_use() -> int:
    """Threads the current forward splits work over (1 outside a forward)."""
    return getattr(_local, "threads", None) or 1


def threads_for(work: int) -> int:
    """Threads worth splitting `work` multiply-adds over: 1 below _MIN_SPLIT_WORK (waking a worker costs more)."""
    return threads_in_use() if work >= _MIN_SPLIT_WORK else 1


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _lock:
        if _pool is None or _pool_size < workers:
            old, _pool, _pool_size = _pool, ThreadPoolExecutor(workers, thread_name_prefix="rlx"), workers
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def run_chunks(count: int, fn: Callable[[int], None]) -> None:
    """fn(0) .. fn(count - 1), pulled by the caller and up to threads_in_use() - 1 workers; the first
    exception is raised here after every taken chunk has finished. Inside a chunk nothing splits again, on
    the caller as on the workers (so a chunk's result does not depend on which thread ran it)."""
    workers = min(threads_in_use(), count) - 1
    if workers <= 0:
        for i in range(count):
            fn(i)
        return
    counter = itertools.count()
    outer = getattr(_local, "threads", None)
    _local.threads = 1
    try:
        _pull_with(counter, count, fn, workers)
    finally:
        _local.threads = outer


def _pull_with(counter, count: int, fn: Callable[[int], None], workers: int) -> None:
    """The caller and `workers` pool threads take chunk numbers from `counter` until `count`."""

    def pull() -> None:
        for i in counter:
            if i >= count:
                return
            fn(i)

    pool = _executor(workers)
    futures = [pool.submit(pull) for _ in range(workers)]
    error = None
    try:
        pull()
    except BaseException as e:  # noqa: BLE001 - re-raised once the workers are done
        error = e
    for f in futures:
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001
            error = error or e
    if error is not None:
        raise error


def chunk_edges(length: int, threads: int, work: int = 0, min_chunk: int = _MIN_CHUNK) -> list[int]:
    """Chunk edges along `length`: a few chunks per thread (one for a long GEMM), each at least min_chunk."""
    per = 1 if work >= _BIG_WORK else _CHUNKS_PER_THREAD
    chunks = max(1, min(threads * per, length // min_chunk))
    return [length * i // chunks for i in range(chunks + 1)]


# epilogue(out3, b0, b1, r0, r1, c0, c1): runs in place on block [b0, b1) x [r0, r1) x [c0, c1) of the whole
# output viewed as (B, M, N), once the block's GEMM is done, on the thread that computed it
Epilogue = Callable[[np.ndarray, int, int, int, int, int, int], None]


def _whole(a: np.ndarray, b: np.ndarray, epilogue: Epilogue | None) -> np.ndarray:
    out = np.matmul(a, b)
    if epilogue is not None:
        out3 = out.reshape(-1, *out.shape[-2:])
        epilogue(out3, 0, out3.shape[0], 0, out3.shape[1], 0, out3.shape[2])
    return out


_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _blas_operand(x: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(array, transpose flag, leading dimension) describing 2-D x to a row-major cblas call."""
    item = x.itemsize
    if x.strides[1] == item and x.strides[0] % item == 0 and x.strides[0] >= max(1, x.shape[1]) * item:
        return x, _NO_TRANS, x.strides[0] // item
    if x.strides[0] == item and x.strides[1] % item == 0 and x.strides[1] >= max(1, x.shape[0]) * item:
        return x, _TRANS, x.strides[1] // item
    x = np.ascontiguousarray(x)
    return x, _NO_TRANS, max(1, x.shape[1])


def float_gemm(dtype) -> Callable | None:
    """The cblas sgemm/dgemm of the BLAS rlx manages, for float32/float64 (None: no such BLAS or dtype)."""
    libs = _blas_controllers()
    return libs[0].gemm.get(np.dtype(dtype)) if libs else None


def _gemm_into(gemm, a: np.ndarray, b: np.ndarray, out: np.ndarray, beta: float = 0.0) -> None:
    """out[:] = a @ b + beta * out for 2-D views (out's rows contiguous), one single-threaded BLAS call without
    the GIL."""
    (a, ta, lda), (b, tb, ldb) = _blas_operand(a), _blas_operand(b)
    m, k = a.shape
    gemm(_ROW_MAJOR, ta, tb, m, b.shape[1], k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, beta, out.ctypes.data,
         out.strides[0] // out.itemsize)


def _row_times_columns(gemv, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out[0, :] = a[0] @ b for a one-row a: a GEMV (OpenBLAS's GEMM with one row packs all of b first, which
    made a GPT-2 decoding step's split MatMuls slower on two threads than on one)."""
    (w, tw, ldw) = _blas_operand(b)
    k, n = b.shape
    x, incx = a.ctypes.data, a.strides[1] // a.itemsize
    if tw == _NO_TRANS:  # b row-major (k, n): out = bᵀ-gemv over its k rows
        gemv(_ROW_MAJOR, _TRANS, k, n, 1.0, w.ctypes.data, ldw, x, incx, 0.0, out.ctypes.data, 1)
    else:  # b = Wᵀ with W row-major (n, k)
        gemv(_ROW_MAJOR, _NO_TRANS, n, k, 1.0, w.ctypes.data, ldw, x, incx, 0.0, out.ctypes.data, 1)


def gemm_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, beta: float = 0.0) -> None:
    """_gemm_into with the BLAS's GEMM for a's dtype (see float_gemm; callers check that there is one)."""
    _gemm_into(float_gemm(a.dtype), a, b, out, beta)


def _matmul_2d(a: np.ndarray, b: np.ndarray, epilogue: Epilogue | None) -> np.ndarray:
    m, n = a.shape[0], b.shape[1]
    threads = threads_for(m * n * a.shape[1])
    gemm = float_gemm(a.dtype)
    if threads <= 1 or gemm is None or a.shape[1] == 0:
        return _whole(a, b, epilogue)
    out = np.empty((m, n), a.dtype)
    out3 = out[None]
    # each chunk packs the operand it does not split again: split the longer side, so that is the smaller one
    if m >= n:
        edges = chunk_edges(m, threads, m * n * a.shape[1])

        def chunk(i: int) -> None:
            r0, r1 = edges[i], edges[i + 1]
            _gemm_into(gemm, a[r0:r1], b, out[r0:r1])
            if epilogue is not None:
                epilogue(out3, 0, 1, r0, r1, 0, n)
    else:
        edges = chunk_edges(n, threads, m * n * a.shape[1])
        gemv = _blas_controllers()[0].gemv.get(a.dtype) if m == 1 else None

        def chunk(i: int) -> None:
            c0, c1 = edges[i], edges[i + 1]
            if gemv is not None:
                _row_times_columns(gemv, a, b[:, c0:c1], out[0, c0:c1])
            else:
                _gemm_into(gemm, a, b[:, c0:c1], out[:, c0:c1])
            if epilogue is not None:
                epilogue(out3, 0, 1, 0, m, c0, c1)
    run_chunks(len(edges) - 1, chunk)
    return out


def matmul(a: np.ndarray, b: np.ndarray, epilogue: Epilogue | None = None) -> np.ndarray:
    """np.matmul(a, b), with float GEMMs split over the forward's threads. A stack of row blocks times one
    matrix runs as one tall GEMM (the matrix is packed once, not once per block). `epilogue` (see Epilogue)
    runs on each finished block."""
    if (a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.dtype not in (np.float32, np.float64)):
        return _whole(a, b, epilogue)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if math.prod(batch) == 1:
        return _matmul_2d(a.reshape(m, k), b.reshape(k, n), epilogue).reshape(batch + (m, n))
    if b.ndim == 2 and a.flags.c_contiguous and epilogue is None:
        return _matmul_2d(a.reshape(-1, k), b, None).reshape(a.shape[:-1] + (n,))
    threads = threads_for(math.prod(batch) * m * n * k)
    if threads <= 1 or batch[0] < 2:
        return _whole(a, b, epilogue)
    out = np.empty(batch + (m, n), a.dtype)
    out3 = out.reshape(-1, m, n)
    # chunks along the leading batch axis; an operand without it (or with size 1 there) is broadcast whole
    lead_a = a.ndim == out.ndim and a.shape[0] > 1
    lead_b = b.ndim == out.ndim and b.shape[0] > 1
    edges = chunk_edges(batch[0], threads, min_chunk=1)
    inner = out3.shape[0] // batch[0]  # matrices per step of the leading axis

    def chunk(i: int) -> None:
        s = slice(edges[i], edges[i + 1])
        # not np.matmul(out=...): with out= it keeps the GIL, and the chunks would run one at a time
        out[s] = np.matmul(a[s] if lead_a else a, b[s] if lead_b else b)
        if epilogue is not None:
            epilogue(out3, edges[i] * inner, edges[i + 1] * inner, 0, m, 0, n)

    run_chunks(len(edges) - 1, chunk)
    return out
