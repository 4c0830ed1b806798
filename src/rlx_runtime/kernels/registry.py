"""The kernel registry: one short function per op, written against an array module `xp`.

Signature: kernel(xp, attrs, *inputs) -> array. `attrs` is the catalogue-normalized dict (plus
private keys set at compile, e.g. `_rng`). KERNELS holds the generic kernel of every op, written for
any array module; a backend may override an op (`@kernel("Erf", backend="cpu")`: the numba one).
A Backend's `kernel(op)` picks. Semantics are those of spec/ops.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlx_format.errors import RlxError
from rlx_format.ops import OPS

Kernel = Callable[..., object]
KERNELS: dict[str, Kernel] = {}            # op -> generic kernel
OVERRIDES: dict[str, dict[str, Kernel]] = {}  # backend name -> op -> kernel used there instead


@dataclass(frozen=True)
class KernelFacts:
    """What generated code may assume about an op's result, stated where its kernel is registered (every
    backend's kernel for the op must honour them)."""

    aliases: bool = False       # the result may be input 0 itself or a view of it (never of another input)
    inplace: str | None = None  # numpy ufunc that computes the op into a dying input 0 (`np.<ufunc>(*ins, out=)`)
    inplace_floats_only: bool = False  # e.g. Div: np.divide is true division, so integer Div is never in place


FACTS: dict[str, KernelFacts] = {}

# backend name -> op -> binder. A binder is called at a plan step's first run with the step's attrs and inputs, and
# returns a kernel (the same signature and values) bound to them: the decisions the op's kernel makes on every
# call (its path, its derived geometry, its epilogue) made once, so later calls run little Python beyond the compute.
# Inside a CPU forward each Python operation of a step's wrapper cost 3-10x its hot time (the big kernels between
# steps evict the interpreter's working set from the caches: a 576-channel 7x7 depthwise conv's wrappers took ~90 us
# after a 16 MB copy, ~20 us hot). The bound kernel checks that its inputs are the ones it was bound to (shape,
# dtype, the constant weights' identity) and hands any other call to the op's kernel. None: nothing to bind.
Binder = Callable[..., Kernel | None]
BINDERS: dict[str, dict[str, Binder]] = {}


def kernel(*names: str, backend: str | None = None, **facts):
    """Register the decorated function as the kernel of `names`: generic (with the op's KernelFacts), or
    for one backend only (the facts stay those of the generic registration)."""
    def deco(fn):
        for n in names:
            register(n, fn, backend=backend, **facts)
        return fn
    return deco


def register(name: str, fn: Kernel, backend: str | None = None, **facts) -> None:
    if backend is None:
        KERNELS[name] = fn
        FACTS[name] = KernelFacts(**facts)
    elif facts:
        raise ValueError(f"{name}: kernel facts belong to the generic registration, not backend {backend!r}")
    else:
        OVERRIDES.setdefault(backend, {})[name] = fn


def binder(*names: str, backend: str):
    """Register the decorated function as the binder of `names` on `backend` (see BINDERS)."""
    def deco(fn):
        for n in names:
            BINDERS.setdefault(backend, {})[n] = fn
        return fn
    return deco


def numba_loaded() -> bool:
    """Whether numba is imported already: CPU kernels with a numba path that numpy's steps also cover take it only
    then, so a forward that needs numba for nothing else does not pay its start-up (spec/ops.md, "with numba
    loaded")."""
    return sys.modules.get("numba") is not None


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
    bad = sorted(op for op, f in FACTS.items() if f.aliases and f.inplace)
    if bad:
        raise RlxError(f"ops both aliasing their input and computed in place: {bad}")
    for name, table in OVERRIDES.items():
        stray = sorted(set(table) - set(OPS))
        if stray:
            raise RlxError(f"backend {name!r} overrides unknown ops {stray}")
