"""fmaf in numpy, exactly: the reference for kernels whose outputs are fma chains (tests import it)."""

from __future__ import annotations

import numpy as np


def fma32(a, b, c) -> np.ndarray:
    """fmaf(a, b, c) for float32 arrays of finite values, exactly: a * b is exact in float64; s = a*b + c rounds
    there, with error err (Knuth's two-sum, exact); rounding s to float32 is then the correctly rounded result but
    where s falls exactly halfway between two float32 values and err decides the side."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = np.asarray(c, np.float32).astype(np.float64)
    s = p + c
    v = s - p
    err = (p - (s - v)) + (c - v)
    r = s.astype(np.float32)
    lo = np.where(r.astype(np.float64) <= s, r, np.nextafter(r, np.float32(-np.inf)))
    hi = np.nextafter(lo, np.float32(np.inf))
    tie = (s == (lo.astype(np.float64) + hi.astype(np.float64)) / 2) & (err != 0)
    return np.where(tie, np.where(err > 0, hi, lo), r).astype(np.float32)
