"""Lowerings: the integer ops of quantized models: DynamicQuantizeLinear, MatMulInteger, ConvInteger
(onnxruntime.quantization.quantize_dynamic), QLinearMatMul and QLinearConv (the QOperator format).

DynamicQuantizeLinear becomes its formula in catalogue ops (float32, in the ONNX reference's order):
  lo = min(0, min(x)), hi = max(0, max(x)), scale = (hi - lo) / 255 (1 when hi == lo),
  zero_point = saturate(round(0 - lo / scale)), y = saturate(round(x / scale) + zero_point)
with round half to even and saturation to [0, 255]. The integer ops keep their uint8/int8 weights as they
are (the file stays small) and sum exactly (kernels/integer.py).
"""

from __future__ import annotations

import numpy as np

from rlx_format.ops.infer_integer import OPTIONAL

from .context import LOWER, Unsupported, NodeLike
from .lower_nn import QUANT_RANGE, auto_pad, conv_kernel


def _dynamic_quantize_linear(ctx, n, a):
    x = n.input[0]
    if ctx.dtype(x) not in (None, "f32"):
        raise Unsupported(f"DynamicQuantizeLinear of {ctx.dtype(x)}")
    zero = ctx.const(0.0, "float32")
    lo = ctx.emit("Min", [zero, ctx.emit("ReduceMin", [x], {"keepdims": 0})])
    hi = ctx.emit("Max", [zero, ctx.emit("ReduceMax", [x], {"keepdims": 0})])
    span = ctx.emit("Div", [ctx.emit("Sub", [hi, lo]), ctx.const(255.0, "float32")])
    # an all-zero x has no range: scale 1 (onnxruntime's choice; the formula would divide by 0)
    scale = ctx.emit("Where", [ctx.emit("Equal", [hi, lo]), ctx.const(1.0, "float32"), span], {},
                     n.output[1] if len(n.output) > 1 and n.output[1] else None)
    zp_f = ctx.emit("Clip", [ctx.emit("Round", [ctx.emit("Sub", [zero, ctx.emit("Div", [lo, scale])])])],
                    {"min": 0.0, "max": 255.0})
    # the uint8 zero point output (y uses its float value: the same number); DCE drops it when unused
    ctx.emit("Cast", [zp_f], {"to": "u8"}, n.output[2] if len(n.output) > 2 and n.output[2] else None)
    q = ctx.emit("Add", [ctx.emit("Round", [ctx.emit("Div", [x, scale])]), zp_f])
    ctx.emit("Cast", [ctx.emit("Clip", [q], {"min": 0.0, "max": 255.0})], {"to": "u8"}, n.output[0])


def _integer(op: str):
    def lower(ctx, n, a):
        ins, optional = list(n.input[:2]), []
        for pos, name in enumerate(OPTIONAL[op], start=2):
            if len(n.input) > pos and n.input[pos]:
                ins.append(n.input[pos])
                optional.append(name)
        attrs = {"optional": optional}
        if op == "ConvInteger":
            kernel = conv_kernel(ctx, n, a, op)
            attrs.update({k: a[k] for k in ("strides", "dilations", "group") if k in a})
            # a run-time SAME pad (symbolic dims with a stride) fills with the input's zero point: the value
            # that stands for 0 once the zero point is subtracted
            zp = ctx.value(n.input[2]) if len(n.input) > 2 and n.input[2] else 0
            fill = 0.0 if zp is None else float(np.asarray(zp).reshape(-1)[0])
            pads, padded = auto_pad(ctx, n, a, kernel, fill=fill)
            if padded != ins[0] and zp is None:
                raise Unsupported("ConvInteger auto_pad SAME_* padded at run time with a run-time input zero point")
            ins[0] = padded
            if pads is not None:
                attrs["pads"] = list(pads)
        ctx.emit(op, ins, attrs, n.output[0])
    return lower


LOWER["DynamicQuantizeLinear"] = _dynamic_quantize_linear
LOWER["MatMulInteger"] = _integer("MatMulInteger")
LOWER["ConvInteger"] = _integer("ConvInteger")


def _requantize(ctx, acc: str, scale: str, zp: str, out: str) -> None:
    """saturate(round_half_even(float(acc) * scale) + zp), onnxruntime's float32 requantization."""
    out_t = ctx.dtype(zp)
    if out_t not in ("u8", "i8"):
        raise Unsupported(f"requantization to {out_t}")
    lo, hi = QUANT_RANGE[out_t]
    q = ctx.emit("Round", [ctx.emit("Mul", [ctx.emit("Cast", [acc], {"to": "f32"}), scale])])
    q = ctx.emit("Add", [q, ctx.emit("Cast", [zp], {"to": "f32"})])
    ctx.emit("Cast", [ctx.emit("Clip", [q], {"min": float(lo), "max": float(hi)})], {"to": out_t}, out)


def _qlinear_scale(ctx, a_s: str, b_s: str, y_s: str, per_channel_rank: int | None = None) -> str:
    b = b_s
    if per_channel_rank and ctx.rank(b_s) == 1:  # per output channel: [M] -> [M, 1, ...]
        b = ctx.emit("Reshape", [b_s], {"shape": [-1] + [1] * (per_channel_rank - 2)})
    return ctx.emit("Div", [ctx.emit("Mul", [a_s, b]), y_s])  # (a_scale * b_scale) / y_scale, in that order


def _qlinear_matmul(ctx, n, a):
    a_, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = n.input[:8]
    acc = ctx.fresh("qlinear_acc")
    LOWER["MatMulInteger"](ctx, NodeLike([a_, b, a_zp, b_zp], [acc]), {})
    _requantize(ctx, acc, _qlinear_scale(ctx, a_s, b_s, y_s), y_zp, n.output[0])


def _qlinear_conv(ctx, n, a):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = n.input[:8]
    r = ctx.rank(x)
    if r is None:
        raise Unsupported("QLinearConv on an input of unknown rank")
    acc = ctx.fresh("qlinear_acc")
    LOWER["ConvInteger"](ctx, NodeLike([x, w, x_zp, w_zp], [acc]), a)
    if len(n.input) > 8 and n.input[8]:  # int32 bias, added before requantization
        acc = ctx.emit("Add", [acc, ctx.emit("Reshape", [n.input[8]], {"shape": [-1] + [1] * (r - 2)})])
    _requantize(ctx, acc, _qlinear_scale(ctx, x_s, w_s, y_s, r), y_zp, n.output[0])


LOWER["QLinearMatMul"] = _qlinear_matmul
LOWER["QLinearConv"] = _qlinear_conv
