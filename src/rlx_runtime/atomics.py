"""Atomic operations on int64 words of a numpy array, for numba code that threads share without the GIL (the
worker pool's control words, pool_kernels.py; the LSTM steps' block counters, recurrent_kernels.py): LLVM atomics
behind numba intrinsics: acquire loads, release stores and acq_rel read-modify-writes, so what a thread wrote before
it published a word is seen by whoever reads that word after it."""

from __future__ import annotations

import os
import platform

from rlx_format.numba_setup import numba  # first: numba's import goes through rlx's set-up
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def _word_ptr(builder, context, aryty, ary, index):
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.gep(data, [index])


@intrinsic
def load(typingctx, ctrl, index):
    """ctrl[index], an atomic acquire load (re-read on every call; a plain load may be hoisted out of a loop)."""
    if not (isinstance(ctrl, types.Array) and ctrl.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        return builder.load_atomic(_word_ptr(builder, context, sig.args[0], args[0], args[1]), "acquire", 8)

    return types.int64(ctrl, types.intp), codegen


@intrinsic
def store(typingctx, ctrl, index, value):
    """ctrl[index] = value, an atomic release store (what was written before is seen by whoever loads it)."""
    if not (isinstance(ctrl, types.Array) and ctrl.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _word_ptr(builder, context, sig.args[0], args[0], args[1]), "release", 8)
        return context.get_dummy_value()

    return types.void(ctrl, types.intp, types.int64), codegen


@intrinsic
def add(typingctx, ctrl, index, value):
    """Atomically ctrl[index] += value."""
    if not (isinstance(ctrl, types.Array) and ctrl.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        builder.atomic_rmw("add", _word_ptr(builder, context, sig.args[0], args[0], args[1]), args[2], "acq_rel")
        return context.get_dummy_value()

    return types.void(ctrl, types.intp, types.int64), codegen


@intrinsic
def swap(typingctx, ctrl, index, expected, new):
    """Compare-and-swap ctrl[index] from `expected` to `new`; True if it was swapped."""
    if not (isinstance(ctrl, types.Array) and ctrl.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        ptr = _word_ptr(builder, context, sig.args[0], args[0], args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "acq_rel", "acquire")
        return builder.extract_value(pair, 1)

    return types.boolean(ctrl, types.intp, types.int64, types.int64), codegen


@intrinsic
def pause(typingctx):
    """x86's PAUSE (a spin-loop hint); nothing elsewhere."""

    def codegen(context, builder, sig, args):
        if _X86:
            fn = builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=ir.FunctionType(ir.VoidType(), []))
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def fetch_add(typingctx, ctrl, index, value):
    """Atomically ctrl[index] += value; the value before."""
    if not (isinstance(ctrl, types.Array) and ctrl.dtype == types.int64):
        return None

    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _word_ptr(builder, context, sig.args[0], args[0], args[1]), args[2],
                                  "acq_rel")

    return types.int64(ctrl, types.intp, types.int64), codegen


_POSIX = os.name == "posix"


@intrinsic
def yield_cpu(typingctx):
    """sched_yield(): let another runnable thread have this CPU (a spin-wait for a thread that the scheduler put
    on the same CPU would otherwise burn its whole time slice); nothing where there is no sched_yield."""

    def codegen(context, builder, sig, args):
        if _POSIX:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


# PAUSEs a spin-wait starts with before it yields the CPU at every poll: the thread it waits for may have been put on
# this CPU by the scheduler, and a spin without yielding then holds it up for a whole time slice. Measured on this
# 2-vCPU VM in bursts of forwards after idle pauses, when woken workers shared the caller's CPU: a 2-thread LSTM
# forward took 12-23 ms instead of ~5 (a steady 5 with the two threads pinned apart by hand).
SPIN_PAUSES = 64


@numba.njit(cache=True, nogil=True)
def backoff(polls):  # pragma: no cover - compiled
    """One poll's wait in a spin loop, the `polls`-th: PAUSE at first, then sched_yield."""
    if polls < SPIN_PAUSES:
        pause()
    else:
        yield_cpu()
