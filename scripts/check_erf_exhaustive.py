"""Check rlx's float32 erf against the correctly rounded erf for every float32 input in [0, 6.5).

The function is odd by construction and is exactly ±1 beyond 6.5, so this covers all float32
inputs. ~1.09e9 values, about 20 s on 2 cores. Reference: scipy's double-precision erf rounded to
float32 (double erf is accurate to ~1 ulp of double, far below half a float32 ulp).
Run: python scripts/check_erf_exhaustive.py
"""

from __future__ import annotations

import sys
import time

import numpy as np
import scipy.special as sp

from rlx_runtime.ufuncs import erf


def main() -> int:
    t0 = time.perf_counter()
    lo, hi = int(np.float32(0).view(np.int32)), int(np.float32(6.5).view(np.int32))
    total = mismatches = 0
    for start in range(lo, hi, 1 << 24):
        x = np.arange(start, min(start + (1 << 24), hi), dtype=np.int32).view(np.float32)
        diff = erf(x) != sp.erf(x.astype(np.float64)).astype(np.float32)
        mismatches += int(diff.sum())
        total += x.size
    print(f"{total} float32 inputs in [0, 6.5): {mismatches} differ from the correctly rounded erf "
          f"({time.perf_counter() - t0:.0f} s)")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
