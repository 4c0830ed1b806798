"""Shape/dtype inference: MatMul, convolution, pooling, normalization, attention, quantized, random."""

from __future__ import annotations

import math
from dataclasses import replace

from ..constants import QUANT_ENCODINGS
from ..dtypes import FLOAT_DTYPES
from .core import (
    Dim, InferCtx, Shape, TensorType, require_float, same_dtypes, broadcast_shapes, dims_equal_or_symbolic,
)

def matmul_shape(ctx: InferCtx, a: Shape, b: Shape) -> Shape:
    if not a or not b:
        raise ctx.fail("MatMul of a scalar; expected rank >= 1")
    a2 = a if len(a) > 1 else (1,) + a
    b2 = b if len(b) > 1 else b + (1,)
    if not dims_equal_or_symbolic(a2[-1], b2[-2]):
        raise ctx.fail(f"inner dims differ: {list(a)} @ {list(b)} ({a2[-1]} vs {b2[-2]})")
    batch = broadcast_shapes(ctx, a2[:-2], b2[:-2]) if (a2[:-2] or b2[:-2]) else ()
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def infer_matmul(ctx: InferCtx) -> TensorType:
    dt = same_dtypes(ctx, (0, 1))
    if dt == "bool":
        raise ctx.fail("MatMul of bool")
    return TensorType(dt, matmul_shape(ctx, ctx.inputs[0].shape, ctx.inputs[1].shape))


def infer_fused_matmul(ctx: InferCtx) -> TensorType:
    """MatMul's rules on (x, w) with w a matrix; the bias has one value per output column (shape (N,), or leading
    1s then N) in the output's dtype; a fourth operand, the residual, has the output's type (no broadcasting)."""
    t = infer_matmul(replace(ctx, inputs=ctx.inputs[:2]))
    if len(ctx.inputs[1].shape) != 2 or len(ctx.inputs[0].shape) < 2:
        raise ctx.fail(f"FusedMatMul takes x of rank >= 2 and a matrix w; got ranks {len(ctx.inputs[0].shape)} and "
                       f"{len(ctx.inputs[1].shape)}")
    b = ctx.inputs[2]
    if (b.dtype != t.dtype or not b.shape or len(b.shape) > len(t.shape) or any(d != 1 for d in b.shape[:-1])
            or not dims_equal_or_symbolic(b.shape[-1], t.shape[-1])):
        raise ctx.fail(f"bias {b.dtype}{list(b.shape)}; expected one {t.dtype} value per output column "
                       f"([{t.shape[-1]}], or leading 1s then {t.shape[-1]})")
    _check_residual(ctx, t, "the product's")
    return t


def _check_residual(ctx: InferCtx, t: TensorType, what: str) -> None:
    """A fourth operand (a fused op's residual) must have the result's type t, no broadcasting."""
    if len(ctx.inputs) == 4:
        r = ctx.inputs[3]
        if r.dtype != t.dtype or len(r.shape) != len(t.shape) or any(
                isinstance(p, int) and isinstance(q, int) and p != q for p, q in zip(r.shape, t.shape)):
            raise ctx.fail(f"residual {r.dtype}{list(r.shape)}; expected {what} {t.dtype}{list(t.shape)}")


def _spatial_attrs(ctx: InferCtx, nsp: int, kernel: Shape) -> tuple[list, list, list]:
    strides = ctx.attrs.get("strides") or [1] * nsp
    dil = ctx.attrs.get("dilations") or [1] * nsp
    pads = ctx.attrs.get("pads") or [0] * (2 * nsp)
    if len(strides) != nsp or len(dil) != nsp or len(pads) != 2 * nsp:
        raise ctx.fail(
            f"strides/dilations need {nsp} entries and pads {2 * nsp}; got {strides}, {dil}, {pads}"
        )
    return strides, dil, pads  # positivity: the catalogue's attr schema


def window_count(d: int, k: int, s: int, dl: int, pb: int, pe: int, ceil_mode: bool = False) -> int:
    """Output size of a conv/pool axis (spec/ops.md): windows of (k-1)*dl+1 over d+pb+pe with stride s,
    rounded down (ceil_mode: up, but a window may not start inside the end padding). Callers ensure the
    dilated kernel fits the padded input."""
    span = d + pb + pe - dl * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= d + pb:
        out -= 1
    return out


def _pool_out(ctx, d, k, s, dl, pb, pe, ceil_mode=False) -> Dim:
    if not isinstance(d, int) or not isinstance(k, int):
        return ctx.fresh()
    if d + pb + pe < dl * (k - 1) + 1:
        raise ctx.fail(f"kernel {k} (dilation {dl}) is larger than the padded input {d + pb + pe}; "
                       "expected a kernel that fits (pad the input)")
    return window_count(d, k, s, dl, pb, pe, ceil_mode)


def _conv_operands(ctx: InferCtx):
    """Checks shared by Conv and ConvTranspose: (x, w, spatial rank, group, strides, dilations, pads)."""
    x, w = ctx.inputs[:2]
    require_float(ctx)
    same_dtypes(ctx, tuple(range(len(ctx.inputs))))
    if x.rank not in (3, 4, 5) or w.rank != x.rank:
        raise ctx.fail(f"input rank {x.rank}, weight rank {w.rank}; expected both 3, 4 or 5 (1-D/2-D/3-D)")
    nsp = x.rank - 2
    if any(isinstance(k, int) and k < 1 for k in w.shape[2:]):
        raise ctx.fail(f"weight shape {list(w.shape)} has an empty kernel; expected kernel dims >= 1")
    return (x, w, nsp, ctx.attrs["group"], *_spatial_attrs(ctx, nsp, w.shape[2:]))


def infer_conv(ctx: InferCtx) -> TensorType:
    x, w, nsp, g, strides, dil, pads = _conv_operands(ctx)
    if isinstance(x.shape[1], int) and isinstance(w.shape[1], int) and x.shape[1] != w.shape[1] * g:
        raise ctx.fail(f"input channels {x.shape[1]} != weight in-channels {w.shape[1]} x group {g}")
    if isinstance(w.shape[0], int) and w.shape[0] % g:
        raise ctx.fail(f"weight out-channels {w.shape[0]} not divisible by group {g}")
    if len(ctx.inputs) == 3 and ctx.inputs[2].shape not in ((w.shape[0],),) and isinstance(w.shape[0], int):
        raise ctx.fail(f"bias shape {list(ctx.inputs[2].shape)}; expected [{w.shape[0]}]")
    sp = [_pool_out(ctx, x.shape[2 + i], w.shape[2 + i], strides[i], dil[i], pads[i], pads[i + nsp])
          for i in range(nsp)]
    return TensorType(x.dtype, (x.shape[0], w.shape[0], *sp))


def infer_fused_conv(ctx: InferCtx) -> TensorType:
    """Conv's rules on (x, w, b); a fourth operand, the residual added before the activation, has the output's
    type (no broadcasting)."""
    t = infer_conv(replace(ctx, inputs=ctx.inputs[:3]))
    _check_residual(ctx, t, "the conv's output")
    return t


def infer_squeeze_excite(ctx: InferCtx) -> TensorType:
    """x (N, C, H, W) float, w1 (C1, C, 1, 1), b1 (C1,), w2 (C, C1, 1, 1), b2 (C,) of x's dtype: x's type."""
    x, w1, b1, w2, b2 = ctx.inputs
    require_float(ctx)
    if x.rank != 4:
        raise ctx.fail(f"input rank {x.rank}; expected 4 (N, C, H, W)")
    for i, t in enumerate(ctx.inputs[1:], 1):
        if t.dtype != x.dtype:
            raise ctx.fail(f"input {i} is {t.dtype}; expected {x.dtype}, as x")
    c, c1 = x.shape[1], w1.shape[0] if w1.rank == 4 else "C1"
    want = {1: ((c1, c, 1, 1), w1), 2: ((c1,), b1), 3: ((c, c1, 1, 1), w2), 4: ((c,), b2)}
    for i, (shape, t) in want.items():
        if t.rank != len(shape) or not all(dims_equal_or_symbolic(a, b) for a, b in zip(t.shape, shape)):
            raise ctx.fail(f"input {i} has shape {list(t.shape)}; expected {list(shape)} (x has {c} channels, the "
                           "squeeze w1's first dim its channels)")
    return x


def infer_conv_transpose(ctx: InferCtx) -> TensorType:
    x, w, nsp, g, strides, dil, pads = _conv_operands(ctx)
    op = ctx.attrs.get("output_padding") or [0] * nsp
    if len(op) != nsp:
        raise ctx.fail(f"output_padding {op} has {len(op)} entries; expected {nsp} (one per spatial axis)")
    if isinstance(x.shape[1], int) and isinstance(w.shape[0], int) and x.shape[1] != w.shape[0]:
        raise ctx.fail(f"input channels {x.shape[1]} != weight dim 0 {w.shape[0]}")
    if isinstance(x.shape[1], int) and x.shape[1] % g:
        raise ctx.fail(f"input channels {x.shape[1]} not divisible by group {g}")
    sp = []
    for i in range(nsp):
        d, k = x.shape[2 + i], w.shape[2 + i]
        if isinstance(d, int) and isinstance(k, int):
            sp.append(strides[i] * (d - 1) + op[i] + (k - 1) * dil[i] + 1 - pads[i] - pads[i + nsp])
        else:
            sp.append(ctx.fresh())
    cout = w.shape[1] * g if isinstance(w.shape[1], int) else ctx.fresh()
    return TensorType(x.dtype, (x.shape[0], cout, *sp))


def infer_pool(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    require_float(ctx)
    if x.rank not in (3, 4, 5):
        raise ctx.fail(f"input rank {x.rank}; expected 3, 4 or 5")
    nsp = x.rank - 2
    k = ctx.attrs["kernel_shape"]
    if len(k) != nsp:
        raise ctx.fail(f"kernel_shape {k}; expected {nsp} entries")
    strides, dil, pads = _spatial_attrs(ctx, nsp, tuple(k))
    sp = [_pool_out(ctx, x.shape[2 + i], k[i], strides[i], dil[i], pads[i], pads[i + nsp],
                    bool(ctx.attrs["ceil_mode"])) for i in range(nsp)]
    return TensorType(x.dtype, (x.shape[0], x.shape[1], *sp))


def infer_global_pool(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    require_float(ctx)
    if x.rank < 3:
        raise ctx.fail(f"input rank {x.rank}; expected >= 3")
    return TensorType(x.dtype, x.shape[:2] + (1,) * (x.rank - 2))


def _channel_params(ctx: InferCtx, first: int, c: Dim) -> None:
    for i in range(first, len(ctx.inputs)):
        t = ctx.inputs[i]
        if t.rank != 1 or not dims_equal_or_symbolic(t.shape[0], c):
            raise ctx.fail(f"input {i} has shape {list(t.shape)}; expected [{c}]")


def infer_batchnorm(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    require_float(ctx)
    same_dtypes(ctx, tuple(range(5)))
    if x.rank < 2:
        raise ctx.fail(f"input rank {x.rank}; expected >= 2 (N, C, ...)")
    _channel_params(ctx, 1, x.shape[1])
    return x


def infer_norm_last(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    require_float(ctx)
    same_dtypes(ctx, tuple(range(len(ctx.inputs))))
    ax = ctx.axis(ctx.attrs["axis"], x.rank)
    norm_shape = x.shape[ax:]
    for i in range(1, len(ctx.inputs)):
        s = ctx.inputs[i].shape
        if len(s) > len(norm_shape) or not all(dims_equal_or_symbolic(a, b)
                                                for a, b in zip(s[::-1], norm_shape[::-1])):
            raise ctx.fail(f"input {i} has shape {list(s)}; expected {list(norm_shape)} (normalized dims)")
    return x


def infer_groupnorm(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    require_float(ctx)
    g = ctx.attrs["num_groups"]
    if x.rank < 2:
        raise ctx.fail(f"input rank {x.rank}; expected >= 2")
    if isinstance(x.shape[1], int) and x.shape[1] % g:
        raise ctx.fail(f"channels {x.shape[1]} not divisible by num_groups {g}")
    _channel_params(ctx, 1, x.shape[1])
    return x


def infer_sdpa(ctx: InferCtx) -> TensorType:
    q, k, v = ctx.inputs[:3]
    require_float(ctx)
    same_dtypes(ctx, (0, 1, 2))
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank:
        raise ctx.fail("q, k, v must share a rank >= 2 ([..., seq, dim])")
    if not dims_equal_or_symbolic(q.shape[-1], k.shape[-1]):
        raise ctx.fail(f"q dim {q.shape[-1]} != k dim {k.shape[-1]}")
    if not dims_equal_or_symbolic(k.shape[-2], v.shape[-2]):
        raise ctx.fail(f"k length {k.shape[-2]} != v length {v.shape[-2]}")
    batch = broadcast_shapes(ctx, q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if len(ctx.inputs) == 4:
        m = ctx.inputs[3]
        if m.dtype != "bool" and m.dtype != q.dtype:
            raise ctx.fail(f"mask dtype {m.dtype}; expected bool or {q.dtype}")
        broadcast_shapes(ctx, m.shape, batch + (q.shape[-2], k.shape[-2]))
    return TensorType(q.dtype, batch + (q.shape[-2], v.shape[-1]))


QUANT_BLOCKS = QUANT_ENCODINGS  # encoding -> (block elems, block bytes), from the codec registry


def infer_dequantize(ctx: InferCtx) -> TensorType:
    p = ctx.inputs[0]
    enc, shape = ctx.attrs["encoding"], ctx.attrs["shape"]
    qk, bs = QUANT_BLOCKS[enc]
    if p.dtype != "u8":
        raise ctx.fail(f"packed input dtype {p.dtype}; expected u8")
    if not shape or shape[-1] % qk:
        raise ctx.fail(f"shape {shape}: last dim must be a multiple of {qk} for {enc}")
    want = (*shape[:-1], shape[-1] // qk * bs)
    if p.is_static() and tuple(p.shape) != want:
        raise ctx.fail(f"packed shape {list(p.shape)}; expected {list(want)} for {enc} {shape}")
    return TensorType("f32", tuple(shape))


def infer_dequant_matmul(ctx: InferCtx) -> TensorType:
    x, p = ctx.inputs
    enc, n, k = ctx.attrs["encoding"], ctx.attrs["N"], ctx.attrs["K"]
    qk, bs = QUANT_BLOCKS[enc]
    if x.dtype != "f32":
        raise ctx.fail(f"x dtype {x.dtype}; expected f32")
    if k % qk:
        raise ctx.fail(f"K={k} not a multiple of {qk} for {enc}")
    if not dims_equal_or_symbolic(x.shape[-1] if x.rank else None, k):
        raise ctx.fail(f"x last dim {x.shape[-1] if x.rank else None}; expected K={k}")
    if p.dtype != "u8" or (p.is_static() and tuple(p.shape) != (n, k // qk * bs)):
        raise ctx.fail(f"packed weight {p.dtype}{list(p.shape)}; expected u8[{n}, {k // qk * bs}]")
    return TensorType("f32", x.shape[:-1] + (n,))


def infer_dequant_gather(ctx: InferCtx) -> TensorType:
    p, idx = ctx.inputs
    enc, n, k = ctx.attrs["encoding"], ctx.attrs["N"], ctx.attrs["K"]
    qk, bs = QUANT_BLOCKS[enc]
    if k % qk:
        raise ctx.fail(f"K={k} not a multiple of {qk} for {enc}")
    if p.dtype != "u8" or (p.is_static() and tuple(p.shape) != (n, k // qk * bs)):
        raise ctx.fail(f"packed table {p.dtype}{list(p.shape)}; expected u8[{n}, {k // qk * bs}]")
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    return TensorType("f32", idx.shape + (k,))


def infer_random(ctx: InferCtx) -> TensorType:
    if ctx.attrs["dtype"] not in FLOAT_DTYPES:
        raise ctx.fail(f"dtype {ctx.attrs['dtype']}; expected a float dtype")
    if ctx.op == "RandomUniform" and not math.isfinite(ctx.attrs["high"] - ctx.attrs["low"]):
        raise ctx.fail(f"high - low = {ctx.attrs['high']} - {ctx.attrs['low']} overflows; expected a finite span")
    return TensorType(ctx.attrs["dtype"], tuple(ctx.attrs["shape"]))
