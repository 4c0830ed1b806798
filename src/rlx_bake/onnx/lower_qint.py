"""Lowerings: the integer ops of dynamically quantized models (onnxruntime.quantization.quantize_dynamic):
DynamicQuantizeLinear, MatMulInteger, ConvInteger.

DynamicQuantizeLinear becomes its formula in catalogue ops (float32, in the ONNX reference's order):
  lo = min(0, min(x)), hi = max(0, max(x)), scale = (hi - lo) / 255 (1 when hi == lo),
  zero_point = saturate(round(0 - lo / scale)), y = saturate(round(x / scale) + zero_point)
with round half to even and saturation to [0, 255]. The integer ops keep their uint8/int8 weights as they
are (the file stays small) and sum exactly (kernels/integer.py).
"""

from __future__ import annotations

from rlx_format.ops.infer_integer import OPTIONAL

from .context import LOWER, Unsupported
from .lower_nn import _auto_pad


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
            w = ctx.value(n.input[1])
            kernel = a.get("kernel_shape") or (list(w.shape[2:]) if w is not None else None)
            if kernel is None:
                raise Unsupported("ConvInteger with a run-time weight and no kernel_shape")
            attrs.update({k: a[k] for k in ("strides", "dilations", "group") if k in a})
            pads = _auto_pad(ctx, n, a, kernel)
            if pads is not None:
                attrs["pads"] = list(pads)
        ctx.emit(op, ins, attrs, n.output[0])
    return lower


LOWER["DynamicQuantizeLinear"] = _dynamic_quantize_linear
LOWER["MatMulInteger"] = _integer("MatMulInteger")
LOWER["ConvInteger"] = _integer("ConvInteger")
