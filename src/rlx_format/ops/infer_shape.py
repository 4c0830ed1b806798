"""Shape/dtype inference: data movement, indexing, scatter/gather, einsum and resize."""

from __future__ import annotations

import math

import numpy as np

from ..constants import MAX_DIM
from ..dtypes import INT_DTYPES
from .core import Dim, InferCtx, TensorType, require_float, same_dtypes, broadcast_shapes, dims_equal_or_symbolic

def _static_ints(ctx: InferCtx, i: int, what: str) -> list[int] | None:
    v = ctx.const(i)
    if v is None:
        return None
    if v.dtype.kind not in "iu" or v.ndim > 1:
        raise ctx.fail(f"{what} input has dtype {v.dtype} and rank {v.ndim}; expected a 1-D integer tensor")
    return [int(e) for e in np.atleast_1d(v)]


def _shape_arg(ctx: InferCtx, attr: str, idx: int) -> list[int] | None | int:
    """Shape-like argument: attr, constant input, or (returns its length) a dynamic 1-D input."""
    if ctx.attrs.get(attr) is not None:
        if len(ctx.inputs) > idx:
            raise ctx.fail(f"both attr {attr!r} and input {idx} given; expected one")
        return list(ctx.attrs[attr])
    if len(ctx.inputs) <= idx:
        raise ctx.fail(f"needs attr {attr!r} or input {idx}; got neither")
    t = ctx.inputs[idx]
    if t.dtype not in INT_DTYPES or t.rank != 1:
        raise ctx.fail(f"{attr} input has {t.dtype}{list(t.shape)}; expected a 1-D integer tensor")
    val = _static_ints(ctx, idx, attr)
    if val is not None:
        return val
    if not isinstance(t.shape[0], int):
        raise ctx.fail(f"{attr} input has symbolic length {t.shape[0]!r}; its length must be static")
    return t.shape[0]


def infer_reshape(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    target = _shape_arg(ctx, "shape", 1)
    if isinstance(target, int):
        return TensorType(x.dtype, tuple(ctx.fresh() for _ in range(target)))
    if target.count(-1) > 1:
        raise ctx.fail(f"shape {target} has more than one -1")
    zero_is_literal = bool(ctx.attrs.get("allowzero"))  # ONNX allowzero=1: 0 means a 0-length dim, not "copy"
    if zero_is_literal and 0 in target and -1 in target:
        raise ctx.fail(f"shape {target} has both 0 and -1 with allowzero=1; expected one of them")
    out: list[Dim] = []
    for i, d in enumerate(target):
        if d == 0 and zero_is_literal:
            out.append(0)
        elif d == 0:
            if i >= x.rank:
                raise ctx.fail(f"shape {target} copies dim {i} (0) but input has rank {x.rank}")
            out.append(x.shape[i])
        elif d < -1:
            raise ctx.fail(f"shape {target} has negative dim {d}")
        else:
            out.append(d)
    if -1 in out:
        known = [d for d in out if d != -1]
        if x.is_static() and all(isinstance(d, int) for d in known):
            total, rest = math.prod(x.shape), math.prod(known)
            if rest == 0 or total % rest:
                raise ctx.fail(f"cannot reshape {list(x.shape)} to {target}")
            out[out.index(-1)] = total // rest
        else:
            # symbolic: try to cancel identical factors, else a fresh symbol
            num = list(x.shape)
            den = list(known)
            for d in list(den):
                if d in num:
                    num.remove(d)
                    den.remove(d)
            if all(isinstance(d, int) for d in num + den) and math.prod(num) % max(math.prod(den), 1) == 0:
                out[out.index(-1)] = math.prod(num) // math.prod(den)
            elif not den and len(num) == 1:
                out[out.index(-1)] = num[0]
            else:
                out[out.index(-1)] = ctx.fresh()
    elif x.is_static() and all(isinstance(d, int) for d in out) and math.prod(x.shape) != math.prod(out):
        raise ctx.fail(f"cannot reshape {list(x.shape)} ({math.prod(x.shape)} elements) to {target}")
    return TensorType(x.dtype, tuple(out))


def infer_transpose(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    perm = ctx.attrs["perm"]
    perm = list(range(x.rank))[::-1] if perm is None else perm
    if sorted(perm) != list(range(x.rank)):
        raise ctx.fail(f"perm {perm} is not a permutation of 0..{x.rank - 1}")
    return TensorType(x.dtype, tuple(x.shape[p] for p in perm))


def infer_concat(ctx: InferCtx) -> TensorType:
    dt = same_dtypes(ctx, tuple(range(len(ctx.inputs))))
    r = ctx.inputs[0].rank
    ax = ctx.axis(ctx.attrs["axis"], r)
    total: Dim = 0
    for i, t in enumerate(ctx.inputs):
        if t.rank != r:
            raise ctx.fail(f"input {i} has rank {t.rank}; expected {r} like input 0")
        for j in range(r):
            if j != ax and not dims_equal_or_symbolic(t.shape[j], ctx.inputs[0].shape[j]):
                raise ctx.fail(f"input {i} dim {j} is {t.shape[j]}; expected {ctx.inputs[0].shape[j]}")
        d = t.shape[ax]
        total = total + d if isinstance(total, int) and isinstance(d, int) else ctx.fresh()
    shape = list(ctx.inputs[0].shape)
    shape[ax] = total
    return TensorType(dt, tuple(shape))


def slice_bounds(d: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice clamping: negatives count from the end; then start in [0, d] and end in [0, d] for a
    positive step, start in [0, d-1] and end in [-1, d-1] for a negative one (-1 = before index 0)."""
    start = start + d if start < 0 else start
    end = end + d if end < 0 else end
    if step > 0:
        return min(max(start, 0), d), min(max(end, 0), d)
    return min(max(start, 0), d - 1), min(max(end, -1), d - 1)


def slice_dim(d: int, start: int, end: int, step: int) -> int:
    if d == 0:
        return 0
    b, e = slice_bounds(d, start, end, step)
    return max(0, -(-(e - b) // step))


def infer_slice(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    starts, ends = _shape_arg(ctx, "starts", 1), _shape_arg(ctx, "ends", 2)
    if isinstance(starts, int) or isinstance(ends, int):  # run-time starts/ends: only their lengths are known
        n_s = starts if isinstance(starts, int) else len(starts)
        n_e = ends if isinstance(ends, int) else len(ends)
        starts = ends = None
    else:
        n_s, n_e = len(starts), len(ends)
    axes = ctx.attrs["axes"] if ctx.attrs["axes"] is not None else list(range(n_s))
    steps = ctx.attrs["steps"] if ctx.attrs["steps"] is not None else [1] * n_s
    if not n_s == n_e == len(axes) == len(steps):
        raise ctx.fail("starts, ends, axes and steps must have the same length")
    norm = [ctx.axis(a, x.rank) for a in axes]
    if len(set(norm)) != len(norm):
        raise ctx.fail(f"axes {axes} repeat an axis; expected each axis at most once")
    if any(st == 0 for st in steps):
        raise ctx.fail("slice step 0; expected a nonzero step")
    shape = list(x.shape)
    if starts is None:
        for a in norm:
            shape[a] = ctx.fresh()
        return TensorType(x.dtype, tuple(shape))
    for s, e, a, st in zip(starts, ends, norm, steps):
        d = shape[a]
        if isinstance(d, int):
            shape[a] = slice_dim(d, s, e, st)
        elif s == 0 and st == 1 and e >= 2**62:
            shape[a] = d
        else:
            shape[a] = ctx.fresh()
    return TensorType(x.dtype, tuple(shape))


def infer_gather(ctx: InferCtx) -> TensorType:
    x, idx = ctx.inputs
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    ax = ctx.axis(ctx.attrs["axis"], x.rank)
    return TensorType(x.dtype, x.shape[:ax] + idx.shape + x.shape[ax + 1 :])


def infer_expand(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    target = _shape_arg(ctx, "shape", 1)
    if isinstance(target, int):
        return TensorType(x.dtype, tuple(ctx.fresh() for _ in range(max(target, x.rank))))
    return TensorType(x.dtype, broadcast_shapes(ctx, x.shape, tuple(target)))


def infer_tile(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    reps = _shape_arg(ctx, "repeats", 1)
    if isinstance(reps, int):  # a dynamic repeats input: only its length is known
        if reps != x.rank:
            raise ctx.fail(f"repeats input has {reps} entries; expected rank {x.rank}")
        return TensorType(x.dtype, tuple(ctx.fresh() for _ in range(x.rank)))
    if len(reps) != x.rank:
        raise ctx.fail(f"repeats {reps} has {len(reps)} entries; expected rank {x.rank}")
    if any(r < 0 for r in reps):
        raise ctx.fail(f"repeats {reps} has a negative entry; expected every entry >= 0")
    return TensorType(x.dtype, tuple(d * r if isinstance(d, int) else (d if r == 1 else ctx.fresh())
                                     for d, r in zip(x.shape, reps)))


def infer_squeeze(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    axes = ctx.attrs["axes"]
    if axes is None:
        if not x.is_static():
            raise ctx.fail("Squeeze without axes on a symbolic shape; give axes")
        return TensorType(x.dtype, tuple(d for d in x.shape if d != 1))
    norm = {ctx.axis(a, x.rank) for a in axes}
    for a in norm:
        if isinstance(x.shape[a], int) and x.shape[a] != 1:
            raise ctx.fail(f"cannot squeeze axis {a} of size {x.shape[a]}; expected size 1")
    return TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in norm))


def infer_unsqueeze(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    r = x.rank + len(ctx.attrs["axes"])
    norm = sorted(ctx.axis(a, r) for a in ctx.attrs["axes"])
    if len(set(norm)) != len(norm):
        raise ctx.fail(f"axes {ctx.attrs['axes']} repeat an axis")
    it = iter(x.shape)
    return TensorType(x.dtype, tuple(1 if i in norm else next(it) for i in range(r)))


def _prod(dims: tuple, ctx: InferCtx) -> Dim:
    if all(isinstance(d, int) for d in dims):
        return math.prod(dims)
    if len(dims) == 1:
        return dims[0]
    return ctx.fresh()


def infer_flatten(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    ax = ctx.attrs["axis"]
    if not -x.rank <= ax <= x.rank:
        raise ctx.fail(f"axis {ax} out of range for rank {x.rank}")
    ax %= x.rank + 1 if ax < 0 else x.rank + 1
    return TensorType(x.dtype, (_prod(x.shape[:ax], ctx), _prod(x.shape[ax:], ctx)))


def infer_pad(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    pads = _shape_arg(ctx, "pads", 1)
    n = pads if isinstance(pads, int) else len(pads)
    if n != 2 * x.rank:
        raise ctx.fail(f"pads has {n} entries; expected 2*rank = {2 * x.rank} (all begins, then all ends)")
    if isinstance(pads, int):  # run-time pads: every dim may change
        return TensorType(x.dtype, tuple(ctx.fresh() for _ in x.shape))
    shape = []
    for i, d in enumerate(x.shape):
        extra = pads[i] + pads[i + x.rank]
        shape.append(d + extra if isinstance(d, int) else (d if extra == 0 else ctx.fresh()))
        if isinstance(shape[-1], int) and shape[-1] < 0:
            raise ctx.fail(f"pads {pads} make axis {i} negative")
    return TensorType(x.dtype, tuple(shape))


def infer_shape_of(ctx: InferCtx) -> TensorType:
    return TensorType("i64", (ctx.inputs[0].rank,))


def infer_range(ctx: InferCtx) -> TensorType:
    dt = same_dtypes(ctx, (0, 1, 2))
    for i, t in enumerate(ctx.inputs):
        if t.rank != 0:
            raise ctx.fail(f"input {i} has shape {list(t.shape)}; expected a scalar")
    vals = [ctx.const(i) for i in range(3)]
    if all(v is not None for v in vals):
        s, l, d = (v.item() for v in vals)
        try:
            n = range_length(s, l, d)
        except ValueError as e:
            raise ctx.fail(str(e)) from None
        if n > MAX_DIM:
            raise ctx.fail(f"start, limit, delta = {s}, {l}, {d} give {n} elements; expected at most {MAX_DIM}")
        return TensorType(dt, (n,))
    return TensorType(dt, (ctx.fresh(),))


def range_length(start, limit, delta) -> int:
    """Range's element count max(ceil((limit - start) / delta), 0): exact for integers (no float rounding
    past 2^53); ValueError where it is undefined (a NaN/±Inf operand, delta 0). Load-time inference and the
    run-time kernel both use it."""
    if isinstance(start, int) and isinstance(limit, int) and isinstance(delta, int):
        if delta == 0:
            raise ValueError(f"delta is 0 (start {start}, limit {limit}); expected a non-zero step")
        return max(-((start - limit) // delta), 0)
    if not all(math.isfinite(v) for v in (start, limit, delta)):
        raise ValueError(f"start, limit, delta = {start}, {limit}, {delta}; expected finite values")
    if delta == 0:
        raise ValueError(f"delta is 0 (start {start}, limit {limit}); expected a non-zero step")
    n = (limit - start) / delta
    if not math.isfinite(n):  # a finite span can still overflow
        raise ValueError(f"start, limit, delta = {start}, {limit}, {delta} give {n} elements; expected a finite count")
    return max(math.ceil(n), 0)


def infer_constant_of_shape(ctx: InferCtx) -> TensorType:
    target = _shape_arg(ctx, "shape", 0)
    dt = ctx.attrs["dtype"]
    if isinstance(target, int):
        return TensorType(dt, tuple(ctx.fresh() for _ in range(target)))
    if any(d < 0 for d in target):
        raise ctx.fail(f"shape {target} has a negative dim")
    return TensorType(dt, tuple(target))


def infer_depth_to_space(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    b = ctx.attrs["blocksize"]
    if x.rank != 4:
        raise ctx.fail(f"input rank {x.rank}; expected 4 (N, C, H, W)")
    n, c, h, w = x.shape
    if isinstance(c, int) and c % (b * b):
        raise ctx.fail(f"channels {c} not divisible by blocksize^2 = {b * b}")
    f = lambda d: d * b if isinstance(d, int) else ctx.fresh()  # noqa: E731
    return TensorType(x.dtype, (n, c // (b * b) if isinstance(c, int) else ctx.fresh(), f(h), f(w)))


def parse_einsum(eq: str, ranks: list[int]) -> tuple[list[str], str]:
    """Operand subscripts and output subscripts of an einsum equation, with '...' expanded to
    upper-case letters (so every returned subscript is one letter per dim). Raises ValueError."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation has {len(terms)} operands; got {len(ranks)} inputs")
    n_ell = 0
    for t, r in zip(terms, ranks):
        if "..." in t:
            n_ell = max(n_ell, r - len(t.replace("...", "")))
    ell = "".join(chr(ord("Z") - i) for i in range(n_ell))[::-1]
    out_terms = []
    for t, r in zip(terms, ranks):
        if not all("a" <= ch <= "z" for ch in t.replace("...", "")):
            raise ValueError(f"operand subscripts {t!r} must be lower-case letters and '...'")
        if "..." in t:
            k = r - len(t.replace("...", ""))
            t = t.replace("...", ell[n_ell - k:] if k else "")
        if len(t) != r:
            raise ValueError(f"subscripts {t!r} have {len(t)} letters; the operand has rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
        if not all(ch.isascii() and ch.isalpha() for ch in out) or len(set(out)) != len(out):
            raise ValueError(f"output subscripts {rhs!r} must be distinct letters")
        if any(ch not in "".join(out_terms) for ch in out):
            raise ValueError(f"output subscripts {rhs!r} use a letter no operand has")
    else:
        letters = "".join(t for t in out_terms if t)
        out = ell + "".join(sorted(ch for ch in set(letters) if ch.islower() and letters.count(ch) == 1))
    return out_terms, out


def infer_trilu(ctx: InferCtx) -> TensorType:
    if ctx.inputs[0].rank < 2:
        raise ctx.fail(f"input rank {ctx.inputs[0].rank}; expected >= 2 (the last two dims form matrices)")
    return ctx.inputs[0]


def infer_gather_elements(ctx: InferCtx) -> TensorType:
    x, idx = ctx.inputs
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    if idx.rank != x.rank:
        raise ctx.fail(f"indices rank {idx.rank}; expected the data rank {x.rank}")
    _index_fits(ctx, idx, x, ctx.axis(ctx.attrs["axis"], x.rank))
    return TensorType(x.dtype, idx.shape)


def infer_gather_nd(ctx: InferCtx) -> TensorType:
    x, idx = ctx.inputs
    b = ctx.attrs["batch_dims"]
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    if idx.rank < 1 or not isinstance(idx.shape[-1], int):
        raise ctx.fail(f"indices have shape {list(idx.shape)}; expected rank >= 1 with a static last dim")
    k = idx.shape[-1]
    if b >= min(x.rank, idx.rank) or not 1 <= k <= x.rank - b:
        raise ctx.fail(f"batch_dims {b} and index depth {k} do not fit data rank {x.rank} and indices rank "
                       f"{idx.rank}; expected batch_dims < both ranks and 1 <= depth <= data rank - batch_dims")
    return TensorType(x.dtype, idx.shape[:-1] + x.shape[b + k:])


def _index_fits(ctx: InferCtx, idx: TensorType, x: TensorType, ax: int) -> None:
    """GatherElements/ScatterElements (ONNX, like torch.gather): off the axis, indices dims <= data dims."""
    for j, (i, d) in enumerate(zip(idx.shape, x.shape)):
        if j != ax and isinstance(i, int) and isinstance(d, int) and i > d:
            raise ctx.fail(f"indices shape {list(idx.shape)} exceeds data shape {list(x.shape)} on axis {j}; "
                           "expected indices dims <= data dims off the gather axis")


def infer_scatter_nd(ctx: InferCtx) -> TensorType:
    x, idx, upd = ctx.inputs
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    if upd.dtype != x.dtype:
        raise ctx.fail(f"updates dtype {upd.dtype}; expected the data dtype {x.dtype}")
    if idx.rank < 1 or not isinstance(idx.shape[-1], int) or idx.shape[-1] > x.rank:
        raise ctx.fail(f"indices shape {list(idx.shape)}: the last dim must be static and <= data rank {x.rank}")
    want = idx.shape[:-1] + x.shape[idx.shape[-1]:]
    if upd.rank != len(want) or not all(dims_equal_or_symbolic(a, b) for a, b in zip(upd.shape, want)):
        raise ctx.fail(f"updates shape {list(upd.shape)}; expected {list(want)}")
    return x


def infer_scatter_elements(ctx: InferCtx) -> TensorType:
    x, idx, upd = ctx.inputs
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    if upd.dtype != x.dtype or idx.rank != x.rank or upd.rank != x.rank:
        raise ctx.fail("data, indices and updates must share a rank, and data/updates a dtype")
    if not all(dims_equal_or_symbolic(a, b) for a, b in zip(idx.shape, upd.shape)):
        raise ctx.fail(f"updates shape {list(upd.shape)}; expected the indices shape {list(idx.shape)}")
    _index_fits(ctx, idx, x, ctx.axis(ctx.attrs["axis"], x.rank))
    return x


def infer_topk(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    if x.dtype == "bool":
        raise ctx.fail("TopK of bool; expected a numeric dtype")
    ax = ctx.axis(ctx.attrs["axis"], x.rank)
    k = ctx.attrs["k"]
    if isinstance(x.shape[ax], int) and k > x.shape[ax]:
        raise ctx.fail(f"k={k} is outside [0, {x.shape[ax]}] for axis {ax}")
    shape = x.shape[:ax] + (k,) + x.shape[ax + 1:]
    return TensorType("i64" if ctx.attrs["output"] == "indices" else x.dtype, shape)


def infer_einsum(ctx: InferCtx) -> TensorType:
    dt = same_dtypes(ctx, tuple(range(len(ctx.inputs))))
    try:
        terms, out = parse_einsum(ctx.attrs["equation"], [t.rank for t in ctx.inputs])
    except ValueError as e:
        raise ctx.fail(f"equation {ctx.attrs['equation']!r}: {e}") from None
    sizes: dict[str, Dim] = {}
    for t, typ in zip(terms, ctx.inputs):
        for ch, d in zip(t, typ.shape):
            prev = sizes.get(ch)
            if prev is None or prev == 1 or (isinstance(prev, str) and isinstance(d, int) and d != 1):
                sizes[ch] = d
            elif isinstance(d, int) and isinstance(prev, int) and d not in (1, prev):
                raise ctx.fail(f"subscript {ch!r} is {prev} in one operand and {d} in another")
    return TensorType(dt, tuple(sizes[ch] for ch in out))


def infer_resize(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    require_float(ctx)
    scales, sizes = ctx.attrs["scales"], ctx.attrs["sizes"]
    if len(ctx.inputs) > 1:  # sizes as input 1 (computed at run time)
        if scales is not None:
            raise ctx.fail("both attr 'scales' and a sizes input given; expected one")
        sizes = _shape_arg(ctx, "sizes", 1)
        if isinstance(sizes, int):
            if sizes != x.rank:
                raise ctx.fail(f"sizes input has {sizes} entries; expected rank {x.rank}")
            return TensorType(x.dtype, tuple(ctx.fresh() for _ in x.shape))
        if any(d < 1 for d in sizes):
            raise ctx.fail(f"sizes {sizes} must be >= 1")
    if (scales is None) == (sizes is None):
        raise ctx.fail("give exactly one of scales and sizes")
    n = len(scales if scales is not None else sizes)
    if n != x.rank:
        raise ctx.fail(f"{'scales' if scales is not None else 'sizes'} has {n} entries; expected rank {x.rank}")
    if scales is not None:  # finite: the catalogue's attr schema; sizes >= 1 likewise
        if any(sc <= 0 for sc in scales):
            raise ctx.fail(f"scales {scales} must be positive")
        if any(isinstance(d, int) and not d * sc <= MAX_DIM for d, sc in zip(x.shape, scales)):
            raise ctx.fail(f"scales {scales} on shape {list(x.shape)} exceed the dim cap {MAX_DIM}")
        out = tuple(int(math.floor(d * sc)) if isinstance(d, int) else (d if sc == 1 else ctx.fresh())
                    for d, sc in zip(x.shape, scales))
    else:
        out = tuple(sizes)
    return TensorType(x.dtype, out)
