"""Shape/dtype inference: elementwise, comparison, logic, cast and reduction ops."""

from __future__ import annotations

from .core import InferCtx, TensorType, infer_float_unary, infer_numeric_unary, same_dtypes, broadcast_shapes

def infer_arith(ctx: InferCtx) -> TensorType:
    dt = same_dtypes(ctx, (0, 1))
    if dt == "bool":
        raise ctx.fail("arithmetic on bool; expected a numeric dtype (Cast first)")
    return TensorType(dt, broadcast_shapes(ctx, ctx.inputs[0].shape, ctx.inputs[1].shape))


def infer_compare(ctx: InferCtx) -> TensorType:
    same_dtypes(ctx, (0, 1))
    return TensorType("bool", broadcast_shapes(ctx, ctx.inputs[0].shape, ctx.inputs[1].shape))


def infer_logic(ctx: InferCtx) -> TensorType:
    for i, t in enumerate(ctx.inputs):
        if t.dtype != "bool":
            raise ctx.fail(f"input {i} has dtype {t.dtype}; expected bool")
    return TensorType("bool", broadcast_shapes(ctx, *(t.shape for t in ctx.inputs)))


def infer_not(ctx: InferCtx) -> TensorType:
    return infer_logic(ctx)


def infer_where(ctx: InferCtx) -> TensorType:
    if ctx.inputs[0].dtype != "bool":
        raise ctx.fail(f"condition has dtype {ctx.inputs[0].dtype}; expected bool")
    dt = same_dtypes(ctx, (1, 2))
    return TensorType(dt, broadcast_shapes(ctx, *(t.shape for t in ctx.inputs)))


def infer_cast(ctx: InferCtx) -> TensorType:
    return TensorType(ctx.attrs["to"], ctx.inputs[0].shape)


def infer_clip(ctx: InferCtx) -> TensorType:
    infer_numeric_unary(ctx)
    for i in range(1, len(ctx.inputs)):
        if ctx.inputs[i].rank != 0:
            raise ctx.fail(f"clip bound input {i} has shape {list(ctx.inputs[i].shape)}; expected a scalar")
    return ctx.inputs[0]


def _reduce_axes(ctx: InferCtx, rank: int) -> list[int]:
    axes = ctx.attrs.get("axes")
    if axes is None:
        return list(range(rank))
    norm = [ctx.axis(a, rank, "axes entry") for a in axes]
    if len(set(norm)) != len(norm):
        raise ctx.fail(f"axes {axes} repeat an axis")
    return norm


def infer_reduce(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    if x.dtype == "bool":
        raise ctx.fail("reduction of bool; expected a numeric dtype")
    axes = _reduce_axes(ctx, x.rank)
    keep = ctx.attrs["keepdims"]
    shape = tuple((1 if keep else None) if i in axes else d for i, d in enumerate(x.shape))
    return TensorType(x.dtype, tuple(d for d in shape if d is not None))


def infer_argreduce(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    ax = ctx.axis(ctx.attrs["axis"], x.rank)
    keep = ctx.attrs["keepdims"]
    shape = tuple(d for i, d in enumerate(x.shape) if i != ax or keep)
    shape = tuple(1 if (i == ax and keep) else d for i, d in enumerate(x.shape)) if keep else shape
    return TensorType("i64", shape)


def infer_axis_same(ctx: InferCtx) -> TensorType:
    ctx.axis(ctx.attrs["axis"], ctx.inputs[0].rank)
    return infer_float_unary(ctx) if ctx.op in ("Softmax", "LogSoftmax") else infer_numeric_unary(ctx)
