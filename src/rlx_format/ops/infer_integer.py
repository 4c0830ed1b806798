"""Shape inference for the integer ops MatMulInteger and ConvInteger (ONNX semantics: uint8/int8
operands minus optional zero points, exact int32 sums)."""

from __future__ import annotations

from dataclasses import replace

from .core import InferCtx, TensorType
from .infer_nn import infer_conv, matmul_shape

_INT8 = ("u8", "i8")
OPTIONAL = {"MatMulInteger": ("a_zero_point", "b_zero_point"), "ConvInteger": ("x_zero_point", "w_zero_point")}


def _check_operands(ctx: InferCtx) -> None:
    allowed = OPTIONAL[ctx.op]
    opt = list(ctx.attrs["optional"])
    if any(o not in allowed for o in opt) or opt != [o for o in allowed if o in opt]:
        raise ctx.fail(f"optional = {opt}; expected a subset of {list(allowed)} in that order")
    if len(ctx.inputs) != 2 + len(opt):
        raise ctx.fail(f"{len(ctx.inputs)} inputs for optional = {opt}; expected {2 + len(opt)}")
    for i, t in enumerate(ctx.inputs):
        if t.dtype not in _INT8:
            raise ctx.fail(f"input {i} has dtype {t.dtype}; expected u8 or i8")
    for name, t in zip(opt, ctx.inputs[2:]):
        if t.rank > 1:
            raise ctx.fail(f"{name} has rank {t.rank}; expected a scalar or a vector (per row / column / channel)")


def infer_matmul_integer(ctx: InferCtx) -> TensorType:
    _check_operands(ctx)
    return TensorType("i32", matmul_shape(ctx, ctx.inputs[0].shape, ctx.inputs[1].shape))


def infer_conv_integer(ctx: InferCtx) -> TensorType:
    _check_operands(ctx)
    # the Conv rules, on float stand-ins of the two 8-bit operands and without a bias operand
    t = infer_conv(replace(ctx, inputs=[TensorType("f32", i.shape) for i in ctx.inputs[:2]]))
    return TensorType("i32", t.shape)
