"""Relu and Clip on the CPU: numpy's maximum/minimum against arrays of the bound, not against the scalar.

numpy 2.4's float maximum/minimum/clip with a scalar (or 0-d) operand took its slow loop here: 0.33 ns an
element on a 225K-element Relu, against 0.09 ns for the same maximum of two contiguous arrays (and 0.06 ns for
an add). So the bound is a cached run of CHUNK elements and a large tensor goes through in CHUNK-sized slices
(the run stays in cache; a whole-tensor run would cost memory the size of the largest activation). Same
function, same values: maximum(x, lo) element by element either way (NaN kept, ties give the bound's zero).
"""

from __future__ import annotations

import functools

import numpy as np

CHUNK = 1 << 16  # elements per slice: 256 KiB of float32 bound, in L2 beside the slice itself
# below this many elements the scalar loop's extra ~0.25 ns an element costs less than finding the bound's run
SMALL = 1 << 13


def _run(dtype: np.dtype, value) -> np.ndarray:
    """CHUNK elements of `value` as dtype, read-only, shared (keyed by the value's bits: -0.0 is not 0.0)."""
    return _run_of(dtype, np.asarray(value, dtype).tobytes())


@functools.lru_cache(maxsize=64)
def _run_of(dtype: np.dtype, bits: bytes) -> np.ndarray:
    run = np.full(CHUNK, np.frombuffer(bits, dtype)[0], dtype)
    run.flags.writeable = False
    return run


def clamp(x: np.ndarray, lo, hi, out: np.ndarray | None = None) -> np.ndarray:
    """np.minimum(np.maximum(x, lo), hi) for a float array x (either bound may be None: no clamp on that side),
    into `out` (a fresh array if None; may be x). Scalar bounds only."""
    if out is None:
        out = np.empty_like(x)
    if x.size <= SMALL or not (x.flags.c_contiguous and out.flags.c_contiguous and x.dtype.kind == "f"):
        _whole(x, lo, hi, out)
        return out
    flat, dst = x.reshape(-1), out.reshape(-1)
    t = x.dtype.type
    runs = [(np.maximum, _run(x.dtype, t(lo)))] if lo is not None else []
    if hi is not None:
        runs.append((np.minimum, _run(x.dtype, t(hi))))
    if not runs:
        np.copyto(dst, flat)
    for s in range(0, flat.size, CHUNK):
        e = min(flat.size, s + CHUNK)
        src = flat[s:e]
        for ufunc, run in runs:
            ufunc(src, run[: e - s], out=dst[s:e])
            src = dst[s:e]
    return out


def _whole(x, lo, hi, out) -> None:
    """clamp's values for any layout: numpy's scalar loops."""
    src = x
    if lo is not None:
        np.maximum(src, x.dtype.type(lo), out=out)
        src = out
    if hi is not None:
        np.minimum(src, x.dtype.type(hi), out=out)
        src = out
    if src is x:
        np.copyto(out, x)


def relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """np.maximum(x, 0) (see clamp)."""
    return clamp(x, 0, None, out)
