"""The forward's thread count on the calling thread, and the hooks that run before a numba parallel kernel:
numba-free, so threads.py (which must not load numba) and numba_parallel.py (which does) both read it."""

from __future__ import annotations

import threading
from collections.abc import Callable

state = threading.local()  # state.threads: the current forward's thread count on this thread (unset outside)
before_parallel: list[Callable[[], None]] = []  # run before a numba parallel kernel inside a forward of > 1 thread


def forward_threads_here() -> int | None:
    """The current forward's thread count on this thread; None outside a forward."""
    return getattr(state, "threads", None)
