"""The kernel registry: one short function per op, written against an array module `xp`.

Signature: kernel(xp, attrs, *inputs) -> array. `attrs` is the catalogue-normalized dict (plus
private keys set at compile, e.g. `_rng`). KERNELS holds the generic kernel of every op, written for
any array module; a backend may override an op (`@kernel("Erf", backend="cpu")`: the numba one).
A Backend's `kernel(op)` picks. Semantics are those of spec/ops.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_format.errors import RlxError
from rlx_format.ops import OPS

from ..backend import backend_of

Kernel = Callable[..., object]
KERNELS: dict[str, Kernel] = {}            # op -> generic kernel
OVERRIDES: dict[str, dict[str, Kernel]] = {}  # backend name -> op -> kernel used there instead


def kernel(*names: str, backend: str | None = None):
    """Register the decorated function as the kernel of `names` (generic, or for one backend only)."""
    table = KERNELS if backend is None else OVERRIDES.setdefault(backend, {})

    def deco(fn):
        for n in names:
            table[n] = fn
        return fn
    return deco


def host_ints(xp, a) -> list[int]:
    """Values of a small integer tensor as Python ints (syncs on a device)."""
    return [int(v) for v in np.asarray(backend_of(xp).to_host(a)).ravel()]


def special(xp):
    """erf / expit for the arrays of `xp` (the backend's special functions)."""
    return backend_of(xp).special


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
    for name, table in OVERRIDES.items():
        stray = sorted(set(table) - set(OPS))
        if stray:
            raise RlxError(f"backend {name!r} overrides unknown ops {stray}")
