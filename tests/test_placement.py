"""A forward that splits over every CPU the process may use holds its caller on one CPU and keeps rlx's workers
off it (placement.py); its allowed set is put back afterwards, and with spare CPUs nothing is held."""

from __future__ import annotations

import os
import threading

import pytest
from threadpoolctl import threadpool_limits

from rlx_runtime import placement, threads
from rlx_runtime.threads import forward_threads, run_chunks

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or placement.current_cpu() < 0,
                                reason="no CPU affinity calls on this platform")


@pytest.fixture
def cpus():
    """This thread's allowed CPUs (at least two), put back after the test whatever it did."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("one CPU: nothing to keep apart")
    yield frozenset(allowed)
    os.sched_setaffinity(0, allowed)


def _split_once() -> None:
    """A two-chunk Python job: starts the worker pool if there is none."""
    run_chunks(2, lambda i: None)


def _worker_cpus() -> list[frozenset]:
    return [frozenset(os.sched_getaffinity(t.native_id)) for t in threads._pool.workers]


def test_current_cpu_is_one_this_thread_may_use(cpus):
    assert placement.current_cpu() in cpus


def test_hold_caller_pins_to_the_current_cpu_and_release_puts_the_set_back(cpus):
    hold = placement.hold_caller(len(cpus))
    assert hold is not None and hold.allowed == cpus
    assert os.sched_getaffinity(0) == {hold.cpu}
    assert placement.current_cpu() == hold.cpu
    assert hold.others == cpus - {hold.cpu}
    placement.release_caller(hold)
    assert os.sched_getaffinity(0) == cpus


def test_nothing_is_held_with_spare_cpus_or_one_thread(cpus):
    assert placement.hold_caller(1) is None
    assert placement.hold_caller(len(cpus) - 1) is None or len(cpus) - 1 < 2
    assert os.sched_getaffinity(0) == cpus


def test_a_forward_over_every_cpu_holds_the_caller_and_keeps_the_workers_off_its_cpu(cpus):
    with threadpool_limits(limits=len(cpus), user_api="blas"):
        with forward_threads():
            _split_once()  # the pool exists from here on
            first = placement.current_cpu()
        os.sched_setaffinity(0, cpus - {first})  # the next forward starts on another CPU
        os.sched_setaffinity(0, cpus)
        with forward_threads():
            held = os.sched_getaffinity(0)
            assert held != {first}
            assert len(held) == 1
            (cpu,) = held
            assert all(w == cpus - {cpu} for w in _worker_cpus())
            ran_on = {}

            def chunk(i):
                ran_on[threading.get_native_id()] = placement.current_cpu()

            run_chunks(len(cpus), chunk)
            assert ran_on[threading.get_native_id()] == cpu  # the caller took at least one chunk, on its CPU
            assert all(c != cpu for t, c in ran_on.items() if t != threading.get_native_id())
        assert os.sched_getaffinity(0) == cpus  # put back
        with pytest.raises(ZeroDivisionError), forward_threads():  # an error inside a forward puts it back too
            raise ZeroDivisionError
        assert os.sched_getaffinity(0) == cpus


def test_a_forward_with_spare_cpus_lets_the_workers_run_anywhere_again(cpus):
    with threadpool_limits(limits=len(cpus), user_api="blas"), forward_threads():
        _split_once()
    if len(cpus) < 3:
        pytest.skip("needs a spare CPU beside two threads")
    with threadpool_limits(limits=2, user_api="blas"), forward_threads():
        assert os.sched_getaffinity(0) == cpus
        _split_once()
        assert all(w == cpus for w in _worker_cpus())


def test_nested_and_concurrent_forwards_hold_only_the_first_caller(cpus):
    seen = []
    go = threading.Event()

    def other():  # started before the forward (a thread started inside it would inherit the hold)
        go.wait()
        with forward_threads():
            seen.append(os.sched_getaffinity(0))

    t = threading.Thread(target=other)
    t.start()
    with threadpool_limits(limits=len(cpus), user_api="blas"), forward_threads():
        (cpu,) = os.sched_getaffinity(0)
        with forward_threads():  # nested: still held, and the release is the outer one's
            assert os.sched_getaffinity(0) == {cpu}
        assert os.sched_getaffinity(0) == {cpu}
        go.set()
        t.join()
        assert seen == [cpus]  # a second forward meanwhile is not held
    assert os.sched_getaffinity(0) == cpus


def test_unheld_steps_outside_the_hold_for_its_block_only(cpus):
    """cpu_hold.unheld() gives a held thread its set from before the hold for the block, and holds it again after;
    for a thread that is not held (the hold released) it changes nothing."""
    from rlx_format import cpu_hold

    hold = placement.hold_caller(len(cpus))
    try:
        with cpu_hold.unheld():
            assert frozenset(os.sched_getaffinity(0)) == cpus
        assert os.sched_getaffinity(0) == {hold.cpu}
    finally:
        placement.release_caller(hold)
    os.sched_setaffinity(0, {hold.cpu})  # narrowed by hand, not by a hold: unheld() must leave it so
    with cpu_hold.unheld():
        assert os.sched_getaffinity(0) == {hold.cpu}


_NUMBA_IN_A_HOLD = """
import os, sys
import numpy as np
from rlx_runtime import placement
cpus = frozenset(os.sched_getaffinity(0))
hold = placement.hold_caller(len(cpus))  # as a forward over every CPU (and a compile in its scope) holds its caller
assert hold is not None and "numba" not in sys.modules
before = set(os.listdir("/proc/self/task"))
from rlx_format.quants import quantize_q8_0  # numba's first import: inside the hold
from rlx_runtime.quant_kernels import dequant_matmul  # a numba parallel kernel: its first call starts numba's workers
w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
dequant_matmul(np.ones((1, 64), np.float32), quantize_q8_0(w), "gguf_q8_0", 64, 64)
import numba
new = set(os.listdir("/proc/self/task")) - before
print(numba.config.NUMBA_NUM_THREADS == len(cpus), bool(new), all(os.sched_getaffinity(int(t)) == cpus for t in new),
      os.sched_getaffinity(0) == {hold.cpu})
"""


def test_numba_loaded_and_started_inside_a_hold_gets_every_cpu(cpus):
    """numba sizes its pool from the importing thread's CPU set and its workers inherit the launching thread's; rlx
    first imports numba and calls a parallel kernel inside compiles and forwards, whose caller is held on one CPU.
    In a fresh process with the caller held: numba's thread count is the process's CPU count, every thread numba
    started may run on every CPU, and the caller is still held afterwards. (Launched in the hold, two workers shared
    one CPU: a Q8_0 GEMV of 4096x4096 weights ran 1.27 ms at 2 threads, as at one; 0.74 ms on both.)"""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _NUMBA_IN_A_HOLD], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True"] * 4
