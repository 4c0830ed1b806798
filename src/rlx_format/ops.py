"""The op catalogue: arity, attributes (type + default) and shape/dtype inference.

spec/ops.md is the normative description; this module is its executable form. It never
computes tensor values, only types. Symbolic dims (strings) are carried through; a dim that
cannot be known statically gets a fresh symbolic name derived from the node name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dtypes import DTYPES, FLOAT_DTYPES, INT_DTYPES
from .errors import GraphError

Dim = int | str
Shape = tuple[Dim, ...]


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: Shape

    @property
    def rank(self) -> int:
        return len(self.shape)

    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def to_json(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape)}


REQUIRED = object()


@dataclass(frozen=True)
class Attr:
    kind: str  # int | float | bool | str | ints | floats | dtype | shape
    default: Any = REQUIRED
    choices: tuple = ()


@dataclass(frozen=True)
class OpSpec:
    name: str
    min_inputs: int
    max_inputs: int
    attrs: dict[str, Attr]
    infer: Callable[[InferCtx], TensorType]
    kind: str = "compute"  # compute | random | leaf
    doc: str = ""


@dataclass
class InferCtx:
    node: str
    op: str
    inputs: list[TensorType]
    attrs: dict[str, Any]  # normalized: defaults filled in
    consts: list[np.ndarray | None] = field(default_factory=list)
    _fresh: int = 0

    def fail(self, msg: str) -> GraphError:
        return GraphError(f"node {self.node!r} ({self.op}): {msg}")

    def fresh(self) -> str:
        self._fresh += 1
        return f"{self.node}:d{self._fresh}"

    def const(self, i: int) -> np.ndarray | None:
        return self.consts[i] if i < len(self.consts) else None

    def axis(self, axis: int, rank: int, what: str = "axis") -> int:
        if not -rank <= axis < max(rank, 1):
            raise self.fail(f"{what} {axis} out of range for rank {rank}; expected -{rank} <= {what} < {rank}")
        return axis % rank if rank else 0


# ---------------------------------------------------------------------------- helpers


def dims_equal_or_symbolic(a: Dim, b: Dim) -> bool:
    return a == b or isinstance(a, str) or isinstance(b, str)


def broadcast_shapes(ctx: InferCtx, *shapes: Shape) -> Shape:
    rank = max(len(s) for s in shapes)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        ints = {d for d in dims if isinstance(d, int) and d != 1}
        syms = [d for d in dims if isinstance(d, str)]
        if len(ints) > 1:
            raise ctx.fail(
                f"shapes {[list(s) for s in shapes]} do not broadcast (axis {i} has {sorted(ints)}); "
                "expected equal dims or 1"
            )
        if ints:
            out.append(ints.pop())
        elif syms:
            out.append(syms[0])
        else:
            out.append(1)
    return tuple(out)


def _same(ctx: InferCtx) -> TensorType:
    return ctx.inputs[0]


def _require_float(ctx: InferCtx, i: int = 0) -> None:
    if ctx.inputs[i].dtype not in FLOAT_DTYPES:
        raise ctx.fail(f"input {i} has dtype {ctx.inputs[i].dtype}; expected a float dtype")


def _float_unary(ctx: InferCtx) -> TensorType:
    _require_float(ctx)
    return ctx.inputs[0]


def _numeric_unary(ctx: InferCtx) -> TensorType:
    if ctx.inputs[0].dtype == "bool":
        raise ctx.fail("input is bool; expected a numeric dtype")
    return ctx.inputs[0]


def _same_dtypes(ctx: InferCtx, idx: tuple[int, ...]) -> str:
    dts = {ctx.inputs[i].dtype for i in idx if i < len(ctx.inputs)}
    if len(dts) > 1:
        raise ctx.fail(f"inputs have dtypes {sorted(dts)}; expected one dtype (insert a Cast)")
    return dts.pop()


def _arith(ctx: InferCtx) -> TensorType:
    dt = _same_dtypes(ctx, (0, 1))
    if dt == "bool":
        raise ctx.fail("arithmetic on bool; expected a numeric dtype (Cast first)")
    return TensorType(dt, broadcast_shapes(ctx, ctx.inputs[0].shape, ctx.inputs[1].shape))


def _compare(ctx: InferCtx) -> TensorType:
    _same_dtypes(ctx, (0, 1))
    return TensorType("bool", broadcast_shapes(ctx, ctx.inputs[0].shape, ctx.inputs[1].shape))


def _logic(ctx: InferCtx) -> TensorType:
    for i, t in enumerate(ctx.inputs):
        if t.dtype != "bool":
            raise ctx.fail(f"input {i} has dtype {t.dtype}; expected bool")
    return TensorType("bool", broadcast_shapes(ctx, *(t.shape for t in ctx.inputs)))


def _not(ctx: InferCtx) -> TensorType:
    return _logic(ctx)


def _where(ctx: InferCtx) -> TensorType:
    if ctx.inputs[0].dtype != "bool":
        raise ctx.fail(f"condition has dtype {ctx.inputs[0].dtype}; expected bool")
    dt = _same_dtypes(ctx, (1, 2))
    return TensorType(dt, broadcast_shapes(ctx, *(t.shape for t in ctx.inputs)))


def _cast(ctx: InferCtx) -> TensorType:
    return TensorType(ctx.attrs["to"], ctx.inputs[0].shape)


def _clip(ctx: InferCtx) -> TensorType:
    _numeric_unary(ctx)
    for i in range(1, len(ctx.inputs)):
        if ctx.inputs[i].rank != 0:
            raise ctx.fail(f"clip bound input {i} has shape {list(ctx.inputs[i].shape)}; expected a scalar")
    return ctx.inputs[0]


def _reduce_axes(ctx: InferCtx, rank: int) -> list[int]:
    axes = ctx.attrs.get("axes")
    if axes is None:
        return list(range(rank))
    norm = [ctx.axis(a, rank, "axes entry") for a in axes]
    if len(set(norm)) != len(norm):
        raise ctx.fail(f"axes {axes} repeat an axis")
    return norm


def _reduce(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    if x.dtype == "bool":
        raise ctx.fail("reduction of bool; expected a numeric dtype")
    axes = _reduce_axes(ctx, x.rank)
    keep = ctx.attrs["keepdims"]
    shape = tuple((1 if keep else None) if i in axes else d for i, d in enumerate(x.shape))
    return TensorType(x.dtype, tuple(d for d in shape if d is not None))


def _argreduce(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    ax = ctx.axis(ctx.attrs["axis"], x.rank)
    keep = ctx.attrs["keepdims"]
    shape = tuple(d for i, d in enumerate(x.shape) if i != ax or keep)
    shape = tuple(1 if (i == ax and keep) else d for i, d in enumerate(x.shape)) if keep else shape
    return TensorType("i64", shape)


def _axis_same(ctx: InferCtx) -> TensorType:
    ctx.axis(ctx.attrs["axis"], ctx.inputs[0].rank)
    return _float_unary(ctx) if ctx.op in ("Softmax", "LogSoftmax") else _numeric_unary(ctx)


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


def _reshape(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    target = _shape_arg(ctx, "shape", 1)
    if isinstance(target, int):
        return TensorType(x.dtype, tuple(ctx.fresh() for _ in range(target)))
    if target.count(-1) > 1:
        raise ctx.fail(f"shape {target} has more than one -1")
    out: list[Dim] = []
    for i, d in enumerate(target):
        if d == 0:
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


def _transpose(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    perm = ctx.attrs["perm"]
    perm = list(range(x.rank))[::-1] if perm is None else perm
    if sorted(perm) != list(range(x.rank)):
        raise ctx.fail(f"perm {perm} is not a permutation of 0..{x.rank - 1}")
    return TensorType(x.dtype, tuple(x.shape[p] for p in perm))


def _concat(ctx: InferCtx) -> TensorType:
    dt = _same_dtypes(ctx, tuple(range(len(ctx.inputs))))
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


def _slice(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    starts, ends = ctx.attrs["starts"], ctx.attrs["ends"]
    axes = ctx.attrs["axes"] if ctx.attrs["axes"] is not None else list(range(len(starts)))
    steps = ctx.attrs["steps"] if ctx.attrs["steps"] is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.fail("starts, ends, axes and steps must have the same length")
    shape = list(x.shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ctx.fail("slice step 0; expected a nonzero step")
        a = ctx.axis(a, x.rank)
        d = shape[a]
        if isinstance(d, int):
            shape[a] = slice_dim(d, s, e, st)
        elif s == 0 and st == 1 and e >= 2**62:
            shape[a] = d
        else:
            shape[a] = ctx.fresh()
    return TensorType(x.dtype, tuple(shape))


def _gather(ctx: InferCtx) -> TensorType:
    x, idx = ctx.inputs
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    ax = ctx.axis(ctx.attrs["axis"], x.rank)
    return TensorType(x.dtype, x.shape[:ax] + idx.shape + x.shape[ax + 1 :])


def _expand(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    target = _shape_arg(ctx, "shape", 1)
    if isinstance(target, int):
        return TensorType(x.dtype, tuple(ctx.fresh() for _ in range(max(target, x.rank))))
    return TensorType(x.dtype, broadcast_shapes(ctx, x.shape, tuple(target)))


def _tile(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    reps = _shape_arg(ctx, "repeats", 1)
    if isinstance(reps, int):
        return TensorType(x.dtype, tuple(ctx.fresh() for _ in range(x.rank)))
    if len(reps) != x.rank:
        raise ctx.fail(f"repeats {reps} has {len(reps)} entries; expected rank {x.rank}")
    return TensorType(x.dtype, tuple(d * r if isinstance(d, int) else (d if r == 1 else ctx.fresh())
                                     for d, r in zip(x.shape, reps)))


def _squeeze(ctx: InferCtx) -> TensorType:
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


def _unsqueeze(ctx: InferCtx) -> TensorType:
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


def _flatten(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    ax = ctx.attrs["axis"]
    if not -x.rank <= ax <= x.rank:
        raise ctx.fail(f"axis {ax} out of range for rank {x.rank}")
    ax %= x.rank + 1 if ax < 0 else x.rank + 1
    return TensorType(x.dtype, (_prod(x.shape[:ax], ctx), _prod(x.shape[ax:], ctx)))


def _pad(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    pads = ctx.attrs["pads"]
    if len(pads) != 2 * x.rank:
        raise ctx.fail(f"pads has {len(pads)} entries; expected 2*rank = {2 * x.rank} (all begins, then all ends)")
    shape = []
    for i, d in enumerate(x.shape):
        extra = pads[i] + pads[i + x.rank]
        shape.append(d + extra if isinstance(d, int) else (d if extra == 0 else ctx.fresh()))
        if isinstance(shape[-1], int) and shape[-1] < 0:
            raise ctx.fail(f"pads {pads} make axis {i} negative")
    return TensorType(x.dtype, tuple(shape))


def _shape(ctx: InferCtx) -> TensorType:
    return TensorType("i64", (ctx.inputs[0].rank,))


def _range(ctx: InferCtx) -> TensorType:
    dt = _same_dtypes(ctx, (0, 1, 2))
    for i, t in enumerate(ctx.inputs):
        if t.rank != 0:
            raise ctx.fail(f"input {i} has shape {list(t.shape)}; expected a scalar")
    vals = [ctx.const(i) for i in range(3)]
    if all(v is not None for v in vals):
        s, l, d = (v.item() for v in vals)
        if d == 0:
            raise ctx.fail("delta is 0; expected a nonzero step")
        return TensorType(dt, (max(int(math.ceil((l - s) / d)), 0),))
    return TensorType(dt, (ctx.fresh(),))


def _constant_of_shape(ctx: InferCtx) -> TensorType:
    target = _shape_arg(ctx, "shape", 0)
    dt = ctx.attrs["dtype"]
    if isinstance(target, int):
        return TensorType(dt, tuple(ctx.fresh() for _ in range(target)))
    if any(d < 0 for d in target):
        raise ctx.fail(f"shape {target} has a negative dim")
    return TensorType(dt, tuple(target))


def _depth_to_space(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    b = ctx.attrs["blocksize"]
    if x.rank != 4:
        raise ctx.fail(f"input rank {x.rank}; expected 4 (N, C, H, W)")
    n, c, h, w = x.shape
    if isinstance(c, int) and c % (b * b):
        raise ctx.fail(f"channels {c} not divisible by blocksize^2 = {b * b}")
    f = lambda d: d * b if isinstance(d, int) else ctx.fresh()  # noqa: E731
    return TensorType(x.dtype, (n, c // (b * b) if isinstance(c, int) else ctx.fresh(), f(h), f(w)))


def matmul_shape(ctx: InferCtx, a: Shape, b: Shape) -> Shape:
    if not a or not b:
        raise ctx.fail("MatMul of a scalar; expected rank >= 1")
    a2 = a if len(a) > 1 else (1,) + a
    b2 = b if len(b) > 1 else b + (1,)
    if not dims_equal_or_symbolic(a2[-1], b2[-2]):
        raise ctx.fail(f"inner dims differ: {list(a)} @ {list(b)} ({a2[-1]} vs {b2[-2]})")
    batch = broadcast_shapes(ctx, a2[:-2], b2[:-2]) if (a2[:-2] or b2[:-2]) else ()
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul(ctx: InferCtx) -> TensorType:
    dt = _same_dtypes(ctx, (0, 1))
    if dt == "bool":
        raise ctx.fail("MatMul of bool")
    return TensorType(dt, matmul_shape(ctx, ctx.inputs[0].shape, ctx.inputs[1].shape))


def _spatial_attrs(ctx: InferCtx, nsp: int, kernel: Shape) -> tuple[list, list, list]:
    strides = ctx.attrs.get("strides") or [1] * nsp
    dil = ctx.attrs.get("dilations") or [1] * nsp
    pads = ctx.attrs.get("pads") or [0] * (2 * nsp)
    if len(strides) != nsp or len(dil) != nsp or len(pads) != 2 * nsp:
        raise ctx.fail(
            f"strides/dilations need {nsp} entries and pads {2 * nsp}; got {strides}, {dil}, {pads}"
        )
    if any(s <= 0 for s in strides) or any(d <= 0 for d in dil):
        raise ctx.fail("strides and dilations must be positive")
    return strides, dil, pads


def window_count(d: int, k: int, s: int, dl: int, pb: int, pe: int, ceil_mode: bool = False) -> int:
    """Output size of a conv/pool axis (spec/ops.md): windows of (k-1)*dl+1 over d+pb+pe with stride s,
    rounded down (ceil_mode: up, but a window may not start inside the end padding). Callers ensure the
    dilated kernel fits the padded input."""
    span = d + pb + pe - dl * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= d + pb:
        out -= 1
    return out


def _pool_out(ctx, d, k, s, dl, pb, pe, ceil_mode=False) -> Dim:
    if not isinstance(d, int) or not isinstance(k, int):
        return ctx.fresh()
    if d + pb + pe < dl * (k - 1) + 1:
        raise ctx.fail(f"kernel {k} (dilation {dl}) is larger than the padded input {d + pb + pe}; "
                       "expected a kernel that fits (pad the input)")
    return window_count(d, k, s, dl, pb, pe, ceil_mode)


def _conv(ctx: InferCtx) -> TensorType:
    x, w = ctx.inputs[:2]
    _require_float(ctx)
    _same_dtypes(ctx, tuple(range(len(ctx.inputs))))
    if x.rank not in (3, 4, 5) or w.rank != x.rank:
        raise ctx.fail(f"input rank {x.rank}, weight rank {w.rank}; expected both 3, 4 or 5 (1-D/2-D/3-D)")
    nsp = x.rank - 2
    g = ctx.attrs["group"]
    strides, dil, pads = _spatial_attrs(ctx, nsp, w.shape[2:])
    if isinstance(x.shape[1], int) and isinstance(w.shape[1], int) and x.shape[1] != w.shape[1] * g:
        raise ctx.fail(f"input channels {x.shape[1]} != weight in-channels {w.shape[1]} x group {g}")
    if len(ctx.inputs) == 3 and ctx.inputs[2].shape not in ((w.shape[0],),) and isinstance(w.shape[0], int):
        raise ctx.fail(f"bias shape {list(ctx.inputs[2].shape)}; expected [{w.shape[0]}]")
    sp = [_pool_out(ctx, x.shape[2 + i], w.shape[2 + i], strides[i], dil[i], pads[i], pads[i + nsp])
          for i in range(nsp)]
    return TensorType(x.dtype, (x.shape[0], w.shape[0], *sp))


def _conv_transpose(ctx: InferCtx) -> TensorType:
    x, w = ctx.inputs[:2]
    _require_float(ctx)
    _same_dtypes(ctx, tuple(range(len(ctx.inputs))))
    if x.rank not in (3, 4, 5) or w.rank != x.rank:
        raise ctx.fail(f"input rank {x.rank}, weight rank {w.rank}; expected both 3, 4 or 5")
    nsp = x.rank - 2
    g = ctx.attrs["group"]
    strides, dil, pads = _spatial_attrs(ctx, nsp, w.shape[2:])
    op = ctx.attrs.get("output_padding") or [0] * nsp
    if isinstance(x.shape[1], int) and isinstance(w.shape[0], int) and x.shape[1] != w.shape[0]:
        raise ctx.fail(f"input channels {x.shape[1]} != weight dim 0 {w.shape[0]}")
    sp = []
    for i in range(nsp):
        d, k = x.shape[2 + i], w.shape[2 + i]
        if isinstance(d, int) and isinstance(k, int):
            sp.append(strides[i] * (d - 1) + op[i] + (k - 1) * dil[i] + 1 - pads[i] - pads[i + nsp])
        else:
            sp.append(ctx.fresh())
    cout = w.shape[1] * g if isinstance(w.shape[1], int) else ctx.fresh()
    return TensorType(x.dtype, (x.shape[0], cout, *sp))


def _pool(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    _require_float(ctx)
    if x.rank not in (3, 4, 5):
        raise ctx.fail(f"input rank {x.rank}; expected 3, 4 or 5")
    nsp = x.rank - 2
    k = ctx.attrs["kernel_shape"]
    if len(k) != nsp:
        raise ctx.fail(f"kernel_shape {k}; expected {nsp} entries")
    strides, dil, pads = _spatial_attrs(ctx, nsp, tuple(k))
    sp = [_pool_out(ctx, x.shape[2 + i], k[i], strides[i], dil[i], pads[i], pads[i + nsp],
                    bool(ctx.attrs["ceil_mode"])) for i in range(nsp)]
    return TensorType(x.dtype, (x.shape[0], x.shape[1], *sp))


def _global_pool(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    _require_float(ctx)
    if x.rank < 3:
        raise ctx.fail(f"input rank {x.rank}; expected >= 3")
    return TensorType(x.dtype, x.shape[:2] + (1,) * (x.rank - 2))


def _channel_params(ctx: InferCtx, first: int, c: Dim) -> None:
    for i in range(first, len(ctx.inputs)):
        t = ctx.inputs[i]
        if t.rank != 1 or not dims_equal_or_symbolic(t.shape[0], c):
            raise ctx.fail(f"input {i} has shape {list(t.shape)}; expected [{c}]")


def _batchnorm(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    _require_float(ctx)
    _same_dtypes(ctx, tuple(range(5)))
    if x.rank < 2:
        raise ctx.fail(f"input rank {x.rank}; expected >= 2 (N, C, ...)")
    _channel_params(ctx, 1, x.shape[1])
    return x


def _norm_last(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    _require_float(ctx)
    _same_dtypes(ctx, tuple(range(len(ctx.inputs))))
    ax = ctx.axis(ctx.attrs["axis"], x.rank)
    norm_shape = x.shape[ax:]
    for i in range(1, len(ctx.inputs)):
        s = ctx.inputs[i].shape
        if len(s) > len(norm_shape) or not all(dims_equal_or_symbolic(a, b)
                                                for a, b in zip(s[::-1], norm_shape[::-1])):
            raise ctx.fail(f"input {i} has shape {list(s)}; expected {list(norm_shape)} (normalized dims)")
    return x


def _groupnorm(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    _require_float(ctx)
    g = ctx.attrs["num_groups"]
    if x.rank < 2:
        raise ctx.fail(f"input rank {x.rank}; expected >= 2")
    if isinstance(x.shape[1], int) and (g <= 0 or x.shape[1] % g):
        raise ctx.fail(f"channels {x.shape[1]} not divisible by num_groups {g}")
    _channel_params(ctx, 1, x.shape[1])
    return x


def _sdpa(ctx: InferCtx) -> TensorType:
    q, k, v = ctx.inputs[:3]
    _require_float(ctx)
    _same_dtypes(ctx, (0, 1, 2))
    if q.rank < 2 or k.rank != q.rank or v.rank != q.rank:
        raise ctx.fail("q, k, v must share a rank >= 2 ([..., seq, dim])")
    if not dims_equal_or_symbolic(q.shape[-1], k.shape[-1]):
        raise ctx.fail(f"q dim {q.shape[-1]} != k dim {k.shape[-1]}")
    if not dims_equal_or_symbolic(k.shape[-2], v.shape[-2]):
        raise ctx.fail(f"k length {k.shape[-2]} != v length {v.shape[-2]}")
    batch = broadcast_shapes(ctx, q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if len(ctx.inputs) == 4:
        m = ctx.inputs[3]
        if m.dtype != "bool" and m.dtype != q.dtype:
            raise ctx.fail(f"mask dtype {m.dtype}; expected bool or {q.dtype}")
        broadcast_shapes(ctx, m.shape, batch + (q.shape[-2], k.shape[-2]))
    return TensorType(q.dtype, batch + (q.shape[-2], v.shape[-1]))


QUANT_BLOCKS = {"gguf_q8_0": (32, 34), "gguf_tq2_0": (256, 66)}  # encoding -> (block elems, block bytes)


def _dequantize(ctx: InferCtx) -> TensorType:
    p = ctx.inputs[0]
    enc, shape = ctx.attrs["encoding"], ctx.attrs["shape"]
    qk, bs = QUANT_BLOCKS[enc]
    if p.dtype != "u8":
        raise ctx.fail(f"packed input dtype {p.dtype}; expected u8")
    if not shape or shape[-1] % qk:
        raise ctx.fail(f"shape {shape}: last dim must be a multiple of {qk} for {enc}")
    want = (*shape[:-1], shape[-1] // qk * bs)
    if p.is_static() and tuple(p.shape) != want:
        raise ctx.fail(f"packed shape {list(p.shape)}; expected {list(want)} for {enc} {shape}")
    return TensorType("f32", tuple(shape))


def _dequant_matmul(ctx: InferCtx) -> TensorType:
    x, p = ctx.inputs
    enc, n, k = ctx.attrs["encoding"], ctx.attrs["N"], ctx.attrs["K"]
    qk, bs = QUANT_BLOCKS[enc]
    if x.dtype != "f32":
        raise ctx.fail(f"x dtype {x.dtype}; expected f32")
    if k % qk:
        raise ctx.fail(f"K={k} not a multiple of {qk} for {enc}")
    if not dims_equal_or_symbolic(x.shape[-1] if x.rank else None, k):
        raise ctx.fail(f"x last dim {x.shape[-1] if x.rank else None}; expected K={k}")
    if p.dtype != "u8" or (p.is_static() and tuple(p.shape) != (n, k // qk * bs)):
        raise ctx.fail(f"packed weight {p.dtype}{list(p.shape)}; expected u8[{n}, {k // qk * bs}]")
    return TensorType("f32", x.shape[:-1] + (n,))


def _dequant_gather(ctx: InferCtx) -> TensorType:
    p, idx = ctx.inputs
    enc, n, k = ctx.attrs["encoding"], ctx.attrs["N"], ctx.attrs["K"]
    qk, bs = QUANT_BLOCKS[enc]
    if k % qk:
        raise ctx.fail(f"K={k} not a multiple of {qk} for {enc}")
    if p.dtype != "u8" or (p.is_static() and tuple(p.shape) != (n, k // qk * bs)):
        raise ctx.fail(f"packed table {p.dtype}{list(p.shape)}; expected u8[{n}, {k // qk * bs}]")
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    return TensorType("f32", idx.shape + (k,))


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
        if not all(ch.isalpha() and ch.islower() for ch in t.replace("...", "")):
            raise ValueError(f"operand subscripts {t!r} must be lower-case letters and '...'")
        if "..." in t:
            k = r - len(t.replace("...", ""))
            t = t.replace("...", ell[n_ell - k:] if k else "")
        if len(t) != r:
            raise ValueError(f"subscripts {t!r} have {len(t)} letters; the operand has rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
        if not all(ch.isalpha() for ch in out) or len(set(out)) != len(out):
            raise ValueError(f"output subscripts {rhs!r} must be distinct letters")
        if any(ch not in "".join(out_terms) for ch in out):
            raise ValueError(f"output subscripts {rhs!r} use a letter no operand has")
    else:
        letters = "".join(t for t in out_terms if t)
        out = ell + "".join(sorted(ch for ch in set(letters) if ch.islower() and letters.count(ch) == 1))
    return out_terms, out


def _trilu(ctx: InferCtx) -> TensorType:
    if ctx.inputs[0].rank < 2:
        raise ctx.fail(f"input rank {ctx.inputs[0].rank}; expected >= 2 (the last two dims form matrices)")
    return ctx.inputs[0]


def _gather_elements(ctx: InferCtx) -> TensorType:
    x, idx = ctx.inputs
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    if idx.rank != x.rank:
        raise ctx.fail(f"indices rank {idx.rank}; expected the data rank {x.rank}")
    ctx.axis(ctx.attrs["axis"], x.rank)
    return TensorType(x.dtype, idx.shape)


def _scatter_nd(ctx: InferCtx) -> TensorType:
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


def _scatter_elements(ctx: InferCtx) -> TensorType:
    x, idx, upd = ctx.inputs
    if idx.dtype not in ("i64", "i32"):
        raise ctx.fail(f"indices have dtype {idx.dtype}; expected i64 or i32")
    if upd.dtype != x.dtype or idx.rank != x.rank or upd.rank != x.rank:
        raise ctx.fail("data, indices and updates must share a rank, and data/updates a dtype")
    ctx.axis(ctx.attrs["axis"], x.rank)
    return x


def _topk(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    if x.dtype == "bool":
        raise ctx.fail("TopK of bool; expected a numeric dtype")
    ax = ctx.axis(ctx.attrs["axis"], x.rank)
    k = ctx.attrs["k"]
    if k < 0 or (isinstance(x.shape[ax], int) and k > x.shape[ax]):
        raise ctx.fail(f"k={k} is outside [0, {x.shape[ax]}] for axis {ax}")
    shape = x.shape[:ax] + (k,) + x.shape[ax + 1:]
    return TensorType("i64" if ctx.attrs["output"] == "indices" else x.dtype, shape)


def _einsum(ctx: InferCtx) -> TensorType:
    dt = _same_dtypes(ctx, tuple(range(len(ctx.inputs))))
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


def _resize(ctx: InferCtx) -> TensorType:
    x = ctx.inputs[0]
    _require_float(ctx)
    scales, sizes = ctx.attrs["scales"], ctx.attrs["sizes"]
    if (scales is None) == (sizes is None):
        raise ctx.fail("give exactly one of scales and sizes")
    n = len(scales if scales is not None else sizes)
    if n != x.rank:
        raise ctx.fail(f"{'scales' if scales is not None else 'sizes'} has {n} entries; expected rank {x.rank}")
    if scales is not None:
        if any(sc <= 0 for sc in scales):
            raise ctx.fail(f"scales {scales} must be positive")
        out = tuple(int(math.floor(d * sc)) if isinstance(d, int) else (d if sc == 1 else ctx.fresh())
                    for d, sc in zip(x.shape, scales))
    else:
        if any(sz <= 0 for sz in sizes):
            raise ctx.fail(f"sizes {sizes} must be positive")
        out = tuple(sizes)
    return TensorType(x.dtype, out)


def _random(ctx: InferCtx) -> TensorType:
    if ctx.attrs["dtype"] not in FLOAT_DTYPES:
        raise ctx.fail(f"dtype {ctx.attrs['dtype']}; expected a float dtype")
    return TensorType(ctx.attrs["dtype"], tuple(ctx.attrs["shape"]))


# ---------------------------------------------------------------------------- the table

OPS: dict[str, OpSpec] = {}


def _reg(name, n_in, infer, attrs=None, kind="compute", doc=""):
    lo, hi = (n_in, n_in) if isinstance(n_in, int) else n_in
    OPS[name] = OpSpec(name, lo, hi, attrs or {}, infer, kind, doc)


_FLOAT_UNARY = ["Exp", "Log", "Sqrt", "Rsqrt", "Reciprocal", "Sin", "Cos", "Tan", "Tanh", "Sigmoid",
                "Silu", "Softplus", "Softsign", "Erf", "Floor", "Ceil", "Round", "Asin", "Acos", "Atan", "Sinh",
                "Cosh", "Asinh", "Acosh", "Atanh"]
for _n in _FLOAT_UNARY:
    _reg(_n, 1, _float_unary)
for _n in ["Neg", "Abs", "Relu", "Sign"]:
    _reg(_n, 1, _numeric_unary)
_reg("Identity", 1, _same)
_reg("LeakyRelu", 1, _float_unary, {"alpha": Attr("float", 0.01)})
_reg("Elu", 1, _float_unary, {"alpha": Attr("float", 1.0)})
_reg("Selu", 1, _float_unary, {"alpha": Attr("float", 1.6732632423543772),
                               "gamma": Attr("float", 1.0507009873554805)})
_reg("Gelu", 1, _float_unary, {"approximate": Attr("str", "none", ("none", "tanh"))})
_reg("Clip", (1, 3), _clip, {"min": Attr("float", None), "max": Attr("float", None)})
_reg("Cast", 1, _cast, {"to": Attr("dtype")})
_reg("Not", 1, _not)
for _n in ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]:
    _reg(_n, 2, _arith)
_reg("Mod", 2, _arith, {"fmod": Attr("int", 0, (0, 1))})
for _n in ["Equal", "Less", "LessEqual", "Greater", "GreaterEqual"]:
    _reg(_n, 2, _compare)
for _n in ["And", "Or"]:
    _reg(_n, 2, _logic)
_reg("Where", 3, _where)
for _n in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"]:
    _reg(_n, 1, _reduce, {"axes": Attr("ints", None), "keepdims": Attr("int", 1, (0, 1))})
for _n in ["ArgMax", "ArgMin"]:
    _reg(_n, 1, _argreduce, {"axis": Attr("int", 0), "keepdims": Attr("int", 1, (0, 1)),
                             "select_last_index": Attr("int", 0, (0, 1))})
for _n in ["Softmax", "LogSoftmax"]:
    _reg(_n, 1, _axis_same, {"axis": Attr("int", -1)})
_reg("CumSum", 1, _axis_same, {"axis": Attr("int", 0), "exclusive": Attr("int", 0, (0, 1)),
                               "reverse": Attr("int", 0, (0, 1))})
_reg("Reshape", (1, 2), _reshape, {"shape": Attr("ints", None)})
_reg("Transpose", 1, _transpose, {"perm": Attr("ints", None)})
_reg("Concat", (1, 1 << 16), _concat, {"axis": Attr("int")})
_reg("Slice", 1, _slice, {"starts": Attr("ints"), "ends": Attr("ints"), "axes": Attr("ints", None),
                          "steps": Attr("ints", None)})
_reg("Gather", 2, _gather, {"axis": Attr("int", 0)})
_reg("Expand", (1, 2), _expand, {"shape": Attr("ints", None)})
_reg("Tile", (1, 2), _tile, {"repeats": Attr("ints", None)})
_reg("Squeeze", 1, _squeeze, {"axes": Attr("ints", None)})
_reg("Unsqueeze", 1, _unsqueeze, {"axes": Attr("ints")})
_reg("Flatten", 1, _flatten, {"axis": Attr("int", 1)})
_reg("Pad", 1, _pad, {"pads": Attr("ints"), "mode": Attr("str", "constant", ("constant", "reflect", "edge")),
                      "value": Attr("float", 0.0)})
_reg("Shape", 1, _shape)
_reg("Range", 3, _range)
_reg("ConstantOfShape", (0, 1), _constant_of_shape, {"shape": Attr("ints", None), "value": Attr("float", 0.0),
                                                     "dtype": Attr("dtype", "f32")})
_reg("DepthToSpace", 1, _depth_to_space, {"blocksize": Attr("int"), "mode": Attr("str", "DCR", ("DCR", "CRD"))})
_reg("MatMul", 2, _matmul)
_CONV_ATTRS = {"strides": Attr("ints", None), "pads": Attr("ints", None), "dilations": Attr("ints", None),
               "group": Attr("int", 1)}
_reg("Conv", (2, 3), _conv, dict(_CONV_ATTRS))
_reg("ConvTranspose", (2, 3), _conv_transpose, {**_CONV_ATTRS, "output_padding": Attr("ints", None)})
_POOL_ATTRS = {"kernel_shape": Attr("ints"), "strides": Attr("ints", None), "pads": Attr("ints", None),
               "ceil_mode": Attr("int", 0, (0, 1))}
_reg("MaxPool", 1, _pool, {**_POOL_ATTRS, "dilations": Attr("ints", None)})
_reg("AveragePool", 1, _pool, {**_POOL_ATTRS, "count_include_pad": Attr("int", 0, (0, 1))})
_reg("GlobalAveragePool", 1, _global_pool)
_reg("BatchNormalization", 5, _batchnorm, {"epsilon": Attr("float", 1e-5)})
_reg("LayerNorm", (2, 3), _norm_last, {"axis": Attr("int", -1), "epsilon": Attr("float", 1e-5)})
_reg("RMSNorm", 2, _norm_last, {"axis": Attr("int", -1), "epsilon": Attr("float", 1e-6)})
_reg("GroupNorm", 3, _groupnorm, {"num_groups": Attr("int"), "epsilon": Attr("float", 1e-5)})
_reg("ScaledDotProductAttention", (3, 4), _sdpa, {"causal": Attr("int", 0, (0, 1)), "scale": Attr("float", None)})
_ENC = tuple(QUANT_BLOCKS)
_reg("Dequantize", 1, _dequantize, {"encoding": Attr("str", REQUIRED, _ENC), "shape": Attr("ints")})
_reg("DequantMatMul", 2, _dequant_matmul, {"encoding": Attr("str", REQUIRED, _ENC), "N": Attr("int"),
                                           "K": Attr("int")})
_reg("DequantGather", 2, _dequant_gather, {"encoding": Attr("str", REQUIRED, _ENC), "N": Attr("int"),
                                           "K": Attr("int")})
_reg("Einsum", (1, 8), _einsum, {"equation": Attr("str")})
_REDUCTIONS = ("none", "add", "mul", "max", "min")
_reg("ScatterND", 3, _scatter_nd, {"reduction": Attr("str", "none", _REDUCTIONS)})
_reg("ScatterElements", 3, _scatter_elements, {"axis": Attr("int", 0), "reduction": Attr("str", "none", _REDUCTIONS)})
_reg("TopK", 1, _topk, {"k": Attr("int"), "axis": Attr("int", -1), "largest": Attr("int", 1, (0, 1)),
                        "output": Attr("str", "values", ("values", "indices"))})
_reg("Trilu", 1, _trilu, {"upper": Attr("int", 1, (0, 1)), "k": Attr("int", 0)})
_reg("GatherElements", 2, _gather_elements, {"axis": Attr("int", 0)})
_reg("Resize", 1, _resize, {
    "scales": Attr("floats", None), "sizes": Attr("ints", None),
    "mode": Attr("str", "nearest", ("nearest", "linear")),
    "coordinate_transformation_mode": Attr("str", "half_pixel",
                                           ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")),
    "nearest_mode": Attr("str", "round_prefer_floor", ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"))})
_reg("RandomNormal", 0, _random, {"shape": Attr("ints"), "mean": Attr("float", 0.0), "scale": Attr("float", 1.0),
                                  "seed": Attr("int", 0), "dtype": Attr("dtype", "f32")}, kind="random")
_reg("RandomUniform", 0, _random, {"shape": Attr("ints"), "low": Attr("float", 0.0), "high": Attr("float", 1.0),
                                   "seed": Attr("int", 0), "dtype": Attr("dtype", "f32")}, kind="random")

LEAF_OPS = ("Input", "Param", "Constant")
RANDOM_OPS = frozenset(n for n, s in OPS.items() if s.kind == "random")


def normalize_attrs(op: str, attrs: dict, where: str) -> dict[str, Any]:
    """Type-check attrs against the catalogue and fill defaults. Raises GraphError."""
    spec = OPS[op]
    if not isinstance(attrs, dict):
        raise GraphError(f"{where}: attrs must be an object; got {type(attrs).__name__}")
    unknown = sorted(set(attrs) - set(spec.attrs))
    if unknown:
        raise GraphError(f"{where}: unknown attr(s) {unknown} for {op}; expected a subset of {sorted(spec.attrs)}")
    out: dict[str, Any] = {}
    for name, a in spec.attrs.items():
        if name not in attrs:
            if a.default is REQUIRED:
                raise GraphError(f"{where}: missing required attr {name!r} ({a.kind}) for {op}")
            out[name] = a.default
            continue
        out[name] = _check_attr(attrs[name], a, f"{where}: attr {name!r}")
    return out


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_attr(v, a: Attr, where: str):
    if v is None and a.default is None:
        return None
    ok = True
    if a.kind == "int":
        ok = _is_int(v) or isinstance(v, bool)
        v = int(v) if ok else v
    elif a.kind == "float":
        ok = isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)
        v = float(v) if ok else v
    elif a.kind == "str":
        ok = isinstance(v, str)
    elif a.kind == "dtype":
        ok = v in DTYPES
    elif a.kind in ("ints", "floats"):
        ok = isinstance(v, (list, tuple)) and all(
            _is_int(e) if a.kind == "ints" else isinstance(e, (int, float)) and not isinstance(e, bool) for e in v)
        v = [int(e) if a.kind == "ints" else float(e) for e in v] if ok else v
    if not ok:
        raise GraphError(f"{where} has value {v!r}; expected {a.kind}")
    if a.choices and v not in a.choices:
        raise GraphError(f"{where} is {v!r}; expected one of {list(a.choices)}")
    return v
