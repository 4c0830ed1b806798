"""The float32 sigmoid and SiLU as explicit vector IR (numba intrinsic): the CPU's Sigmoid and Silu ops, the conv
epilogues' and the LSTM gates'.

The steps are those of ufuncs.py (its comment above `_exp_neg` gives the method and the accuracy: at most 2 ulp), one
fixed sequence of IEEE operations with no fma, so every CPU gives the same bits. Spelled out here rather than
left to numba's loop vectorizer because the vectorized loop ran at 1.1-1.2 ns a value on Zen 3 (AVX2): one
8-lane vector per iteration waited on its ~60-cycle dependency chain, and in place (a conv epilogue) LLVM's
run-time alias check failed, so every epilogue first copied its block to a scratch and added the bias in a pass
of its own. Here two vectors are in flight per iteration, the bias is added as the values are loaded, and the
result may overwrite the input.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from rlx_format.numba_setup import numba

from . import ufuncs
from .simd import (AVX512, _F32, _I32, _I64, _block_loop, _const, _data, _first_lanes, _is_f32, _load_vec, _masked,
                   _splat, _store_vec)

# lanes per vector, and vectors per loop iteration (independent chains side by side)
LANES = 16 if AVX512 else 8
UNROLL = 2


def _call(builder, name: str, v):
    """A one-argument LLVM float intrinsic (llvm.fabs, llvm.floor) on vector v."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type, [v.type]),
                                        f"{name}.v{v.type.count}f32")
    return builder.call(fn, [v])


def _exp_neg(builder, a):
    """exp(-a) for a >= 0 or NaN, as ufuncs._exp_neg: the same operations in the same order."""
    vf, n = a.type, a.type.count
    vi = ir.VectorType(_I32, n)
    c = lambda v: _const(vf, v)  # noqa: E731
    abs_max = c(float(ufuncs._ABS_MAX))
    a = builder.select(builder.fcmp_ordered("<", a, abs_max), a, abs_max)  # NaN -> _ABS_MAX
    kf = _call(builder, "llvm.floor", builder.fadd(builder.fmul(a, c(float(ufuncs._INV_LN2))), c(0.5)))
    k = builder.fptosi(kf, vi)  # kf in [0, 150]
    s = builder.fadd(builder.fsub(builder.fmul(kf, c(float(ufuncs._LN2_HI))), a),
                     builder.fmul(kf, c(float(ufuncs._LN2_LO))))
    s2 = builder.fmul(s, s)
    p0, p1, p2, p3, p4, p5 = (c(float(t)) for t in ufuncs.EXP_TERMS)
    q = builder.fadd(builder.fadd(builder.fadd(p5, builder.fmul(p4, s)),
                                  builder.fmul(builder.fadd(p3, builder.fmul(p2, s)), s2)),
                     builder.fmul(builder.fadd(p1, builder.fmul(p0, s)), builder.fmul(s2, s2)))
    e = builder.fadd(builder.fadd(builder.fmul(q, s2), s), c(1.0))
    k125 = _const(vi, 125)
    k1 = builder.select(builder.icmp_signed("<", k, k125), k, k125)
    f1 = builder.bitcast(builder.shl(builder.sub(_const(vi, 127), k1), _const(vi, 23)), vf)
    f2 = builder.bitcast(builder.shl(builder.sub(_const(vi, 127), builder.sub(k, k1)), _const(vi, 23)), vf)
    return builder.fmul(builder.fmul(e, f1), f2)


def _sigmoid_vec(builder, x, silu: bool):
    """sigmoid(x) = (1 if x >= 0 else t) / (1 + t) with t = exp(-|x|), or x * sigmoid(x) (silu), on a vector; NaN
    stays NaN."""
    one = _const(x.type, 1.0)
    t = _exp_neg(builder, _call(builder, "llvm.fabs", x))
    r = builder.fdiv(builder.select(builder.fcmp_ordered(">=", x, _const(x.type, 0.0)), one, t), builder.fadd(one, t))
    r = builder.select(builder.fcmp_unordered("uno", x, x), x, r)
    return builder.fmul(x, r) if silu else r


@intrinsic
def sigmoid_f32(typingctx, dst, at, src, start, count, bias, silu):
    """dst[at + i] = f(src[start + i] + bias) for i < count, f sigmoid or, with silu, x * sigmoid(x); bias a
    float32 added first (one rounding, as Conv's bias before its activation; -0.0 for none: x + -0.0 is x for
    every x). dst may be src at the same positions (in place). UNROLL vectors of LANES per iteration, then single
    vectors, then (AVX2) vectors of 8, then one masked vector: nothing outside the elements is read or written."""
    ints = all(isinstance(v, types.Integer) for v in (at, start, count))
    if not (_is_f32(dst) and _is_f32(src) and ints and isinstance(bias, types.Float)
            and isinstance(silu, (types.Boolean, types.Integer))):
        return None

    def codegen(context, builder, sig, args):
        dp = builder.gep(_data(context, builder, sig.args[0], args[0]).data, [builder.sext(args[1], _I64)])
        sp = builder.gep(_data(context, builder, sig.args[2], args[2]).data, [builder.sext(args[3], _I64)])
        n = builder.sext(args[4], _I64) if args[4].type.width < 64 else args[4]
        b = args[5] if args[5].type == _F32 else builder.fptrunc(args[5], _F32)
        on = builder.icmp_unsigned("!=", args[6], ir.Constant(args[6].type, 0))

        def run(is_silu: bool):
            def vectors(first, width, per):
                """whole groups of `per` vectors of `width` from element `first`; returns where they end"""
                vf = ir.VectorType(_F32, width)
                bv = _splat(builder, b, vf)
                step = width * per
                groups = builder.sdiv(builder.sub(n, first), ir.Constant(_I64, step))

                def body(g, state):
                    base = builder.add(first, builder.mul(g, ir.Constant(_I64, step)))
                    at_ = [builder.add(base, ir.Constant(_I64, k * width)) for k in range(per)]
                    xs = [builder.fadd(_load_vec(builder, sp, p, vf), bv) for p in at_]
                    for p, v in zip(at_, [_sigmoid_vec(builder, x, is_silu) for x in xs]):
                        _store_vec(builder, v, dp, p)
                    return []

                _block_loop(builder, ir.Constant(_I64, 0), groups, [], body)
                return builder.add(first, builder.mul(groups, ir.Constant(_I64, step)))

            done = vectors(ir.Constant(_I64, 0), LANES, UNROLL)
            done = vectors(done, LANES, 1)
            tail = LANES
            if not AVX512:  # AVX2's masked moves are slow: whole 8-lane vectors first
                done = vectors(done, 8, 1)
                tail = 8
            left = builder.sub(n, done)
            with builder.if_then(builder.icmp_signed(">", left, ir.Constant(_I64, 0))):
                vf = ir.VectorType(_F32, tail)
                mask = _first_lanes(builder, left, tail)
                x = builder.fadd(_masked(builder, "load", vf, builder.gep(sp, [done]), mask), _splat(builder, b, vf))
                _masked(builder, "store", vf, builder.gep(dp, [done]), mask, _sigmoid_vec(builder, x, is_silu))

        with builder.if_else(on) as (yes, no):
            with yes:
                run(True)
            with no:
                run(False)
        return context.get_dummy_value()

    return types.void(dst, at, src, start, count, bias, silu), codegen



# Single-threaded on purpose: a parallel kernel's static split waits for every worker thread, which on a loaded
# machine costs a scheduler time slice per call (measured: a YOLO-like forward went from 20 ms to 116 ms with 2
# numba threads while other processes ran).
@numba.njit(cache=True, error_model="numpy", nogil=True)
def sigmoid_array(src, dst, silu):  # pragma: no cover - compiled
    """dst = sigmoid(src), or SiLU with silu: flat float32 arrays of one size (dst may be src)."""
    sigmoid_f32(dst, 0, src, 0, src.size, np.float32(-0.0), silu)
