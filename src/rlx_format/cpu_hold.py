"""The CPU set a thread had before rlx_runtime held it on one CPU, and a way to step outside that hold.

A forward that splits work over every CPU the process may use holds its calling thread on one CPU while it runs
(rlx_runtime/placement.py), and compiles run inside the same scope. Whatever sizes or starts threads from the
calling thread in that window sees one CPU: numba sizes its thread pool from the importing thread's CPU set
(config.NUMBA_NUM_THREADS, fixed from then on) and its workers inherit the CPU set of the thread that launches
them. rlx imports numba and runs its first parallel kernel inside compiles and forwards, so a deploy process got a
one-thread numba pool, or two workers sharing the caller's CPU. The hold records the thread's own set here
(numba-free, so the numba setup in this package can read it); both steps run `unheld()`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

_local = threading.local()  # _local.allowed: this thread's CPU set before its hold; absent or None when not held


def note_hold(allowed: frozenset[int] | None) -> None:
    """Record that this thread is now held and had `allowed` before; None records that the hold ended."""
    _local.allowed = allowed


@contextlib.contextmanager
def unheld() -> Iterator[None]:
    """Run the block with this thread on its CPU set from before its hold, then hold it again (nothing changes for a
    thread that is not held)."""
    allowed = getattr(_local, "allowed", None)
    now = os.sched_getaffinity(0) if allowed is not None else None
    if now is not None:
        try:
            os.sched_setaffinity(0, allowed)
        except OSError:  # the set is no longer allowed (a cgroup's cpuset shrank): stay as held
            now = None
    try:
        yield
    finally:
        if now is not None:
            os.sched_setaffinity(0, now)
