"""Keeping a forward's caller and rlx's worker threads on different CPUs while the forward runs.

Linux wakes a sleeping thread on its waker's CPU when it judges the waker is about to wait (wake-affine): a
worker woken for a job, or the caller woken when a worker hands back the GIL, lands on the other's CPU, and the
two then stay there taking turns (the load balancer does not move a task that ran within the last half
millisecond, and two threads taking turns always have). Measured on a 2-vCPU VM, the LSTM benchmark model at 2
threads after the process idled 0.2 s: the caller and its worker shared one vCPU for the next 5-6 forwards
(7.7-8.2 ms each, against 5.3 ms once apart; one thread alone takes 7.2). Moving the worker off once per job did
not help: the caller followed it at the next GIL hand-off.

So a forward that splits work over every CPU the process may use holds its caller on the CPU it started on
(its own allowed set is put back when the forward ends) and keeps the workers off that CPU. Only then: with
spare CPUs the scheduler has room to place threads itself, and a held thread could not escape a CPU that
another process keeps busy.
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import NamedTuple

from rlx_format import cpu_hold


class Hold(NamedTuple):
    """The caller's CPU for this forward and the allowed set to put back afterwards."""

    cpu: int
    allowed: frozenset[int]

    @property
    def others(self) -> frozenset[int]:
        """The CPUs the workers may use meanwhile."""
        return self.allowed - {self.cpu}


@functools.cache
def _getcpu():
    """The C library's sched_getcpu, or None where it has none."""
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (AttributeError, OSError):
        return None
    fn.argtypes, fn.restype = [], ctypes.c_int
    return fn


def current_cpu() -> int:
    """The CPU this thread runs on now, or -1 where that cannot be known."""
    fn = _getcpu()
    return fn() if fn is not None else -1


def hold_caller(threads: int) -> Hold | None:
    """Hold this thread on its current CPU if a forward of `threads` threads uses every CPU it may run on (at
    least two); None (nothing changed) otherwise or where the platform has no affinity calls."""
    if threads < 2 or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = frozenset(os.sched_getaffinity(0))
    cpu = current_cpu()
    if len(allowed) < 2 or threads < len(allowed) or cpu not in allowed:
        return None
    os.sched_setaffinity(0, {cpu})
    cpu_hold.note_hold(allowed)
    return Hold(cpu, allowed)


def release_caller(hold: Hold) -> None:
    """Put this thread's allowed set back as hold_caller found it."""
    os.sched_setaffinity(0, hold.allowed)
    cpu_hold.note_hold(None)


def keep_off(thread_id: int, cpus: frozenset[int]) -> None:
    """Let thread `thread_id` (a native id) run on `cpus` only (a hold's `others`)."""
    os.sched_setaffinity(thread_id, cpus)
