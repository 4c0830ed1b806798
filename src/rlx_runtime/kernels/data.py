"""Kernels: reshaping, slicing, gathering/scattering, padding, einsum, resize and friends."""

from __future__ import annotations

import math

import numpy as np

from rlx_format.dtypes import compute_dtype
from rlx_format.ops import slice_bounds
from rlx_format.ops.infer_shape import range_length

from ..backend import host_ints
from .registry import kernel, numba_loaded

def resolve_reshape(in_shape: tuple, target: list[int], allowzero: bool = False) -> tuple:
    out = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        out[out.index(-1)] = math.prod(in_shape) // known if known else 0
    return tuple(out)


@kernel("Reshape", aliases=True)
def _reshape(xp, a, x, shape=None):
    target = a["shape"] if shape is None else host_ints(xp, shape)
    return x.reshape(resolve_reshape(x.shape, target, bool(a["allowzero"])))


@kernel("Transpose", aliases=True)
def _transpose(xp, a, x):
    return xp.transpose(x, a["perm"])


@kernel("Concat")
def _concat(xp, a, *xs):
    return xp.concatenate(xs, axis=a["axis"])


@kernel("Slice", aliases=True)
def _slice(xp, a, x, starts=None, ends=None):
    starts = a["starts"] if starts is None else host_ints(xp, starts)
    ends = a["ends"] if ends is None else host_ints(xp, ends)
    return x[slice_index(x.shape, a, starts, ends)]


def slice_index(shape: tuple[int, ...], a: dict, starts, ends) -> tuple[slice, ...]:
    """The numpy index of a Slice of an array of `shape` (attrs `a`: axes, steps), starts and ends given."""
    idx = [slice(None)] * len(shape)
    axes = a["axes"] if a["axes"] is not None else range(len(starts))
    steps = a["steps"] or [1] * len(starts)
    for s, e, ax, st in zip(starts, ends, axes, steps):
        if shape[ax] == 0:
            continue
        start, stop = slice_bounds(shape[ax], s, e, st)
        idx[ax] = slice(start, None if stop < 0 else stop, st)  # stop -1 means "before index 0"
    return tuple(idx)


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


@kernel("Squeeze", aliases=True)
def _squeeze(xp, a, x):
    return xp.squeeze(x, axis=None if a["axes"] is None else tuple(a["axes"]))


@kernel("Unsqueeze", aliases=True)
def _unsqueeze(xp, a, x):
    r = x.ndim + len(a["axes"])
    return xp.expand_dims(x, tuple(sorted(ax % r for ax in a["axes"])))


@kernel("Flatten", aliases=True)
def _flatten(xp, a, x):
    ax = a["axis"] % (x.ndim + 1) if a["axis"] < 0 else a["axis"]
    return x.reshape(math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))


@kernel("Pad")
def _pad(xp, a, x, pads=None):
    r = x.ndim
    pads = a["pads"] if pads is None else host_ints(xp, pads)
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
    n = range_length(s, l, d)
    return (s + d * xp.arange(n, dtype=np.float64 if start.dtype.kind == "f" else np.int64)).astype(start.dtype)


@kernel("ConstantOfShape")
def _constant_of_shape(xp, a, shape=None):
    target = tuple(a["shape"] if shape is None else host_ints(xp, shape))
    return xp.full(target, a["value"], dtype=compute_dtype(a["dtype"]))


@kernel("DepthToSpace", aliases=True)
def _d2s(xp, a, x):
    n, c, h, w = x.shape
    b = a["blocksize"]
    if a["mode"] == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(n, c // (b * b), h * b, w * b)


def _resize_coords(xp, a, d_in: int, d_out: int, scale: float):
    """Source coordinate of every output index along one axis (ONNX coordinate_transformation_mode),
    computed in float32 in the same operation order as onnxruntime (ties in nearest mode depend on it)."""
    f = np.float32
    i = xp.arange(d_out, dtype=np.float32)
    s = f(scale)
    mode = a["coordinate_transformation_mode"]
    if mode == "align_corners":
        return i * f(d_in - 1) / f(d_out - 1) if d_out > 1 else xp.zeros(d_out, np.float32)
    if mode == "asymmetric":
        return i / s
    if mode == "pytorch_half_pixel" and d_out == 1:
        return xp.zeros(1, np.float32)
    return (i + f(0.5)) / s - f(0.5)


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


def _resize_sizes(xp, a, x, sizes_in) -> tuple[list[int], list]:
    """The output sizes and the scales of a Resize of x."""
    if sizes_in is not None:  # ValueError: the plan names the node
        sizes = host_ints(xp, sizes_in)
        if len(sizes) != x.ndim or any(d < 1 for d in sizes):
            raise ValueError(f"sizes {sizes} computed at run time for input shape {list(x.shape)}; "
                           f"expected {x.ndim} entries, each >= 1")
    else:
        sizes = a["sizes"] or [int(math.floor(d * s)) for d, s in zip(x.shape, a["scales"])]
    return list(sizes), a["scales"] or [np.float32(o) / np.float32(d) for o, d in zip(sizes, x.shape)]


def _nearest_index(xp, a, d_in: int, d_out: int, scale):
    """The source index of every output index along one axis of a nearest Resize."""
    return xp.clip(_nearest(xp, a, _resize_coords(xp, a, d_in, d_out, scale)), 0, d_in - 1).astype(np.int64)


@kernel("Resize")
def _resize(xp, a, x, sizes_in=None):
    """Separable resize, one axis at a time: nearest is a gather, linear a weighted pair of gathers."""
    sizes, scales = _resize_sizes(xp, a, x, sizes_in)
    if list(x.shape) == sizes:  # same output shape: a copy, whatever the scales (as onnxruntime does)
        return x.copy()
    y = x
    for ax, (d_in, d_out, sc) in enumerate(zip(x.shape, sizes, scales)):
        if d_in == d_out and sc == 1:
            continue
        if a["mode"] == "nearest":
            y = xp.take(y, _nearest_index(xp, a, d_in, d_out, sc), axis=ax)
            continue
        c = _resize_coords(xp, a, d_in, d_out, sc)
        c = xp.clip(c, 0, d_in - 1)
        lo = xp.floor(c).astype(np.int64)
        hi = xp.minimum(lo + 1, d_in - 1)
        w = (c - lo).astype(x.dtype).reshape((-1,) + (1,) * (y.ndim - ax - 1))
        y = xp.take(y, lo, axis=ax) * (x.dtype.type(1) - w) + xp.take(y, hi, axis=ax) * w
    return y


@kernel("Resize", backend="cpu")
def _resize_cpu(xp, a, x, sizes_in=None):
    """A nearest Resize of a 4-D float32 tensor whose spatial indices are each input index repeated a whole
    number of times (a detector's 2x upsample), once numba is loaded: conv_kernels.repeat_planes, each output row
    built once and copied to its repeats (YOLO-like's 128x20x20 -> 40x40: 0.36 ms as two np.take passes, the
    inner one gathering along the last axis). A copy: the same values as _resize."""
    if not (a["mode"] == "nearest" and x.ndim == 4 and x.dtype == np.float32 and x.size
            and numba_loaded()):
        return _resize(xp, a, x, sizes_in)
    sizes, scales = _resize_sizes(xp, a, x, sizes_in)
    known = a.setdefault("_repeats", {})  # the step's own attrs: per input shape and sizes, found once
    key = (x.shape, tuple(sizes))
    if key not in known:
        known[key] = _repeat_factors(a, x.shape, sizes, scales)
    if known[key] is None:
        return _resize(xp, a, x, sizes_in)
    from ..conv_kernels import repeat_planes
    out = np.empty(sizes, np.float32)
    repeat_planes(np.ascontiguousarray(x).reshape(-1, *x.shape[2:]), out.reshape(-1, *sizes[2:]), *known[key])
    return out


def _repeat_factors(a, shape, sizes, scales) -> tuple[int, int] | None:
    """(kh, kw) when a nearest Resize of a 4-D `shape` to `sizes` takes every N and C index once and each input row
    and column index kh and kw times, in order (its source indices as _resize computes them); else None."""
    factors = []
    for ax in range(4):
        d_in, d_out = shape[ax], sizes[ax]
        k = d_out // d_in
        if k < 1 or d_out % d_in or (ax < 2 and k != 1):  # (an empty output is the generic kernel's)
            return None
        if not (k == 1 and scales[ax] == 1) and not np.array_equal(
                _nearest_index(np, a, d_in, d_out, scales[ax]), np.repeat(np.arange(d_in), k)):
            return None
        factors.append(k)
    return factors[2], factors[3]
