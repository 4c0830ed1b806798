"""The kernel registry: one short function per op, written against an array module `xp`.

Signature: kernel(xp, attrs, *inputs) -> array. `attrs` is the catalogue-normalized dict (plus
private keys set at compile, e.g. `_rng`). numpy is the reference; cupy runs the same code.
Semantics are those of spec/ops.md.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_format.errors import RlxError
from rlx_format.ops import OPS

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
