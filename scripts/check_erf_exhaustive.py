"""Check rlx's float32 erf against the correctly rounded erf for every float32 input in [0, 6.5), and its
fused exact GELU against the unfused float32 steps (Div by √2, that erf, Add 1, Mul 0.5, Mul) for every float32
input whose erf argument lies in (-6.5, 6.5).

erf is odd by construction and is exactly ±1 beyond 6.5, so the first part covers all float32 inputs; GELU is
checked on both signs (its steps are not odd). ~1.09e9 + ~2.2e9 values, about 1.5 min on 2 cores.
Reference: scipy's double-precision erf rounded to float32 (double erf is accurate to ~1 ulp of double, far
below half a float32 ulp). The fast path's estimate is free to use fma (it only decides which results are
certain), so this is the check to rerun whenever its compile flags or coefficients change.
Run: python scripts/check_erf_exhaustive.py
"""

from __future__ import annotations

import sys
import time

import numpy as np
import scipy.special as sp

from rlx_runtime.ufuncs import erf, gelu_erf

_CHUNK = 1 << 24
_SQRT2 = np.float32(np.sqrt(2.0))


def _float32_range(lo: float, hi: float):
    """Every float32 in [lo, hi) for 0 <= lo < hi, in chunks."""
    a, b = int(np.float32(lo).view(np.int32)), int(np.float32(hi).view(np.int32))
    for start in range(a, b, _CHUNK):
        yield np.arange(start, min(start + _CHUNK, b), dtype=np.int32).view(np.float32)


def _rounded_erf(x: np.ndarray) -> np.ndarray:
    return sp.erf(x.astype(np.float64)).astype(np.float32)


def check_erf() -> tuple[int, int]:
    total = mismatches = 0
    for x in _float32_range(0.0, 6.5):
        mismatches += int((erf(x) != _rounded_erf(x)).sum())
        total += x.size
    return total, mismatches


def check_gelu() -> tuple[int, int]:
    total = mismatches = 0
    for pos in _float32_range(0.0, 6.5 * float(_SQRT2)):
        for x in (pos, -pos):
            want = np.float32(0.5) * x * (np.float32(1.0) + _rounded_erf(x / _SQRT2))
            got = gelu_erf(x)
            mismatches += int((got.view(np.int32) != want.view(np.int32)).sum())  # bits: -0.0 vs 0.0 counts
            total += x.size
    return total, mismatches


def main() -> int:
    t0 = time.perf_counter()
    total, bad_erf = check_erf()
    print(f"erf: {total} float32 inputs in [0, 6.5): {bad_erf} differ from the correctly rounded erf "
          f"({time.perf_counter() - t0:.0f} s)")
    t0 = time.perf_counter()
    total, bad_gelu = check_gelu()
    print(f"GELU: {total} float32 inputs with |x / sqrt(2)| < 6.5: {bad_gelu} differ from the unfused float32 steps "
          f"({time.perf_counter() - t0:.0f} s)")
    return 1 if bad_erf or bad_gelu else 0


if __name__ == "__main__":
    sys.exit(main())
