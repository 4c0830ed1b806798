"""Explicit-vector kernels for packed Q8_0, TQ2_0, Q4_0/1 and Q5_0/1 rows: LLVM vector IR behind numba intrinsics.

Why IR and not numba loops: numba's loop vectorizer left the 32-wide block loops of the row decoders scalar
(it cannot prove that the output row and the packed bytes do not overlap, and for 32 iterations it judged a
run-time overlap check too dear): the Q8_0 row decoder ran at 0.43 ns per weight and the batch-1 dot at about
half the f32 GEMV's speed. Here every vector is spelled out, so there is nothing left to prove.

Same bits on every x86 CPU: a 32-lane vector is split by LLVM into whatever registers the machine has (two
zmm on AVX-512, four ymm on AVX2), each lane's operations are fixed in the IR, multiply-adds are `llvm.fma`
(exact; a CPU without FMA gets the same value, only slower), and the final lane sum is a fixed halving tree.

Callers guarantee the sizes (no bounds checks here): a packed row holds `nb` whole blocks, the f32 side at
least `nb * block` elements.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rlx_format.numba_setup import numba  # first: numba's import goes through rlx's set-up
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
GROUP = 8  # blocks whose fp16 scales are converted together (one vector)
CHAINS = 4  # independent accumulators in the dot loops (a power of two)
TAP_CHAINS = 4  # rows whose tap sums tap_rows_f32 runs side by side (each its own fma chain)
LANES = 32  # one Q8_0 block; also a TQ2_0 block's 32-byte code group
_VF = ir.VectorType(_F32, LANES)
_VI8 = ir.VectorType(_I8, LANES)

Q8_0_BYTES, TQ2_0_BYTES = 34, 66  # GGML block sizes: Q8_0 = fp16 d + 32 int8; TQ2_0 = 64 code bytes + fp16 d


def _data(context, builder, aryty, value):
    return context.make_array(aryty)(context, builder, value)


def _splat(builder, v, vty):
    undef = ir.Constant(vty, ir.Undefined)
    one = builder.insert_element(undef, v, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, undef, ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count))


def _load_vec(builder, base, offset, vty):
    """vty loaded from element `offset` of `base` (no alignment assumed)."""
    ptr = builder.bitcast(builder.gep(base, [offset]), vty.as_pointer())
    return builder.load(ptr, align=1)


def _store_vec(builder, value, base, offset):
    ptr = builder.bitcast(builder.gep(base, [offset]), value.type.as_pointer())
    builder.store(value, ptr, align=1)


def _const(ty, v):
    """A constant of an integer or float scalar type, or of a vector type (splat)."""
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [ir.Constant(ty.element, v)] * ty.count)
    return ir.Constant(ty, v)


def _half_to_f32(builder, h):
    """fp16 bits (in i32 lanes, scalar or vector) -> f32, exact for every pattern, NaN payloads kept as numpy's
    conversion keeps them. Spelled out in integer ops: LLVM's fpext from half becomes, on a target without
    F16C, a runtime call numba's JIT does not link (it crashed)."""
    fty = ir.VectorType(_F32, h.type.count) if isinstance(h.type, ir.VectorType) else _F32
    c = lambda v: _const(h.type, v)  # noqa: E731
    sign = builder.shl(builder.and_(h, c(0x8000)), c(16))
    em = builder.and_(h, c(0x7FFF))
    shifted = builder.shl(em, c(13))
    normal = builder.add(shifted, c((127 - 15) << 23))  # rebias the exponent
    special = builder.or_(shifted, c(0x7F800000))  # Inf / NaN: all-ones exponent, mantissa kept
    tiny = builder.fmul(builder.sitofp(em, fty), _const(fty, 2.0 ** -24))  # subnormal: em * 2^-24, exact
    bits = builder.select(builder.icmp_unsigned(">=", em, c(0x7C00)), special, normal)
    bits = builder.select(builder.icmp_unsigned("<", em, c(0x400)), builder.bitcast(tiny, h.type), bits)
    return builder.bitcast(builder.or_(bits, sign), fty)


def _half_bits(builder, row, at):
    """The little-endian fp16 at byte `at` of a packed row, zero-extended to i32."""
    lo = builder.zext(builder.load(builder.gep(row, [at])), _I32)
    hi = builder.zext(builder.load(builder.gep(row, [builder.add(at, ir.Constant(_I64, 1))])), _I32)
    return builder.or_(lo, builder.shl(hi, ir.Constant(_I32, 8)))


def _scales(builder, row, b, layout, count):
    """The d of blocks b .. b+count-1 as f32 scalars; a group's bits are converted as one vector (one block at a
    time the conversion's ~12 integer ops cost the Q8_0 dot 1.4x)."""
    nbytes, at = layout
    offs = [builder.add(builder.mul(builder.add(b, ir.Constant(_I64, k)), ir.Constant(_I64, nbytes)),
                        ir.Constant(_I64, at)) for k in range(count)]
    if count == 1:
        return [_half_to_f32(builder, _half_bits(builder, row, offs[0]))]
    vec = ir.Constant(ir.VectorType(_I32, count), ir.Undefined)
    for k, off in enumerate(offs):
        vec = builder.insert_element(vec, _half_bits(builder, row, off), ir.Constant(_I32, k))
    ds = _half_to_f32(builder, vec)
    return [builder.extract_element(ds, ir.Constant(_I32, k)) for k in range(count)]


def _fma(builder, a, b, c):
    """llvm.fma of float32 scalars or vectors (llvmlite names only scalar intrinsics: declared by mangled name)."""
    ty = a.type
    name = f"llvm.fma.v{ty.count}f32" if isinstance(ty, ir.VectorType) else "llvm.fma.f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * 3), name)
    return builder.call(fn, [a, b, c])


def _lane_tree(builder, v, combine):
    """A vector's lanes combined by a fixed halving tree (combine(low half, high half); the same order on every
    CPU)."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n, 2 * n))))
        v = combine(lo, hi)
    return builder.extract_element(v, ir.Constant(_I32, 0))


def _lane_sum(builder, v):
    """Sum of a vector's lanes by the fixed halving tree."""
    return _lane_tree(builder, v, builder.fadd)


def _block_loop(builder, start, stop, init, body):
    """for b in range(start, stop): state = body(b, state); returns the final state (`init` if none ran)."""
    pre = builder.block
    loop = builder.append_basic_block("blocks")
    done = builder.append_basic_block("blocks_done")
    builder.cbranch(builder.icmp_signed("<", start, stop), loop, done)
    builder.position_at_end(loop)
    b = builder.phi(_I64)
    b.add_incoming(start, pre)
    state = [builder.phi(v.type) for v in init]
    for p, v in zip(state, init):
        p.add_incoming(v, pre)
    new = body(b, state)
    nxt = builder.add(b, ir.Constant(_I64, 1))
    end = builder.block
    b.add_incoming(nxt, end)
    for p, v in zip(state, new):
        p.add_incoming(v, end)
    builder.cbranch(builder.icmp_signed("<", nxt, stop), loop, done)
    builder.position_at_end(done)
    out = []
    for v0, v1 in zip(init, new):
        p = builder.phi(v0.type)
        p.add_incoming(v0, pre)
        p.add_incoming(v1, end)
        out.append(p)
    return out


def _each_block(builder, row, nb, fmt, init, body):
    """state = body(b, scales, state) for every block b of a row with its fp16 scales (d, and m where the format
    has one), in order: whole groups of GROUP blocks first (their scales converted as one vector each), then the
    rest one at a time."""
    groups = builder.sdiv(nb, ir.Constant(_I64, GROUP))

    def scales(b, count):
        per = [_scales(builder, row, b, (fmt.nbytes, at), count) for at in fmt.scale_at]
        return [list(s) for s in zip(*per)]

    def group(g, state):
        b0 = builder.mul(g, ir.Constant(_I64, GROUP))
        for k, ds in enumerate(scales(b0, GROUP)):
            state = body(builder.add(b0, ir.Constant(_I64, k)), ds, state)
        return state

    state = _block_loop(builder, ir.Constant(_I64, 0), groups, init, group)
    rest = builder.mul(groups, ir.Constant(_I64, GROUP))
    return _block_loop(builder, rest, nb, state, lambda b, st: body(b, scales(b, 1)[0], st))


def _row_args(context, builder, sig, args, nbytes):
    """(packed row i8*, f32 side float*, block count) of a (row, f32 array) call."""
    row = _data(context, builder, sig.args[0], args[0])
    vec = _data(context, builder, sig.args[1], args[1])
    length = cgutils.unpack_tuple(builder, row.shape)[0]
    return row.data, vec.data, builder.sdiv(length, ir.Constant(_I64, nbytes))


def _is_u8_row(t) -> bool:
    return isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" and t.dtype == types.uint8


def _is_f32(t) -> bool:
    return isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" and t.dtype == types.float32


def _offset(builder, b, scale, plus=0):
    return builder.add(builder.mul(b, ir.Constant(_I64, scale)), ir.Constant(_I64, plus))


def _q8_0_codes(builder, row, b):
    """Block b's 32 codes as f32 lanes."""
    return builder.sitofp(_load_vec(builder, row, _offset(builder, b, Q8_0_BYTES, 2), _VI8), _VF)


def _tq2_0_codes(builder, row, b):
    """Block b's 8 groups of 32 codes in {-1, 0, 1} as f32 lanes, in element order (group j*4+l holds elements
    j*128 + l*32 .. +32: bits 2l..2l+1 of code byte j*32 + i)."""
    groups = []
    three, one = _const(_VI8, 3), _const(_VI8, 1)
    for j in range(2):
        raw = _load_vec(builder, row, _offset(builder, b, TQ2_0_BYTES, 32 * j), _VI8)
        for shift in range(4):
            q = builder.lshr(raw, _const(_VI8, 2 * shift)) if shift else raw
            groups.append(builder.sitofp(builder.sub(builder.and_(q, three), one), _VF))
    return groups


def _nibble_codes(builder, row, b, nbytes, at, high_at, offset):
    """A 4- or 5-bit block's 32 codes as f32 lanes: element j < 16 in the low nibble of byte at + j, j + 16 in
    its high nibble; with `high_at`, bit j of the little-endian u32 there is element j's fifth bit (Q5_x); then
    minus `offset` (Q4_0: 8, Q5_0: 16; the types with a min: 0)."""
    raw = _load_vec(builder, row, _offset(builder, b, nbytes, at), ir.VectorType(_I8, 16))
    lo = builder.and_(raw, _const(raw.type, 15))
    hi = builder.lshr(raw, _const(raw.type, 4))
    q = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, LANES), list(range(LANES))))
    if high_at is not None:
        vi32 = ir.VectorType(_I32, LANES)
        ptr = builder.bitcast(builder.gep(row, [_offset(builder, b, nbytes, high_at)]), _I32.as_pointer())
        bits = builder.lshr(_splat(builder, builder.load(ptr, align=1), vi32), ir.Constant(vi32, list(range(LANES))))
        fifth = builder.trunc(builder.and_(bits, _const(vi32, 1)), _VI8)
        q = builder.or_(q, builder.shl(fifth, _const(_VI8, 4)))
    if offset:
        return [builder.sitofp(builder.sub(q, _const(_VI8, offset)), _VF)]
    return [builder.uitofp(q, _VF)]


@dataclass(frozen=True)
class _Format:
    nbytes: int          # bytes per block
    scale_at: tuple      # byte offsets of the fp16 d (and m) in a block
    codes: Callable      # (builder, row, b) -> the block's codes as f32 vectors of LANES, in element order
    elements: int = LANES  # elements per block


_Q8_0 = _Format(Q8_0_BYTES, (0,), lambda builder, row, b: [_q8_0_codes(builder, row, b)])
_TQ2_0 = _Format(TQ2_0_BYTES, (64,), _tq2_0_codes, 8 * LANES)
_Q4_0 = _Format(18, (0,), lambda builder, row, b: _nibble_codes(builder, row, b, 18, 2, None, 8))
_Q4_1 = _Format(20, (0, 2), lambda builder, row, b: _nibble_codes(builder, row, b, 20, 4, None, 0))
_Q5_0 = _Format(22, (0,), lambda builder, row, b: _nibble_codes(builder, row, b, 22, 6, 2, 16))
_Q5_1 = _Format(24, (0, 2), lambda builder, row, b: _nibble_codes(builder, row, b, 24, 8, 4, 0))


def _tree_sum(builder, vs):
    while len(vs) > 1:  # pairwise: three adds deep for 8, not seven
        vs = [builder.fadd(vs[i], vs[i + 1]) for i in range(0, len(vs), 2)]
    return vs[0]


def _row_dot(fmt: _Format):
    """dot(dequantized row, x[:nb*E]) as f32. Per block: fma(d, sum of the groups' q * x, acc), or for a format
    with a min fma(q * d + m, x, acc), into CHAINS accumulators taken in turn (so consecutive blocks do not wait
    on each other's multiply-add), then a fixed tree."""
    def typer(typingctx, row, x):
        if not (_is_u8_row(row) and _is_f32(x)):
            return None

        def codegen(context, builder, sig, args):
            prow, xp, nb = _row_args(context, builder, sig, args, fmt.nbytes)
            zero = ir.Constant(_VF, None)

            def body(b, ds, state):
                xs = [_load_vec(builder, xp, _offset(builder, b, fmt.elements, g * LANES), _VF)
                      for g in range(fmt.elements // LANES)]
                codes = fmt.codes(builder, prow, b)
                if len(ds) > 1:  # with a min: the weights themselves (q * d + m, the decoder's values) times x
                    # (factoring d and m out would give 0 * Inf = NaN where the weight is m and x is infinite)
                    dv, mv = _splat(builder, ds[0], _VF), _splat(builder, ds[1], _VF)
                    for q, xv in zip(codes, xs):
                        state = state[1:] + [_fma(builder, builder.fadd(builder.fmul(q, dv), mv), xv, state[0])]
                    return state
                v = _tree_sum(builder, [builder.fmul(q, xv) for q, xv in zip(codes, xs)])
                return state[1:] + [_fma(builder, _splat(builder, ds[0], _VF), v, state[0])]

            accs = _each_block(builder, prow, nb, fmt, [zero] * CHAINS, body)
            return _lane_sum(builder, _tree_sum(builder, accs))

        return types.float32(row, x), codegen

    return typer


def _decoder(fmt: _Format):
    """A row decoder: out[b*E : (b+1)*E] = codes * d (then + m) for every block, the reference's float32 steps."""
    def typer(typingctx, row, out):
        if not (_is_u8_row(row) and _is_f32(out)):
            return None

        def codegen(context, builder, sig, args):
            prow, op, nb = _row_args(context, builder, sig, args, fmt.nbytes)

            def body(b, ds, state):
                dv = _splat(builder, ds[0], _VF)
                for g, q in enumerate(fmt.codes(builder, prow, b)):
                    v = builder.fmul(q, dv)
                    if len(ds) > 1:
                        v = builder.fadd(v, _splat(builder, ds[1], _VF))
                    _store_vec(builder, v, op, _offset(builder, b, fmt.elements, g * LANES))
                return state

            _each_block(builder, prow, nb, fmt, [], body)
            return context.get_dummy_value()

        return types.void(row, out), codegen

    return typer


q8_0_row_dot = intrinsic(_row_dot(_Q8_0))
tq2_0_row_dot = intrinsic(_row_dot(_TQ2_0))
q4_0_row_dot = intrinsic(_row_dot(_Q4_0))
q4_1_row_dot = intrinsic(_row_dot(_Q4_1))
q5_0_row_dot = intrinsic(_row_dot(_Q5_0))
q5_1_row_dot = intrinsic(_row_dot(_Q5_1))
q8_0_row_decode = intrinsic(_decoder(_Q8_0))  # float32(q) * d
tq2_0_row_decode = intrinsic(_decoder(_TQ2_0))  # (q - 1) * d
q4_0_row_decode = intrinsic(_decoder(_Q4_0))  # (q - 8) * d
q4_1_row_decode = intrinsic(_decoder(_Q4_1))  # q * d + m
q5_0_row_decode = intrinsic(_decoder(_Q5_0))  # (q - 16) * d
q5_1_row_decode = intrinsic(_decoder(_Q5_1))  # q * d + m


def _target_has_avx512() -> bool:
    """Whether numba compiles for a CPU with AVX-512: NUMBA_CPU_FEATURES when set, else the host's features
    (numba's own rule for the features it compiles with)."""
    from llvmlite import binding
    from numba.core import config

    if config.CPU_FEATURES is not None:
        return "+avx512f" in config.CPU_FEATURES.split(",")
    return bool(binding.get_host_cpu_features().get("avx512f"))


# numba compiles for an AVX-512 CPU: some kernels pick their vector shapes by it (none changes a result)
AVX512 = _target_has_avx512()


def _is_i64(t) -> bool:
    return isinstance(t, types.Array) and t.ndim == 1 and t.layout == "C" and t.dtype == types.int64


def _in_tiles(builder, n, tile: int, body) -> None:
    """body(first, tile) for each whole tile of n items (first an i64, from 0), then body(done, rest) once for the
    rest (a Python int 1 .. tile - 1, each its own unrolled code)."""
    groups = builder.sdiv(n, ir.Constant(_I64, tile))
    _block_loop(builder, ir.Constant(_I64, 0), groups, [], lambda g, state: body(_offset(builder, g, tile), tile) or [])
    done = builder.mul(groups, ir.Constant(_I64, tile))
    rest = builder.sub(n, done)
    for count in range(1, tile):
        with builder.if_then(builder.icmp_signed("==", rest, ir.Constant(_I64, count))):
            body(done, count)


@intrinsic
def tap_rows_f32(typingctx, dst, at, pitch, src, start, src_pitch, rows, count, weights, offsets):
    """dst[at + r * pitch + i] = sum over t of weights[t] * src[start + r * src_pitch + offsets[t] + i], for r < rows
    and i < count: each row's taps summed in order from 0.0, each added by fma (one rounding: the same bits on
    every CPU), in registers. TAP_CHAINS rows at a time, a 32-lane vector of each side by side (each its own fma
    chain: one chain alone waits on each fma's latency), the row's last vector masked (nothing read or written past
    `count`). The depthwise conv's inner loop (conv_kernels.tap_planes): a row per output row, straight into the
    output; or the stride-phase grid as rows of 32 (no mask). A pass per tap over a buffer was bound by its stores,
    one vector at a time by the add latency (a 240-channel 5x5 conv: 64 us, 48 us in registers); a multiply and an
    add each took a vector port where the fma takes one (EfficientNet-B0/MobileNetV3-sized depthwise convs' taps
    0-25% faster as fma, Rocket Lake, 1 thread)."""
    ints = all(isinstance(v, types.Integer) for v in (at, pitch, start, src_pitch, rows, count))
    if not (_is_f32(dst) and _is_f32(src) and ints and _is_f32(weights) and _is_i64(offsets)):
        return None

    def codegen(context, builder, sig, args):
        dp = _data(context, builder, sig.args[0], args[0]).data
        sp = _data(context, builder, sig.args[3], args[3]).data
        at_, pitch_, start_, spitch_, rows_, n = (builder.sext(args[i], _I64) if args[i].type.width < 64 else args[i]
                                                  for i in (1, 2, 4, 5, 6, 7))
        wts = _data(context, builder, sig.args[8], args[8])
        wp, ntaps = wts.data, cgutils.unpack_tuple(builder, wts.shape)[0]
        op = _data(context, builder, sig.args[9], args[9]).data
        whole = builder.sdiv(n, ir.Constant(_I64, LANES))
        tail = builder.sub(n, builder.mul(whole, ir.Constant(_I64, LANES)))

        def vector(first, count, column, mask):
            """rows first .. first + count - 1 (count a Python int), LANES columns from `column` (mask's lanes)"""
            src_at = [builder.add(builder.add(start_, builder.mul(builder.add(first, ir.Constant(_I64, j)), spitch_)),
                                  column) for j in range(count)]

            def tap(t, accs):
                ws = _splat(builder, builder.load(builder.gep(wp, [t])), _VF)
                off = builder.load(builder.gep(op, [t]))
                out = []
                for pos, acc in zip(src_at, accs):
                    at_t = builder.add(pos, off)
                    x = (_load_vec(builder, sp, at_t, _VF) if mask is None
                         else _masked(builder, "load", _VF, builder.gep(sp, [at_t]), mask))
                    out.append(_fma(builder, ws, x, acc))
                return out

            accs = _block_loop(builder, ir.Constant(_I64, 0), ntaps, [ir.Constant(_VF, None)] * count, tap)
            for j, v in enumerate(accs):
                d = builder.add(builder.add(at_, builder.mul(builder.add(first, ir.Constant(_I64, j)), pitch_)), column)
                if mask is None:
                    _store_vec(builder, v, dp, d)
                else:
                    _masked(builder, "store", _VF, builder.gep(dp, [d]), mask, v)

        def rows_from(first, count):
            _block_loop(builder, ir.Constant(_I64, 0), whole, [],
                        lambda b, state: vector(first, count, _offset(builder, b, LANES), None) or [])
            with builder.if_then(builder.icmp_signed(">", tail, ir.Constant(_I64, 0))):
                vector(first, count, builder.mul(whole, ir.Constant(_I64, LANES)),
                       _first_lanes(builder, tail, LANES))

        _in_tiles(builder, rows_, TAP_CHAINS, rows_from)
        return context.get_dummy_value()

    return types.void(dst, at, pitch, src, start, src_pitch, rows, count, weights, offsets), codegen


# channels per block of the channel-blocked depthwise kernel: one vector register of float32 (16 with AVX-512, 8
# with AVX2)
BLOCK = 16 if AVX512 else 8
BLOCK_TILE = 8  # output pixels whose tap sums taps_block_f32 runs side by side (each its own fma chain)


def _transpose_block(builder, rows: list, block: int) -> list:
    """The block x block transpose of `block` vectors of `block` lanes (rows[i][j] -> out[j][i]) in log2(block)
    rounds of `block` two-source shuffles: round k swaps bit k of the row index with bit k of the lane index."""
    for k in range(block.bit_length() - 1):
        d = 1 << k
        lo = ir.Constant(ir.VectorType(_I32, block), [c if not c & d else block + (c ^ d) for c in range(block)])
        hi = ir.Constant(ir.VectorType(_I32, block), [c | d if not c & d else block + c for c in range(block)])
        new = list(rows)
        for i in range(block):
            if not i & d:
                new[i] = builder.shuffle_vector(rows[i], rows[i | d], lo)
                new[i | d] = builder.shuffle_vector(rows[i], rows[i | d], hi)
        rows = new
    return rows


def _transpose_block_codegen(scattered: bool, block: int):
    """transpose_block_f32's code (column j stored at at + j * pitch) or transpose_block_to_f32's (at at +
    where[w_at + j]), for tiles of `block` x `block`."""
    src = 4 if scattered else 3  # (dst, at, where, w_at, src, ...) or (dst, at, pitch, src, ...)
    vb = ir.VectorType(_F32, block)

    def codegen(context, builder, sig, args):
        dp, sp = (_data(context, builder, sig.args[i], args[i]).data for i in (0, src))
        wh = _data(context, builder, sig.args[2], args[2]).data if scattered else None
        # step_: w_at or pitch
        at_, step_, start_, spitch_, rows_, cols_ = (builder.sext(args[i], _I64) if args[i].type.width < 64
                                                     else args[i] for i in (1, src - 1, *range(src + 1, src + 5)))
        none = ir.Constant(ir.VectorType(ir.IntType(1), block), None)
        block_ = ir.Constant(_I64, block)

        def tile(whole: bool):
            """The loads, the transpose and the stores; whole: a full tile, plain vector moves (AVX2's masked
            stores are slow), else masked ones."""
            if not whole:
                col_mask, row_mask = _first_lanes(builder, cols_, block), _first_lanes(builder, rows_, block)
            loaded = []
            for i in range(block):  # a row past `rows`: an empty mask, nothing read, zeros
                at = builder.add(start_, builder.mul(ir.Constant(_I64, i), spitch_))
                if whole:
                    loaded.append(_load_vec(builder, sp, at, vb))
                    continue
                live = builder.icmp_signed("<", ir.Constant(_I64, i), rows_)
                mask = builder.select(live, col_mask, none)
                loaded.append(_masked(builder, "load", vb, builder.gep(sp, [at]), mask))
            for j, v in enumerate(_transpose_block(builder, loaded, block)):
                live = builder.icmp_signed("<", ir.Constant(_I64, j), cols_)
                if scattered:  # where[w_at + j] read only for a live column (in bounds)
                    k = builder.select(live, builder.add(step_, ir.Constant(_I64, j)), step_)
                    to = builder.add(at_, builder.load(builder.gep(wh, [k])))
                else:
                    to = builder.add(at_, builder.mul(ir.Constant(_I64, j), step_))
                if whole:
                    _store_vec(builder, v, dp, to)
                else:
                    _masked(builder, "store", vb, builder.gep(dp, [to]), builder.select(live, row_mask, none), v)

        full = builder.and_(builder.icmp_signed("==", rows_, block_), builder.icmp_signed("==", cols_, block_))
        with builder.if_else(full) as (whole, part):
            with whole:
                tile(True)
            with part:
                tile(False)
        return context.get_dummy_value()
    return codegen


def _taps_block_codegen(block: int):
    """taps_block_f32's code for blocks of `block` channels."""
    vb = ir.VectorType(_F32, block)

    def codegen(context, builder, sig, args):
        dp = _data(context, builder, sig.args[0], args[0]).data
        sp = _data(context, builder, sig.args[2], args[2]).data
        at_, start_, step_, n, wat_ = (builder.sext(args[i], _I64) if args[i].type.width < 64 else args[i]
                                       for i in (1, 3, 4, 5, 7))
        wp = _data(context, builder, sig.args[6], args[6]).data
        offs = _data(context, builder, sig.args[8], args[8])
        op, ntaps = offs.data, cgutils.unpack_tuple(builder, offs.shape)[0]

        def pixels(first, count):
            """pixels first .. first + count - 1 (count a Python int)"""
            src_at = [builder.add(start_, builder.mul(builder.add(first, ir.Constant(_I64, j)), step_))
                      for j in range(count)]

            def tap(t, accs):
                w = _load_vec(builder, wp, builder.add(wat_, builder.mul(t, ir.Constant(_I64, block))), vb)
                off = builder.load(builder.gep(op, [t]))
                return [_fma(builder, w, _load_vec(builder, sp, builder.add(pos, off), vb), acc)
                        for pos, acc in zip(src_at, accs)]

            accs = _block_loop(builder, ir.Constant(_I64, 0), ntaps, [ir.Constant(vb, None)] * count, tap)
            for j, v in enumerate(accs):
                pix = builder.add(first, ir.Constant(_I64, j))
                _store_vec(builder, v, dp, builder.add(at_, builder.mul(pix, ir.Constant(_I64, block))))

        _in_tiles(builder, n, BLOCK_TILE, pixels)
        return context.get_dummy_value()
    return codegen


def block_intrinsics(block: int = BLOCK) -> tuple:
    """(transpose_block_f32, transpose_block_to_f32, taps_block_f32) for blocks of `block` channels (a power of
    two); the module's are BLOCK's (tests build the other size too: both must move and sum the same way)."""
    @intrinsic
    def transpose_block_f32(typingctx, dst, at, pitch, src, start, src_pitch, rows, cols):
        ints = all(isinstance(v, types.Integer) for v in (at, pitch, start, src_pitch, rows, cols))
        if not (_is_f32(dst) and _is_f32(src) and ints):
            return None
        return types.void(dst, at, pitch, src, start, src_pitch, rows, cols), _transpose_block_codegen(False, block)

    @intrinsic
    def transpose_block_to_f32(typingctx, dst, at, where, w_at, src, start, src_pitch, rows, cols):
        ints = all(isinstance(v, types.Integer) for v in (at, w_at, start, src_pitch, rows, cols))
        if not (_is_f32(dst) and _is_i64(where) and _is_f32(src) and ints):
            return None
        return (types.void(dst, at, where, w_at, src, start, src_pitch, rows, cols),
                _transpose_block_codegen(True, block))

    @intrinsic
    def taps_block_f32(typingctx, dst, at, src, start, step, count, weights, w_at, offsets):
        ints = all(isinstance(v, types.Integer) for v in (at, start, step, count, w_at))
        if not (_is_f32(dst) and _is_f32(src) and ints and _is_f32(weights) and _is_i64(offsets)):
            return None
        return types.void(dst, at, src, start, step, count, weights, w_at, offsets), _taps_block_codegen(block)

    return transpose_block_f32, transpose_block_to_f32, taps_block_f32


# transpose_block_f32(dst, at, pitch, src, start, src_pitch, rows, cols): dst[at + j * pitch + i] = src[start + i *
# src_pitch + j] for i < rows and j < cols (both at most BLOCK): a BLOCK x BLOCK tile transposed in registers
# (nothing read or written outside those elements). The channel-blocked depthwise kernel's way from (pixel, BLOCK
# channels) vectors back to (channels, pixels) rows (conv_kernels.dw_blocks): 64 shuffles per 16 x 16 tile, where
# element-wise copies took a load and a store each.
# transpose_block_to_f32(dst, at, where, w_at, src, start, src_pitch, rows, cols): transpose_block_f32 with column
# j's vector stored at dst[at + where[w_at + j]] instead (each its own place): a plane's pixels, BLOCK in a row of
# the flat plane, into the rows of a zero-padded buffer.
# taps_block_f32(dst, at, src, start, step, count, weights, w_at, offsets): dst[at + B * p + l] = sum over t of
# weights[w_at + B * t + l] * src[start + step * p + offsets[t] + l] for p < count and l < B (B = BLOCK): `count`
# output pixels of B channels of a channel-blocked depthwise conv, each lane's taps summed in order from 0.0, each
# added by fma (tap_rows_f32's order and rounding: the same bits), BLOCK_TILE pixels side by side (one load of a
# tap's B weights feeds each of their fma chains).
transpose_block_f32, transpose_block_to_f32, taps_block_f32 = block_intrinsics()


SKINNY_ROWS = 8  # rows of x that skinny_f32 and gather_f32 take per call


# skinny_f32 / gather_f32's register tile: (rows per pass over k, columns per vector). AVX-512's 32 zmm hold
# 8 rows x 32 lanes of accumulators in 16 registers; on AVX2 the same tile needs 32 ymm of the 16 there are, and
# its spills ran it at 12 GFLOPS on Zen 3, where 4 rows x 16 lanes (8 ymm; two passes over k per call) ran at
# 55-69 GFLOPS. The tile changes no result: each output is its own fma chain in order of k.
# A third element: vectors per pass of a whole tile's rows (1 if absent). On AVX2 4 rows x 3 vectors of 8 lanes (12
# ymm accumulators; per step 4 broadcasts and 3 loads feed 12 fma, where 4 x 16 lanes fed 8 fma with 6): MobileNetV3's
# pointwise convs on 7x7 planes 43-49 GMAC/s against 22-28, on 14x14 planes 44-46 against 39-40 (Zen 3, 1 thread).
# On AVX-512 8 rows x 3 vectors of 16 lanes (24 zmm accumulators; per step 8 broadcasts and 3 loads feed 24 fma,
# where 8 x 2 vectors fed 16 with 10) since session 32. Hot, 1 thread, Xeon (rocketlake), pointwise convs with bias +
# Relu against 8 x 32: ResNet-50's 128->512 and 512->128 at 28x28, 256->1024 and 1024->256 at 14x14 0.79-0.94x the
# time; on 7x7 planes (512<->2048) 1.04-1.15x (a 49-pixel row is one 48-column pass and a masked vector). Whole
# forwards, alternating processes, two rounds, rlx / onnxruntime at 1 / 2 threads: ResNet-50 1.50-1.51 -> 1.41-1.45
# / 1.57-1.59 -> 1.49-1.53, YOLO-like (its direct convs take gather_f32) 1.44-1.46 -> 1.34-1.37 / 1.46-1.47 ->
# 1.39-1.42, EfficientNet-B0 1.31-1.43 -> 1.29-1.34 / 1.44-1.52 -> 1.41-1.45, MobileNetV3-small level (1.34-1.36 ->
# 1.35-1.38 / 1.47-1.50 -> 1.49-1.52).
FEW_ROWS_TILE = (8, 16, 3) if AVX512 else (4, 8, 3)
# the LSTM's and GRU's steps (recurrent_kernels: gather_panels_f32 over Rᵀ's column panels of PANEL_TILE's span)
# keep 8 x 32 on AVX-512: with 8 x 48 (384-column panels; an LSTM's 1024 columns in three) their 2-thread forwards
# ran 1.06-1.14x (LSTM) and 1.04x (GRU) the time
PANEL_TILE = (8, 32) if AVX512 else FEW_ROWS_TILE
FEW_ROWS_SPAN = math.prod(FEW_ROWS_TILE)  # columns of the kernels' column blocks (see below)
FEW_ROWS_UNIT = math.prod(FEW_ROWS_TILE[1:])  # columns of a pass over a whole tile's rows: split columns by these


def _few_rows_codegen(gathered: bool, tile: tuple[int, ...], epilogue: bool = False):
    """skinny_f32's code (gathered False: row i of the right operand at i*n) or gather_f32's (row i at
    offsets[i]): the arguments are (out, x, wt, [offsets,] rows, k, n, c0, c1). `tile`: (rows per pass over k,
    columns per vector[, vectors per pass of a whole tile's rows: `base`, 1 if absent]). With `epilogue`
    (skinny_epilogue_f32) five more: (bias, res, mode, has_bias, has_res), applied to each output vector before its
    store (_epilogue_store).

    A pass over k has one accumulator per row and column vector it computes: per_pass rows by `base` vectors, or
    fewer rows by more vectors (up to base * per_pass // rows of them), so a pass of few rows still has enough fma
    chains in flight, and no row is computed that is not wanted (rows short of a whole pass run as passes of
    half, a quarter, ... of per_pass: 7 rows on AVX-512 are 4 + 2 + 1). Before, every pass was per_pass rows by
    one vector, the missing rows computed and dropped: an LSTM step's 1 x 256 @ 256 x 1024 took as long as
    its 8 x 256 (25 us; now 9.6), 4 rows 25 us (now 17.7). Columns go in blocks of per_pass * base vectors
    (FEW_ROWS_SPAN columns), each block's passes one after the other (the block's slice of wt stays in cache),
    then the columns left `base` vectors at a time (tile's third element), then one vector at a time, the last as
    one masked vector."""
    per_pass, lanes, base = (*tile, 1)[:3]
    vf = ir.VectorType(_F32, lanes)
    span = per_pass * lanes * base  # columns of a block

    def codegen(context, builder, sig, args):
        op, xp, wp = (_data(context, builder, sig.args[i], args[i]).data for i in range(3))
        offs = _data(context, builder, sig.args[3], args[3]).data if gathered else None
        rest = args[4:] if gathered else args[3:]
        if epilogue:
            bias_p, res_p = (_data(context, builder, sig.args[i], args[i]).data for i in (8, 9))
            mode_, has_bias_, has_res_ = (_truth(builder, sig.args[i], args[i]) for i in (10, 11, 12))
            relu_ = builder.icmp_signed("==", builder.sext(args[10], _I64) if args[10].type.width < 64 else args[10],
                                        ir.Constant(_I64, 2))
            rest = rest[:5]
        rows_, k_, n_, c0_, c1_ = (builder.sext(v, _I64) if v.type.width < 64 else v for v in rest)
        zero = ir.Constant(_I64, 0)

        def const(v):
            return ir.Constant(_I64, v)

        def one_pass(first, count, column, vectors, mask=None):
            """Rows first .. first + count - 1 by `vectors` vectors of columns from `column` (mask: one vector,
            its lanes only; nothing outside them read or written), each output its fma chain over k."""
            xrow = [builder.mul(builder.add(first, const(j)), k_) for j in range(count)]
            cols = [builder.add(column, const(v * lanes)) for v in range(vectors)]

            def step(i, accs):
                row = builder.load(builder.gep(offs, [i])) if gathered else builder.mul(i, n_)
                ws = [_load_vec(builder, wp, builder.add(row, c), vf) if mask is None
                      else _masked(builder, "load", vf, builder.gep(wp, [builder.add(row, c)]), mask) for c in cols]
                xs = [_splat(builder, builder.load(builder.gep(xp, [builder.add(xr, i)])), vf) for xr in xrow]
                return [_fma(builder, xv, w, accs[j * vectors + v]) for j, xv in enumerate(xs)
                        for v, w in enumerate(ws)]

            accs = _block_loop(builder, zero, k_, [ir.Constant(vf, None)] * (count * vectors), step)
            places = [(builder.add(builder.mul(builder.add(first, const(j)), n_), c), j)
                      for j in range(count) for c in cols]

            def store(values):
                for (at, _), value in zip(places, values):
                    if mask is None:
                        _store_vec(builder, value, op, at)
                    else:
                        _masked(builder, "store", vf, builder.gep(op, [at]), mask, value)

            if not epilogue:
                store(accs)
                return
            with builder.if_else(mode_) as (fused, plain):
                with fused:
                    _epilogue_store(builder, first, places, accs, bias_p, res_p, has_bias_, has_res_, relu_, mask,
                                    store)
                with plain:
                    store(accs)

        def passes(column, width: int | None, mask=None):
            """Every row's outputs of a block of span columns from `column` (width None), or of `width` vectors."""
            def run(first, count):
                if width is not None:
                    one_pass(first, count, column, width, mask)
                    return
                vectors = base * max(v for v in range(1, per_pass // count + 1) if per_pass % v == 0)
                _block_loop(builder, zero, const(span // (vectors * lanes)), [], lambda b, _: one_pass(
                    first, count, builder.add(column, builder.mul(b, const(vectors * lanes))), vectors) or [])

            # one vector a pass: as many rows as a tile holds accumulators (on AVX2 8 rows x 1 vector, not 4: a
            # 49-pixel conv's last, masked vector took a third of its time as passes of 4 fma chains)
            group = per_pass if width is None or width > 1 else min(SKINNY_ROWS, per_pass * base)
            for first in range(0, SKINNY_ROWS, group):
                here = builder.sub(rows_, const(first))  # rows from `first` on
                with builder.if_then(builder.icmp_signed(">", here, zero)):
                    with builder.if_else(builder.icmp_signed(">=", here, const(group))) as (whole, part):
                        with whole:
                            run(const(first), group)
                        with part:  # here < group: its bits, highest first
                            size = 1 << ((group - 1).bit_length() - 1)
                            while size:
                                with builder.if_then(builder.icmp_signed("!=", builder.and_(here, const(size)), zero)):
                                    run(builder.add(const(first), builder.and_(here, const(-2 * size))), size)
                                size //= 2

        done = c0_
        for width in sorted({span // lanes, base, 1}, reverse=True):  # blocks, then base vectors, then single ones
            count = builder.sdiv(builder.sub(c1_, done), const(width * lanes))
            _block_loop(builder, zero, count, [], lambda b, _, at=done, w=width: passes(
                builder.add(at, builder.mul(b, const(w * lanes))), None if w == span // lanes else w) or [])
            done = builder.add(done, builder.mul(count, const(width * lanes)))
        # then the last columns as one masked vector (one column at a time, a 49-pixel conv ran at 1/5 the speed)
        left = builder.sub(c1_, done)
        with builder.if_then(builder.icmp_signed(">", left, zero)):
            passes(done, 1, _first_lanes(builder, left, lanes))
        return context.get_dummy_value()
    return codegen


def _truth(builder, ty, value):
    """An integer or boolean argument as an i1: value != 0."""
    if isinstance(ty, types.Boolean):
        return builder.trunc(value, ir.IntType(1)) if value.type.width != 1 else value
    return builder.icmp_signed("!=", value, ir.Constant(value.type, 0))


def _epilogue_store(builder, first, places, accs, bias, res, has_bias, has_res, relu, mask, store):
    """skinny_epilogue_f32's stores: each output vector acc at flat `at` of row first + j ((at, j) in places) as
    v = acc + bias[first + j] (-0.0 without has_bias: x + -0.0 is x), then (has_res) v + res[at], then (relu)
    0.0 where v <= 0 else v + 0.0: conv_kernels.bias_act_rows' roundings in the same order, so the same bits."""
    vf = accs[0].type
    rows = sorted({j for _, j in places})
    bvs = {}
    for j in rows:  # the row's bias, read only if there is one (a bias-less conv's array is a 1-element stand-in)
        pre = builder.block
        with builder.if_then(has_bias):
            loaded = builder.load(builder.gep(bias, [builder.add(first, ir.Constant(_I64, j))]))
            got = builder.block
        phi = builder.phi(_F32)
        phi.add_incoming(ir.Constant(_F32, -0.0), pre)
        phi.add_incoming(loaded, got)
        bvs[j] = _splat(builder, phi, vf)
    biased = [builder.fadd(acc, bvs[j]) for acc, (_, j) in zip(accs, places)]

    def finish(values):
        zero = ir.Constant(vf, None)
        store([builder.select(relu, builder.select(builder.fcmp_ordered("<=", v, zero), zero, builder.fadd(v, zero)), v)
               for v in values])

    with builder.if_else(has_res) as (added, alone):
        with added:
            finish([builder.fadd(v, _load_vec(builder, res, at, vf) if mask is None
                                 else _masked(builder, "load", vf, builder.gep(res, [at]), mask))
                    for v, (at, _) in zip(biased, places)])
        with alone:
            finish(biased)


def few_rows_intrinsics(tile: tuple[int, ...] = FEW_ROWS_TILE) -> tuple:
    """(skinny_f32, gather_f32, skinny_epilogue_f32) built with a register tile (rows per pass over k, columns per
    vector[, vectors per pass]); the module's are FEW_ROWS_TILE's (tests build the others: every tile must give the
    same bits)."""
    @intrinsic
    def skinny_f32(typingctx, out, x, wt, rows, k, n, c0, c1):
        ints = all(isinstance(v, types.Integer) for v in (rows, k, n, c0, c1))
        if not (_is_f32(out) and _is_f32(x) and _is_f32(wt) and ints):
            return None
        return types.void(out, x, wt, rows, k, n, c0, c1), _few_rows_codegen(False, tile)

    @intrinsic
    def gather_f32(typingctx, out, x, src, offsets, rows, k, n, c0, c1):
        ints = all(isinstance(v, types.Integer) for v in (rows, k, n, c0, c1))
        if not (_is_f32(out) and _is_f32(x) and _is_f32(src) and _is_i64(offsets) and ints):
            return None
        return types.void(out, x, src, offsets, rows, k, n, c0, c1), _few_rows_codegen(True, tile)

    @intrinsic
    def skinny_epilogue_f32(typingctx, out, x, wt, rows, k, n, c0, c1, bias, res, mode, has_bias, has_res):
        ints = all(isinstance(v, types.Integer) for v in (rows, k, n, c0, c1, mode))
        flags = all(isinstance(v, (types.Integer, types.Boolean)) for v in (has_bias, has_res))
        if not (_is_f32(out) and _is_f32(x) and _is_f32(wt) and _is_f32(bias) and _is_f32(res) and ints and flags):
            return None
        return (types.void(out, x, wt, rows, k, n, c0, c1, bias, res, mode, has_bias, has_res),
                _few_rows_codegen(False, tile, epilogue=True))

    return skinny_f32, gather_f32, skinny_epilogue_f32


# skinny_f32(out, x, wt, rows, k, n, c0, c1): out[j*n + c] = sum over i < k of x[j*k + i] * wt[i*n + c] for j < rows
# (at most SKINNY_ROWS) and c in [c0, c1): a GEMM with few rows, x (rows, k) times wt (k, n), all flat C-order
# float32. Each output is its products added by fma in order of i from 0.0 (the same bits on every CPU).
# FEW_ROWS_TILE at a time: one load of wt's row-piece feeds a multiply-add into each row's accumulator (OpenBLAS
# packs the whole of wt on every call, which made an LSTM step's 8x256 @ 256x1024 cost ~150 us); the last columns
# as one masked vector.
# gather_f32(out, x, src, offsets, rows, k, n, c0, c1): skinny_f32 with the right operand's row i at
# src[offsets[i]:]: out[j*n + c] = sum over i < k of x[j*k + i] * src[offsets[i] + c]. A direct conv's inner loop
# (conv_direct.py): the rows are the shifted views of the padded input's channels, one per (channel, kernel
# offset), so no im2col matrix is written.
# skinny_epilogue_f32(out, x, wt, rows, k, n, c0, c1, bias, res, mode, has_bias, has_res): skinny_f32 with a
# conv's epilogue applied to each output vector before it is stored (mode 0: none; 1: the bias (bias[j] of row j,
# has_bias), then the residual (res, indexed as out, has_res); 2: those, then Relu), where a pass over each block
# after it cost a pointwise conv 13-25% of its time with a bias and Relu, 22-100% with a residual (Zen 3, 1 thread,
# 16-128 input channels). The other activations run after, as a pass over the block.
skinny_f32, gather_f32, skinny_epilogue_f32 = few_rows_intrinsics()
gather_panels_f32 = few_rows_intrinsics(PANEL_TILE)[1] if PANEL_TILE != FEW_ROWS_TILE else gather_f32


CHANNEL_BLOCK = 32  # output channels channels_f32 computes per call: 4 vectors of 8 lanes
_CHANNEL_TILES = {4: 3, 2: 6, 1: 12}  # vectors of channels -> grid columns side by side (12 accumulators each)


def _channels_codegen(context, builder, sig, args):
    """channels_f32's code: for each tile of grid columns, the accumulators of its columns x vectors start at 0.0
    (first) or as stored, take one fma per step, and are stored back; per step one load of each vector of weights
    feeds every column's fma, and one broadcast of each column's input feeds every vector's."""
    vf = ir.VectorType(_F32, 8)
    op, sp, offp, wp = (_data(context, builder, sig.args[i], args[i]).data for i in (0, 2, 4, 7))
    at_, start_, i0_, i1_, wat_, cols_, first_, vecs_ = (builder.sext(args[i], _I64) if args[i].type.width < 64
                                                         else args[i] for i in (1, 3, 5, 6, 8, 9, 10, 11))

    def const(v):
        return ir.Constant(_I64, v)

    def tiles(vectors: int):
        def columns(c0, count):
            outs = [builder.add(at_, builder.mul(builder.add(c0, const(p)), const(CHANNEL_BLOCK)))
                    for p in range(count)]
            fresh = builder.icmp_signed("!=", first_, const(0))
            init = [builder.select(fresh, ir.Constant(vf, None),
                                   _load_vec(builder, op, builder.add(o, const(8 * v)), vf))
                    for o in outs for v in range(vectors)]
            base = builder.add(start_, c0)

            def step(i, accs):
                at = builder.add(base, builder.load(builder.gep(offp, [i])))
                xs = [_splat(builder, builder.load(builder.gep(sp, [builder.add(at, const(p))])), vf)
                      for p in range(count)]
                row = builder.add(wat_, builder.mul(i, const(CHANNEL_BLOCK)))
                new = list(accs)
                for v in range(vectors):
                    w = _load_vec(builder, wp, builder.add(row, const(8 * v)), vf)
                    for p, x in enumerate(xs):
                        new[p * vectors + v] = _fma(builder, x, w, accs[p * vectors + v])
                return new

            accs = _block_loop(builder, i0_, i1_, init, step)
            for p, o in enumerate(outs):
                for v in range(vectors):
                    _store_vec(builder, accs[p * vectors + v], op, builder.add(o, const(8 * v)))
        _in_tiles(builder, cols_, _CHANNEL_TILES[vectors], columns)

    with builder.if_else(builder.icmp_signed(">=", vecs_, const(3))) as (four, fewer):
        with four:
            tiles(4)
        with fewer:
            with builder.if_else(builder.icmp_signed("==", vecs_, const(2))) as (two, one):
                with two:
                    tiles(2)
                with one:
                    tiles(1)
    return context.get_dummy_value()


@intrinsic
def channels_f32(typingctx, out, at, src, start, offsets, i0, i1, w, w_at, cols, first, vectors):
    ints = all(isinstance(v, types.Integer) for v in (at, start, i0, i1, w_at, cols, vectors))
    if not (_is_f32(out) and _is_f32(src) and _is_i64(offsets) and _is_f32(w) and ints
            and isinstance(first, (types.Integer, types.Boolean))):
        return None
    return types.void(out, at, src, start, offsets, i0, i1, w, w_at, cols, first, vectors), _channels_codegen


# channels_f32(out, at, src, start, offsets, i0, i1, w, w_at, cols, first, vectors): for c < cols and l < 8 * vectors
# (vectors 1, 2 or 4), out[at + CHANNEL_BLOCK * c + l] = (0.0 if first else itself) + the products src[start +
# offsets[i] + c] * w[w_at + CHANNEL_BLOCK * i + l] for i from i0 to i1 - 1, each added by fma in that order. A
# direct conv's inner loop with the output channels in the vector lanes (conv_kernels.channel_rows on AVX2): w holds a
# block of 32 output channels' weights, step i's 32 side by side; src the input's stride phases, step i (a channel
# and kernel offset) reading the view at offsets[i]. Per step each vector of weights is loaded once and feeds a
# multiply-add per grid column of the tile (3 columns x 4 vectors: 12 ymm accumulators, 7 loads per 12 fma), where
# gather_f32's AVX2 tile (4 channels x 16 columns: 8 accumulators, 6 loads per 8 fma) ran at ~30 GMAC/s on Zen 3
# and this one at ~47.


def _while(builder, cond, body):
    """while cond(): body(): cond and body build IR at the loop's head and in its body."""
    head = builder.append_basic_block("while")
    loop = builder.append_basic_block("while_body")
    done = builder.append_basic_block("while_done")
    builder.branch(head)
    builder.position_at_end(head)
    builder.cbranch(cond(), loop, done)
    builder.position_at_end(loop)
    body()
    builder.branch(head)
    builder.position_at_end(done)


def _masked(builder, op: str, vty, ptr, mask, value=None):
    """llvm.masked.load / llvm.masked.store of vty at ptr: lanes whose mask bit is clear are neither read nor
    written (a masked-off lane past the end of a buffer does not fault); a load gives `value` there (0.0 if None)."""
    bits = ir.VectorType(ir.IntType(1), vty.count)
    name = f"llvm.masked.{op}.v{vty.count}f32.p0"
    if op == "load":
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [ptr.type, _I32, bits, vty]), name)
        return builder.call(fn, [ptr, ir.Constant(_I32, 4), mask, value or ir.Constant(vty, None)])
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [vty, ptr.type, _I32, bits]),
                                        name)
    return builder.call(fn, [value, ptr, ir.Constant(_I32, 4), mask])


def _first_lanes(builder, count, lanes):
    """A mask of `lanes` bits, set in the first `count` (an i64, at least 0). On AVX-512 built as an integer,
    (1 << count) - 1, moved into a mask register: the compare of a lane index vector took 4-12 vector compares
    and mask merges (a 64-lane mask, step 2 of copy_intrinsic), most of a short row's fold."""
    if AVX512 and lanes in (16, 32, 64):
        ity = ir.IntType(lanes)
        n = builder.trunc(count, ity) if lanes < 64 else count
        full = builder.icmp_unsigned(">=", count, ir.Constant(_I64, lanes))
        bits = builder.select(full, ir.Constant(ity, -1), builder.sub(builder.shl(ir.Constant(ity, 1), n),
                                                                       ir.Constant(ity, 1)))
        return builder.bitcast(bits, ir.VectorType(ir.IntType(1), lanes))
    # lane indices as i32 (the count clamped to `lanes` first): an i64 compare of 32 lanes took 8 AVX2 compares and
    # the packs down to the load's 4 masks, part of a short row's sum (sum_f32 on 49 values: 20.6 -> 16.7 ns)
    c32 = builder.trunc(builder.select(builder.icmp_unsigned("<", count, ir.Constant(_I64, lanes)), count,
                                       ir.Constant(_I64, lanes)), _I32)
    vi = ir.VectorType(_I32, lanes)
    return builder.icmp_signed("<", ir.Constant(vi, list(range(lanes))), _splat(builder, c32, vi))


def _np_maximum(builder, old, new):
    """np.maximum(old, new) of float32 values or vectors: a NaN in `old` stays, else a NaN in `new` wins; of
    equal values (-0.0 and 0.0) `new` (numpy's own float32 maximum on x86, which MaxPool's fold follows). As x86's
    maxps (old > new ? old : new: `new` on a tie or any NaN), then `old` where it is a NaN: two compares and two
    selects. (Spelled as one select on the and/or of three compares, AVX2's code ran a 3x3 MaxPool 4x slower.)"""
    larger = builder.select(builder.fcmp_ordered(">", old, new), old, new)
    return _nan_or(builder, old, larger)


def _nan_or(builder, x, value):
    """x where x is a NaN, else value (float32 values or vectors), the NaN side computed as x + x (the same NaN). A
    select one of whose sides is x itself, where x was loaded from the address the result is stored to (a fold
    into its destination, a kernel in place), becomes a masked store of the other side in LLVM's x86 back end: on
    AVX2 vmaskmovps, slow on AMD's cores (a 3x3/2 MaxPool of 64x112x112 at 1 thread on Zen 3: 0.86-1.37 ms, 0.48-0.84
    ms with the sum)."""
    return builder.select(builder.fcmp_unordered("uno", x, x), builder.fadd(x, x), value)


def copy_intrinsic(masked_tail: bool, combine=None):
    """copy_f32 ending each row with one masked vector (masked_tail; AVX-512's masked moves cost what plain ones
    do) or with vectors of 8 and then single elements (AVX2's masked stores are slow: a 56-float row took 21 ns
    with a masked tail on Zen 3, 2.7 ns for a 32-float row without one). With `combine` (builder, old, new) ->
    value, each element stored is combine(dst's element, the source's) instead of the source's (max_fold_f32)."""
    def put(builder, value, base, k, mask=None):
        """Store value (a vector or scalar) at element k of base, combined with what is there (only mask's
        lanes)."""
        if combine is not None:
            if mask is not None:
                old = _masked(builder, "load", value.type, builder.gep(base, [k]), mask)
            else:
                old = _load_vec(builder, base, k, value.type)
            value = combine(builder, old, value)
        if mask is not None:
            _masked(builder, "store", value.type, builder.gep(base, [k]), mask, value)
        else:
            _store_vec(builder, value, base, k)

    @intrinsic
    def copy_f32(typingctx, dst, at, src, start, count, step):
        ints = all(isinstance(v, types.Integer) for v in (at, start, count, step))
        if not (_is_f32(dst) and _is_f32(src) and ints):
            return None

        def codegen(context, builder, sig, args):
            dp = builder.gep(_data(context, builder, sig.args[0], args[0]).data, [builder.sext(args[1], _I64)])
            sp = builder.gep(_data(context, builder, sig.args[2], args[2]).data, [builder.sext(args[3], _I64)])
            n, stp = (builder.sext(v, _I64) if v.type.width < 64 else v for v in (args[4], args[5]))
            i = cgutils.alloca_once_value(builder, ir.Constant(_I64, 0))
            one, two = ir.Constant(_I64, 1), ir.Constant(_I64, 2)

            def vectors(dense: bool, width: int):
                """whole vectors of `width` while they fit (step 2: while a further element is still needed)"""
                vty, wide = ir.VectorType(_F32, width), ir.VectorType(_F32, 2 * width)
                evens = ir.Constant(ir.VectorType(_I32, width), list(range(0, 2 * width, 2)))
                lanes = ir.Constant(_I64, width)

                def body():
                    k = builder.load(i)
                    if dense:
                        v = _load_vec(builder, sp, k, vty)
                    else:
                        v = _load_vec(builder, sp, builder.mul(k, two), wide)
                        v = builder.shuffle_vector(v, v, evens)
                    put(builder, v, dp, k)
                    builder.store(builder.add(k, lanes), i)

                _while(builder, lambda: builder.icmp_signed(">=" if dense else ">", builder.sub(n, builder.load(i)),
                                                            lanes), body)

            def masked_rest(dense: bool):
                k = builder.load(i)
                left = builder.sub(n, k)
                with builder.if_then(builder.icmp_signed(">", left, ir.Constant(_I64, 0))):
                    if dense:
                        v = _masked(builder, "load", _VF, builder.gep(sp, [k]), _first_lanes(builder, left, LANES))
                    else:  # elements 0, 2, ..., 2 * (left - 1) of the source
                        need = builder.sub(builder.mul(left, two), one)
                        v = _masked(builder, "load", ir.VectorType(_F32, 2 * LANES),
                                    builder.gep(sp, [builder.mul(k, two)]), _first_lanes(builder, need, 2 * LANES))
                        v = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, LANES),
                                                                     list(range(0, 2 * LANES, 2))))
                    put(builder, v, dp, k, _first_lanes(builder, left, LANES))
                    builder.store(n, i)

            def last_vector(dense: bool):
                """the last 1-7 elements, if there are 8 in all, as the vector of the last 8: those before them done
                again, which changes nothing (a copy, or a fold, rewrites what is there already). A step-2 load
                of 16 lanes is masked to the 15 read."""
                k = builder.sub(n, ir.Constant(_I64, 8))
                left = builder.sub(n, builder.load(i))
                more = builder.and_(builder.icmp_signed(">", left, ir.Constant(_I64, 0)),
                                    builder.icmp_signed(">=", k, ir.Constant(_I64, 0)))
                with builder.if_then(more):
                    if dense:
                        v = _load_vec(builder, sp, k, ir.VectorType(_F32, 8))
                    else:
                        wide = ir.VectorType(_F32, 16)
                        v = _masked(builder, "load", wide, builder.gep(sp, [builder.mul(k, two)]),
                                    ir.Constant(ir.VectorType(ir.IntType(1), 16), [1] * 15 + [0]))
                        v = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, 8), list(range(0, 16, 2))))
                    put(builder, v, dp, k)
                    builder.store(n, i)

            def elements():
                def body():
                    k = builder.load(i)
                    put(builder, builder.load(builder.gep(sp, [builder.mul(k, stp)])), dp, k)
                    builder.store(builder.add(k, one), i)
                _while(builder, lambda: builder.icmp_signed("<", builder.load(i), n), body)

            def copy(dense: bool):
                vectors(dense, LANES)
                if masked_tail:
                    masked_rest(dense)
                else:
                    vectors(dense, 8)
                    last_vector(dense)
                    elements()

            with builder.if_else(builder.icmp_signed("==", stp, one)) as (unit, other):
                with unit:
                    copy(True)
                with other:
                    with builder.if_else(builder.icmp_signed("==", stp, two)) as (pair, rest):
                        with pair:
                            copy(False)
                        with rest:
                            elements()
            return context.get_dummy_value()

        return types.void(dst, at, src, start, count, step), codegen

    return copy_f32


# copy_f32(dst, at, src, start, count, step): dst[at + i] = src[start + i * step] for i < count (dst and src not
# overlapping): whole vectors of 32, then the rest (copy_intrinsic); step 2 loads twice the lanes and keeps the
# even ones. Reads and writes nothing outside those elements (a full vector of step 2 is loaded only while a
# further element is still needed, so its last lane is one; masked loads and stores leave other lanes alone). The
# tap convs' and im2col's row copies (their rows are 7-112 elements: numba's own loop over a slice copy ran at
# about 0.7 ns an element); other steps one element at a time.
copy_f32 = copy_intrinsic(AVX512)
# max_fold_f32(dst, at, src, start, count, step): dst[at + i] = np.maximum(dst[at + i], src[start + i * step]), by
# copy_f32's vectors and masks (a select on three compares per vector: numba's own loop over the same steps stayed
# scalar, ~1.8 ns an element). MaxPool's fold of a window row into an output row.
max_fold_f32 = copy_intrinsic(AVX512, _np_maximum)


SUM_CHAINS = 4  # 32-lane accumulators sum_f32 keeps (consecutive vectors go to each in turn)


@intrinsic
def sum_f32(typingctx, src, start, count):
    """The sum of src[start:start + count] (float32) in a fixed order: vectors of 32 taken in turn by SUM_CHAINS
    accumulators from -0.0, the last partial vector masked (its missing lanes add -0.0; nothing past the end is
    read), then the accumulators and lanes by a fixed halving tree: the same bits on every CPU, an error like a
    pairwise sum's (each element passes through about count / 128 additions in its lane, then 7 in the tree)."""
    if not (_is_f32(src) and isinstance(start, types.Integer) and isinstance(count, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        sp = builder.gep(_data(context, builder, sig.args[0], args[0]).data, [builder.sext(args[1], _I64)])
        n = builder.sext(args[2], _I64) if args[2].type.width < 64 else args[2]
        zero = _const(_VF, -0.0)  # IEEE's additive identity (-0.0 + x is x for every x, -0.0 included)
        blocks = builder.sdiv(n, ir.Constant(_I64, SUM_CHAINS * LANES))

        def body(b, accs):
            return [builder.fadd(acc, _load_vec(builder, sp, _offset(builder, b, SUM_CHAINS * LANES, k * LANES), _VF))
                    for k, acc in enumerate(accs)]

        accs = _block_loop(builder, ir.Constant(_I64, 0), blocks, [zero] * SUM_CHAINS, body)
        done = builder.mul(blocks, ir.Constant(_I64, SUM_CHAINS * LANES))
        accs = list(accs)
        for k in range(SUM_CHAINS):  # the rest, a vector (the last one masked) into each accumulator in turn
            at = builder.add(done, ir.Constant(_I64, k * LANES))
            left = builder.sub(n, at)
            before, acc = builder.block, accs[k]
            with builder.if_then(builder.icmp_signed(">", left, ir.Constant(_I64, 0))):
                # a whole vector unmasked (a masked load's mask cost more than its 32 additions); the last partial
                # one masked to the `left` lanes there are
                with builder.if_else(builder.icmp_signed(">=", left, ir.Constant(_I64, LANES))) as (whole, part):
                    with whole:
                        v_whole, from_whole = _load_vec(builder, sp, at, _VF), builder.block
                    with part:
                        mask = _first_lanes(builder, left, LANES)
                        v_part = _masked(builder, "load", _VF, builder.gep(sp, [at]), mask, zero)
                        from_part = builder.block
                v = builder.phi(_VF)
                v.add_incoming(v_whole, from_whole)
                v.add_incoming(v_part, from_part)
                added, from_added = builder.fadd(acc, v), builder.block
            accs[k] = builder.phi(_VF)
            accs[k].add_incoming(acc, before)
            accs[k].add_incoming(added, from_added)
        return _lane_sum(builder, _tree_sum(builder, accs))

    return types.float32(src, start, count), codegen


def _select_max(builder, old, new):
    """new where new > old (an ordered compare: a NaN in new never wins), else old; of scalars or vectors."""
    return builder.select(builder.fcmp_ordered(">", new, old), new, old)


def _lane_max(builder, v):
    """_select_max over a vector's lanes by the fixed halving tree."""
    return _lane_tree(builder, v, lambda lo, hi: _select_max(builder, lo, hi))


@intrinsic
def max_f32(typingctx, src, start, count):
    """The largest non-NaN value of src[start:start + count] (float32), -inf if there is none: vectors of LANES
    into one accumulator, the last partial vector masked (its missing lanes read -inf; nothing past the end is
    read), then the lanes by a halving tree. (Of -0.0 and 0.0 the one met first in that order.)"""
    if not (_is_f32(src) and isinstance(start, types.Integer) and isinstance(count, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        sp = builder.gep(_data(context, builder, sig.args[0], args[0]).data, [builder.sext(args[1], _I64)])
        n = builder.sext(args[2], _I64) if args[2].type.width < 64 else args[2]
        low = _const(_VF, float("-inf"))
        whole = builder.sdiv(n, ir.Constant(_I64, LANES))

        def body(b, state):
            return [_select_max(builder, state[0], _load_vec(builder, sp, _offset(builder, b, LANES), _VF))]

        (acc,) = _block_loop(builder, ir.Constant(_I64, 0), whole, [low], body)
        cell = cgutils.alloca_once_value(builder, acc)
        done = builder.mul(whole, ir.Constant(_I64, LANES))
        left = builder.sub(n, done)
        with builder.if_then(builder.icmp_signed(">", left, ir.Constant(_I64, 0))):
            v = _masked(builder, "load", _VF, builder.gep(sp, [done]), _first_lanes(builder, left, LANES), low)
            builder.store(_select_max(builder, builder.load(cell), v), cell)
        return _lane_max(builder, builder.load(cell))

    return types.float32(src, start, count), codegen

# ---------------------------------------------------------------- the float32 sigmoid and SiLU (sigmoid_f32)
# The float32 sigmoid and SiLU as explicit vector IR (numba intrinsic): the CPU's Sigmoid and Silu ops, the conv
# epilogues' and the LSTM gates'. One fixed sequence of IEEE operations, so every CPU gives the same bits:
#   n = -|x| (NaN: -EXP_ABS_MAX), k = rint(n / ln 2) (an integer <= 0, ties to even),
#   s = fma(k, -LN2_LO, fma(k, -LN2_HI, n))  (Cody and Waite: n - k ln 2 with ln 2 split in two, |s| <= ln2/2),
#   P(s) by Horner's rule in fma from Cephes expf's degree-5 coefficients, e = fma(P, s*s, s) + 1 (e^s),
#   t = e * 2^k rounded once (exp(-|x|): subnormal results rounded once, as IEEE's scaling does),
#   sigmoid = (x >= 0 ? 1 : t) / (1 + t) (no overflow, subnormal results kept); NaN stays NaN; SiLU = x * that.
# Every multiply-add is llvm.fma, exact on every CPU (one rounding; a CPU without FMA computes it in software). The
# scaling by 2^k is vscalefps with AVX-512 (one instruction, rounded once) and without it k added to e's exponent
# bits when every lane's k >= SCALE_MIN (the product is normal: exact), else two normal powers of two (e * 2^k1 is
# exact for k1 >= -125, the second factor rounds once): the same correctly rounded product. Checked
# over every third float32 in [-110, 110] (test_speed_kernels, slow): at most 2 ulp from the correctly rounded
# sigmoid. Before (separate multiplies and adds, an Estrin form, the integer scaling everywhere) the same steps took
# ~40 vector operations per vector and 0.62-0.69 ns a value on AVX-512 (Emerald Rapids); these take ~26.
EXP_ABS_MAX = np.float32(104.0)  # exp(-104) rounds to 0 in float32 (below half the smallest subnormal)
EXP_INV_LN2 = np.float32(1.0 / math.log(2.0))
EXP_LN2_HI = np.float32(0.693359375)  # 10 significant bits: k * EXP_LN2_HI is exact for k < 2^14
EXP_LN2_LO = np.float32(-2.12194440e-4)
EXP_TERMS = np.array([1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                      5.0000001201e-1], np.float32)  # P(s)'s coefficients, highest power first (Cephes expf)
SCALE_MIN = -125  # the smallest power of two the two-factor scaling applies first (2^-125 * e stays normal)


# sigmoid_f32's lanes per vector: one AVX-512 register, two AVX2 ones (two independent chains of its ~26 steps per
# vector: on Zen 3, hot, in one process, 16 lanes took 0.79-0.86x the time of 8 from 196 values a call on, Sigmoid
# and SiLU alike (0.64-0.80 ns a value against 0.74-0.99), 1.06-1.12x on 49-value calls (a 7x7 plane's rows); 32
# lanes were faster still on long runs (0.57-0.79) but slower on short ones (1.2-1.3x at 49 values). The same bits.
SIGMOID_LANES = 16


def _unary(builder, name: str, v):
    """A one-argument LLVM float intrinsic (llvm.fabs, llvm.rint) on vector v."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type, [v.type]),
                                        f"{name}.v{v.type.count}f32")
    return builder.call(fn, [v])


def _times_power_of_two(builder, e, k, scalef: bool):
    """e * 2^k rounded once, for a vector e in [0.5, 2) and integer-valued float k in [-150, 0]: AVX-512's
    vscalefps (scalef), else, when every lane's k is at least SCALE_MIN (all but arguments below about -86.6), k
    added to e's exponent bits (exact: the product is normal), and two normal powers of two built from their IEEE
    bits otherwise (no float->int cast sees anything but k). The exponent add took 3 vector operations of the 8
    for two factors: the sigmoid and SiLU 0.88-0.92x the time on Zen 3 (AVX2), the same bits."""
    vf, n = e.type, e.type.count
    if scalef:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf, ir.IntType(n), _I32]),
                                            f"llvm.x86.avx512.mask.scalef.ps.{32 * n}")
        return builder.call(fn, [e, k, ir.Constant(vf, None), ir.Constant(ir.IntType(n), -1),
                                 ir.Constant(_I32, 4)])  # all lanes, MXCSR's rounding (to nearest)
    vi = ir.VectorType(_I32, n)
    ki = builder.fptosi(k, vi)
    lowest = _const(vi, SCALE_MIN)
    below = builder.bitcast(builder.icmp_signed("<", ki, lowest), ir.IntType(n))
    with builder.if_else(builder.icmp_unsigned("!=", below, ir.Constant(ir.IntType(n), 0)), likely=False) as (
            two, one):
        with two:  # a lane's product may be subnormal: e * 2^k1 exact, then * 2^(k - k1) rounded once
            k1 = builder.select(builder.icmp_signed(">", ki, lowest), ki, lowest)
            f1 = builder.bitcast(builder.shl(builder.add(k1, _const(vi, 127)), _const(vi, 23)), vf)
            f2 = builder.bitcast(builder.shl(builder.add(builder.sub(ki, k1), _const(vi, 127)), _const(vi, 23)), vf)
            scaled_two, from_two = builder.fmul(builder.fmul(e, f1), f2), builder.block
        with one:
            added = builder.add(builder.bitcast(e, vi), builder.shl(ki, _const(vi, 23)))
            scaled_one, from_one = builder.bitcast(added, vf), builder.block
    scaled = builder.phi(vf)
    scaled.add_incoming(scaled_two, from_two)
    scaled.add_incoming(scaled_one, from_one)
    return scaled


def _exp_neg_abs(builder, x, scalef: bool):
    """exp(-|x|) on a vector by the steps above (NaN gives exp(-EXP_ABS_MAX) = 0)."""
    vf = x.type
    c = lambda v: _const(vf, v)  # noqa: E731
    n = builder.fneg(_unary(builder, "llvm.fabs", x))
    n = builder.select(builder.fcmp_ordered(">", n, c(-float(EXP_ABS_MAX))), n, c(-float(EXP_ABS_MAX)))
    k = _unary(builder, "llvm.rint", builder.fmul(n, c(float(EXP_INV_LN2))))  # in [-150, 0]
    s = _fma(builder, k, c(-float(EXP_LN2_LO)), _fma(builder, k, c(-float(EXP_LN2_HI)), n))
    terms = [c(float(t)) for t in EXP_TERMS]
    p = terms[0]
    for t in terms[1:]:
        p = _fma(builder, p, s, t)
    e = builder.fadd(_fma(builder, p, builder.fmul(s, s), s), c(1.0))
    return _times_power_of_two(builder, e, k, scalef)


def _sigmoid_vec(builder, x, silu: bool):
    """sigmoid(x) = (1 if x >= 0 else t) / (1 + t) with t = exp(-|x|), or x * sigmoid(x) (silu), on a vector; NaN
    stays NaN."""
    one = _const(x.type, 1.0)
    t = _exp_neg_abs(builder, x, AVX512 and x.type.count == 16)
    r = builder.fdiv(builder.select(builder.fcmp_ordered(">=", x, _const(x.type, 0.0)), one, t), builder.fadd(one, t))
    r = _nan_or(builder, x, r)  # in place with no bias, x is the vector loaded from where r is stored
    return builder.fmul(x, r) if silu else r


def _map_vectors(builder, dp, sp, n, fn):
    """dp[i] = fn(sp[i]) for i < n (float32 pointers, n an i64), fn on vectors of SIGMOID_LANES: whole vectors, then
    one masked vector (nothing outside the n elements is read or written; dp may be sp)."""
    vf = ir.VectorType(_F32, SIGMOID_LANES)
    whole = builder.sdiv(n, ir.Constant(_I64, SIGMOID_LANES))

    def body(g, state):
        at = builder.mul(g, ir.Constant(_I64, SIGMOID_LANES))
        _store_vec(builder, fn(_load_vec(builder, sp, at, vf)), dp, at)
        return []

    _block_loop(builder, ir.Constant(_I64, 0), whole, [], body)
    done = builder.mul(whole, ir.Constant(_I64, SIGMOID_LANES))
    left = builder.sub(n, done)
    with builder.if_then(builder.icmp_signed(">", left, ir.Constant(_I64, 0))):
        mask = _first_lanes(builder, left, SIGMOID_LANES)
        x = _masked(builder, "load", vf, builder.gep(sp, [done]), mask)
        _masked(builder, "store", vf, builder.gep(dp, [done]), mask, fn(x))


def _span_pointers(context, builder, sig, args):
    """(dst + at, src + start, count as i64) of an intrinsic's (dst, at, src, start, count, ...) arguments."""
    dp = builder.gep(_data(context, builder, sig.args[0], args[0]).data, [builder.sext(args[1], _I64)])
    sp = builder.gep(_data(context, builder, sig.args[2], args[2]).data, [builder.sext(args[3], _I64)])
    return dp, sp, builder.sext(args[4], _I64) if args[4].type.width < 64 else args[4]


@intrinsic
def sigmoid_f32(typingctx, dst, at, src, start, count, bias, silu):
    """dst[at + i] = f(src[start + i] + bias) for i < count, f sigmoid or, with silu, x * sigmoid(x); bias a
    float32 added first (one rounding, as Conv's bias before its activation; -0.0 for none: x + -0.0 is x for
    every x). dst may be src at the same positions (in place). Vectors of SIGMOID_LANES, then one masked vector:
    nothing outside the elements is read or written."""
    ints = all(isinstance(v, types.Integer) for v in (at, start, count))
    if not (_is_f32(dst) and _is_f32(src) and ints and isinstance(bias, types.Float)
            and isinstance(silu, (types.Boolean, types.Integer))):
        return None

    def codegen(context, builder, sig, args):
        dp, sp, n = _span_pointers(context, builder, sig, args)
        b = args[5] if args[5].type == _F32 else builder.fptrunc(args[5], _F32)
        on = builder.icmp_unsigned("!=", args[6], ir.Constant(args[6].type, 0))

        bv = _splat(builder, b, ir.VectorType(_F32, SIGMOID_LANES))

        def act(is_silu: bool):
            return lambda x: _sigmoid_vec(builder, builder.fadd(x, bv), is_silu)

        with builder.if_else(on) as (yes, no):
            with yes:
                _map_vectors(builder, dp, sp, n, act(True))
            with no:
                _map_vectors(builder, dp, sp, n, act(False))
        return context.get_dummy_value()

    return types.void(dst, at, src, start, count, bias, silu), codegen


@intrinsic
def exp_shifted_f32(typingctx, dst, at, src, start, count, shift):
    """dst[at + i] = exp(src[start + i] - shift) for i < count, for a float32 shift at least every non-NaN element
    (a softmax row's max): the difference rounded once (<= 0), then exp(-|d|) by the sigmoid's steps
    (_exp_neg_abs: the same bits on every CPU); NaN stays NaN. dst may be src at the same positions."""
    ints = all(isinstance(v, types.Integer) for v in (at, start, count))
    if not (_is_f32(dst) and _is_f32(src) and ints and isinstance(shift, types.Float)):
        return None

    def codegen(context, builder, sig, args):
        dp, sp, n = _span_pointers(context, builder, sig, args)
        m = _splat(builder, args[5] if args[5].type == _F32 else builder.fptrunc(args[5], _F32),
                   ir.VectorType(_F32, SIGMOID_LANES))
        scalef = AVX512 and SIGMOID_LANES == 16

        def exp_of(x):
            d = builder.fsub(x, m)
            return _nan_or(builder, d, _exp_neg_abs(builder, d, scalef))

        _map_vectors(builder, dp, sp, n, exp_of)
        return context.get_dummy_value()

    return types.void(dst, at, src, start, count, shift), codegen


# Single-threaded on purpose: a parallel kernel's static split waits for every worker thread, which on a loaded
# machine costs a scheduler time slice per call (measured: a YOLO-like forward went from 20 ms to 116 ms with 2
# numba threads while other processes ran).
@numba.njit(cache=True, error_model="numpy", nogil=True)
def sigmoid_array(src, dst, silu):  # pragma: no cover - compiled
    """dst = sigmoid(src), or SiLU with silu: flat float32 arrays of one size (dst may be src)."""
    sigmoid_f32(dst, 0, src, 0, src.size, np.float32(-0.0), silu)
