"""The op table: one short kernel per op, written against an array module `xp`.

Signature: kernel(xp, attrs, *inputs) -> array. `attrs` is the catalogue-normalized dict
(plus private keys set at compile, e.g. `_rng`). numpy is the reference; cupy runs the same
code. Semantics are those of spec/ops.md.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable

import numpy as np

from rlx_format.dtypes import NUMPY_DTYPES, bf16_to_f32, compute_dtype, f32_to_bf16
from rlx_format.errors import RlxError
from rlx_format.ops import OPS, slice_bounds, window_count

Kernel = Callable[..., object]
KERNELS: dict[str, Kernel] = {}


def kernel(*names: str):
    def deco(fn):
        for n in names:
            KERNELS[n] = fn
        return fn
    return deco


def host_ints(xp, a) -> list[int]:
    """Values of a small integer tensor as Python ints (syncs on GPU)."""
    if xp is not np and hasattr(a, "get"):
        a = a.get()
    return [int(v) for v in np.asarray(a).ravel()]


def special(xp):
    if xp is np:
        import scipy.special as sp
        return sp
    import cupyx.scipy.special as sp  # pragma: no cover - GPU only
    return sp


# ------------------------------------------------------------------ elementwise


def _erf(xp, x):
    if xp is np:
        from .ufuncs import erf
        return erf(x)
    return special(xp).erf(x)  # pragma: no cover - GPU only


def _unary(name: str, fn):
    KERNELS[name] = lambda xp, a, x: fn(xp, x)


_unary("Identity", lambda xp, x: x)
_unary("Neg", lambda xp, x: -x)
_unary("Abs", lambda xp, x: xp.abs(x))
_unary("Exp", lambda xp, x: xp.exp(x))
_unary("Log", lambda xp, x: xp.log(x))
_unary("Sqrt", lambda xp, x: xp.sqrt(x))
_unary("Rsqrt", lambda xp, x: x.dtype.type(1) / xp.sqrt(x))
_unary("Reciprocal", lambda xp, x: x.dtype.type(1) / x)
_unary("Sin", lambda xp, x: xp.sin(x))
_unary("Cos", lambda xp, x: xp.cos(x))
_unary("Tan", lambda xp, x: xp.tan(x))
_unary("Tanh", lambda xp, x: xp.tanh(x))
_unary("Sigmoid", lambda xp, x: special(xp).expit(x))
_unary("Relu", lambda xp, x: xp.maximum(x, x.dtype.type(0)))
_unary("Silu", lambda xp, x: x * special(xp).expit(x))
_unary("Softplus", lambda xp, x: xp.logaddexp(x.dtype.type(0), x))
_unary("Softsign", lambda xp, x: x / (x.dtype.type(1) + xp.abs(x)))
_unary("Erf", lambda xp, x: _erf(xp, x))
_unary("Floor", lambda xp, x: xp.floor(x))
_unary("Ceil", lambda xp, x: xp.ceil(x))
_unary("Round", lambda xp, x: xp.round(x))  # half to even
_unary("Asin", lambda xp, x: xp.arcsin(x))
_unary("Acos", lambda xp, x: xp.arccos(x))
_unary("Atan", lambda xp, x: xp.arctan(x))
_unary("Sinh", lambda xp, x: xp.sinh(x))
_unary("Cosh", lambda xp, x: xp.cosh(x))
_unary("Asinh", lambda xp, x: xp.arcsinh(x))
_unary("Acosh", lambda xp, x: xp.arccosh(x))
_unary("Atanh", lambda xp, x: xp.arctanh(x))
_unary("Sign", lambda xp, x: xp.sign(x))
_unary("Not", lambda xp, x: xp.logical_not(x))


@kernel("LeakyRelu")
def _leaky(xp, a, x):
    return xp.where(x >= 0, x, x * x.dtype.type(a["alpha"]))


@kernel("Elu")
def _elu(xp, a, x):
    return xp.where(x > 0, x, x.dtype.type(a["alpha"]) * xp.expm1(xp.minimum(x, x.dtype.type(0))))


@kernel("Selu")
def _selu(xp, a, x):
    t = x.dtype.type
    neg = t(a["alpha"]) * xp.expm1(xp.minimum(x, t(0)))
    return t(a["gamma"]) * xp.where(x > 0, x, neg)


@kernel("Gelu")
def _gelu(xp, a, x):
    t = x.dtype.type
    if a["approximate"] == "tanh":
        inner = t(math.sqrt(2.0 / math.pi)) * (x + t(0.044715) * x * x * x)
        return t(0.5) * x * (t(1) + xp.tanh(inner))
    if xp is np:
        from .ufuncs import gelu_erf
        return gelu_erf(x)
    return t(0.5) * x * (t(1) + special(xp).erf(x / t(math.sqrt(2.0))))  # pragma: no cover - GPU only


@kernel("Clip")
def _clip(xp, a, x, lo=None, hi=None):
    lo = a["min"] if lo is None else lo
    hi = a["max"] if hi is None else hi
    if lo is not None:
        x = xp.maximum(x, xp.asarray(lo, dtype=x.dtype))
    if hi is not None:
        x = xp.minimum(x, xp.asarray(hi, dtype=x.dtype))
    return x


@kernel("Cast")
def _cast(xp, a, x):
    to = a["to"]
    if to == "bf16":  # runtime carries bf16 widened to f32, rounded to bf16 precision
        bits = f32_to_bf16(x.astype(np.float32) if xp is np else x.astype(xp.float32).get())
        return xp.asarray(bf16_to_f32(bits))
    if to == "bool":
        return x != 0
    return x.astype(compute_dtype(to))


KERNELS["Add"] = lambda xp, a, x, y: x + y
KERNELS["Sub"] = lambda xp, a, x, y: x - y
KERNELS["Mul"] = lambda xp, a, x, y: x * y
KERNELS["Max"] = lambda xp, a, x, y: xp.maximum(x, y)
KERNELS["Min"] = lambda xp, a, x, y: xp.minimum(x, y)
KERNELS["Pow"] = lambda xp, a, x, y: xp.power(x, y)
KERNELS["Equal"] = lambda xp, a, x, y: x == y
KERNELS["Less"] = lambda xp, a, x, y: x < y
KERNELS["LessEqual"] = lambda xp, a, x, y: x <= y
KERNELS["Greater"] = lambda xp, a, x, y: x > y
KERNELS["GreaterEqual"] = lambda xp, a, x, y: x >= y
KERNELS["And"] = lambda xp, a, x, y: xp.logical_and(x, y)
KERNELS["Or"] = lambda xp, a, x, y: xp.logical_or(x, y)
KERNELS["Where"] = lambda xp, a, c, x, y: xp.where(c, x, y)


@kernel("Div")
def _div(xp, a, x, y):
    if x.dtype.kind in "iu":  # integer division truncates toward zero (C / ONNX semantics)
        q = xp.abs(x) // xp.abs(y)
        return (q * (xp.sign(x) * xp.sign(y))).astype(x.dtype)
    return x / y


@kernel("Mod")
def _mod(xp, a, x, y):
    return xp.fmod(x, y) if a["fmod"] else xp.mod(x, y)


# ------------------------------------------------------------------ reductions


def _axes(a, x):
    return None if a["axes"] is None else tuple(a["axes"])


def _reducer(name, fn):
    KERNELS[name] = lambda xp, a, x: fn(xp, x, axis=_axes(a, x), keepdims=bool(a["keepdims"]))


_reducer("ReduceSum", lambda xp, x, **k: xp.sum(x, dtype=x.dtype, **k))
_reducer("ReduceMean", lambda xp, x, **k: xp.mean(x, dtype=x.dtype, **k) if x.dtype.kind == "f"
         else xp.mean(x, **k).astype(x.dtype))  # integer mean truncates toward zero
_reducer("ReduceMax", lambda xp, x, **k: xp.max(x, **k))
_reducer("ReduceMin", lambda xp, x, **k: xp.min(x, **k))
_reducer("ReduceProd", lambda xp, x, **k: xp.prod(x, dtype=x.dtype, **k))


def _argk(fn_name):
    def k(xp, a, x):
        fn = getattr(xp, fn_name)
        ax = a["axis"] % x.ndim
        if a["select_last_index"]:
            flipped = xp.flip(x, axis=ax)
            r = x.shape[ax] - 1 - fn(flipped, axis=ax)
        else:
            r = fn(x, axis=ax)
        r = r.astype(np.int64)
        return xp.expand_dims(r, ax) if a["keepdims"] else r
    return k


KERNELS["ArgMax"] = _argk("argmax")
KERNELS["ArgMin"] = _argk("argmin")


@kernel("Softmax")
def _softmax(xp, a, x):
    e = xp.exp(x - xp.max(x, axis=a["axis"], keepdims=True))
    return e / xp.sum(e, axis=a["axis"], keepdims=True)


@kernel("LogSoftmax")
def _log_softmax(xp, a, x):
    s = x - xp.max(x, axis=a["axis"], keepdims=True)
    return s - xp.log(xp.sum(xp.exp(s), axis=a["axis"], keepdims=True))


@kernel("CumSum")
def _cumsum(xp, a, x):
    ax = a["axis"]
    if a["reverse"]:
        x = xp.flip(x, axis=ax)
    c = xp.cumsum(x, axis=ax, dtype=x.dtype)
    if a["exclusive"]:
        c = c - x
    return xp.flip(c, axis=ax) if a["reverse"] else c


# ------------------------------------------------------------------ data movement


def resolve_reshape(in_shape: tuple, target: list[int]) -> tuple:
    out = [in_shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(in_shape) // known if known else 0
    return tuple(out)


@kernel("Reshape")
def _reshape(xp, a, x, shape=None):
    target = a["shape"] if shape is None else host_ints(xp, shape)
    return x.reshape(resolve_reshape(x.shape, target))


@kernel("Transpose")
def _transpose(xp, a, x):
    return xp.transpose(x, a["perm"])


@kernel("Concat")
def _concat(xp, a, *xs):
    return xp.concatenate(xs, axis=a["axis"])


@kernel("Slice")
def _slice(xp, a, x):
    idx = [slice(None)] * x.ndim
    axes = a["axes"] if a["axes"] is not None else range(len(a["starts"]))
    steps = a["steps"] or [1] * len(a["starts"])
    for s, e, ax, st in zip(a["starts"], a["ends"], axes, steps):
        if x.shape[ax] == 0:
            continue
        start, stop = slice_bounds(x.shape[ax], s, e, st)
        idx[ax] = slice(start, None if stop < 0 else stop, st)  # stop -1 means "before index 0"
    return x[tuple(idx)]


@kernel("Gather")
def _gather(xp, a, x, idx):
    return xp.take(x, idx.astype(np.int64), axis=a["axis"])


@kernel("Expand")
def _expand(xp, a, x, shape=None):
    target = tuple(a["shape"] if shape is None else host_ints(xp, shape))
    out_shape = np.broadcast_shapes(x.shape, target)
    return xp.broadcast_to(x, out_shape).copy()


@kernel("Tile")
def _tile(xp, a, x, reps=None):
    return xp.tile(x, tuple(a["repeats"] if reps is None else host_ints(xp, reps)))


@kernel("Squeeze")
def _squeeze(xp, a, x):
    return xp.squeeze(x, axis=None if a["axes"] is None else tuple(a["axes"]))


@kernel("Unsqueeze")
def _unsqueeze(xp, a, x):
    r = x.ndim + len(a["axes"])
    return xp.expand_dims(x, tuple(sorted(ax % r for ax in a["axes"])))


@kernel("Flatten")
def _flatten(xp, a, x):
    ax = a["axis"] % (x.ndim + 1) if a["axis"] < 0 else a["axis"]
    return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))


@kernel("Pad")
def _pad(xp, a, x):
    r = x.ndim
    pads = a["pads"]
    # negative pads crop first
    crop = tuple(slice(max(-pads[i], 0), x.shape[i] - max(-pads[i + r], 0)) for i in range(r))
    x = x[crop]
    width = [(max(pads[i], 0), max(pads[i + r], 0)) for i in range(r)]
    if a["mode"] == "constant":
        return xp.pad(x, width, mode="constant", constant_values=x.dtype.type(a["value"]))
    return xp.pad(x, width, mode=a["mode"])


@kernel("Shape")
def _shape(xp, a, x):
    return xp.asarray(x.shape, dtype=np.int64)


@kernel("Range")
def _range(xp, a, start, limit, delta):
    s, l, d = (v.item() for v in (start, limit, delta))
    n = max(int(math.ceil((l - s) / d)), 0)
    return (s + d * xp.arange(n, dtype=np.float64 if start.dtype.kind == "f" else np.int64)).astype(start.dtype)


@kernel("ConstantOfShape")
def _constant_of_shape(xp, a, shape=None):
    target = tuple(a["shape"] if shape is None else host_ints(xp, shape))
    return xp.full(target, a["value"], dtype=compute_dtype(a["dtype"]))


@kernel("DepthToSpace")
def _d2s(xp, a, x):
    n, c, h, w = x.shape
    b = a["blocksize"]
    if a["mode"] == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


def _resize_coords(xp, a, d_in: int, d_out: int, scale: float):
    """Source coordinate of every output index along one axis (ONNX coordinate_transformation_mode)."""
    i = xp.arange(d_out, dtype=np.float64)
    mode = a["coordinate_transformation_mode"]
    if mode == "align_corners":
        return i * ((d_in - 1) / (d_out - 1)) if d_out > 1 else xp.zeros(d_out)
    if mode == "asymmetric":
        return i / scale
    if mode == "pytorch_half_pixel" and d_out == 1:
        return xp.zeros(1)
    return (i + 0.5) / scale - 0.5


def _nearest(xp, a, c):
    m = a["nearest_mode"]
    if m == "floor":
        return xp.floor(c)
    if m == "ceil":
        return xp.ceil(c)
    half = (c - xp.floor(c)) == 0.5
    if m == "round_prefer_floor":
        return xp.where(half, xp.floor(c), xp.round(c))
    return xp.where(half, xp.ceil(c), xp.round(c))


@kernel("Resize")
def _resize(xp, a, x):
    """Separable resize, one axis at a time: nearest is a gather, linear a weighted pair of gathers."""
    sizes = a["sizes"] or [int(math.floor(d * s)) for d, s in zip(x.shape, a["scales"])]
    scales = a["scales"] or [o / d for o, d in zip(sizes, x.shape)]
    if list(x.shape) == list(sizes):  # same output shape: a copy, whatever the scales (as onnxruntime does)
        return x.copy()
    y = x
    for ax, (d_in, d_out, sc) in enumerate(zip(x.shape, sizes, scales)):
        if d_in == d_out and sc == 1:
            continue
        c = _resize_coords(xp, a, d_in, d_out, sc)
        if a["mode"] == "nearest":
            idx = xp.clip(_nearest(xp, a, c), 0, d_in - 1).astype(np.int64)
            y = xp.take(y, idx, axis=ax)
            continue
        c = xp.clip(c, 0, d_in - 1)
        lo = xp.floor(c).astype(np.int64)
        hi = xp.minimum(lo + 1, d_in - 1)
        w = (c - lo).astype(x.dtype).reshape((-1,) + (1,) * (y.ndim - ax - 1))
        y = xp.take(y, lo, axis=ax) * (x.dtype.type(1) - w) + xp.take(y, hi, axis=ax) * w
    return y


# ------------------------------------------------------------------ NN


KERNELS["MatMul"] = lambda xp, a, x, y: xp.matmul(x, y)


@kernel("Trilu")
def _trilu(xp, a, x):
    return xp.triu(x, a["k"]) if a["upper"] else xp.tril(x, a["k"])


@kernel("GatherElements")
def _gather_elements(xp, a, x, idx):
    ax = a["axis"] % x.ndim
    i = idx.astype(np.int64)
    return xp.take_along_axis(x, xp.where(i < 0, i + x.shape[ax], i), axis=ax)


_SCATTER_UFUNC = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


@kernel("ScatterND")
def _scatter_nd(xp, a, x, idx, upd):
    out = x.copy()
    k = idx.shape[-1]
    flat_idx = idx.reshape(-1, k).astype(np.int64)
    flat_idx = xp.where(flat_idx < 0, flat_idx + xp.asarray(x.shape[:k]), flat_idx)
    target = tuple(flat_idx[:, j] for j in range(k))
    vals = upd.reshape((-1,) + x.shape[k:])
    if a["reduction"] == "none":
        out[target] = vals  # duplicate indices: the last update wins (ONNX leaves the order undefined)
    else:
        getattr(xp, _SCATTER_UFUNC[a["reduction"]]).at(out, target, vals)
    return out


@kernel("ScatterElements")
def _scatter_elements(xp, a, x, idx, upd):
    out = x.copy()
    ax = a["axis"] % x.ndim
    i = idx.astype(np.int64)
    i = xp.where(i < 0, i + x.shape[ax], i)
    grid = list(xp.indices(idx.shape, sparse=True))
    grid[ax] = i
    if a["reduction"] == "none":
        out[tuple(grid)] = upd
    else:
        getattr(xp, _SCATTER_UFUNC[a["reduction"]]).at(out, tuple(grid), upd)
    return out


@kernel("TopK")
def _topk(xp, a, x):
    """The k largest (smallest) along axis, sorted; ties keep the lower index first (stable sort)."""
    ax = a["axis"] % x.ndim
    order = xp.argsort(-x if a["largest"] else x, axis=ax, kind="stable")
    idx = xp.take(order, xp.arange(a["k"]), axis=ax)
    if a["output"] == "indices":
        return idx.astype(np.int64)
    return xp.take_along_axis(x, idx, axis=ax)


@kernel("Einsum")
def _einsum(xp, a, *xs):
    return xp.einsum(a["equation"].replace(" ", ""), *xs, optimize=len(xs) > 1)


def _spatial(a, nsp):
    return (a.get("strides") or [1] * nsp, a.get("dilations") or [1] * nsp, a.get("pads") or [0] * (2 * nsp))


@kernel("Conv")
def _conv(xp, a, x, w, b=None):
    nsp = x.ndim - 2
    strides, dil, pads = _spatial(a, nsp)
    g = a["group"]
    if any(pads):
        x = xp.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)])
    n, c = x.shape[:2]
    o, k = w.shape[0], w.shape[2:]
    out_sp = [window_count(x.shape[2 + i], k[i], strides[i], dil[i], 0, 0) for i in range(nsp)]  # x is padded
    # im2col from one strided slice per kernel offset, then a single (batched) GEMM
    cols = xp.stack([x[(slice(None), slice(None)) + tuple(
        slice(pos[i] * dil[i], pos[i] * dil[i] + (out_sp[i] - 1) * strides[i] + 1, strides[i]) for i in range(nsp))]
        for pos in np.ndindex(*k)], axis=2)                        # (n, c, K, *out)
    cols = cols.reshape(n, g, (c // g) * math.prod(k), math.prod(out_sp))
    wg = w.reshape(g, o // g, (c // g) * math.prod(k))
    y = xp.matmul(wg, cols).reshape(n, o, *out_sp)                # (n, g, o/g, P) -> (n, o, *out)
    if b is not None:
        y += b.reshape((1, o) + (1,) * nsp)
    return y


@kernel("ConvTranspose")
def _conv_transpose(xp, a, x, w, b=None):
    nsp = x.ndim - 2
    strides, dil, pads = _spatial(a, nsp)
    outpad = a.get("output_padding") or [0] * nsp
    g = a["group"]
    n, cin = x.shape[:2]
    k = w.shape[2:]
    cout_g = w.shape[1]
    full = [(x.shape[2 + i] - 1) * strides[i] + (k[i] - 1) * dil[i] + 1 + outpad[i] for i in range(nsp)]
    y = xp.zeros((n, g, cout_g, *full), dtype=x.dtype)
    xg = x.reshape(n, g, cin // g, *x.shape[2:])
    wg = w.reshape(g, cin // g, cout_g, *k)
    sp = string.ascii_lowercase[:nsp]
    for pos in np.ndindex(*k):
        contrib = xp.einsum(f"NGC{sp},GCO->NGO{sp}", xg, wg[(slice(None),) * 3 + pos], optimize=True)
        idx = tuple(slice(pos[i] * dil[i], pos[i] * dil[i] + (x.shape[2 + i] - 1) * strides[i] + 1, strides[i])
                    for i in range(nsp))
        y[(slice(None),) * 3 + idx] += contrib
    y = y.reshape(n, g * cout_g, *full)
    crop = tuple(slice(pads[i], full[i] - pads[i + nsp]) for i in range(nsp))
    y = y[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * nsp)
    return xp.ascontiguousarray(y)


def _pool_pads(a, x, nsp, k, strides, dil):
    """Explicit pads, the output sizes, and the extra end padding that ceil_mode's last window needs."""
    pads = a.get("pads") or [0] * (2 * nsp)
    extra, out_sp = [], []
    for i in range(nsp):
        d = x.shape[2 + i] + pads[i] + pads[i + nsp]
        out = window_count(x.shape[2 + i], k[i], strides[i], dil[i], pads[i], pads[i + nsp], bool(a["ceil_mode"]))
        out_sp.append(out)
        extra.append(max(0, (out - 1) * strides[i] + (k[i] - 1) * dil[i] + 1 - d))
    return pads, extra, out_sp


def _pool_reduce(xp, xpd, k, strides, dil, out_sp, combine):
    """Fold `combine` over the k-window offsets: one strided slice per kernel position.

    prod(k) whole-array ufunc calls beat a reduction over a sliding-window view by ~10x, because each
    call streams contiguous rows instead of gathering tiny windows.
    """
    nsp = len(k)
    acc = None
    for pos in np.ndindex(*k):
        idx = (slice(None), slice(None)) + tuple(
            slice(pos[i] * dil[i], pos[i] * dil[i] + (out_sp[i] - 1) * strides[i] + 1, strides[i]) for i in range(nsp))
        acc = xpd[idx].copy() if acc is None else combine(acc, xpd[idx], out=acc)
    return acc


@kernel("MaxPool")
def _maxpool(xp, a, x):
    nsp = x.ndim - 2
    k = a["kernel_shape"]
    strides, dil, _ = _spatial(a, nsp)
    pads, extra, out_sp = _pool_pads(a, x, nsp, k, strides, dil)
    width = [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp] + extra[i]) for i in range(nsp)]
    xpd = xp.pad(x, width, constant_values=-np.inf) if any(sum(w) for w in width) else x
    return _pool_reduce(xp, xpd, k, strides, dil, out_sp, xp.maximum)


@kernel("AveragePool")
def _avgpool(xp, a, x):
    nsp = x.ndim - 2
    k = a["kernel_shape"]
    strides = a.get("strides") or [1] * nsp
    dil = [1] * nsp
    pads, extra, out_sp = _pool_pads(a, x, nsp, k, strides, dil)
    width = [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp] + extra[i]) for i in range(nsp)]
    xpd = xp.pad(x, width)
    s = _pool_reduce(xp, xpd, k, strides, dil, out_sp, xp.add)
    ones = xp.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    if a["count_include_pad"]:
        inner = [(0, 0), (0, 0)] + [(pads[i], pads[i + nsp]) for i in range(nsp)]
        ones = xp.pad(ones, inner, constant_values=1)
        cnt_w = [(0, 0), (0, 0)] + [(0, extra[i]) for i in range(nsp)]
    else:
        cnt_w = width
    cnt = _pool_reduce(xp, xp.pad(ones, cnt_w), k, strides, dil, out_sp, xp.add)
    return s / cnt


@kernel("GlobalAveragePool")
def _gap(xp, a, x):
    return xp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True, dtype=x.dtype)


@kernel("BatchNormalization")
def _bn(xp, a, x, scale, bias, mean, var):
    shp = (1, -1) + (1,) * (x.ndim - 2)
    inv = scale / xp.sqrt(var + var.dtype.type(a["epsilon"]))
    return (x - mean.reshape(shp)) * inv.reshape(shp) + bias.reshape(shp)


@kernel("LayerNorm")
def _layernorm(xp, a, x, scale, bias=None):
    axes = tuple(range(a["axis"] % x.ndim, x.ndim))
    mu = xp.mean(x, axis=axes, keepdims=True)
    d = x - mu
    var = xp.mean(d * d, axis=axes, keepdims=True)
    y = d / xp.sqrt(var + x.dtype.type(a["epsilon"])) * scale
    return y if bias is None else y + bias


@kernel("RMSNorm")
def _rmsnorm(xp, a, x, scale):
    axes = tuple(range(a["axis"] % x.ndim, x.ndim))
    ms = xp.mean(x * x, axis=axes, keepdims=True)
    return x / xp.sqrt(ms + x.dtype.type(a["epsilon"])) * scale


@kernel("GroupNorm")
def _groupnorm(xp, a, x, scale, bias):
    n, c = x.shape[:2]
    g = a["num_groups"]
    xg = x.reshape(n, g, -1)
    mu = xp.mean(xg, axis=2, keepdims=True)
    d = xg - mu
    var = xp.mean(d * d, axis=2, keepdims=True)
    y = (d / xp.sqrt(var + x.dtype.type(a["epsilon"]))).reshape(x.shape)
    shp = (1, c) + (1,) * (x.ndim - 2)
    return y * scale.reshape(shp) + bias.reshape(shp)


@kernel("ScaledDotProductAttention")
def _sdpa(xp, a, q, k, v, mask=None):
    t = q.dtype.type
    scale = a["scale"] if a["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    s = xp.matmul(q * t(scale), xp.swapaxes(k, -1, -2))  # scale the (smaller) q, not the scores
    lq, lk = q.shape[-2], k.shape[-2]
    neg_inf = t(-np.inf)
    if a["causal"]:
        s += xp.where(xp.tril(xp.ones((lq, lk), dtype=bool)), t(0), neg_inf)
    if mask is not None:
        s += xp.where(mask, t(0), neg_inf) if mask.dtype == bool else mask  # small bias, broadcast in place
    m = xp.max(s, axis=-1, keepdims=True)
    s -= xp.where(xp.isfinite(m), m, t(0))
    xp.exp(s, out=s)
    den = xp.sum(s, axis=-1, keepdims=True)
    s /= xp.where(den == 0, t(1), den)  # fully masked rows give zeros, not NaN
    return xp.matmul(s, v)


# ------------------------------------------------------------------ random


@kernel("RandomNormal")
def _rnormal(xp, a, rng=None):
    vals = a["_rng"].standard_normal(tuple(a["shape"])) * a["scale"] + a["mean"]
    return xp.asarray(vals.astype(compute_dtype(a["dtype"])))


@kernel("RandomUniform")
def _runiform(xp, a):
    vals = a["_rng"].uniform(a["low"], a["high"], tuple(a["shape"]))
    return xp.asarray(vals.astype(compute_dtype(a["dtype"])))


def prepare_attrs(op: str, attrs: dict) -> dict:
    """Compile-time attr preparation (per plan step): RNG state, normalized axes."""
    a = dict(attrs)
    if op in ("RandomNormal", "RandomUniform"):
        a["_rng"] = np.random.default_rng(a["seed"])
    return a


def check_table() -> None:
    missing = sorted(set(OPS) - set(KERNELS))
    if missing:
        raise RlxError(f"ops without kernels: {missing}")


__all__ = ["KERNELS", "kernel", "prepare_attrs", "host_ints", "NUMPY_DTYPES"]


# ------------------------------------------------------------------ quantized


@kernel("Dequantize")
def _dequantize(xp, a, packed):
    if xp is np:
        from .quant_kernels import dequantize_cpu
        return dequantize_cpu(packed, a["encoding"], a["shape"])
    raise RlxError("Dequantize on CUDA is not implemented yet; run this graph on Device.CPU")


@kernel("DequantGather")
def _dequant_gather(xp, a, packed, idx):
    """Rows `idx` of a packed [N, K] table, dequantized: only the gathered rows are decoded."""
    if xp is not np:
        raise RlxError("DequantGather on CUDA is not implemented yet; run this graph on Device.CPU")
    from rlx_format.quants import dequantize
    rows = np.take(packed, idx.astype(np.int64).ravel(), axis=0)
    return dequantize(rows, a["encoding"]).reshape(*idx.shape, a["K"])


@kernel("DequantMatMul")
def _dequant_matmul(xp, a, x, packed):
    if xp is np:
        from .quant_kernels import dequant_matmul
        return dequant_matmul(x, packed, a["encoding"], a["N"], a["K"])
    raise RlxError("DequantMatMul on CUDA is not implemented yet; run this graph on Device.CPU")
