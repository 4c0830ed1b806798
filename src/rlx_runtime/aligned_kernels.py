"""numba's side of aligned.py: fresh float32 arrays starting on a cache line, made in one compiled call."""

from __future__ import annotations

import numpy as np

from rlx_format.numba_setup import numba


@numba.njit(cache=True, nogil=True)
def flat(count, line, slack):  # pragma: no cover - compiled
    """A fresh float32 array of `count` elements whose data starts on a `line`-byte boundary, from a buffer of
    `slack` more (numba's own arrays are 32-byte aligned: the start moves by 0 or 8 elements)."""
    buf = np.empty(count + slack, np.float32)
    skip = ((line - buf.ctypes.data % line) % line) // 4
    return buf[skip:skip + count]
