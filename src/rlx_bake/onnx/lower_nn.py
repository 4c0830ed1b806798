"""Lowerings: Gemm, convolution, pooling, normalization, LRN, QDQ (Quantize/DequantizeLinear), Attention and
RotaryEmbedding."""

from __future__ import annotations

import numpy as np

from .context import LOWER, Unsupported, ONNX_DTYPES, numpy_dtype


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


QUANT_RANGE = {"u8": (0, 255), "i8": (-128, 127), "i16": (-32768, 32767), "i32": (-(2**31), 2**31 - 1)}


def _quantize_linear(ctx, n, a):
    if a.get("block_size", 0):
        raise Unsupported("QuantizeLinear block_size")
    x, scale = n.input[0], n.input[1]
    has_zp = len(n.input) > 2 and n.input[2]
    out_t = ctx.dtype(n.input[2]) if has_zp else ONNX_DTYPES.get(a.get("output_dtype", 2), "u8")
    if out_t not in QUANT_RANGE:
        raise Unsupported(f"QuantizeLinear to {out_t}")
    q = ctx.emit("Round", [ctx.emit("Div", [x, _per_axis(ctx, n, a, scale, x)])])  # half to even, as ONNX
    if has_zp:
        q = ctx.emit("Add", [q, ctx.emit("Cast", [_per_axis(ctx, n, a, n.input[2], x)], {"to": ctx.dtype(x) or "f32"})])
    lo, hi = QUANT_RANGE[out_t]
    ctx.emit("Cast", [ctx.emit("Clip", [q], {"min": float(lo), "max": float(hi)})], {"to": out_t}, n.output[0])


LOWER["DequantizeLinear"] = _dequantize_linear
LOWER["QuantizeLinear"] = _quantize_linear


def _gemm(ctx, n, a):
    A, B = n.input[0], n.input[1]
    if a.get("transA", 0):
        A = ctx.emit("Transpose", [A], {"perm": [1, 0]})
    if a.get("transB", 0):
        B = ctx.emit("Transpose", [B], {"perm": [1, 0]})
    dt = numpy_dtype(ctx, n.input[0])
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


def auto_pad(ctx, n, a, kernel, fill: float = 0.0, x: str | None = None) -> tuple[list[int] | None, str]:
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


def conv_kernel(ctx, n, a, op: str) -> list[int]:
    """A convolution's kernel dims: the kernel_shape attr, else the constant weight's spatial dims."""
    w = ctx.value(n.input[1])
    kernel = a.get("kernel_shape") or (list(w.shape[2:]) if w is not None else None)
    if kernel is None:
        raise Unsupported(f"{op} with a run-time weight and no kernel_shape")
    return kernel


def _conv(op):
    def lower(ctx, n, a):
        kernel = conv_kernel(ctx, n, a, op)
        if a.get("output_shape"):
            raise Unsupported("ConvTranspose output_shape")
        attrs = {k: a[k] for k in ("strides", "dilations", "group", "output_padding") if k in a}
        if op == "Conv":
            attrs.pop("output_padding", None)
        if op == "ConvTranspose" and a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            raise Unsupported(f"ConvTranspose auto_pad={a['auto_pad']}")
        pads, x = auto_pad(ctx, n, a, kernel)
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
        pads, x = auto_pad(ctx, n, a, kernel, fill=-np.inf if op == "MaxPool" else 0.0)
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


def _groupnormalization(ctx, n, a):
    """GroupNormalization (torch's dynamo exporter writes it for nn.GroupNorm at opset 21). Opset 21 scales
    and shifts per channel ([C]); opsets 18-20 per group ([num_groups]): there x is viewed as [N, G, rest], so
    each group is one channel of GroupNorm, and viewed back."""
    g, eps = a["num_groups"], a.get("epsilon", 1e-5)
    x, scale, bias = n.input[:3]
    if ctx.opset >= 21:
        ctx.emit("GroupNorm", [x, scale, bias], {"num_groups": g, "epsilon": eps}, n.output[0])
        return
    t = ctx.types.get(x)
    c = t[1][1] if t is not None and t[1] is not None and len(t[1]) > 1 else None
    if isinstance(c, int) and c % g:  # the view below would hide it until run time
        raise ValueError(f"{c} channels are not divisible by num_groups {g}")
    grouped = ctx.emit("Reshape", [x], {"shape": [0, g, -1]})
    y = ctx.emit("GroupNorm", [grouped, scale, bias], {"num_groups": g, "epsilon": eps})
    ctx.emit("Reshape", [y, ctx.emit("Shape", [x])], {}, n.output[0])


LOWER["GroupNormalization"] = _groupnormalization


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
    dt = numpy_dtype(ctx, x)
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


def _heads_4d(ctx, x: str, heads: int) -> str:
    """[batch, seq, heads * dim] -> [batch, heads, seq, dim] (Attention's 3-D form)."""
    return ctx.emit("Transpose", [ctx.emit("Reshape", [x], {"shape": [0, 0, heads, -1]})], {"perm": [0, 2, 1, 3]})


def _dim(ctx, x: str, axis: int) -> int | None:
    """A dim of x known at import time, else None."""
    t = ctx.types.get(x)
    d = None if t is None or t[1] is None else t[1][axis]
    return d if isinstance(d, int) else None


def _attention(ctx, n, a):
    """ONNX Attention (opset 23) -> ScaledDotProductAttention. 4-D [batch, heads, seq, dim] inputs, or 3-D
    [batch, seq, heads * dim] with q_num_heads/kv_num_heads; fewer key/value heads than query heads (grouped-
    query: each key/value head serves a group of query heads); the KV-cache form: past_key/past_value in front
    of the new keys/values, the concatenation out as present_key/present_value, and is_causal aligned to the
    end (query i attends keys up to past + i), as onnxruntime and onnx's reference evaluator do."""
    ins = list(n.input) + [""] * (6 - len(n.input))
    q, k, v, mask, past_k, past_v = ins[:6]
    if any(ins[6:]) or any(o for o in n.output[3:]):
        raise Unsupported("Attention nonpad_kv_seqlen / qk_matmul_output")
    if a.get("softcap", 0.0) or a.get("qk_matmul_output_mode", 0):
        raise Unsupported("Attention softcap / qk_matmul_output_mode")
    if bool(past_k) != bool(past_v):
        raise Unsupported("Attention with only one of past_key / past_value")
    rank = ctx.rank(q)
    if rank not in (3, 4) or ctx.rank(k) != rank or ctx.rank(v) != rank:
        raise Unsupported("Attention on inputs of unknown or mixed rank (3-D or 4-D expected)")
    if rank == 3:
        hq, hk = a.get("q_num_heads", 0), a.get("kv_num_heads", 0)
        if not hq or not hk:
            raise Unsupported("Attention on 3-D inputs without q_num_heads and kv_num_heads")
        q, k, v = _heads_4d(ctx, q, hq), _heads_4d(ctx, k, hk), _heads_4d(ctx, v, hk)
        dk, dv = (None if w is None else w // hk for w in (_dim(ctx, ins[1], 2), _dim(ctx, ins[2], 2)))
    else:  # unknown head counts: taken as equal (SDPA's shape check names a mismatch at run time)
        hq, hk, dk, dv = _dim(ctx, q, 1), _dim(ctx, k, 1), _dim(ctx, k, 3), _dim(ctx, v, 3)
    if past_k:
        k = ctx.emit("Concat", [past_k, k], {"axis": 2}, n.output[1] if len(n.output) > 1 and n.output[1] else None)
        v = ctx.emit("Concat", [past_v, v], {"axis": 2}, n.output[2] if len(n.output) > 2 and n.output[2] else None)
    elif any(o for o in n.output[1:3]):  # no past: the presents are the new keys/values
        for i, t in ((1, k), (2, v)):
            if len(n.output) > i and n.output[i]:
                ctx.emit("Identity", [t], {}, n.output[i])
    if hq is not None and hk is not None and hq != hk:
        if hq % hk:
            raise Unsupported(f"Attention with {hq} query heads and {hk} key/value heads (not a multiple)")
        if dk is None or dv is None:
            raise Unsupported("grouped-query Attention with a key/value head size unknown at import time")
        group = ctx.const(np.array([1, 1, hq // hk, 1, 1], np.int64))

        def repeat(t, d):  # [b, hk, L, d] -> [b, hk, group, L, d] -> [b, hq, L, d]
            wide = ctx.emit("Expand", [ctx.emit("Unsqueeze", [t], {"axes": [2]}), group])
            return ctx.emit("Reshape", [wide], {"shape": [0, hq, -1, d]})
        k, v = repeat(k, dk), repeat(v, dv)
    attrs = {}
    if "scale" in a:
        attrs["scale"] = float(a["scale"])
    if a.get("is_causal", 0) and past_k:  # bottom-right: query i at position past + i
        qlen = ctx.emit("Gather", [ctx.emit("Shape", [q]), ctx.const(np.array(2, np.int64))], {"axis": 0})
        plen = ctx.emit("Gather", [ctx.emit("Shape", [past_k]), ctx.const(np.array(2, np.int64))], {"axis": 0})
        klen = ctx.emit("Gather", [ctx.emit("Shape", [k]), ctx.const(np.array(2, np.int64))], {"axis": 0})
        zero, one = ctx.const(np.array(0, np.int64)), ctx.const(np.array(1, np.int64))
        qpos = ctx.emit("Unsqueeze", [ctx.emit("Add", [ctx.emit("Range", [zero, qlen, one]), plen])], {"axes": [1]})
        causal = ctx.emit("LessEqual", [ctx.emit("Range", [zero, klen, one]), qpos])  # [Lq, Lk]
        if not mask:
            mask = causal
        elif ctx.dtype(mask) == "bool":
            mask = ctx.emit("And", [mask, causal])
        else:
            dt = numpy_dtype(ctx, q)
            bias = ctx.emit("Where", [causal, ctx.const(np.array(0, dt)), ctx.const(np.array(-np.inf, dt))])
            mask = ctx.emit("Add", [mask, bias])
    elif a.get("is_causal", 0):
        attrs["causal"] = 1
    out = ctx.emit("ScaledDotProductAttention", [q, k, v] + ([mask] if mask else []), attrs,
                   None if rank == 3 else n.output[0])
    if rank == 3:
        ctx.emit("Reshape", [ctx.emit("Transpose", [out], {"perm": [0, 2, 1, 3]})], {"shape": [0, 0, -1]},
                 n.output[0])


LOWER["Attention"] = _attention


def _rotary_embedding(ctx, n, a):
    """ONNX RotaryEmbedding (opset 23): x [batch, heads, seq, head] (or [batch, seq, heads*head] with num_heads),
    cos/sin caches [batch, seq, rot/2] (or [positions, rot/2] indexed by position_ids); the first rot features
    of each head rotate as (x1, x2) pairs, halves (or even/odd features with interleaved=1), the rest pass."""
    x, cos, sin = n.input[:3]
    pos = n.input[3] if len(n.input) > 3 and n.input[3] else None
    t = ctx.types.get(x)
    if t is None or t[1] is None or len(t[1]) not in (3, 4) or not isinstance(t[1][-1], int):
        raise Unsupported("RotaryEmbedding on an input whose rank (3 or 4) or last dim is unknown at import time")
    heads = a.get("num_heads", 0)
    if len(t[1]) == 3:
        if not heads or t[1][-1] % heads:
            raise Unsupported(f"RotaryEmbedding on a 3-D input needs num_heads dividing its last dim {t[1][-1]}")
        head = t[1][-1] // heads
        xh = ctx.emit("Reshape", [x], {"shape": [0, 0, heads, head]})  # [batch, seq, heads, head]
        head_axis = 2
    else:
        head, xh, head_axis = t[1][-1], x, 1
    rot = a.get("rotary_embedding_dim", 0) or head
    if rot % 2 or rot > head:
        raise Unsupported(f"RotaryEmbedding rotary_embedding_dim {rot} (even, at most the head size {head})")
    half = rot // 2

    def table(c):  # [batch, seq, rot/2] with a unit heads axis, broadcasting over the heads
        if pos is not None:
            c = ctx.emit("Gather", [c, pos], {"axis": 0})
        c = ctx.emit("Slice", [c], {"starts": [0], "ends": [half], "axes": [-1]})
        return ctx.emit("Unsqueeze", [c], {"axes": [head_axis]})

    c, s = table(cos), table(sin)
    if a.get("interleaved", 0):
        x1 = ctx.emit("Slice", [xh], {"starts": [0], "ends": [rot], "axes": [-1], "steps": [2]})
        x2 = ctx.emit("Slice", [xh], {"starts": [1], "ends": [rot], "axes": [-1], "steps": [2]})
    else:
        x1 = ctx.emit("Slice", [xh], {"starts": [0], "ends": [half], "axes": [-1]})
        x2 = ctx.emit("Slice", [xh], {"starts": [half], "ends": [rot], "axes": [-1]})
    real = ctx.emit("Sub", [ctx.emit("Mul", [c, x1]), ctx.emit("Mul", [s, x2])])
    imag = ctx.emit("Add", [ctx.emit("Mul", [s, x1]), ctx.emit("Mul", [c, x2])])
    if a.get("interleaved", 0):  # pairs back in place: [..., rot/2, 2] -> [..., rot]
        pair = ctx.emit("Concat", [ctx.emit("Unsqueeze", [real], {"axes": [-1]}),
                                   ctx.emit("Unsqueeze", [imag], {"axes": [-1]})], {"axis": -1})
        parts = [ctx.emit("Reshape", [pair], {"shape": [0, 0, 0, rot]})]
    else:
        parts = [real, imag]
    if rot < head:
        parts.append(ctx.emit("Slice", [xh], {"starts": [rot], "ends": [head], "axes": [-1]}))
    if len(t[1]) == 3:
        ctx.emit("Reshape", [ctx.emit("Concat", parts, {"axis": -1})], {"shape": [0, 0, -1]}, n.output[0])
    else:
        ctx.emit("Concat", parts, {"axis": -1}, n.output[0])


LOWER["RotaryEmbedding"] = _rotary_embedding
