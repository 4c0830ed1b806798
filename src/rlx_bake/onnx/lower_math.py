"""Lowerings: elementwise math, activations, casts, softmax and reductions."""

from __future__ import annotations

import numpy as np

from .context import LOWER, Unsupported, ONNX_DTYPES, NodeLike, attr_copy, axes_from, direct, numpy_dtype


_SAME = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tan", "Tanh", "Sigmoid", "Relu", "Erf",
         "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
         "Floor", "Ceil", "Round", "Sign", "Not", "Softplus", "Softsign", "Identity", "Add", "Sub", "Mul", "Div",
         "Pow", "Equal", "Less", "Greater", "And", "Or", "Xor", "Where", "MatMul",
         "GlobalAveragePool"]


for _op in _SAME:
    LOWER[_op] = direct(_op)


# ONNX spells these GreaterOrEqual/LessOrEqual (opset 12+); the catalogue's names are shorter
LOWER["GreaterOrEqual"] = direct("GreaterEqual")
LOWER["LessOrEqual"] = direct("LessEqual")
LOWER["LeakyRelu"] = attr_copy("LeakyRelu", ["alpha"])
LOWER["Elu"] = attr_copy("Elu", ["alpha"])
LOWER["Selu"] = attr_copy("Selu", ["alpha", "gamma"])
LOWER["Gelu"] = attr_copy("Gelu", ["approximate"])
LOWER["ArgMax"] = attr_copy("ArgMax", ["axis", "keepdims", "select_last_index"])
LOWER["ArgMin"] = attr_copy("ArgMin", ["axis", "keepdims", "select_last_index"])
LOWER["Einsum"] = attr_copy("Einsum", ["equation"])
LOWER["Mod"] = attr_copy("Mod", ["fmod"])


def _isnan(ctx, n, a):
    x = n.input[0]
    ctx.emit("Not", [ctx.emit("Equal", [x, x])], {}, n.output[0])  # NaN is the only value != itself


def _isinf(ctx, n, a):
    x = n.input[0]
    pos, neg = a.get("detect_positive", 1), a.get("detect_negative", 1)
    inf = ctx.const(np.array(np.inf, numpy_dtype(ctx, x)))
    if pos and neg:
        ctx.emit("Equal", [ctx.emit("Abs", [x]), inf], {}, n.output[0])
    elif pos:
        ctx.emit("Equal", [x, inf], {}, n.output[0])
    else:
        ctx.emit("Equal", [x, ctx.emit("Neg", [inf])], {}, n.output[0])


def _reduce_composite(kind):
    def lower(ctx, n, a):
        x = n.input[0]
        axes = axes_from(ctx, n, a, 1)
        keep = a.get("keepdims", 1)
        if kind == "L1":
            ctx.emit("ReduceSum", [ctx.emit("Abs", [x])], {"axes": axes, "keepdims": keep}, n.output[0])
        elif kind == "L2":
            s = ctx.emit("ReduceSum", [ctx.emit("Mul", [x, x])], {"axes": axes, "keepdims": keep})
            ctx.emit("Sqrt", [s], {}, n.output[0])
        elif kind == "LogSum":
            ctx.emit("Log", [ctx.emit("ReduceSum", [x], {"axes": axes, "keepdims": keep})], {}, n.output[0])
        else:  # LogSumExp, max-shifted so large inputs do not overflow
            m = ctx.emit("ReduceMax", [x], {"axes": axes, "keepdims": 1})
            s = ctx.emit("ReduceSum", [ctx.emit("Exp", [ctx.emit("Sub", [x, m])])], {"axes": axes, "keepdims": 1})
            out = ctx.emit("Add", [ctx.emit("Log", [s]), m])
            if keep:
                ctx.emit("Identity", [out], {}, n.output[0])
            else:
                r = ctx.rank(x)
                if r is None and axes is None:
                    raise Unsupported("ReduceLogSumExp keepdims=0 on an input of unknown rank")
                ctx.emit("Squeeze", [out], {"axes": axes if axes is not None else list(range(r))}, n.output[0])
    return lower
LOWER["IsNaN"] = _isnan
LOWER["IsInf"] = _isinf
LOWER["ReduceL1"] = _reduce_composite("L1")
LOWER["ReduceL2"] = _reduce_composite("L2")
LOWER["ReduceLogSum"] = _reduce_composite("LogSum")
LOWER["ReduceLogSumExp"] = _reduce_composite("LogSumExp")


def _dropout(ctx, n, a):
    if len(n.input) > 2 and n.input[2]:  # opset 12+: training_mode; inference only
        mode = ctx.value(n.input[2])
        if mode is None or bool(np.asarray(mode).reshape(())):
            raise Unsupported("Dropout in training mode (training_mode not a constant false)")
    ctx.emit("Identity", [n.input[0]], {}, n.output[0])
    if len(n.output) > 1 and n.output[1]:  # the mask of an inference Dropout keeps everything
        dt = "bool" if ctx.opset >= 10 else (ctx.dtype(n.input[0]) or "f32")  # opsets 7-9: mask has x's type
        ctx.emit("ConstantOfShape", [ctx.emit("Shape", [n.input[0]])], {"value": 1.0, "dtype": dt}, n.output[1])


LOWER["Dropout"] = _dropout


def _cast(ctx, n, a):
    to = ONNX_DTYPES.get(a["to"])
    if to is None:
        raise Unsupported(f"Cast to ONNX type {a['to']}")
    ctx.emit("Cast", [n.input[0]], {"to": to}, n.output[0])


LOWER["Cast"] = _cast


def _softmax(op):
    def lower(ctx, n, a):
        axis = a.get("axis", -1 if ctx.opset >= 13 else 1)
        r = ctx.rank(n.input[0])
        if ctx.opset >= 13 or (r is not None and axis % r == r - 1):
            ctx.emit(op, [n.input[0]], {"axis": axis}, n.output[0])
            return
        # opset < 13: softmax over the input flattened to 2-D at `axis`
        flat = ctx.emit("Flatten", [n.input[0]], {"axis": axis})
        sm = ctx.emit(op, [flat], {"axis": 1})
        ctx.emit("Reshape", [sm, ctx.emit("Shape", [n.input[0]])], {}, n.output[0])
    return lower


LOWER["Softmax"] = _softmax("Softmax")
LOWER["LogSoftmax"] = _softmax("LogSoftmax")


def _softmin(ctx, n, a):
    neg = ctx.emit("Neg", [n.input[0]])
    LOWER["Softmax"](ctx, NodeLike([neg], n.output), a)


LOWER["Softmin"] = _softmin


def _variadic(op):
    def lower(ctx, n, a):
        ins = [i for i in n.input if i]
        if len(ins) == 1:
            ctx.emit("Identity", ins, {}, n.output[0])
            return
        acc = ins[0]
        for k, i in enumerate(ins[1:]):
            acc = ctx.emit(op, [acc, i], {}, n.output[0] if k == len(ins) - 2 else None)
    return lower


LOWER["Sum"] = _variadic("Add")
LOWER["Max"] = _variadic("Max")
LOWER["Min"] = _variadic("Min")


def _mean(ctx, n, a):
    ins = [i for i in n.input if i]
    total = ins[0]
    for i in ins[1:]:
        total = ctx.emit("Add", [total, i])
    ctx.emit("Div", [total, ctx.const(np.array(len(ins), numpy_dtype(ctx, ins[0])))], {}, n.output[0])


LOWER["Mean"] = _mean


def _clip(ctx, n, a):
    """Constant bounds become Clip's attrs; a bound computed at run time (detection models clip boxes to the
    image size) becomes Max / Min, in Clip's order: min(max(x, lo), hi)."""
    attrs, run_time = {}, {}
    if ctx.opset < 11:
        attrs = {k: a[k] for k in ("min", "max") if k in a}
    else:
        for pos, key in ((1, "min"), (2, "max")):
            if len(n.input) > pos and n.input[pos]:
                v = ctx.value(n.input[pos])
                if v is None:
                    if ctx.rank(n.input[pos]) not in (None, 0):
                        raise Unsupported("Clip with a non-scalar bound")
                    run_time[key] = n.input[pos]
                else:
                    attrs[key] = float(np.asarray(v).reshape(()))
    if not run_time:
        ctx.emit("Clip", [n.input[0]], attrs, n.output[0])
        return
    y, steps = n.input[0], [k for k in ("min", "max") if k in attrs or k in run_time]
    for i, key in enumerate(steps):
        out = n.output[0] if i == len(steps) - 1 else None
        if key in run_time:
            y = ctx.emit("Max" if key == "min" else "Min", [y, run_time[key]], {}, out)
        else:
            y = ctx.emit("Clip", [y], {key: attrs[key]}, out)


LOWER["Clip"] = _clip


def _emit_hard_sigmoid(ctx, x: str, alpha: float, beta: float, name: str | None = None) -> str:
    dt = numpy_dtype(ctx, x)
    lin = ctx.emit("Add", [ctx.emit("Mul", [x, ctx.const(np.array(alpha, dt))]), ctx.const(np.array(beta, dt))])
    return ctx.emit("Clip", [lin], {"min": 0.0, "max": 1.0}, name)


def _hard_sigmoid(ctx, n, a):
    _emit_hard_sigmoid(ctx, n.input[0], a.get("alpha", 0.2), a.get("beta", 0.5), n.output[0])


LOWER["HardSigmoid"] = _hard_sigmoid


def _hard_swish(ctx, n, a):
    x = n.input[0]
    ctx.emit("Mul", [x, _emit_hard_sigmoid(ctx, x, 1 / 6, 0.5)], {}, n.output[0])


def _mish(ctx, n, a):
    x = n.input[0]
    ctx.emit("Mul", [x, ctx.emit("Tanh", [ctx.emit("Softplus", [x])])], {}, n.output[0])


def _celu(ctx, n, a):
    x = n.input[0]
    dt = numpy_dtype(ctx, x)
    alpha = ctx.const(np.array(a.get("alpha", 1.0), dt))
    zero = ctx.const(np.array(0, dt))
    neg = ctx.emit("Mul", [alpha, ctx.emit("Sub", [ctx.emit("Exp", [ctx.emit("Div", [x, alpha])]),
                                                   ctx.const(np.array(1, dt))])])
    ctx.emit("Add", [ctx.emit("Max", [x, zero]), ctx.emit("Min", [neg, zero])], {}, n.output[0])


def _thresholded_relu(ctx, n, a):
    x = n.input[0]
    dt = numpy_dtype(ctx, x)
    ctx.emit("Where", [ctx.emit("Greater", [x, ctx.const(np.array(a.get("alpha", 1.0), dt))]), x,
                       ctx.const(np.array(0, dt))], {}, n.output[0])


def _shrink(ctx, n, a):
    x = n.input[0]
    dt = numpy_dtype(ctx, x)
    lambd, bias = ctx.const(np.array(a.get("lambd", 0.5), dt)), ctx.const(np.array(a.get("bias", 0.0), dt))
    zero = ctx.const(np.array(0, dt))
    low = ctx.emit("Where", [ctx.emit("Less", [x, ctx.emit("Neg", [lambd])]), ctx.emit("Add", [x, bias]), zero])
    ctx.emit("Where", [ctx.emit("Greater", [x, lambd]), ctx.emit("Sub", [x, bias]), low], {}, n.output[0])


LOWER["HardSwish"] = _hard_swish
LOWER["Mish"] = _mish
LOWER["Celu"] = _celu
LOWER["ThresholdedRelu"] = _thresholded_relu
LOWER["Shrink"] = _shrink


def _prelu(ctx, n, a):
    x, slope = n.input[0], n.input[1]
    xr = ctx.rank(x)
    sv = ctx.value(slope)
    if sv is not None and xr is not None and sv.ndim == 1 and sv.size > 1 and xr > 2:
        slope = ctx.emit("Reshape", [slope], {"shape": [sv.size] + [1] * (xr - 2)})  # per-channel slope
    zero = ctx.const(np.array(0, numpy_dtype(ctx, x)))
    ctx.emit("Where", [ctx.emit("Less", [x, zero]), ctx.emit("Mul", [x, slope]), x], {}, n.output[0])


LOWER["PRelu"] = _prelu


def _reduce(op):
    def lower(ctx, n, a):
        axes = axes_from(ctx, n, a, 1)
        if axes == [] or (axes is None and a.get("noop_with_empty_axes", 0)):
            if a.get("noop_with_empty_axes", 0):
                ctx.emit("Identity", [n.input[0]], {}, n.output[0])
                return
            axes = None
        ctx.emit(op, [n.input[0]], {"axes": axes, "keepdims": a.get("keepdims", 1)}, n.output[0])
    return lower


for _op in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"]:
    LOWER[_op] = _reduce(_op)


def _reduce_sum_square(ctx, n, a):
    sq = ctx.emit("Mul", [n.input[0], n.input[0]])
    LOWER["ReduceSum"](ctx, NodeLike([sq] + list(n.input[1:]), n.output), a)


LOWER["ReduceSumSquare"] = _reduce_sum_square


def _cumsum(ctx, n, a):
    axis = ctx.ints(n.input[1], "CumSum axis")[0]
    ctx.emit("CumSum", [n.input[0]], {"axis": axis, "exclusive": a.get("exclusive", 0), "reverse": a.get("reverse", 0)},
             n.output[0])


LOWER["CumSum"] = _cumsum
