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
