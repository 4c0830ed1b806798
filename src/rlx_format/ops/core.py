"""Types shared by the op catalogue: TensorType, Attr, OpSpec, InferCtx, broadcasting, attr checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dtypes import FLOAT_DTYPES
from ..errors import GraphError

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


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


@dataclass(frozen=True)
class Attr:
    """An attr's schema. Every int (and entry of ints) MUST fit int64 and be >= lo; every float (and entry
    of floats) MUST be finite and >= lo, unless `nonfinite` (fill values, clip bounds: inf and NaN mean
    something there)."""

    kind: str  # int | float | str | ints | floats | strs | dtype | graph
    default: Any = REQUIRED
    choices: tuple = ()
    lo: int | float | None = None
    nonfinite: bool = False


@dataclass(frozen=True)
class OpSpec:
    name: str
    min_inputs: int
    max_inputs: int
    attrs: dict[str, Attr]
    infer: Callable[[InferCtx], TensorType]
    kind: str = "compute"  # compute | random | control | leaf
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
        """Normalize an axis of a rank-`rank` operand; a rank-0 operand has no axis to name."""
        if rank == 0:
            raise self.fail(f"{what} {axis} given for a rank-0 (scalar) input; expected an input of rank >= 1")
        if not -rank <= axis < rank:
            raise self.fail(f"{what} {axis} out of range for rank {rank}; expected -{rank} <= {what} < {rank}")
        return axis % rank


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


def infer_same(ctx: InferCtx) -> TensorType:
    return ctx.inputs[0]


def require_float(ctx: InferCtx, i: int = 0) -> None:
    if ctx.inputs[i].dtype not in FLOAT_DTYPES:
        raise ctx.fail(f"input {i} has dtype {ctx.inputs[i].dtype}; expected a float dtype")


def infer_float_unary(ctx: InferCtx) -> TensorType:
    require_float(ctx)
    return ctx.inputs[0]


def infer_numeric_unary(ctx: InferCtx) -> TensorType:
    if ctx.inputs[0].dtype == "bool":
        raise ctx.fail("input is bool; expected a numeric dtype")
    return ctx.inputs[0]


def same_dtypes(ctx: InferCtx, idx: tuple[int, ...]) -> str:
    dts = {ctx.inputs[i].dtype for i in idx if i < len(ctx.inputs)}
    if len(dts) > 1:
        raise ctx.fail(f"inputs have dtypes {sorted(dts)}; expected one dtype (insert a Cast)")
    return dts.pop()
