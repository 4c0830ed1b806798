"""numba's parallel kernels (prange) in rlx: the threading layer they use and the lock every call takes."""

from __future__ import annotations

import threading

from rlx_format.numba_setup import numba

# OpenMP worker threads spin after a parallel region and then fight OpenBLAS's threads for the
# same cores (measured: a 4096x4096 tiled matmul went from 20 ms to 130-560 ms). The workqueue
# layer does not spin. Must be chosen before the first parallel kernel runs.
if numba.config.THREADING_LAYER == "default":
    numba.config.THREADING_LAYER = "workqueue"

# The workqueue layer aborts the process if two Python threads enter parallel kernels at once, so
# every parallel numba call in rlx goes through this lock (uncontended it costs ~0.1 us).
PARALLEL_LOCK = threading.Lock()


def parallel_call(fn, *args):
    with PARALLEL_LOCK:
        return fn(*args)
