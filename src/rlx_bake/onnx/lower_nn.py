"""Lowerings: Gemm, convolution, pooling, normalization, LRN and QDQ (Quantize/DequantizeLinear)."""

from __future__ import annotations

import numpy as np

from .context import LOWER, Unsupported, _DTYPES, _Fake, _np


def _per_axis(ctx, n, a, name: str, x: str) -> str:
    """A scale/zero-point operand shaped to broadcast along `axis` of x (per-axis quantization)."""
    v = ctx.value(name)
    t = ctx.types.get(name)
    rank1 = (v is not None and v.ndim == 1 and v.size > 1) or (t is not None and t[1] is not None and len(t[1]) == 1
                                                               and t[1][0] != 1)
    if not rank1:
        return name
    r = ctx.rank(x)
    if r is None:
        raise Unsupported("per-axis (de)quantization on an input of unknown rank")
    axis = a.get("axis", 1) % r
    return ctx.emit("Reshape", [name], {"shape": [-1 if i == axis else 1 for i in range(r)]})


def _dequantize_linear(ctx, n, a):
    if a.get("block_size", 0):
        raise Unsupported("DequantizeLinear block_size")
    x, scale = n.input[0], n.input[1]
    s = _per_axis(ctx, n, a, scale, x)
    xf = ctx.emit("Cast", [x], {"to": ctx.dtype(scale) or "f32"})
    if len(n.input) > 2 and n.input[2]:
        zp = ctx.emit("Cast", [_per_axis(ctx, n, a, n.input[2], x)], {"to": ctx.dtype(scale) or "f32"})
        xf = ctx.emit("Sub", [xf, zp])
    ctx.emit("Mul", [xf, s], {}, n.output[0])


_QRANGE = {"u8": (0, 255), "i8": (-128, 127), "i16": (-32768, 32767), "i32": (-(2**31), 2**31 - 1)}


def _quantize_linear(ctx, n, a):
    if a.get("block_size", 0):
        raise Unsupported("QuantizeLinear block_size")
    x, scale = n.input[0], n.input[1]
    has_zp = len(n.input) > 2 and n.input[2]
    out_t = ctx.dtype(n.input[2]) if has_zp else _DTYPES.get(a.get("output_dtype", 2), "u8")
    if out_t not in _QRANGE:
        raise Unsupported(f"QuantizeLinear to {out_t}")
    q = ctx.emit("Round", [ctx.emit("Div", [x, _per_axis(ctx, n, a, scale, x)])])  # half to even, as ONNX
    if has_zp:
        q = ctx.emit("Add", [q, ctx.emit("Cast", [_per_axis(ctx, n, a, n.input[2], x)], {"to": ctx.dtype(x) or "f32"})])
    lo, hi = _QRANGE[out_t]
    ctx.emit("Cast", [ctx.emit("Clip", [q], {"min": float(lo), "max": float(hi)})], {"to": out_t}, n.output[0])


LOWER["DequantizeLinear"] = _dequantize_linear
LOWER["QuantizeLinear"] = _quantize_linear


def _gemm(ctx, n, a):
    A, B = n.input[0], n.input[1]
    if a.get("transA", 0):
        A = ctx.emit("Transpose", [A], {"perm": [1, 0]})
    if a.get("transB", 0):
        B = ctx.emit("Transpose", [B], {"perm": [1, 0]})
    dt = _np(ctx, n.input[0])
    y = ctx.emit("MatMul", [A, B])
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    has_c = len(n.input) > 2 and n.input[2]
    if alpha != 1.0:
        y = ctx.emit("Mul", [y, ctx.const(np.array(alpha, dt))], {}, None if has_c else n.output[0])
    if has_c:
        c = n.input[2]
        if beta != 1.0:
            c = ctx.emit("Mul", [c, ctx.const(np.array(beta, dt))])
        ctx.emit("Add", [y, c], {}, n.output[0])
    elif alpha == 1.0:
        ctx.emit("Identity", [y], {}, n.output[0])


LOWER["Gemm"] = _gemm


def _auto_pad(ctx, n, a, kernel, fill: float = 0.0, x: str | None = None) -> tuple[list[int] | None, str]:
    """(pads, input): explicit pads, or SAME_* pads computed at import (static spatial dims or stride 1),
    or, for symbolic dims with a stride, a run-time Pad of the input (then pads are zeros). `x` is the
    tensor to pad when it is not the node's input itself (a value computed from it, of its shape)."""
    x = x or n.input[0]
    mode = a.get("auto_pad", "NOTSET")
    if mode in ("NOTSET", "VALID"):
        return (a.get("pads") if mode == "NOTSET" else [0] * (2 * len(kernel))), x
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={mode}")
    t = ctx.types.get(n.input[0])
    if t is None or t[1] is None:
        raise Unsupported(f"auto_pad={mode} on an input of unknown rank")
    strides = a.get("strides") or [1] * len(kernel)
    dil = a.get("dilations") or [1] * len(kernel)
    spatial = t[1][2:]
    if not all(isinstance(d, int) or s == 1 for d, s in zip(spatial, strides)):
        return [0] * (2 * len(kernel)), _same_pad_at_run_time(ctx, x, mode, kernel, strides, dil, fill)
    begin, end = [], []
    for d, k, s, dl in zip(spatial, kernel, strides, dil):
        # stride 1: out = d, so the total is (k-1)*dl whatever d is
        total = (k - 1) * dl if s == 1 else max(0, (-(-d // s) - 1) * s + (k - 1) * dl + 1 - d)
        small, big = total // 2, total - total // 2
        begin.append(big if mode == "SAME_LOWER" else small)
        end.append(small if mode == "SAME_LOWER" else big)
    return begin + end, x


def _same_pad_at_run_time(ctx, x, mode, kernel, strides, dil, fill) -> str:
    """Pad x for SAME_* from its run-time spatial dims d: total = max(0, (ceil(d/s)-1)*s + (k-1)*dl + 1 - d)."""
    r = 2 + len(kernel)
    i64 = lambda v: ctx.const(np.array(v, np.int64))  # noqa: E731
    d = ctx.emit("Slice", [ctx.emit("Shape", [x])], {"starts": [2], "ends": [r]})
    s = i64(strides)
    out = ctx.emit("Div", [ctx.emit("Sub", [ctx.emit("Add", [d, s]), i64(1)]), s])  # ceil(d/s), d >= 0
    need = ctx.emit("Sub", [ctx.emit("Add", [ctx.emit("Mul", [ctx.emit("Sub", [out, i64(1)]), s]),
                                            i64([(k - 1) * dl + 1 for k, dl in zip(kernel, dil)])]), d])
    total = ctx.emit("Max", [need, i64(0)])
    small = ctx.emit("Div", [total, i64(2)])
    big = ctx.emit("Sub", [total, small])
    begin, end = (big, small) if mode == "SAME_LOWER" else (small, big)
    pads = ctx.emit("Concat", [i64([0, 0]), begin, i64([0, 0]), end], {"axis": 0})
    return ctx.emit("Pad", [x, pads], {"mode": "constant", "value": fill})


def _conv(op):
    def lower(ctx, n, a):
        w = ctx.value(n.input[1])
        kernel = a.get("kernel_shape") or (list(w.shape[2:]) if w is not None else None)
        if kernel is None:
            raise Unsupported(f"{op} with a run-time weight and no kernel_shape")
        if a.get("output_shape"):
            raise Unsupported("ConvTranspose output_shape")
        attrs = {k: a[k] for k in ("strides", "dilations", "group", "output_padding") if k in a}
        if op == "Conv":
            attrs.pop("output_padding", None)
        if op == "ConvTranspose" and a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            raise Unsupported(f"ConvTranspose auto_pad={a['auto_pad']}")
        pads, x = _auto_pad(ctx, n, a, kernel)
        if pads is not None:
            attrs["pads"] = list(pads)
        ctx.emit(op, [x] + [i for i in n.input[1:] if i], attrs, n.output[0])
    return lower


LOWER["Conv"] = _conv("Conv")
LOWER["ConvTranspose"] = _conv("ConvTranspose")


def _pool(op):
    def lower(ctx, n, a):
        if len(n.output) > 1 and n.output[1]:
            raise Unsupported(f"{op} indices output")
        if a.get("storage_order", 0):
            raise Unsupported(f"{op} storage_order=1")
        kernel = a["kernel_shape"]
        attrs = {"kernel_shape": kernel, "ceil_mode": a.get("ceil_mode", 0)}
        if a.get("strides"):
            attrs["strides"] = a["strides"]
        same = a.get("auto_pad") in ("SAME_UPPER", "SAME_LOWER")
        if op == "AveragePool" and not a.get("count_include_pad", 0) and same:
            t = ctx.types.get(n.input[0])
            if t is None or t[1] is None or not all(isinstance(d, int) or s == 1 for d, s in
                                                    zip(t[1][2:], a.get("strides") or [1] * len(kernel))):
                raise Unsupported(f"AveragePool auto_pad={a['auto_pad']} with a stride on symbolic dims")
        pads, x = _auto_pad(ctx, n, a, kernel, fill=-np.inf if op == "MaxPool" else 0.0)
        if pads is not None:
            attrs["pads"] = list(pads)
        if op == "MaxPool" and a.get("dilations"):
            attrs["dilations"] = a["dilations"]
        if op == "AveragePool":
            if a.get("dilations") and any(d != 1 for d in a["dilations"]):
                raise Unsupported("AveragePool with dilations")
            attrs["count_include_pad"] = a.get("count_include_pad", 0)
        ctx.emit(op, [x], attrs, n.output[0])
    return lower


LOWER["MaxPool"] = _pool("MaxPool")
LOWER["AveragePool"] = _pool("AveragePool")


def _global_max_pool(ctx, n, a):
    r = ctx.rank(n.input[0])
    if r is None:
        raise Unsupported("GlobalMaxPool on an input of unknown rank")
    ctx.emit("ReduceMax", [n.input[0]], {"axes": list(range(2, r)), "keepdims": 1}, n.output[0])


LOWER["GlobalMaxPool"] = _global_max_pool


def _batchnorm(ctx, n, a):
    if any(o for o in n.output[1:]) or a.get("training_mode", 0):
        raise Unsupported("BatchNormalization training outputs / training_mode=1")
    if a.get("spatial", 1) == 0:  # opsets 7-8: statistics per (channel, position), not per channel
        raise Unsupported("BatchNormalization spatial=0")
    ctx.emit("BatchNormalization", list(n.input[:5]), {"epsilon": a.get("epsilon", 1e-5)}, n.output[0])


LOWER["BatchNormalization"] = _batchnorm


def _instancenorm(ctx, n, a):
    s = ctx.value(n.input[1])
    c = s.shape[0] if s is not None else None
    t = ctx.types.get(n.input[0])
    if c is None and t is not None and isinstance(t[1][1], int):
        c = t[1][1]
    if c is None:
        raise Unsupported("InstanceNormalization with an unknown channel count")
    ctx.emit("GroupNorm", list(n.input[:3]), {"num_groups": int(c), "epsilon": a.get("epsilon", 1e-5)}, n.output[0])


LOWER["InstanceNormalization"] = _instancenorm


def _layernorm(ctx, n, a):
    if any(o for o in n.output[1:]):
        raise Unsupported("LayerNormalization mean/inv-std outputs")
    ctx.emit("LayerNorm", [i for i in n.input if i], {"axis": a.get("axis", -1), "epsilon": a.get("epsilon", 1e-5)},
             n.output[0])


LOWER["LayerNormalization"] = _layernorm


def _rmsnorm(ctx, n, a):
    ctx.emit("RMSNorm", list(n.input[:2]), {"axis": a.get("axis", -1), "epsilon": a.get("epsilon", 1e-5)},
             n.output[0])


LOWER["RMSNormalization"] = _rmsnorm


def _lrn(ctx, n, a):
    x = n.input[0]
    if ctx.rank(x) != 4:
        raise Unsupported("LRN on a non-4-D input")
    size = a["size"]
    dt = _np(ctx, x)
    sq = ctx.emit("Mul", [x, x])
    sq5 = ctx.emit("Unsqueeze", [sq], {"axes": [1]})
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    mean = ctx.emit("AveragePool", [sq5], {"kernel_shape": [size, 1, 1], "pads": [lo, 0, 0, hi, 0, 0],
                                           "count_include_pad": 1})
    ssum = ctx.emit("Squeeze", [mean], {"axes": [1]})  # mean over `size` = sum / size
    base = ctx.emit("Add", [ctx.const(np.array(a.get("bias", 1.0), dt)),
                            ctx.emit("Mul", [ssum, ctx.const(np.array(a.get("alpha", 1e-4), dt))])])
    ctx.emit("Div", [x, ctx.emit("Pow", [base, ctx.const(np.array(a.get("beta", 0.75), dt))])], {}, n.output[0])


LOWER["LRN"] = _lrn


def _lp_norm(ctx, n, a):
    x, p, axis = n.input[0], a.get("p", 2), a.get("axis", -1)
    if p == 2:
        norm = ctx.emit("Sqrt", [ctx.emit("ReduceSum", [ctx.emit("Mul", [x, x])], {"axes": [axis]})])
    elif p == 1:
        norm = ctx.emit("ReduceSum", [ctx.emit("Abs", [x])], {"axes": [axis]})
    else:
        raise Unsupported(f"LpNormalization p={p}")
    ctx.emit("Div", [x, norm], {}, n.output[0])


LOWER["LpNormalization"] = _lp_norm


def _attention(ctx, n, a):
    """ONNX Attention (opset 23) on 4-D [batch, heads, seq, dim] inputs -> ScaledDotProductAttention."""
    if len(n.input) > 4 and any(n.input[4:]) or any(o for o in n.output[1:]):
        raise Unsupported("Attention with past/present key-value caches")
    if a.get("softcap", 0.0) or a.get("qk_matmul_output_mode", 0):
        raise Unsupported("Attention softcap / qk_matmul_output_mode")
    q, k, v = n.input[:3]
    if any(ctx.rank(t) != 4 for t in (q, k, v)):
        raise Unsupported("Attention on 3-D inputs (q_num_heads/kv_num_heads packing)")
    tq, tk = ctx.types[q][1], ctx.types[k][1]
    if isinstance(tq[1], int) and isinstance(tk[1], int) and tq[1] != tk[1] and tk[1] != 1:
        raise Unsupported("grouped-query Attention (fewer key/value heads than query heads)")
    attrs = {"causal": a.get("is_causal", 0)}
    if "scale" in a:
        attrs["scale"] = float(a["scale"])
    ins = [q, k, v] + ([n.input[3]] if len(n.input) > 3 and n.input[3] else [])
    ctx.emit("ScaledDotProductAttention", ins, attrs, n.output[0])


LOWER["Attention"] = _attention


_RNN_ACTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"]}


def _rnn(op):
    """ONNX LSTM/GRU -> one catalogue node per output used (Y, Y_h, Y_c), inputs completed with zeros."""
    gates = 4 if op == "LSTM" else 3

    def lower(ctx, n, a):
        dirs = 2 if a.get("direction", "forward") == "bidirectional" else 1
        acts = [s.lower() for s in a.get("activations", [])]
        if acts and acts != _RNN_ACTS[op] * dirs:
            raise Unsupported(f"{op} activations {a['activations']} (only the defaults)")
        if a.get("input_forget", 0):
            raise Unsupported(f"{op} input_forget=1")
        if len(n.input) > 4 and n.input[4]:
            raise Unsupported(f"{op} sequence_lens")
        x, w, r = n.input[:3]
        rt = ctx.types.get(r)
        if rt is None or rt[1] is None or not isinstance(rt[1][2], int):
            raise Unsupported(f"{op} with a recurrence weight of unknown shape")
        h = int(a.get("hidden_size", rt[1][2]))
        dt = _np(ctx, x)
        layout = a.get("layout", 0)
        if layout:  # batch first: [batch, seq, in] and [batch, dirs, hidden]
            x = ctx.emit("Transpose", [x], {"perm": [1, 0, 2]})
        given = lambda i: n.input[i] if len(n.input) > i and n.input[i] else None  # noqa: E731
        b = given(3) or ctx.const(np.zeros((dirs, 2 * gates * h), dt))
        states = []
        for i in ((5, 6) if op == "LSTM" else (5,)):
            s = given(i)
            if s is None:  # zeros [dirs, batch, hidden], the batch taken from x at run time
                batch = ctx.emit("Slice", [ctx.emit("Shape", [x])], {"starts": [1], "ends": [2]})
                shape = ctx.emit("Concat", [ctx.const(np.array([dirs], np.int64)), batch,
                                            ctx.const(np.array([h], np.int64))], {"axis": 0})
                s = ctx.emit("ConstantOfShape", [shape], {"value": 0.0, "dtype": ctx.dtype(n.input[0]) or "f32"})
            elif layout:
                s = ctx.emit("Transpose", [s], {"perm": [1, 0, 2]})
            states.append(s)
        ins = [x, w, r, b] + states
        if op == "LSTM":
            ins.append(given(7) or ctx.const(np.zeros((dirs, 3 * h), dt)))
        attrs = {"hidden_size": h, "direction": a.get("direction", "forward")}
        if a.get("clip") is not None:
            attrs["clip"] = float(a["clip"])
        if op == "GRU":
            attrs["linear_before_reset"] = a.get("linear_before_reset", 0)
        for out, kind in zip(n.output, ("Y", "Y_h", "Y_c")):
            if not out:
                continue
            if not layout:
                ctx.emit(op, ins, {**attrs, "output": kind}, out)
                continue
            y = ctx.emit(op, ins, {**attrs, "output": kind})
            ctx.emit("Transpose", [y], {"perm": [2, 0, 1, 3] if kind == "Y" else [1, 0, 2]}, out)

    return lower


LOWER["LSTM"] = _rnn("LSTM")
LOWER["GRU"] = _rnn("GRU")


def _dynamic_quantize_linear(ctx, n, a):
    """uint8 quantization with the scale and zero point of x's own range (which always includes 0)."""
    x = n.input[0]
    zero, f255 = ctx.const(np.float32(0)), ctx.const(np.float32(255))
    lo = ctx.emit("Min", [ctx.emit("ReduceMin", [x], {"keepdims": 0}), zero])
    hi = ctx.emit("Max", [ctx.emit("ReduceMax", [x], {"keepdims": 0}), zero])
    scale = ctx.emit("Div", [ctx.emit("Sub", [hi, lo]), f255], {}, n.output[1] if len(n.output) > 1 else None)
    zp = ctx.emit("Clip", [ctx.emit("Round", [ctx.emit("Sub", [zero, ctx.emit("Div", [lo, scale])])])],
                  {"min": 0.0, "max": 255.0})
    if len(n.output) > 2 and n.output[2]:
        ctx.emit("Cast", [zp], {"to": "u8"}, n.output[2])
    q = ctx.emit("Add", [ctx.emit("Round", [ctx.emit("Div", [x, scale])]), zp])
    ctx.emit("Cast", [ctx.emit("Clip", [q], {"min": 0.0, "max": 255.0})], {"to": "u8"}, n.output[0])


def _matmul_integer(ctx, n, a):
    """(A - a_zp) @ (B - b_zp) accumulated exactly in int32, as ONNX defines it."""
    def centred(i):
        v = ctx.emit("Cast", [n.input[i]], {"to": "i32"})
        if len(n.input) > i + 2 and n.input[i + 2]:
            zp = ctx.emit("Cast", [n.input[i + 2]], {"to": "i32"})
            if i == 0 and ctx.rank(n.input[2]) == 1 and ctx.types[n.input[2]][1][0] != 1:
                zp = ctx.emit("Unsqueeze", [zp], {"axes": [-1]})  # per-row zero points of A
            v = ctx.emit("Sub", [v, zp])
        return v
    ctx.emit("MatMul", [centred(0), centred(1)], {}, n.output[0])


LOWER["DynamicQuantizeLinear"] = _dynamic_quantize_linear
LOWER["MatMulInteger"] = _matmul_integer


def _conv_integer(ctx, n, a):
    """(x - x_zp) conv (w - w_zp) in float64, where every int32 ONNX sum is exact, then int32."""
    w = ctx.value(n.input[1])
    kernel = a.get("kernel_shape") or (list(w.shape[2:]) if w is not None else None)
    if kernel is None:
        raise Unsupported("ConvInteger with a run-time weight and no kernel_shape")

    def centred(i, per_channel_rank=None):
        v = ctx.emit("Cast", [n.input[i]], {"to": "f64"})
        if len(n.input) > i + 2 and n.input[i + 2]:
            zp = ctx.emit("Cast", [n.input[i + 2]], {"to": "f64"})
            if per_channel_rank and ctx.rank(n.input[i + 2]) == 1:  # one zero point per output channel
                zp = ctx.emit("Reshape", [zp], {"shape": [-1] + [1] * (per_channel_rank - 1)})
            v = ctx.emit("Sub", [v, zp])
        return v

    xf, wf = centred(0), centred(1, 2 + len(kernel))
    # the centred input pads with 0, i.e. the raw input with its zero point
    pads, xf = _auto_pad(ctx, n, a, kernel, x=xf)
    attrs = {k: a[k] for k in ("strides", "dilations", "group") if k in a}
    if pads is not None:
        attrs["pads"] = list(pads)
    ctx.emit("Cast", [ctx.emit("Conv", [xf, wf], attrs)], {"to": "i32"}, n.output[0])


LOWER["ConvInteger"] = _conv_integer


def _requantize(ctx, acc: str, scale: str, zp: str, out: str) -> None:
    """saturate(round_half_even(float(acc) * scale) + zp), onnxruntime's float32 requantization."""
    out_t = ctx.dtype(zp)
    if out_t not in ("u8", "i8"):
        raise Unsupported(f"requantization to {out_t}")
    lo, hi = _QRANGE[out_t]
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
    _matmul_integer(ctx, _Fake([a_, b, a_zp, b_zp], [acc]), {})
    _requantize(ctx, acc, _qlinear_scale(ctx, a_s, b_s, y_s), y_zp, n.output[0])


def _qlinear_conv(ctx, n, a):
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp = n.input[:8]
    r = ctx.rank(x)
    if r is None:
        raise Unsupported("QLinearConv on an input of unknown rank")
    acc = ctx.fresh("qlinear_acc")
    _conv_integer(ctx, _Fake([x, w, x_zp, w_zp], [acc]), a)
    if len(n.input) > 8 and n.input[8]:  # int32 bias, added before requantization
        acc = ctx.emit("Add", [acc, ctx.emit("Reshape", [n.input[8]], {"shape": [-1] + [1] * (r - 2)})])
    _requantize(ctx, acc, _qlinear_scale(ctx, x_s, w_s, y_s, r), y_zp, n.output[0])


LOWER["QLinearMatMul"] = _qlinear_matmul
LOWER["QLinearConv"] = _qlinear_conv
