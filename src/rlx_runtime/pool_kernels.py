"""The compiled half of threads.py's worker pool (the tables' layouts are in pool_layout.py): workers that
wait for, take and run chunks of a job without the GIL.

Why: a thread asleep in a futex took 30-70 us to wake on this 2-core VM, and a worker that has seen a new job
but needs the GIL to run Python waited that long again for the caller to let go of it: longer than many split
ops take in all (a depthwise conv, a decoding step's GEMV). Here an idle worker polls the job word for a short
while (atomic loads, a PAUSE between them) and runs the job's steps itself: cblas GEMM/GEMV calls through their
addresses, the conv epilogue and the depthwise kernel (conv_kernels.py), all described by rows of int64 and
float64 tables (threads.Steps writes them).

The job word (ctrl[NEXT]): generation << 44 | chunk count << 22 | next chunk. A chunk is taken by a
compare-and-swap of the whole word, so a worker still holding an old job's word can never take a chunk of the
next one (whose table rows are written only after every chunk of the old one has finished).
"""

from __future__ import annotations

import threading
import time

import numpy as np
from rlx_format.numba_setup import numba  # first: numba's import goes through rlx's set-up
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .atomics import add as _add
from .atomics import backoff as _backoff
from .atomics import load as _load
from .atomics import store as _store
from .atomics import swap as _swap
from .conv_kernels import (FALSE, ONE, ZERO, bias_act_block, bias_act_rows, direct_rows, dw_blocks, fill_phases,
                           row_means, scale_rows, tap_planes)
from .linear import add_columns
from .pool_layout import (FINISHED, FLOAT_COLUMNS, INT_COLUMNS, KIND, KIND_NATIVE, NEXT, ROW_BIAS_ACT, ROW_BLOCKED,
                          ROW_COLUMNS, ROW_DIRECT, ROW_FILL, ROW_GEMM, ROW_GEMV, ROW_MEANS, ROW_SCALE, ROW_SKINNY,
                          ROW_TAPS, WORKED, YIELD)
from .simd import FEW_ROWS_UNIT, SKINNY_ROWS, skinny_epilogue_f32

_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()

GEN_SHIFT, COUNT_SHIFT, MASK = 44, 22, (1 << 22) - 1


def _c_caller(kinds: str):
    """An intrinsic call(fn_address, args) calling a void C function whose parameters are `kinds`: i (C int),
    l (int64), f (float), p (pointer); args is a tuple of int64 / float64 values in that order."""

    @intrinsic
    def call(typingctx, fn, args):
        if not isinstance(args, types.BaseTuple) or len(args) != len(kinds):
            return None

        def codegen(context, builder, sig, llargs):
            params = {"i": _I32, "l": _I64, "f": _F32, "p": ir.IntType(8).as_pointer()}
            fnty = ir.FunctionType(ir.VoidType(), [params[k] for k in kinds])
            target = builder.inttoptr(llargs[0], fnty.as_pointer())
            values = []
            for k, v in zip(kinds, cgutils.unpack_tuple(builder, llargs[1])):
                if k == "i":
                    values.append(builder.trunc(v, _I32))
                elif k == "l":
                    values.append(v)
                elif k == "f":
                    values.append(builder.fptrunc(v, _F32))
                else:
                    values.append(builder.inttoptr(v, params["p"]))
            builder.call(target, values)
            return context.get_dummy_value()

        return types.void(fn, args), codegen

    return call


# cblas_sgemm(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); cblas_sgemv(order, trans, m,
# n, alpha, a, lda, x, incx, beta, y, incy); blas ints are C ints or int64 (an ILP64 build, as numpy's)
_sgemm32, _sgemm64 = _c_caller("iiiiiifpipifpi"), _c_caller("iiilllfplplfpl")
_sgemv32, _sgemv64 = _c_caller("iiiifpipifpi"), _c_caller("iillfplplfpl")


@intrinsic
def _f32_at(typingctx, address):
    """An int64 address as a float32 pointer (for numba.carray)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], _F32.as_pointer())
    return types.CPointer(types.float32)(types.int64), codegen


@intrinsic
def _i64_at(typingctx, address):
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], _I64.as_pointer())
    return types.CPointer(types.int64)(types.int64), codegen


@intrinsic
def _f64_at(typingctx, address):
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], ir.DoubleType().as_pointer())
    return types.CPointer(types.float64)(types.int64), codegen


@numba.njit(cache=True, nogil=True)
def skinny_rows(out, x, wt, rows, k, n, c0, c1, r0, r1, bias, has_bias, act, alpha, beta, has_lo, lo, has_hi,
                hi, res, has_res):  # pragma: no cover - compiled
    """out (rows, n) = x (rows, k) @ wt (k, n) on rows r0..r1 and columns c0..c1 (flat C-order float32),
    SKINNY_ROWS rows at a time; with act >= 0 each block gets conv_kernels.bias_act_block's epilogue (bias per
    row: a pointwise conv's; res: out's residual, flat, with has_res), its bias, residual and a Relu in the GEMM's
    stores, another activation as a pass over the block while it is still in cache. Columns go
    in panels of panel_columns(k): every block of rows reads the panel of wt from cache, not the whole of wt from
    memory again."""
    width = c1 - c0 if r1 - r0 <= SKINNY_ROWS else panel_columns(k)
    # the bias, the residual and a Relu go in as each output vector is stored (simd.skinny_epilogue_f32); another
    # activation then runs as a pass over the block
    mode = 0 if act < 0 else 2 if act == 0 else 1
    after = act >= 0 and act != 0 and act != 6
    for p0 in range(c0, c1, max(width, 1)):
        p1 = min(c1, p0 + width)
        for j0 in range(r0, r1, SKINNY_ROWS):
            j1 = min(r1, j0 + SKINNY_ROWS)
            skinny_epilogue_f32(out[j0 * n:], x[j0 * k:], wt, j1 - j0, k, n, p0, p1, bias[j0:] if has_bias else bias,
                                res[j0 * n:] if has_res else res, mode, has_bias, has_res)
            if after:
                bias_act_rows(out, rows, n, ZERO, ONE, j0, j1, p0, p1, ONE, bias, FALSE, act, alpha, beta, has_lo,
                              lo, has_hi, hi, res, FALSE)


# bytes of wt's (k, columns) panel that skinny_rows keeps in cache while every block of rows passes over it.
# Measured at 1 thread (Emerald Rapids, 2 MB L2): 128x256 @ 256x3136 ran at 16 GMAC/s untiled (each 8-row block
# read all 3.2 MB of wt from memory) and 35-38 in panels of 64-512 columns; k = 16 wanted >= 512 columns (a
# narrower panel only adds epilogue calls and loop set-up), k = 512 64-256
PANEL_BYTES = 128 << 10


@numba.njit(cache=True, nogil=True)
def panel_columns(k):  # pragma: no cover - compiled
    """skinny_rows' panel width for inner dimension k: PANEL_BYTES of float32 rows, in whole passes of the tile
    (simd.FEW_ROWS_UNIT columns: so only the last panel's last vector is masked, as without panels, and every other
    pass is a whole tile's)."""
    return max(FEW_ROWS_UNIT, PANEL_BYTES // (4 * max(k, 1)) // FEW_ROWS_UNIT * FEW_ROWS_UNIT)


@numba.njit(cache=True, nogil=True)
def put_skinny(ti, tf, r, out, x, wt, c0, c1, r0, r1, bias, has_bias, act, has_lo, has_hi, alpha, beta, lo,
               hi, res, has_res):  # pragma: no cover - compiled
    """Row r: skinny_rows on rows r0..r1 and columns c0..c1 of out = x @ wt (C-contiguous 2-D float32), with the
    epilogue's fields as put_bias_act's (act -1: none)."""
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3] = ROW_SKINNY, out.ctypes.data, x.ctypes.data, wt.ctypes.data
    ti[r, 4], ti[r, 5], ti[r, 6], ti[r, 7], ti[r, 8] = x.shape[0], x.shape[1], wt.shape[1], c0, c1
    ti[r, 9], ti[r, 10], ti[r, 11], ti[r, 12], ti[r, 13] = r0, r1, bias.ctypes.data, bias.size, has_bias
    ti[r, 14], ti[r, 15], ti[r, 16] = act, has_lo, has_hi
    ti[r, 17], ti[r, 18], ti[r, 19] = res.ctypes.data, res.size, has_res
    tf[r, 0], tf[r, 1], tf[r, 2], tf[r, 3] = alpha, beta, lo, hi


# (ints' address, floats' address, rows, row): a native step of one kind (threads.Steps), a C callback of its own.
# _run_row calls the steps other than BLAS calls through these addresses (row_fns()): numba links a callee's code
# into each caller and optimizes it again there, so with the kernels called directly every level above them
# (_run_row, run_rows, _take_chunks, the entry points) compiled them again (MobileNetV3-small's first run on an
# empty cache spent ~75 of its ~100 s there), and each of the three entry points carried a copy of them all.
_ROW_STEP = types.void(types.int64, types.int64, types.int64, types.int64)


@numba.njit(inline="always")
def _rows_at(ti_at, tf_at, rows):  # pragma: no cover - compiled
    return (numba.carray(_i64_at(ti_at), (rows, INT_COLUMNS)), numba.carray(_f64_at(tf_at), (rows, FLOAT_COLUMNS)))


def _step_bias_act(ti_at, tf_at, rows, r):  # pragma: no cover - compiled
    ti, tf = _rows_at(ti_at, tf_at, rows)
    y = numba.carray(_f32_at(ti[r, 1]), (ti[r, 2], ti[r, 3], ti[r, 4]))
    bias = numba.carray(_f32_at(ti[r, 12]), (ti[r, 13],))
    res = numba.carray(_f32_at(ti[r, 18]), (ti[r, 19],))
    bias_act_block(y, ti[r, 5], ti[r, 6], ti[r, 7], ti[r, 8], ti[r, 9], ti[r, 10], ti[r, 11], bias,
                   ti[r, 14] != 0, ti[r, 15], np.float32(tf[r, 0]), np.float32(tf[r, 1]), ti[r, 16] != 0,
                   np.float32(tf[r, 2]), ti[r, 17] != 0, np.float32(tf[r, 3]), res, ti[r, 20] != 0)


def _step_scale(ti_at, tf_at, rows, r):  # pragma: no cover - compiled
    ti, tf = _rows_at(ti_at, tf_at, rows)
    width, r0, r1 = ti[r, 4], ti[r, 5], ti[r, 6]
    big = numba.carray(_f32_at(ti[r, 1] + 4 * r0 * width), ((r1 - r0) * width,))
    small = numba.carray(_f32_at(ti[r, 2] + 4 * r0), (r1 - r0,))
    out = numba.carray(_f32_at(ti[r, 3] + 4 * r0 * width), ((r1 - r0) * width,))
    scale_rows(big, small, out, width)


def _step_means(ti_at, tf_at, rows, r):  # pragma: no cover - compiled
    ti, tf = _rows_at(ti_at, tf_at, rows)
    width, r0, r1 = ti[r, 3], ti[r, 4], ti[r, 5]
    x = numba.carray(_f32_at(ti[r, 1] + 4 * r0 * width), ((r1 - r0) * width,))
    out = numba.carray(_f32_at(ti[r, 2] + 4 * r0), (r1 - r0,))
    row_means(x, out, width)


def _step_columns(ti_at, tf_at, rows, r):  # pragma: no cover - compiled
    ti, tf = _rows_at(ti_at, tf_at, rows)
    nb, m, n = ti[r, 2], ti[r, 3], ti[r, 4]
    y = numba.carray(_f32_at(ti[r, 1]), (nb * m * n,))
    bias = numba.carray(_f32_at(ti[r, 11]), (ti[r, 12],))
    res = numba.carray(_f32_at(ti[r, 13]), (ti[r, 14],))
    add_columns(y, m, n, ti[r, 5], ti[r, 6], ti[r, 7], ti[r, 8], ti[r, 9], ti[r, 10], bias, res, ti[r, 15] != 0)


def _step_taps(ti_at, tf_at, rows, r):  # pragma: no cover - compiled
    ti, tf = _rows_at(ti_at, tf_at, rows)
    o, nb = ti[r, 15], ti[r, 16]
    phases = numba.carray(_f32_at(ti[r, 1]), (ti[r, 2],))
    taps = numba.carray(_f32_at(ti[r, 3]), (o, ti[r, 4]))
    offsets = numba.carray(_i64_at(ti[r, 5]), (ti[r, 4],))
    y = numba.carray(_f32_at(ti[r, 6]), (nb, o, ti[r, 7], ti[r, 8]))
    grid = numba.carray(_f32_at(ti[r, 12]), (ti[r, 14],))
    x = numba.carray(_f32_at(ti[r, 17]), (nb, ti[r, 18], ti[r, 19], ti[r, 20]))
    bias = numba.carray(_f32_at(ti[r, 26]), (ti[r, 27],))
    res = numba.carray(_f32_at(ti[r, 32]), (ti[r, 33],))
    tap_planes(x, phases, taps, offsets, y, ti[r, 9], ti[r, 10], ti[r, 11], grid, ti[r, 13], ti[r, 21], ti[r, 22],
               ti[r, 23], ti[r, 24], ti[r, 25], bias, ti[r, 28] != 0, ti[r, 29], np.float32(tf[r, 0]),
               np.float32(tf[r, 1]), ti[r, 30] != 0, np.float32(tf[r, 2]), ti[r, 31] != 0, np.float32(tf[r, 3]),
               res, ti[r, 34] != 0)


def _step_blocked(ti_at, tf_at, rows, r):  # pragma: no cover - compiled
    ti, tf = _rows_at(ti_at, tf_at, rows)
    nb, c, oh, ow = ti[r, 2], ti[r, 3], ti[r, 14], ti[r, 15]
    x = numba.carray(_f32_at(ti[r, 1]), (nb, c, ti[r, 4], ti[r, 5]))
    taps = numba.carray(_f32_at(ti[r, 6]), (ti[r, 7], ti[r, 8]))
    offsets = numba.carray(_i64_at(ti[r, 9]), (ti[r, 10],))
    where = numba.carray(_i64_at(ti[r, 11]), (ti[r, 12],))
    y = numba.carray(_f32_at(ti[r, 13]), (nb, c, oh, ow))
    buf = numba.carray(_f32_at(ti[r, 21]), (ti[r, 22],))
    out_rows = numba.carray(_f32_at(ti[r, 23]), (ti[r, 24],))
    bias = numba.carray(_f32_at(ti[r, 31]), (ti[r, 32],))
    res = numba.carray(_f32_at(ti[r, 37]), (ti[r, 38],))
    dw_blocks(x, taps, offsets, where, y, ti[r, 16], ti[r, 17], ti[r, 18], ti[r, 19], ti[r, 20], buf, out_rows,
              ti[r, 25], ti[r, 26], ti[r, 27], ti[r, 28], ti[r, 29], ti[r, 30], bias, ti[r, 33] != 0, ti[r, 34],
              np.float32(tf[r, 0]), np.float32(tf[r, 1]), ti[r, 35] != 0, np.float32(tf[r, 2]), ti[r, 36] != 0,
              np.float32(tf[r, 3]), res, ti[r, 39] != 0)


def _step_direct(ti_at, tf_at, rows, r):  # pragma: no cover - compiled
    ti, tf = _rows_at(ti_at, tf_at, rows)
    phases = numba.carray(_f32_at(ti[r, 1]), (ti[r, 2], ti[r, 3]))
    w = numba.carray(_f32_at(ti[r, 4]), (ti[r, 5], ti[r, 6]))
    offsets = numba.carray(_i64_at(ti[r, 7]), (ti[r, 27],))
    y = numba.carray(_f32_at(ti[r, 8]), (ti[r, 2], ti[r, 28], ti[r, 9], ti[r, 10]))
    bias = numba.carray(_f32_at(ti[r, 16]), (ti[r, 17],))
    res = numba.carray(_f32_at(ti[r, 22]), (ti[r, 23],))
    direct_rows(phases, w, offsets, y, ti[r, 11], ti[r, 12], ti[r, 13], ti[r, 25], ti[r, 26], ti[r, 14], ti[r, 15],
                bias, ti[r, 18] != 0, ti[r, 19], np.float32(tf[r, 0]), np.float32(tf[r, 1]), ti[r, 20] != 0,
                np.float32(tf[r, 2]), ti[r, 21] != 0, np.float32(tf[r, 3]), res, ti[r, 24] != 0)


def _step_fill(ti_at, tf_at, rows, r):  # pragma: no cover - compiled
    ti, tf = _rows_at(ti_at, tf_at, rows)
    x = numba.carray(_f32_at(ti[r, 1]), (ti[r, 2], ti[r, 3], ti[r, 4], ti[r, 5]))
    phases = numba.carray(_f32_at(ti[r, 6]), (ti[r, 2], ti[r, 3], ti[r, 7]))
    fill_phases(x, phases, ti[r, 8], ti[r, 9], ti[r, 10], ti[r, 11], ti[r, 12], ti[r, 13], ti[r, 14], ti[r, 15])


def _step_skinny(ti_at, tf_at, rows, r):  # pragma: no cover - compiled
    ti, tf = _rows_at(ti_at, tf_at, rows)
    m, k, n = ti[r, 4], ti[r, 5], ti[r, 6]  # the GEMM's rows (rows: the table's)
    out = numba.carray(_f32_at(ti[r, 1]), (m * n,))
    x = numba.carray(_f32_at(ti[r, 2]), (m * k,))
    wt = numba.carray(_f32_at(ti[r, 3]), (k * n,))
    bias = numba.carray(_f32_at(ti[r, 11]), (ti[r, 12],))
    res = numba.carray(_f32_at(ti[r, 17]), (ti[r, 18],))
    skinny_rows(out, x, wt, m, k, n, ti[r, 7], ti[r, 8], ti[r, 9], ti[r, 10], bias, ti[r, 13] != 0,
                ti[r, 14], np.float32(tf[r, 0]), np.float32(tf[r, 1]), ti[r, 15] != 0, np.float32(tf[r, 2]),
                ti[r, 16] != 0, np.float32(tf[r, 3]), res, ti[r, 19] != 0)


# kind -> its step, compiled as a C callback when the pool first runs a job (GEMM and GEMV rows call the BLAS)
_STEPS = {ROW_BIAS_ACT: _step_bias_act, ROW_SCALE: _step_scale, ROW_MEANS: _step_means, ROW_COLUMNS: _step_columns,
          ROW_TAPS: _step_taps, ROW_BLOCKED: _step_blocked, ROW_DIRECT: _step_direct, ROW_FILL: _step_fill,
          ROW_SKINNY: _step_skinny}
_callbacks: list = []  # the compiled callbacks: their code lives as long as they do
_row_fns: np.ndarray | None = None
_compiling = threading.Lock()


def row_fns() -> np.ndarray:
    """kind -> the address of its step's C callback, compiled or loaded from the kernel cache when the first job
    runs (a bound conv's prepared job runs them at one thread too), not when this module is imported."""
    global _row_fns
    if _row_fns is None:
        with _compiling:
            if _row_fns is None:
                fns = np.zeros(16, np.int64)
                for kind, step in _STEPS.items():
                    _callbacks.append(numba.cfunc(_ROW_STEP, cache=True)(step))
                    fns[kind] = _callbacks[-1].address
                _row_fns = fns
    return _row_fns


_call_step = _c_caller("llll")


@numba.njit(cache=True, nogil=True)
def _run_row(ti, tf, r, fns):  # pragma: no cover - compiled
    kind = ti[r, 0]
    if kind == ROW_GEMM:
        args = (ti[r, 3], ti[r, 4], ti[r, 5], ti[r, 6], ti[r, 7], ti[r, 8], tf[r, 0], ti[r, 9], ti[r, 10], ti[r, 11],
                ti[r, 12], tf[r, 1], ti[r, 13], ti[r, 14])
        if ti[r, 2]:
            _sgemm64(ti[r, 1], args)
        else:
            _sgemm32(ti[r, 1], args)
    elif kind == ROW_GEMV:
        args2 = (ti[r, 3], ti[r, 4], ti[r, 5], ti[r, 6], tf[r, 0], ti[r, 7], ti[r, 8], ti[r, 9], ti[r, 10], tf[r, 1],
                 ti[r, 11], ti[r, 12])
        if ti[r, 2]:
            _sgemv64(ti[r, 1], args2)
        else:
            _sgemv32(ti[r, 1], args2)
    else:
        _call_step(fns[kind], (np.int64(ti.ctypes.data), np.int64(tf.ctypes.data), ti.shape[0], r))


@numba.njit(cache=True, nogil=True)
def _run_rows(ti, tf, r0, r1, fns):  # pragma: no cover - compiled
    for r in range(r0, r1):
        _run_row(ti, tf, r, fns)


def run_rows(ti, tf, r0: int, r1: int) -> None:
    """Rows r0 .. r1 - 1 in order, on the calling thread."""
    _run_rows(ti, tf, r0, r1, row_fns())


@numba.njit(cache=True, nogil=True)
def relocate(ti, tf, pti, ptf, relocs, a0, a1, a2):  # pragma: no cover - compiled
    """A prepared job's rows (pti, ptf) copied to the first rows of ti, tf, each relocation (row, column, array,
    offset) there set to that array's address (a0, a1 or a2: this call's) plus the offset (threads.Prepared)."""
    for r in range(pti.shape[0]):  # by element: a slice assignment compiled numba's shape-error formatting (~6 s)
        for c in range(pti.shape[1]):
            ti[r, c] = pti[r, c]
        for c in range(ptf.shape[1]):
            tf[r, c] = ptf[r, c]
    bases = (a0.ctypes.data, a1.ctypes.data, a2.ctypes.data)
    for i in range(relocs.shape[0]):
        ti[relocs[i, 0], relocs[i, 1]] = bases[relocs[i, 2]] + relocs[i, 3]


@numba.njit(cache=True, nogil=True)
def _run_relocated(ti, tf, pti, ptf, relocs, a0, a1, a2, fns):  # pragma: no cover - compiled
    relocate(ti, tf, pti, ptf, relocs, a0, a1, a2)
    _run_rows(ti, tf, 0, pti.shape[0], fns)


def run_relocated(ti, tf, pti, ptf, relocs, a0, a1, a2) -> None:
    """relocate, then every row in order on the calling thread."""
    _run_relocated(ti, tf, pti, ptf, relocs, a0, a1, a2, row_fns())


@numba.njit(cache=True, nogil=True)
def _take_chunks(ctrl, ti, tf, starts, fns):  # pragma: no cover - compiled
    """Run chunks of the posted job until none is left; how many ran here. (A worker still here when the caller
    posts the next job may go on with that one's chunks: each is taken by a swap of the whole word.)"""
    ran = 0
    while True:
        w = _load(ctrl, NEXT)
        if (w & MASK) >= ((w >> COUNT_SHIFT) & MASK):
            return ran
        if _swap(ctrl, NEXT, w, w + 1):
            i = w & MASK
            _run_rows(ti, tf, starts[i], starts[i + 1], fns)
            _add(ctrl, FINISHED, 1)
            ran += 1


@numba.njit(cache=True, nogil=True)
def _serve_or_run(ctrl, ti, tf, starts, seen, polls, count, fns):  # pragma: no cover - compiled
    """serve (count < 0) or run_and_wait (count >= 0: its result as 1 or 0, then seen): one compiled function, one
    library to load at a first forward."""
    if count >= 0:  # the caller's part of the posted job: take chunks like a worker, then wait for the rest
        _take_chunks(ctrl, ti, tf, starts, fns)
        for i in range(polls):
            if _load(ctrl, FINISHED) == count:
                return 1, seen
            _backoff(i)
        return (1 if _load(ctrl, FINISHED) == count else 0), seen
    idle = 0
    while idle < polls:
        gen = _load(ctrl, NEXT) >> GEN_SHIFT
        if gen == seen:
            if _load(ctrl, YIELD):  # the cores are wanted elsewhere: sleep now
                return -1, seen
            _backoff(idle)
            idle += 1
            continue
        seen = gen
        kind = _load(ctrl, KIND)
        if kind != KIND_NATIVE:
            return kind, seen
        ran = _take_chunks(ctrl, ti, tf, starts, fns)
        if ran:
            _add(ctrl, WORKED, ran)
        idle = 0
    return -1, seen


def serve(ctrl, ti, tf, starts, seen: int, polls: int) -> tuple[int, int]:
    """A worker's loop: run each new native job's chunks; return (KIND_PYTHON or KIND_CLOSED, its generation)
    for a job only Python can run or a closed pool, (-1, last generation) after `polls` polls with no new job or
    once ctrl[YIELD] is set."""
    return _serve_or_run(ctrl, ti, tf, starts, seen, polls, -1, row_fns())


@numba.njit(cache=True, nogil=True)
def post(ctrl, gen, count, kind):  # pragma: no cover - compiled
    """Publish job `gen` (its table rows written before this call) of `count` chunks."""
    _store(ctrl, FINISHED, 0)
    _store(ctrl, YIELD, 0)
    _store(ctrl, KIND, kind)
    _store(ctrl, NEXT, (gen << GEN_SHIFT) | (count << COUNT_SHIFT))


def run_and_wait(ctrl, ti, tf, starts, count: int, polls: int) -> bool:
    """The caller's part of the posted job: take chunks like a worker, then poll until all `count` have
    finished; False if `polls` polls went by first."""
    return _serve_or_run(ctrl, ti, tf, starts, 0, polls, count, row_fns())[0] == 1


@numba.njit(cache=True, nogil=True)
def spin_while_equal(flags, value, polls):  # pragma: no cover - compiled
    """Poll flags[0] up to `polls` times; True as soon as it differs from `value`."""
    for i in range(polls):
        if _load(flags, 0) != value:
            return True
        _backoff(i)
    return _load(flags, 0) != value


def polls_per_second() -> float:
    """How many polls of spin_while_equal take a second on this CPU (PAUSE alone is ~10-140 cycles)."""
    flags = np.zeros(1, np.int64)
    spin_while_equal(flags, 0, 10)
    polls = 20_000
    t = time.perf_counter()
    spin_while_equal(flags, 0, polls)
    return polls / max(time.perf_counter() - t, 1e-9)


# Writing rows (threads.Steps): compiled, so a step costs one dispatch instead of a .ctypes.data per array
_NO_TRANS, _TRANS = 111, 112


@numba.njit(cache=True, nogil=True)
def _operand(x):  # pragma: no cover - compiled
    """(cblas transpose flag, leading dimension) of a 2-D array for a row-major call; (0, 0) if its strides
    are none a BLAS takes."""
    item = x.itemsize
    s0, s1 = x.strides
    if s1 == item and s0 % item == 0 and s0 >= max(1, x.shape[1]) * item:
        return _NO_TRANS, s0 // item
    if s0 == item and s1 % item == 0 and s1 >= max(1, x.shape[0]) * item:
        return _TRANS, s1 // item
    return 0, 0


@numba.njit(cache=True, nogil=True)
def put_gemm(ti, tf, r, fn, wide, a, b, out, beta):  # pragma: no cover - compiled
    """Row r: out[:] = a @ b + beta * out (float32; out's rows contiguous); False if a or b needs a copy first."""
    ta, lda = _operand(a)
    tb, ldb = _operand(b)
    if ta == 0 or tb == 0:
        return False
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3], ti[r, 4], ti[r, 5] = ROW_GEMM, fn, wide, 101, ta, tb
    ti[r, 6], ti[r, 7], ti[r, 8] = a.shape[0], b.shape[1], a.shape[1]
    ti[r, 9], ti[r, 10], ti[r, 11], ti[r, 12] = a.ctypes.data, lda, b.ctypes.data, ldb
    ti[r, 13], ti[r, 14] = out.ctypes.data, out.strides[0] // out.itemsize
    tf[r, 0], tf[r, 1] = 1.0, beta
    return True


@numba.njit(cache=True, nogil=True)
def put_gemv(ti, tf, r, fn, wide, a, b, out):  # pragma: no cover - compiled
    """Row r: out[:] = a[0] @ b (float32, a one row, out 1-D); False if b needs a copy first."""
    tw, ldw = _operand(b)
    if tw == 0:
        return False
    k, n = b.shape
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3] = ROW_GEMV, fn, wide, 101
    if tw == _NO_TRANS:  # b row-major (k, n): out = bᵀ-gemv over its k rows
        ti[r, 4], ti[r, 5], ti[r, 6] = _TRANS, k, n
    else:  # b = Wᵀ with W row-major (n, k)
        ti[r, 4], ti[r, 5], ti[r, 6] = _NO_TRANS, n, k
    ti[r, 7], ti[r, 8], ti[r, 9], ti[r, 10] = b.ctypes.data, ldw, a.ctypes.data, a.strides[1] // a.itemsize
    ti[r, 11], ti[r, 12] = out.ctypes.data, out.strides[0] // out.itemsize
    tf[r, 0], tf[r, 1] = 1.0, 0.0
    return True


@numba.njit(cache=True, nogil=True)
def gemv_halves(fn, wide, a, b, out, part):  # pragma: no cover - compiled
    """out[:] = a[0, :h] @ b[:h] + a[0, h:] @ b[h:], h = k // 2: two GEMVs through cblas_sgemv at `fn` over b's
    halves of rows on this thread, into out and part (float32, 1-D of n), then their sum (threads._gemv_in_halves;
    b's rows contiguous, a one row)."""
    k, n = b.shape
    h = k // 2
    ldw, incx = b.strides[0] // b.itemsize, a.strides[1] // a.itemsize
    for k0, k1, dst in ((0, h, out), (h, k, part)):
        args = (101, _TRANS, k1 - k0, n, 1.0, b[k0:].ctypes.data, ldw, a[:, k0:].ctypes.data, incx, 0.0,
                dst.ctypes.data, 1)
        if wide:
            _sgemv64(fn, args)
        else:
            _sgemv32(fn, args)
    for i in range(n):
        out[i] += part[i]


@numba.njit(cache=True, nogil=True)
def put_bias_act(ti, tf, r, y, b0, b1, r0, r1, c0, c1, groups, bias, has_bias, act, has_lo, has_hi, alpha,
                 beta, lo, hi, res, has_res):  # pragma: no cover - compiled
    """Row r: conv_kernels.bias_act_block on block [b0, b1) x [r0, r1) x [c0, c1) of y (B, M, N) float32."""
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3], ti[r, 4] = ROW_BIAS_ACT, y.ctypes.data, y.shape[0], y.shape[1], y.shape[2]
    ti[r, 5], ti[r, 6], ti[r, 7], ti[r, 8], ti[r, 9], ti[r, 10] = b0, b1, r0, r1, c0, c1
    ti[r, 11], ti[r, 12], ti[r, 13], ti[r, 14] = groups, bias.ctypes.data, bias.size, has_bias
    ti[r, 15], ti[r, 16], ti[r, 17] = act, has_lo, has_hi
    ti[r, 18], ti[r, 19], ti[r, 20] = res.ctypes.data, res.size, has_res
    tf[r, 0], tf[r, 1], tf[r, 2], tf[r, 3] = alpha, beta, lo, hi


@numba.njit(cache=True, nogil=True)
def put_columns(ti, tf, r, y, b0, b1, r0, r1, c0, c1, bias, res, has_res):  # pragma: no cover - compiled
    """Row r: linear.add_columns on block [b0, b1) x [r0, r1) x [c0, c1) of y (B, M, N) float32."""
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3], ti[r, 4] = ROW_COLUMNS, y.ctypes.data, y.shape[0], y.shape[1], y.shape[2]
    ti[r, 5], ti[r, 6], ti[r, 7], ti[r, 8], ti[r, 9], ti[r, 10] = b0, b1, r0, r1, c0, c1
    ti[r, 11], ti[r, 12], ti[r, 13], ti[r, 14] = bias.ctypes.data, bias.size, res.ctypes.data, res.size
    ti[r, 15] = has_res


@numba.njit(cache=True, nogil=True)
def put_scale(ti, tf, r, big, small, out, width, r0, r1):  # pragma: no cover - compiled
    """Row r: conv_kernels.scale_rows on rows r0..r1 of flat float32 big (rows of `width`), small (a value per row) and
    out."""
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3] = ROW_SCALE, big.ctypes.data, small.ctypes.data, out.ctypes.data
    ti[r, 4], ti[r, 5], ti[r, 6] = width, r0, r1


@numba.njit(cache=True, nogil=True)
def put_means(ti, tf, r, x, out, width, r0, r1):  # pragma: no cover - compiled
    """Row r: conv_kernels.row_means on rows r0..r1 of flat float32 x (rows of `width`) into out."""
    ti[r, 0], ti[r, 1], ti[r, 2] = ROW_MEANS, x.ctypes.data, out.ctypes.data
    ti[r, 3], ti[r, 4], ti[r, 5] = width, r0, r1


@numba.njit(cache=True, nogil=True)
def put_blocked(ti, tf, r, x, taps, offsets, where, y, n, k0, k1, g0, g1, buf, out_rows, sh, sw, top, wp, reach, band,
                bias, has_bias, act, alpha, beta, has_lo, lo, has_hi, hi, res, has_res):  # pragma: no cover - compiled
    """Row r: conv_kernels.dw_blocks(x, taps, offsets, where, y, n, k0, k1, g0, g1, buf, out_rows, sh, sw, top, wp,
    reach, band, ...) with the epilogue's fields in threads.epilogue_fields' order (act -1: none)."""
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3] = ROW_BLOCKED, x.ctypes.data, x.shape[0], x.shape[1]
    ti[r, 4], ti[r, 5], ti[r, 6] = x.shape[2], x.shape[3], taps.ctypes.data
    ti[r, 7], ti[r, 8] = taps.shape[0], taps.shape[1]
    ti[r, 9], ti[r, 10], ti[r, 11], ti[r, 12] = offsets.ctypes.data, offsets.size, where.ctypes.data, where.size
    ti[r, 13], ti[r, 14], ti[r, 15] = y.ctypes.data, y.shape[2], y.shape[3]
    ti[r, 16], ti[r, 17], ti[r, 18], ti[r, 19], ti[r, 20] = n, k0, k1, g0, g1
    ti[r, 21], ti[r, 22], ti[r, 23], ti[r, 24] = buf.ctypes.data, buf.size, out_rows.ctypes.data, out_rows.size
    ti[r, 25], ti[r, 26], ti[r, 27], ti[r, 28], ti[r, 29], ti[r, 30] = sh, sw, top, wp, reach, band
    ti[r, 31], ti[r, 32], ti[r, 33], ti[r, 34] = bias.ctypes.data, bias.size, has_bias, act
    ti[r, 35], ti[r, 36] = has_lo, has_hi
    ti[r, 37], ti[r, 38], ti[r, 39] = res.ctypes.data, res.size, has_res
    tf[r, 0], tf[r, 1], tf[r, 2], tf[r, 3] = alpha, beta, lo, hi


@numba.njit(cache=True, nogil=True)
def put_taps(ti, tf, r, x, phases, taps, offsets, y, n, c0, c1, grid, wq, sh, sw, top, left, hq, bias, has_bias,
             act, has_lo, has_hi, alpha, beta, lo, hi, res, has_res):  # pragma: no cover - compiled
    """Row r: conv_kernels.tap_planes(x, phases, taps, offsets, y, n, c0, c1, grid, wq, sh, sw, top, left, hq, ...)
    with the epilogue's fields as put_bias_act's (act -1: none)."""
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3] = ROW_TAPS, phases.ctypes.data, phases.size, taps.ctypes.data
    ti[r, 4], ti[r, 5], ti[r, 6] = taps.shape[1], offsets.ctypes.data, y.ctypes.data
    ti[r, 7], ti[r, 8] = y.shape[2], y.shape[3]
    ti[r, 9], ti[r, 10], ti[r, 11], ti[r, 12], ti[r, 13], ti[r, 14] = n, c0, c1, grid.ctypes.data, wq, grid.size
    ti[r, 15], ti[r, 16], ti[r, 17] = y.shape[1], y.shape[0], x.ctypes.data
    ti[r, 18], ti[r, 19], ti[r, 20] = x.shape[1], x.shape[2], x.shape[3]
    ti[r, 21], ti[r, 22], ti[r, 23], ti[r, 24], ti[r, 25] = sh, sw, top, left, hq
    ti[r, 26], ti[r, 27], ti[r, 28], ti[r, 29] = bias.ctypes.data, bias.size, has_bias, act
    ti[r, 30], ti[r, 31] = has_lo, has_hi
    ti[r, 32], ti[r, 33], ti[r, 34] = res.ctypes.data, res.size, has_res
    tf[r, 0], tf[r, 1], tf[r, 2], tf[r, 3] = alpha, beta, lo, hi


@numba.njit(cache=True, nogil=True)
def put_fill(ti, tf, r, x, phases, sh, sw, top, left, hq, wq, q0, q1):  # pragma: no cover - compiled
    """Row r: conv_kernels.fill_phases(x, phases, sh, sw, top, left, hq, wq, q0, q1) (x (N, C, H, W) and phases
    (N, C, L) float32, C-contiguous)."""
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3], ti[r, 4], ti[r, 5] = ROW_FILL, x.ctypes.data, *x.shape
    ti[r, 6], ti[r, 7], ti[r, 8], ti[r, 9], ti[r, 10] = phases.ctypes.data, phases.shape[2], sh, sw, top
    ti[r, 11], ti[r, 12], ti[r, 13], ti[r, 14], ti[r, 15] = left, hq, wq, q0, q1


@numba.njit(cache=True, nogil=True)
def put_direct(ti, tf, r, phases, w, offsets, y, b, r0, r1, g_lo, g_hi, wq, piece_rows, bias, has_bias, act, has_lo,
               has_hi, alpha, beta, lo, hi, res, has_res):  # pragma: no cover - compiled
    """Row r: conv_kernels.direct_rows(phases, w, offsets, y, b, r0, r1, g_lo, g_hi, wq, piece_rows, ...) with the
    epilogue's fields as put_bias_act's (act -1: none)."""
    ti[r, 0], ti[r, 1], ti[r, 2], ti[r, 3] = ROW_DIRECT, phases.ctypes.data, phases.shape[0], phases.shape[1]
    ti[r, 4], ti[r, 5], ti[r, 6], ti[r, 7] = w.ctypes.data, w.shape[0], w.shape[1], offsets.ctypes.data
    ti[r, 8], ti[r, 9], ti[r, 10], ti[r, 11] = y.ctypes.data, y.shape[2], y.shape[3], b
    ti[r, 12], ti[r, 13], ti[r, 14], ti[r, 15] = r0, r1, wq, piece_rows
    ti[r, 16], ti[r, 17], ti[r, 18], ti[r, 19] = bias.ctypes.data, bias.size, has_bias, act
    ti[r, 20], ti[r, 21] = has_lo, has_hi
    ti[r, 22], ti[r, 23], ti[r, 24] = res.ctypes.data, res.size, has_res
    ti[r, 25], ti[r, 26], ti[r, 27], ti[r, 28] = g_lo, g_hi, offsets.size, y.shape[1]
    tf[r, 0], tf[r, 1], tf[r, 2], tf[r, 3] = alpha, beta, lo, hi
