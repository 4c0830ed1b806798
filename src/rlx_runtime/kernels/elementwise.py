"""Kernels: unary and binary elementwise ops, casts and reductions."""

from __future__ import annotations

import functools
import math

import numpy as np

from rlx_format.dtypes import bf16_words, compute_dtype, float_to_int

from .. import threads
from ..backend import special
from ..clamp import SMALL, clamp, relu
from .registry import binder, kernel, numba_loaded, register


@functools.cache
def _aligned():
    """aligned.py (numba), imported on first use."""
    from .. import aligned
    return aligned


@functools.cache
def _ufuncs():
    """ufuncs.py (numba), imported on first use (an import statement per call cost ~1 us)."""
    from .. import ufuncs
    return ufuncs


@functools.cache
def _conv_kernels():
    """conv_kernels.py (numba), imported on first use."""
    from .. import conv_kernels
    return conv_kernels


@kernel("Silu", backend="cpu")
def _silu_cpu(xp, a, x):
    return _ufuncs().silu(x)  # one pass, no sigmoid temporary


def _unary(name: str, fn, **facts):
    register(name, lambda xp, a, x: fn(xp, x), **facts)


_unary("Identity", lambda xp, x: x, aliases=True)
_unary("Neg", lambda xp, x: -x, inplace="negative")
_unary("Abs", lambda xp, x: xp.abs(x), inplace="absolute")
_unary("Exp", lambda xp, x: xp.exp(x), inplace="exp")
_unary("Log", lambda xp, x: xp.log(x))
_unary("Sqrt", lambda xp, x: xp.sqrt(x), inplace="sqrt")
_unary("Rsqrt", lambda xp, x: x.dtype.type(1) / xp.sqrt(x))
_unary("Reciprocal", lambda xp, x: x.dtype.type(1) / x)
_unary("Sin", lambda xp, x: xp.sin(x), inplace="sin")
_unary("Cos", lambda xp, x: xp.cos(x), inplace="cos")
_unary("Tan", lambda xp, x: xp.tan(x))
_unary("Tanh", lambda xp, x: xp.tanh(x), inplace="tanh")
_unary("Sigmoid", lambda xp, x: special(xp).expit(x))
_unary("Relu", lambda xp, x: xp.maximum(x, x.dtype.type(0)), inplace="relu")
_unary("Silu", lambda xp, x: x * special(xp).expit(x))
_unary("Softplus", lambda xp, x: xp.logaddexp(x.dtype.type(0), x))
_unary("Softsign", lambda xp, x: x / (x.dtype.type(1) + xp.abs(x)))
_unary("Erf", lambda xp, x: special(xp).erf(x))
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


@kernel("Relu", backend="cpu")
def _relu_cpu(xp, a, x):
    return relu(x)


@kernel("LeakyRelu")
def _leaky(xp, a, x):
    return xp.where(x >= 0, x, x * x.dtype.type(a["alpha"]))


@kernel("LeakyRelu", backend="cpu")
def _leaky_cpu(xp, a, x):
    """For 0 < alpha <= 1, maximum(x, x * alpha) is the same function (x * alpha is the larger exactly where x < 0;
    NaN stays NaN, -0.0 stays -0.0; alpha 0 would make inf * 0 a NaN), and two whole-array ufuncs: np.where with
    its mask ran at 4 ns an element."""
    alpha = x.dtype.type(a["alpha"])
    if x.dtype.kind == "f" and 0 < alpha <= 1:
        t = x * alpha
        return np.maximum(x, t, out=t)
    return _leaky(xp, a, x)


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
    return t(0.5) * x * (t(1) + special(xp).erf(x / t(math.sqrt(2.0))))


@kernel("Gelu", backend="cpu")
def _gelu_cpu(xp, a, x):
    if a["approximate"] == "tanh":
        return _gelu(xp, a, x)
    return _ufuncs().gelu_erf(x)  # one pass: the same float32 steps as the generic kernel


@kernel("Clip", aliases=True)  # without bounds it returns its input
def _clip(xp, a, x, lo=None, hi=None):
    lo = a["min"] if lo is None else lo
    hi = a["max"] if hi is None else hi
    if lo is not None:
        x = xp.maximum(x, xp.asarray(lo, dtype=x.dtype))
    if hi is not None:
        x = xp.minimum(x, xp.asarray(hi, dtype=x.dtype))
    return x


@kernel("Clip", backend="cpu")
def _clip_cpu(xp, a, x, lo=None, hi=None):
    lo = a["min"] if lo is None else lo
    hi = a["max"] if hi is None else hi
    if x.size <= SMALL or x.dtype.kind != "f" or (lo is None and hi is None):
        return _clip(xp, a, x, lo, hi)
    if all(v is None or np.size(v) == 1 for v in (lo, hi)):
        t = x.dtype.type
        return clamp(x, *(v if v is None else t(v) if isinstance(v, float) else t(np.asarray(v).item())
                          for v in (lo, hi)))
    return _clip(xp, a, x, lo, hi)


@kernel("Cast")
def _cast(xp, a, x):
    to = a["to"]
    if to == "bf16":  # runtime carries bf16 widened to f32, rounded to bf16 precision
        return bf16_words(xp, x).view(xp.float32).reshape(x.shape)
    if to == "bool":
        return x != 0
    target = compute_dtype(to)
    if x.dtype.kind == "f" and target.kind in "iu":
        return float_to_int(xp, x, target)
    return x.astype(target)


register("Add", lambda xp, a, x, y: x + y, inplace="add")
register("Sub", lambda xp, a, x, y: x - y, inplace="subtract")
register("Mul", lambda xp, a, x, y: x * y, inplace="multiply")
register("Max", lambda xp, a, x, y: xp.maximum(x, y), inplace="maximum")
register("Min", lambda xp, a, x, y: xp.minimum(x, y), inplace="minimum")
register("Pow", lambda xp, a, x, y: xp.power(x, y))


# the row scale pays from rows this long (a squeeze-excite block's planes are 49-12544 elements)
MIN_ROW = 16


def row_scale(x, y) -> tuple[bool, int] | None:
    """(x is the big operand, row width) when x * y is a float32 tensor times one value per row of it (a
    squeeze-excite block's (N, C, H, W) x (N, C, 1, 1)), both C-contiguous, rows of at least MIN_ROW; else None."""
    if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)):
        return None
    big, small = (x, y) if x.size >= y.size else (y, x)
    if not (x.dtype == y.dtype == np.float32 and x.ndim == y.ndim and big.flags.c_contiguous
            and small.flags.c_contiguous and small.size and big.size // small.size >= MIN_ROW):
        return None
    k = small.ndim
    while k and small.shape[k - 1] == 1:
        k -= 1
    return (big is x, big.size // small.size) if small.shape[:k] == big.shape[:k] else None


def scaled_rows(big: np.ndarray, small: np.ndarray, w: int, out=None) -> np.ndarray:
    """big times small's value per row of `w` (row_scale) by conv_kernels.scale_rows, split over the forward's
    threads as a stream (threads.stream_rows)."""
    dst = _aligned().empty(big.shape, w) if out is None else out
    b, s, d = big.reshape(-1), small.reshape(-1), dst.reshape(-1)
    scale_rows = _conv_kernels().scale_rows
    threads.stream_rows("put_scale", s.size, b.size * _conv_kernels().STREAM_COST, (b, s, d), w,
                        lambda r0, r1: scale_rows(b[r0 * w:r1 * w], s[r0:r1], d[r0 * w:r1 * w], w))
    return dst


def multiply_cpu(x, y, out=None):
    """np.multiply(x, y, out=out). A float32 tensor times one value per row of it (row_scale), once numba is
    loaded, by conv_kernels.scale_rows: the same products (but which NaN a NaN times a NaN gives; numpy's
    broadcast loop ran at ~0.17 ns an element here, the row loop at ~0.07)."""
    if numba_loaded():
        scale = row_scale(x, y)
        if scale is not None:
            big, small = (x, y) if scale[0] else (y, x)
            if out is None or out is big:
                return scaled_rows(big, small, scale[1], out)
    return np.multiply(x, y, out=out)


@binder("Mul", backend="cpu")
def _bind_mul(a, x, y):
    """A squeeze-excite scale's Mul step (multiply_cpu's row scale) bound to its shapes: the checks and the
    operands' roles decided once (hot ~3.8 us less a call; whole forwards 0-1% faster). Other calls go to the
    kernel."""
    scale = row_scale(x, y) if numba_loaded() else None
    if scale is None:
        return None
    big_first, w = scale
    sx, sy = x.shape, y.shape

    def step(xp, attrs, x, y):
        if (x.shape != sx or y.shape != sy or x.dtype != np.float32 or y.dtype != np.float32
                or not (x.flags.c_contiguous and y.flags.c_contiguous)):
            return _mul_cpu(xp, attrs, x, y)
        return scaled_rows(x, y, w) if big_first else scaled_rows(y, x, w)
    return step


@kernel("Mul", backend="cpu")
def _mul_cpu(xp, a, x, y):
    return multiply_cpu(x, y)


@kernel("Pow", backend="cpu")
def _pow_cpu(xp, a, x, y):
    """A float x to a one-element exponent of 2 or 3 is x*x or (x*x)*x, as onnxruntime computes it (GELU's
    tanh form cubes its input): the same bits on every CPU, where numpy's float pow takes a SIMD path on
    AVX-512 and libm's elsewhere, and took 62 ns per element (~100x x*x*x) for negative bases."""
    if x.dtype.kind == "f" and y.size == 1 and y.ndim <= x.ndim:
        e = y.reshape(-1)[0]
        if e == 2:
            return x * x
        if e == 3:
            return x * x * x
    return np.power(x, y)
register("Equal", lambda xp, a, x, y: x == y)
register("Less", lambda xp, a, x, y: x < y)
register("LessEqual", lambda xp, a, x, y: x <= y)
register("Greater", lambda xp, a, x, y: x > y)
register("GreaterEqual", lambda xp, a, x, y: x >= y)
register("And", lambda xp, a, x, y: xp.logical_and(x, y))
register("Or", lambda xp, a, x, y: xp.logical_or(x, y))
register("Xor", lambda xp, a, x, y: xp.logical_xor(x, y))
register("Where", lambda xp, a, c, x, y: xp.where(c, x, y))


@kernel("Div", inplace="divide", inplace_floats_only=True)
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
    register(name, lambda xp, a, x: fn(xp, x, axis=_axes(a, x), keepdims=bool(a["keepdims"])))


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


register("ArgMax", _argk("argmax"))
register("ArgMin", _argk("argmin"))


@kernel("Softmax")
def _softmax(xp, a, x):
    e = xp.exp(x - xp.max(x, axis=a["axis"], keepdims=True))
    return e / xp.sum(e, axis=a["axis"], keepdims=True)


@kernel("Softmax", backend="cpu")
def _softmax_cpu(xp, a, x):
    """float32 over the last axis once numba is loaded: a row at a time in L1 (ufuncs.softmax_rows; its own exp and
    sum order, the same bits on every CPU); rows with a non-finite max, and the rest, by the generic kernel."""
    if (x.dtype != np.float32 or x.ndim == 0 or a["axis"] % x.ndim != x.ndim - 1 or x.size == 0
            or not numba_loaded()):
        return _softmax(xp, a, x)
    return _ufuncs().softmax_last(x, np.empty(x.shape, np.float32), lambda rows: _softmax(np, {"axis": -1}, rows))


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
