"""numba's parallel kernels (prange) in rlx: the threading layer they use and the lock every call takes."""

from __future__ import annotations

import threading

from rlx_format.cpu_hold import unheld
from rlx_format.numba_setup import numba

from .thread_local import before_parallel, forward_threads_here

# OpenMP worker threads spin after a parallel region and then fight OpenBLAS's threads for the
# same cores (measured: a 4096x4096 tiled matmul went from 20 ms to 130-560 ms). The workqueue
# layer does not spin. Must be chosen before the first parallel kernel runs.
if numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"

# The workqueue layer aborts the process if two Python threads enter parallel kernels at once, so
# every parallel numba call in rlx goes through this lock (uncontended it costs ~0.1 us).
PARALLEL_LOCK = threading.Lock()
_launched = False  # a parallel call has run (numba's workers started, off any hold)


def parallel_call(fn, *args):
    """fn(*args) for a numba parallel kernel. Inside a forward it runs on the forward's thread count (numba's own
    default is every core, so a 1-thread forward used two here: GELU on 8x128x1536 took 3.3 ms that way, 4.3 ms on
    one), and the worker pool's idle threads stop polling first (a polling worker on the second core made that
    GELU 4.0 ms)."""
    global _launched
    n = forward_threads_here()
    with PARALLEL_LOCK:
        if _launched:
            return _call(fn, args, n)
        _launched = True
        # numba starts its workers at the first thread query (workqueue) or parallel region (OpenMP, TBB), and they
        # inherit the CPU set of the thread that starts them: started inside a forward's hold, both workers shared
        # the caller's one CPU (a Q8_0 GEMV of 4096x4096 weights at 2 threads 1.27 ms, as at 1 thread; 0.74 ms
        # started on both CPUs). So the first call runs whole off the hold.
        with unheld():
            return _call(fn, args, n)


def _call(fn, args: tuple, n: int | None):
    """fn(*args) on n of numba's threads (its own setting outside a forward, n None); under PARALLEL_LOCK."""
    if n is None:
        return fn(*args)
    if n > 1:
        for hook in before_parallel:
            hook()
    old = numba.get_num_threads()
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
    try:
        return fn(*args)
    finally:
        numba.set_num_threads(old)
