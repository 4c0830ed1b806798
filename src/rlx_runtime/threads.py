"""rlx's own threads for the CPU forward: large GEMMs, conv epilogues, tap convs and attention split into chunks
that the caller and one worker pool take in turn (a chunk is taken by whoever is free, so a late thread delays
at most a chunk it took).

Why not the BLAS's threads: OpenBLAS splits each call statically and waits for every one of its threads, so
on a shared machine a descheduled thread costs a scheduler time slice per call (measured here, 2 cores with
other processes running: a YOLO-like forward took 22 ms with one BLAS thread and 104 ms with two), and it
splits nothing but its own calls. Inside a forward the BLAS runs single-threaded, with one exception: until
numba is loaded rlx's workers can only take Python jobs, each hand-off a futex wake each way plus the GIL, and
then a large GEMM is one BLAS call on the BLAS's own threads instead (blas_threads), which wait spinning.

How many threads: as many as the BLAS is set to when the forward starts (OPENBLAS_NUM_THREADS, or
threadpoolctl's `threadpool_limits`), which is how numpy users already choose them. `threads_in_use()`
reports it. While any rlx forward runs, the process's BLAS is single-threaded (restored when the last ends).

Two kinds of job share the workers. A native job (`Steps`) is a table of steps (cblas GEMM/GEMV calls through
their addresses, the conv epilogue, the tap kernel; layouts in pool_layout.py) that pool_kernels.py runs
without the GIL: an idle worker polls for the next job for ~2 ms, then sleeps. A thread asleep in a futex took
30-70 us to wake on this 2-core VM, and a worker that needs the GIL to start a chunk waits that long again for
the caller to let go of it: longer than many split ops take in all. A Python job (`run_chunks`) is a function
of the chunk number, for work that is numpy calls. Until numba is loaded every job is a Python one.

Each GEMM chunk is one single-threaded BLAS call over the whole inner dimension, so every output element is the
same dot product as in the unsplit call, up to the order the BLAS kernel sums it in: OpenBLAS's SkylakeX
kernels give the same bits however the output is split, its Haswell kernels round some elements differently
at chunk edges (tests/test_threads.py bounds the difference as a dot product's). One exception, at any thread count: a
one-row product over row-major weights (a decoding step's GEMV) is the sum of two GEMVs over the weights' halves of
rows (_gemv_in_halves), so that two threads each stream contiguous memory.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

import numpy as np

from . import placement
from .heap import keep_freed_memory
from .pool_layout import (CTRL_SIZE, FINISHED, FLOAT_COLUMNS, INT_COLUMNS, KIND_CLOSED, KIND_NATIVE, KIND_PYTHON,
                          YIELD)
from .thread_local import before_parallel
from .thread_local import state as _local

# multiply-adds below which one call beats the split (~10 us of work). 2^21 until session 21; since the prepared
# jobs (a split costs ~3-8 us) 2^19 measured, whole forwards at 2 threads, A/B in one process (Rocket Lake): YOLO-like
# 0.92-0.93x the time, ResNet-50 0.976x, MobileNetV3-small 0.98x, EfficientNet-B0, GPT-2 step, LSTM, MiniLM
# 0.99-1.01x (2^20 and 2^18 about the same)
_MIN_SPLIT_WORK = 1 << 19
_MIN_CHUNK = 16            # rows or columns per chunk

_lock = threading.Lock()
_active = 0                # forwards running (any thread); the first saves the BLAS's setting, the last restores
_saved = 1
_blas: list | None = None  # the BLAS libraries rlx holds (_OpenBLAS), found once
_pool = None              # the worker pool (_Pool), started by the first split
_hold: placement.Hold | None = None  # the running forward's caller held on its CPU (placement.py), if it is


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's worker threads (and no forward running): start afresh."""
    global _lock, _busy, _active, _pool, _hold
    _lock, _busy, _active, _pool, _hold = threading.Lock(), threading.Lock(), 0, None, None


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
                self.wide = bool(suffix)  # int64 sizes (an ILP64 build)
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
    single-threaded inside. Reentrant, and safe for forwards on several threads at once. The first one also keeps
    freed heap memory mapped for the next (heap.py) and, splitting over every CPU the process may use, holds its
    caller on one CPU and the workers off it (placement.py)."""
    global _active, _saved, _hold
    keep_freed_memory()
    with _lock:
        first = _active == 0
        if first:
            libs = _blas_controllers()
            _saved = max([c.get() for c in libs], default=1)
            if _saved > 1:
                for c in libs:
                    c.set(1)
            _hold = placement.hold_caller(_saved)
            if _pool is not None:
                _pool.keep_off(_hold)
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
            if first and _hold is not None:
                placement.release_caller(_hold)
                _hold = None
            if _active == 0 and _saved > 1:
                for c in _blas_controllers():
                    c.set(_saved)


_wide_calls = 0  # blas_threads scopes open (any thread)


@contextlib.contextmanager
def blas_threads(threads: int) -> Iterator[None]:
    """Inside a forward, BLAS calls made in this scope run on the BLAS's own `threads` threads. For when rlx's
    workers cannot take the work natively (numba not loaded, so they sleep rather than poll): each hand-off to a
    sleeping worker then costs a futex wake each way (30-70 us here) plus the GIL, while OpenBLAS's threads wait
    spinning. Measured at 2 threads, numba not loaded (A/B in one process): ResNet-50 103 -> 81 ms, a GPT-2
    decoding step 28 -> 26 ms; a GEMV of 3072x768 weights from memory 575 -> 434 us. The count is process-wide:
    the BLAS is set back to one thread when the last scope ends."""
    global _wide_calls
    libs = _blas_controllers()
    with _lock:
        _wide_calls += 1
        for c in libs:
            c.set(threads)
    try:
        yield
    finally:
        with _lock:
            _wide_calls -= 1
            if _wide_calls == 0:
                for c in libs:
                    c.set(1)


def blas_threads_instead(threads: int) -> bool:
    """Whether work split `threads` ways runs instead as whole BLAS calls on the BLAS's own threads
    (blas_threads): when rlx's workers cannot take it natively (numba not loaded)."""
    return threads > 1 and _kernels() is None


def threads_in_use() -> int:
    """Threads the current forward splits work over (1 outside a forward)."""
    return getattr(_local, "threads", None) or 1


def threads_for(work: int) -> int:
    """Threads worth splitting `work` multiply-adds over: 1 below _MIN_SPLIT_WORK (waking a worker costs more).
    The same for a Prepared job, whose hand-off costs less."""
    return threads_in_use() if work >= _MIN_SPLIT_WORK else 1


class _Job:
    """A Python job: fn(0) .. fn(count - 1), taken in order by whoever pulls (each needs the GIL)."""

    def __init__(self, fn: Callable[[int], None], count: int):
        self.fn, self.count = fn, count
        self.taken = itertools.count()       # next() is atomic under the GIL: each chunk goes to one thread
        self.finished = itertools.count(1)
        self.done = np.zeros(1, np.int64)    # polled without the GIL (pool_kernels.spin_while_equal)
        self.cond = threading.Condition(threading.Lock())
        self.errors: list[BaseException] = []

    def pull(self) -> None:
        for i in self.taken:
            if i >= self.count:
                return
            if not self.errors:  # after a failure the rest are only counted off
                try:
                    self.fn(i)
                except BaseException as e:  # noqa: BLE001 - re-raised by the caller of run_chunks
                    self.errors.append(e)
            if next(self.finished) == self.count:
                with self.cond:
                    self.done[0] = 1
                    self.cond.notify_all()

    def wait(self) -> None:
        """Until every chunk has finished: polling a while, then asleep."""
        k = _kernels()
        if self.done[0] or (k is not None and k.spin_while_equal(self.done, 0, _polls)):
            return
        with self.cond:
            while not self.done[0]:
                self.cond.wait()


_ROW_CAPACITY, _CHUNK_CAPACITY = 1024, 256  # a native job's table sizes (a larger one runs as a Python job)


class _Pool:
    """`size` worker threads that take part in each posted job. Once numba is loaded, an idle worker polls for
    the next job for about _SPIN_SECONDS without the GIL and runs native jobs (Steps) there too
    (pool_kernels.serve); then, or without numba at all, it sleeps until a job is posted."""

    def __init__(self, size: int):
        self.size = size
        self.ctrl = np.zeros(CTRL_SIZE, np.int64)  # pool_kernels' control words (pool_layout.py)
        self.ints = np.zeros((_ROW_CAPACITY, INT_COLUMNS), np.int64)
        self.floats = np.zeros((_ROW_CAPACITY, FLOAT_COLUMNS), np.float64)
        self.starts = np.zeros(_CHUNK_CAPACITY + 1, np.int64)
        self.gen, self.kind, self.job = 0, 0, None  # the newest job (generation, kind, Python job)
        self.cond = threading.Condition(threading.Lock())
        self.sleeping = 0
        self.workers = [threading.Thread(target=self._work, name="rlx", daemon=True) for _ in range(size)]
        for t in self.workers:
            t.start()
        self.kept: frozenset | None = None  # the CPUs the workers are kept on (placement.py); None: as started
        self.keep_off(_hold)

    def keep_off(self, hold: placement.Hold | None) -> None:
        """Keep the workers off the held caller's CPU; with no hold, let them run where the caller may."""
        cpus = hold.others if hold is not None else None
        if cpus == self.kept:
            return
        if cpus is None:
            cpus = frozenset(os.sched_getaffinity(0))
        for t in self.workers:
            placement.keep_off(t.native_id, cpus)
        self.kept = cpus if hold is not None else None

    def post(self, kind: int, count: int = 0, job: _Job | None = None) -> None:
        """Publish a job (a native one's table rows already written); wake sleeping workers."""
        self.gen = (self.gen + 1) % (1 << 19)
        self.kind, self.job = kind, job
        k = _kernels()
        if k is not None:
            k.post(self.ctrl, self.gen, count, kind)
        if self.sleeping:
            with self.cond:
                self.cond.notify_all()

    def close(self) -> None:
        self.post(KIND_CLOSED)

    def _work(self) -> None:
        seen = 0
        while True:
            k = _kernels()
            if k is not None:
                kind, seen = k.serve(self.ctrl, self.ints, self.floats, self.starts, seen, _polls)
                if kind == KIND_CLOSED:
                    return
                if kind == KIND_PYTHON:
                    job = self.job  # a finished job is only counted off: its chunks are all taken
                    if job is not None:
                        job.pull()
                    continue
            with self.cond:  # nothing for a while (or no numba): sleep until the next post
                self.sleeping += 1
                while self.gen == seen:
                    self.cond.wait()
                self.sleeping -= 1
            if k is None or self.kind != KIND_NATIVE:
                seen = self.gen
                if self.kind == KIND_CLOSED:
                    return
                if self.job is not None:
                    self.job.pull()
            # a native job: serve() above sees its generation and runs it

    def run_native(self, k, count: int, starts: np.ndarray) -> None:
        """Run a native job of `count` chunks (its rows already in the tables; chunk i is rows starts[i] ..
        starts[i + 1]) here and on the workers; return when all have finished."""
        self.starts[:count + 1] = starts
        self.post(KIND_NATIVE, count)
        if not k.run_and_wait(self.ctrl, self.ints, self.floats, self.starts, count, _polls):
            while self.ctrl[FINISHED] < count:  # a worker's chunk is still running: poll asleep
                time.sleep(20e-6)
            if self.ctrl[FINISHED] != count:  # never, unless the pool's own bookkeeping is broken
                raise RuntimeError(f"worker pool: {self.ctrl[FINISHED]} chunks finished of a {count}-chunk job")


_SPIN_SECONDS = 2e-3  # how long an idle worker (or a caller waiting for the last chunk) polls before sleeping
_polls = 0            # polls in _SPIN_SECONDS
_pool_kernels = None  # the pool_kernels module once numba is loaded
_busy = threading.Lock()  # one job in the pool at a time; a second caller meanwhile runs its chunks itself


def _kernels():
    """pool_kernels, or None while numba is not loaded: a forward that uses no numba kernel does not pay numba's
    start-up (~0.5 s) for the faster hand-offs; its jobs then run as Python jobs with sleeping workers."""
    global _pool_kernels, _polls
    if _pool_kernels is None and sys.modules.get("numba") is not None:
        from . import pool_kernels
        _polls = max(1, int(pool_kernels.polls_per_second() * _SPIN_SECONDS))
        _pool_kernels = pool_kernels
    return _pool_kernels


def _quiet_workers() -> None:
    """Idle workers stop polling and sleep (a numba parallel kernel is about to run: numba_parallel.py)."""
    if _pool is not None:
        _pool.ctrl[YIELD] = 1


before_parallel.append(_quiet_workers)


def _pool_of(workers: int) -> _Pool:
    global _pool
    with _lock:
        if _pool is None or _pool.size < workers:
            old, _pool = _pool, _Pool(workers)
            if old is not None:
                old.close()
        return _pool


class Steps:
    """A job of chunks, each a list of steps one thread runs in order: single-threaded cblas GEMMs and GEMVs,
    the conv epilogue, the tap kernel, the few-rows GEMM. Use as `with Steps(rows) as steps: ...add steps...;
    steps.run()`.

    Native (numba loaded, more than one thread, the pool free, every step float32 and of a kind pool_kernels
    runs): each step is written as a row of the pool's tables by a compiled helper (no Python object per step;
    numpy's .ctypes.data alone took 1.9 us per array) and the workers run the job without the GIL. Otherwise
    each step is kept as a Python call and the job runs through run_chunks."""

    def __init__(self, rows: int, native: bool = True, capture: bool = False):
        """capture: the rows go to tables of this object's own (for Prepared), and the job is never run."""
        self._own = None
        self._pool = None
        if capture:
            self._k = _kernels()
            self._own = (np.zeros((rows, INT_COLUMNS), np.int64), np.zeros((rows, FLOAT_COLUMNS), np.float64))
        else:
            self._k = _kernels() if native and rows <= _ROW_CAPACITY and threads_in_use() > 1 else None
        if self._k is not None and self._own is None and _busy.acquire(blocking=False):
            self._pool = _pool_of(threads_in_use() - 1)
        self.rows = 0
        self.starts = [0]
        self.runs: list[Callable[[], None]] = []
        self.keep: list = []  # arrays the steps point into, alive until the job has run

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool = None
            _busy.release()

    @property
    def native(self) -> bool:
        return self._pool is not None or self._own is not None

    def tables(self) -> tuple:
        """(pool_kernels, ints, floats, row) to write the next native step with; then call added()."""
        ints, floats = self._own if self._own is not None else (self._pool.ints, self._pool.floats)
        return self._k, ints, floats, self.rows

    def added(self, run: Callable[[], None] | None = None) -> None:
        """A step was written (native) or is `run` (Python)."""
        if run is not None:
            self.runs.append(run)
        self.rows += 1

    def end_chunk(self) -> None:
        self.starts.append(self.rows)

    def gemm(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, beta: float = 0.0) -> None:
        """out[:] = a @ b + beta * out (2-D views, out's rows contiguous), one single-threaded BLAS call."""
        gemm = float_gemm(a.dtype)
        if self.native:
            k, ints, floats, r = self.tables()
            if not k.put_gemm(ints, floats, r, _address(gemm), _wide(), a, b, out, beta):
                a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)  # not a strided BLAS operand
                k.put_gemm(ints, floats, r, _address(gemm), _wide(), a, b, out, beta)
            self.keep += (a, b, out)  # the row holds only their addresses
            return self.added()
        args, keep = _gemm_args(a, b, out, beta)
        self.keep += keep
        self.added(partial(gemm, *args))

    def gemv(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        """out[:] = a[0] @ b for a one-row a and a 1-D out (see _gemv_args)."""
        gemv = _blas_controllers()[0].gemv[a.dtype]
        if self.native:
            k, ints, floats, r = self.tables()
            if not k.put_gemv(ints, floats, r, _address(gemv), _wide(), a, b, out):
                b = np.ascontiguousarray(b)
                k.put_gemv(ints, floats, r, _address(gemv), _wide(), a, b, out)
            self.keep += (a, b, out)
            return self.added()
        args, keep = _gemv_args(a, b, out)
        self.keep += keep
        self.added(partial(gemv, *args))

    def epilogue(self, epilogue: Epilogue, out3: np.ndarray, *block: int) -> None:
        """epilogue(out3, *block) as a step (native for conv_kernels.BiasActivation, which has `put`)."""
        if self.native:
            epilogue.put(*self.tables(), out3, *block)
            self.keep += (epilogue, out3)
            return self.added()
        self.added(partial(epilogue, out3, *block))

    def run(self) -> None:
        """Run the chunks over the forward's threads; return when all have finished."""
        count = len(self.starts) - 1
        if self.native and count == 1:  # on this thread alone: its data stays in this core's caches
            return self._k.run_rows(self._pool.ints, self._pool.floats, 0, self.rows)
        if self.native:
            return self._pool.run_native(self._k, count, np.asarray(self.starts, np.int64))
        starts, runs = self.starts, self.runs

        def chunk(i: int) -> None:
            for r in range(starts[i], starts[i + 1]):
                runs[r]()

        run_chunks(count, chunk)


class Prepared:
    """A native job written once for arrays of given shapes (a bound conv's: its input, output and residual), then
    run on other arrays of those shapes: each call copies the rows to the pool's tables with this call's addresses
    in place of the templates' (one compiled call; writing the rows anew took a Python call per step, ~1.5 us each
    hot and several times that inside a forward, so that splitting a 20-40 us conv over two threads did not pay).
    The same rows run the same kernels on the same blocks as the job written per call (the same bits)."""

    def __init__(self, rows: int, write: Callable[[Steps, tuple], None], shapes: tuple[tuple[int, ...], ...]):
        """write(steps, arrays) writes the job (its steps and chunks) for float32 arrays of `shapes` (at most
        three: the ones that change from call to call); it runs on `threads_in_use()` threads, as now."""
        self.threads = threads_in_use()
        # each template a little apart from any other, so that every address inside one, or just past its end,
        # belongs to that one alone
        templates = tuple(np.empty(math.prod(s) + 16, np.float32)[:math.prod(s)].reshape(s) for s in shapes)
        with Steps(rows, capture=True) as steps:
            write(steps, templates)
        ints, floats = steps._own
        self.ti, self.tf = ints[:steps.rows].copy(), floats[:steps.rows].copy()
        self.work = (self.ti.copy(), self.tf.copy())  # the tables a run on this thread alone relocates into
        self.starts = np.asarray(steps.starts, np.int64)
        self.count = len(steps.starts) - 1
        self.pooled = 1 < self.count <= _CHUNK_CAPACITY and len(self.ti) <= _ROW_CAPACITY  # else run here alone
        relocs = []
        for slot, t in enumerate(templates):
            lo = t.__array_interface__["data"][0]
            rows_at, cols_at = np.nonzero((self.ti >= lo) & (self.ti <= lo + t.nbytes))
            relocs += [(r, c, slot, self.ti[r, c] - lo) for r, c in zip(rows_at, cols_at) if c > 0]
        self.relocs = np.array(relocs, np.int64).reshape(-1, 4)
        self.keep = [a for a in _arrays(steps.keep) if not any(np.may_share_memory(a, t) for t in templates)]
        self._k = steps._k
        self._using = threading.Lock()

    def run(self, *arrays: np.ndarray) -> bool:
        """Run on this call's arrays (C-contiguous float32 of the templates' shapes, in order): split over the
        pool when the job has chunks for it and the pool is free, else every row here. False (nothing run) while
        another thread runs this job (its scratch is its own) or with another thread count than it was written for."""
        if threads_in_use() != self.threads or not self._using.acquire(blocking=False):
            return False
        try:
            a = arrays + (arrays[0],) * (3 - len(arrays))  # the unused slots: any array (no relocation uses them)
            if self.pooled and _busy.acquire(blocking=False):
                try:
                    pool = _pool_of(self.threads - 1)
                    self._k.relocate(pool.ints, pool.floats, self.ti, self.tf, self.relocs, *a)
                    pool.run_native(self._k, self.count, self.starts)
                finally:
                    _busy.release()
            else:
                self._k.run_relocated(*self.work, self.ti, self.tf, self.relocs, *a)
            return True
        finally:
            self._using.release()


def prepared_conv(rows: int, write: Callable, epilogue, residual: bool, in_shape: tuple, out_shape: tuple) -> Prepared:
    """A conv path's Prepared job, run with (x, y) or, with `residual`, (x, y, residual): write(steps, x, y, ep)
    writes it with `epilogue` given this call's residual (the pointwise, depthwise and blocked paths' shared
    shape)."""
    def job(steps: Steps, arrays: tuple) -> None:
        write(steps, arrays[0], arrays[1], epilogue.with_residual(arrays[2]) if residual else epilogue)

    return Prepared(rows, job, (in_shape, out_shape) + ((out_shape,) * residual))


def _arrays(items) -> Iterator[np.ndarray]:
    """The arrays in `items`, tuples and lists opened up."""
    for it in items:
        if isinstance(it, np.ndarray):
            yield it
        elif isinstance(it, (tuple, list)):
            yield from _arrays(it)


_addresses: dict[int, int] = {}


def _address(fn) -> int:
    """A ctypes function's address (for pool_kernels' calls through it)."""
    found = _addresses.get(id(fn))
    if found is None:
        import ctypes
        found = _addresses[id(fn)] = ctypes.cast(fn, ctypes.c_void_p).value
    return found


def _wide() -> int:
    """1 if the BLAS takes int64 sizes (an ILP64 build, as numpy's own OpenBLAS), else 0."""
    return int(_blas_controllers()[0].wide)


@contextlib.contextmanager
def _inside_a_chunk() -> Iterator[None]:
    """This thread sees one thread meanwhile: work inside a chunk never splits again."""
    outer = getattr(_local, "threads", None)
    _local.threads = 1
    try:
        yield
    finally:
        _local.threads = outer


def run_chunks(count: int, fn: Callable[[int], None]) -> None:
    """fn(0) .. fn(count - 1), pulled by the caller and up to threads_in_use() - 1 workers; the first
    exception is raised here after every taken chunk has finished. Inside a chunk nothing splits again, on
    the caller as on the workers (so a chunk's result does not depend on which thread ran it)."""
    threads = threads_in_use()
    if min(threads, count) <= 1 or not _busy.acquire(blocking=False):
        with _inside_a_chunk():
            for i in range(count):
                fn(i)
        return
    job = _Job(fn, count)
    try:
        with _inside_a_chunk():
            _pool_of(threads - 1).post(KIND_PYTHON, job=job)
            job.pull()
            job.wait()
    finally:
        _busy.release()
    if job.errors:
        raise job.errors[0]


def chunk_edges(length: int, threads: int, min_chunk: int = _MIN_CHUNK) -> list[int]:
    """Chunk edges along `length`: one chunk per thread, each at least min_chunk long. (Two per thread covered
    a late thread better on a busy machine, but cost more on a quiet one: measured A/B in whole forwards, a
    GPT-2 decoding step 8% slower, the others 0-3%; every chunk packs its other operand again.)"""
    chunks = max(1, min(threads, length // min_chunk))
    return [length * i // chunks for i in range(chunks + 1)]


# epilogue(out3, b0, b1, r0, r1, c0, c1): runs in place on block [b0, b1) x [r0, r1) x [c0, c1) of the whole
# output viewed as (B, M, N), once the block's GEMM is done, on the thread that computed it
Epilogue = Callable[[np.ndarray, int, int, int, int, int, int], None]


def _output(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A split GEMM's output: float32 ones start on a cache line once numba is loaded (aligned.py: the conv
    kernels that read it next load whole lines)."""
    if dtype == np.float32 and _kernels() is not None:
        from .aligned import empty
        return empty(shape)
    return np.empty(shape, dtype)


def _whole(a: np.ndarray, b: np.ndarray, epilogue: Epilogue | None) -> np.ndarray:
    out = np.matmul(a, b)
    if epilogue is not None:
        out3 = out.reshape(math.prod(out.shape[:-2]), *out.shape[-2:])  # not -1: an empty output has no such size
        epilogue(out3, 0, out3.shape[0], 0, out3.shape[1], 0, out3.shape[2])
    return out


_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _rows_contiguous(x: np.ndarray) -> bool:
    """Whether 2-D x is a row-major BLAS operand as it is: each row contiguous, rows a whole number of elements
    apart and not overlapping."""
    item = x.itemsize
    return x.strides[1] == item and x.strides[0] % item == 0 and x.strides[0] >= max(1, x.shape[1]) * item


def _blas_operand(x: np.ndarray) -> tuple[np.ndarray, int, int]:
    """(array, transpose flag, leading dimension) describing 2-D x to a row-major cblas call."""
    item = x.itemsize
    if _rows_contiguous(x):
        return x, _NO_TRANS, x.strides[0] // item
    if x.strides[0] == item and x.strides[1] % item == 0 and x.strides[1] >= max(1, x.shape[0]) * item:
        return x, _TRANS, x.strides[1] // item
    x = np.ascontiguousarray(x)
    return x, _NO_TRANS, max(1, x.shape[1])


def float_gemm(dtype) -> Callable | None:
    """The cblas sgemm/dgemm of the BLAS rlx manages, for float32/float64 (None: no such BLAS or dtype)."""
    libs = _blas_controllers()
    return libs[0].gemm.get(np.dtype(dtype)) if libs else None


def _gemm_args(a: np.ndarray, b: np.ndarray, out: np.ndarray, beta: float) -> tuple:
    """cblas ?gemm's arguments for out[:] = a @ b + beta * out (2-D views, out's rows contiguous)."""
    (a, ta, lda), (b, tb, ldb) = _blas_operand(a), _blas_operand(b)
    m, k = a.shape
    return (_ROW_MAJOR, ta, tb, m, b.shape[1], k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, beta,
            out.ctypes.data, out.strides[0] // out.itemsize), (a, b)


def _gemv_args(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> tuple:
    """cblas ?gemv's arguments for out[0, :] = a[0] @ b, a one-row a. (OpenBLAS's GEMM with one row packs all of
    b first, which made a GPT-2 decoding step's split MatMuls slower on two threads than on one.)"""
    (w, tw, ldw) = _blas_operand(b)
    k, n = b.shape
    x, incx = a.ctypes.data, a.strides[1] // a.itemsize
    if tw == _NO_TRANS:  # b row-major (k, n): out = bᵀ-gemv over its k rows
        return (_ROW_MAJOR, _TRANS, k, n, 1.0, w.ctypes.data, ldw, x, incx, 0.0, out.ctypes.data, 1), (w,)
    # b = Wᵀ with W row-major (n, k)
    return (_ROW_MAJOR, _NO_TRANS, n, k, 1.0, w.ctypes.data, ldw, x, incx, 0.0, out.ctypes.data, 1), (w,)


def _gemm_into(gemm, a: np.ndarray, b: np.ndarray, out: np.ndarray, beta: float = 0.0) -> None:
    """out[:] = a @ b + beta * out for 2-D views (out's rows contiguous), one single-threaded BLAS call without
    the GIL."""
    args, _ = _gemm_args(a, b, out, beta)
    gemm(*args)


def gemm_into(a: np.ndarray, b: np.ndarray, out: np.ndarray, beta: float = 0.0) -> None:
    """_gemm_into with the BLAS's GEMM for a's dtype (see float_gemm; callers check that there is one)."""
    _gemm_into(float_gemm(a.dtype), a, b, out, beta)


# elements of b from which a one-row MatMul is split, though it has fewer multiply-adds than _MIN_SPLIT_WORK: a
# GEMV streams b from memory (GPT-2's decoding step at 2 threads, its 768x2304 and 768x768 GEMVs split too:
# 21.4 -> 20.0 ms)
_MIN_GEMV_SPLIT = 1 << 18
# multiply-adds from which a batched matmul splits as a Python job (its chunks take the GIL in turn: ~50-100 us of
# hand-off here, against a prepared job's 3-8 us)
_MIN_PYTHON_SPLIT = 1 << 22


def _gemv_in_halves(a: np.ndarray, b: np.ndarray, epilogue: Epilogue | None) -> np.ndarray:
    """a (1, k) @ b (k, n), float32 with b's rows contiguous, as the sum of two GEMVs over b's halves of rows, at
    any thread count (so the values do not depend on it): on two threads each streams one contiguous half of b.
    Split by columns, each thread read part of every row, and two threads streamed b no faster than one (measured
    on Zen 3, 768x2304 weights from memory, OpenBLAS Haswell kernels: 14-26 GB/s in all against 25 on one thread;
    by halves of rows 34 GB/s). Threads beyond two split each half's columns. `epilogue` runs on the summed row.
    On one thread both halves run in one compiled call (numba loaded), else as two numpy calls."""
    k, n = b.shape[0] // 2, b.shape[1]
    out, part = np.empty((1, n), np.float32), np.empty((1, n), np.float32)
    threads = threads_in_use()
    if threads > 1 and not blas_threads_instead(threads):
        cols = _gemv_half_columns(n, threads)
        with Steps(2 * (len(cols) - 1), True) as steps:
            _write_gemv_halves(steps, a, b, out, part, cols)
            steps.run()
        np.add(out, part, out=out)
    elif threads == 1 and _kernels() is not None:
        _kernels().gemv_halves(_address(_blas_controllers()[0].gemv[np.dtype(np.float32)]), _wide(), a, b, out[0],
                               part[0])
    else:
        with blas_threads(threads) if threads > 1 else contextlib.nullcontext():
            for rows, dst in ((slice(0, k), out), (slice(k, None), part)):
                np.matmul(a[:, rows], b[rows], out=dst)
        np.add(out, part, out=out)
    if epilogue is not None:
        epilogue(out[None], 0, 1, 0, 1, 0, n)
    return out


def _gemv_half_columns(n: int, threads: int) -> list[int]:
    """The column edges of each half's chunks in _gemv_in_halves's split job on `threads` threads."""
    return chunk_edges(n, threads // 2)


def _write_gemv_halves(steps: Steps, a: np.ndarray, b: np.ndarray, out: np.ndarray, part: np.ndarray,
                       cols: list[int]) -> None:
    """_gemv_in_halves's split job as steps: b's first half of rows into out, its second into part, a chunk per
    block of columns between `cols`' edges."""
    k = b.shape[0] // 2
    for rows, dst in ((slice(0, k), out), (slice(k, None), part)):
        for e0, e1 in zip(cols, cols[1:]):
            steps.gemv(a[:, rows], b[rows, e0:e1], dst[0, e0:e1])
            steps.end_chunk()


class PreparedGemv:
    """_gemv_in_halves by one weight matrix b (a bound MatMul step's), its split job written once per thread count
    as a Prepared job (per call ~5-8 us of Python less: a GPT-2 decoding step has 48 such GEMVs). The same calls
    on the same blocks, so the same bits; one thread, or a job that cannot run now, takes _gemv_in_halves."""

    def __init__(self, b: np.ndarray):
        self.b = b
        self.jobs: dict[int, Prepared] = {}

    def __call__(self, a: np.ndarray, epilogue: Epilogue | None = None) -> np.ndarray:
        threads, (k, n) = threads_in_use(), self.b.shape
        if threads < 2 or blas_threads_instead(threads) or not a.flags.c_contiguous:
            return _gemv_in_halves(a, self.b, epilogue)
        job = self.jobs.get(threads)
        if job is None:
            cols = _gemv_half_columns(n, threads)
            job = self.jobs[threads] = Prepared(
                2 * (len(cols) - 1), lambda steps, t: _write_gemv_halves(steps, t[0], self.b, t[1], t[2], cols),
                ((1, k), (1, n), (1, n)))
        out, part = np.empty((1, n), np.float32), np.empty((1, n), np.float32)
        if not job.run(a, out, part):
            return _gemv_in_halves(a, self.b, epilogue)
        np.add(out, part, out=out)
        if epilogue is not None:
            epilogue(out[None], 0, 1, 0, 1, 0, n)
        return out


def gemv_in_halves_applies(a_shape: tuple, a_dtype, b: np.ndarray) -> bool:
    """Whether _matmul_2d takes _gemv_in_halves for a 2-D a of a_shape times b."""
    m, kk = a_shape
    return (m == 1 and a_dtype == b.dtype == np.float32 and kk * b.shape[1] >= _MIN_GEMV_SPLIT
            and _rows_contiguous(b) and kk >= 2 * _MIN_CHUNK and float_gemm(b.dtype) is not None
            and b.dtype in _blas_controllers()[0].gemv)


def stream_rows(put: str, rows: int, work: int, arrays: tuple, width: int, run: Callable[[int, int], None]) -> None:
    """A streaming pass over `rows` rows of `width` (a squeeze-excite scale, channel means): split over the
    forward's threads when `work` is worth it, as a native job of pool_kernels.`put` rows (put(ti, tf, r,
    *arrays, width, r0, r1)) so that each thread takes the rows its share of the producing conv wrote, else
    run(0, rows) here. (As Python jobs the GIL's hand-offs cost more than the split saved.)"""
    edges = chunk_edges(rows, threads_for(work), 1)
    if len(edges) == 2:
        return run(0, rows)
    with Steps(len(edges) - 1, True) as steps:
        for r0, r1 in zip(edges, edges[1:]):
            if steps.native:
                k, ints, floats, r = steps.tables()
                getattr(k, put)(ints, floats, r, *arrays, width, r0, r1)
                steps.added()
            else:
                steps.added(partial(run, r0, r1))
            steps.end_chunk()
        steps.keep += arrays
        steps.run()


def one_chunk(rows: int, work: int) -> bool:
    """Whether rows_in_chunks runs `rows` rows of `work` as one call (then a caller may make the call itself, on
    whole arrays: a small op's slices and closure cost more than its rows, e.g. ~1 of a 12x128 Softmax's 3 us)."""
    return rows < 2 or threads_for(work) < 2


def rows_in_chunks(rows: int, work: int, fn: Callable[[int, int], None]) -> None:
    """fn(r0, r1) over rows 0..rows in one chunk per thread that `work` (the whole job's, in GEMM multiply-adds)
    is worth (threads_for), run by run_chunks (one chunk: called here): for row kernels (numba, nogil) whose rows
    are independent and that split nothing themselves."""
    if one_chunk(rows, work):  # the call itself (run_chunks' set-up took ~2.5 us of a 768-wide LayerNorm's 12)
        return fn(0, rows)
    edges = chunk_edges(rows, threads_for(work), 1)
    run_chunks(len(edges) - 1, lambda i: fn(edges[i], edges[i + 1]))


def _matmul_2d(a: np.ndarray, b: np.ndarray, epilogue: Epilogue | None) -> np.ndarray:
    m, n = a.shape[0], b.shape[1]
    work = m * n * a.shape[1]
    if m == 1 and a.strides[1] <= 0:  # a broadcast or reversed row: a GEMV's x needs a positive increment
        a = np.ascontiguousarray(a)
    if gemv_in_halves_applies(a.shape, a.dtype, b):
        return _gemv_in_halves(a, b, epilogue)
    threads = threads_for(work) if m > 1 else threads_in_use() if work >= _MIN_GEMV_SPLIT else 1
    if threads <= 1 or float_gemm(a.dtype) is None or a.shape[1] == 0:
        return _whole(a, b, epilogue)
    if blas_threads_instead(threads):
        with blas_threads(threads):
            return _whole(a, b, epilogue)
    out = _output((m, n), a.dtype)
    out3 = out[None]
    gemv = m == 1 and a.dtype in _blas_controllers()[0].gemv
    edges = chunk_edges(max(m, n), threads)
    # each chunk packs the operand it does not split again: split the longer side, so that is the smaller one
    with Steps(2 * len(edges), a.dtype == np.float32 and (epilogue is None or hasattr(epilogue, "put"))) as steps:
        for e0, e1 in zip(edges, edges[1:]):
            if m >= n:
                steps.gemm(a[e0:e1], b, out[e0:e1])
                block = (0, 1, e0, e1, 0, n)
            else:
                if gemv:
                    steps.gemv(a, b[:, e0:e1], out[0, e0:e1])
                else:
                    steps.gemm(a, b[:, e0:e1], out[:, e0:e1])
                block = (0, 1, 0, m, e0, e1)
            if epilogue is not None:
                steps.epilogue(epilogue, out3, *block)
            steps.end_chunk()
        steps.run()
    return out


SKINNY_MAX_ROWS = 16  # measured against OpenBLAS (1 thread): 8x256 @ 256x1024 44 vs 102 us, 16x512 @ 512x2048
#                       326 vs 431 us; OpenBLAS packs all of the right operand on every call


def few_rows_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """a @ b for a float32 a with 2..SKINNY_MAX_ROWS rows times a C-contiguous float32 b (k, n) (a weight matrix:
    an LSTM step's state times Rᵀ, a small batch through a linear layer), by simd.skinny_f32 (numba): columns in
    one chunk per thread. None when it does not apply (the caller then uses matmul), or while numba is not loaded
    (a forward that needs it for nothing else does not load it for this)."""
    if not (a.ndim == 2 and b.ndim == 2 and a.dtype == b.dtype == np.float32 and 2 <= a.shape[0] <= SKINNY_MAX_ROWS
            and b.flags.c_contiguous and a.shape[1] == b.shape[0] and a.shape[1] >= 16 and b.shape[1] >= 64
            and _kernels() is not None):
        return None
    a = np.ascontiguousarray(a)
    m, n = a.shape[0], b.shape[1]
    out = np.empty((m, n), np.float32)
    threads = threads_for(m * n * a.shape[1])
    edges = block_edges(n, threads, _kernels().FEW_ROWS_UNIT)  # whole passes of the tile per chunk
    with Steps(len(edges), True) as steps:
        for c0, c1 in zip(edges, edges[1:]):
            skinny_step(steps, a, b, out, c0, c1, 0, m)
            steps.end_chunk()
        steps.run()
    return out


def block_edges(length: int, threads: int, block: int) -> list[int]:
    """chunk_edges along `length` with each edge a whole number of `block`s (32-column vectors, 8-row blocks of
    the few-rows GEMM) and each chunk at least two blocks; the last chunk takes the rest."""
    return [e // block * block for e in chunk_edges(length, threads, 2 * block)[:-1]] + [length]


_no_epilogue: tuple | None = None


def epilogue_fields(epilogue, image: int = -1, image_size: int = 0) -> tuple:
    """The fused epilogue's arguments of pool_kernels.skinny_rows and conv_kernels.tap_planes (bias, has_bias, act,
    alpha, beta, has_lo, lo, has_hi, hi, res, has_res; the bias per output channel, the residual as the output)
    for a conv_kernels.BiasActivation, or for none (act -1). With image >= 0 the residual is that image's (of
    image_size elements each: for kernels given one image's output)."""
    global _no_epilogue
    if epilogue is not None:
        fields = epilogue.args[1:]
        if image >= 0 and fields[-1]:
            fields = (*fields[:-2], fields[-2][image * image_size:(image + 1) * image_size], True)
        return fields
    if _no_epilogue is None:
        z = np.float32(0)
        _no_epilogue = (np.zeros(1, np.float32), False, -1, z, z, False, z, False, z, np.zeros(1, np.float32), False)
    return _no_epilogue


def skinny_step(steps: Steps, a: np.ndarray, b: np.ndarray, out: np.ndarray, c0: int, c1: int, r0: int, r1: int,
                epilogue=None, image: int = -1) -> None:
    """A step of `steps`: out[r0:r1, c0:c1] = (a @ b) there by simd.skinny_epilogue_f32 (pool_kernels.skinny_rows;
    2-D C-contiguous float32), with `epilogue` (a conv_kernels.BiasActivation of one group) its bias (per row),
    residual (image `image`'s, out being that image's output) and a Relu in the stores, another activation then
    on that block, a few rows at a time while they are in cache."""
    ep = epilogue_fields(epilogue, image, out.size)
    if steps.native:
        k, ints, floats, r = steps.tables()
        bias, has_bias, act, alpha, beta, has_lo, lo, has_hi, hi, res, has_res = ep
        k.put_skinny(ints, floats, r, out, a, b, c0, c1, r0, r1, bias, has_bias, act, has_lo, has_hi, alpha, beta, lo,
                     hi, res, has_res)
        steps.added()
    else:
        steps.added(partial(_kernels().skinny_rows, out.reshape(-1), a.reshape(-1), b.reshape(-1), a.shape[0],
                            a.shape[1], b.shape[1], c0, c1, r0, r1, *ep))
    steps.keep += (a, b, out, ep)  # a native row holds only their addresses


def matmul(a: np.ndarray, b: np.ndarray, epilogue: Epilogue | None = None) -> np.ndarray:
    """np.matmul(a, b), with float GEMMs split over the forward's threads. A stack of row blocks times one
    matrix runs as one tall GEMM (the matrix is packed once, not once per block). `epilogue` (see Epilogue)
    runs on each finished block."""
    if (a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.dtype not in (np.float32, np.float64)):
        return _whole(a, b, epilogue)
    if a.ndim == b.ndim == 2:  # the common case, without the batch bookkeeping (a few us: SE blocks' convs)
        return _matmul_2d(a, b, epilogue)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if math.prod(batch) == 1:
        return _matmul_2d(a.reshape(m, k), b.reshape(k, n), epilogue).reshape(batch + (m, n))
    if b.ndim == 2 and a.flags.c_contiguous and epilogue is None:
        return _matmul_2d(a.reshape(-1, k), b, None).reshape(a.shape[:-1] + (n,))
    work = math.prod(batch) * m * n * k
    threads = threads_for(work) if work >= _MIN_PYTHON_SPLIT else 1
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
