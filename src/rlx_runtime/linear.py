"""numba epilogue of the CPU FusedMatMul: a linear layer's bias (one value per output column), then a residual,
added to each finished block of the GEMM output while it is in cache (threads.matmul runs it on the thread that
computed the block).

Apart, the bias Add and the residual Add were passes of their own over the whole output, each on one thread, and
after a GEMM split over two threads half of what they read sat in the other core's cache (MiniLM at 2 threads:
its 50 Adds took ~35 ms of a ~230 ms forward). The float32 steps are the unfused ops': (x @ w + b) + r, each sum
rounded once, so the results are bitwise the unfused ones (IEEE addition commutes: either operand order of the
Adds gives the same values, a NaN's payload aside).
"""

from __future__ import annotations

import numpy as np

from rlx_format.numba_setup import numba


@numba.njit(cache=True, error_model="numpy", nogil=True)
def add_columns(flat, m, n, b0, b1, r0, r1, c0, c1, bias, res, has_res):  # pragma: no cover - compiled
    """flat: a (B, m, n) float32 GEMM output, C-order; in place on block [b0, b1) x [r0, r1) x [c0, c1):
    y + bias[c], then + res (flat, y's shape) with has_res."""
    add = bias[c0:c1]
    for bi in range(b0, b1):
        for r in range(r0, r1):
            at = (bi * m + r) * n
            row = flat[at + c0:at + c1]
            if has_res:
                other = res[at + c0:at + c1]
                for i in range(c1 - c0):
                    row[i] = (row[i] + add[i]) + other[i]
            else:
                for i in range(c1 - c0):
                    row[i] = row[i] + add[i]


class ColumnBias:
    """The epilogue threads.matmul runs on each finished block of a float32 (B, M, N) GEMM output: the bias per
    column, then the residual (as the output, flat), in place. Called in Python, or written as a table row (`put`)
    for the worker pool's compiled loop (pool_kernels.py)."""

    _NO_RESIDUAL = np.zeros(1, np.float32)

    def __init__(self, bias: np.ndarray, residual: np.ndarray | None = None):
        self.bias = np.ascontiguousarray(bias, np.float32).reshape(-1)
        self.has_res = residual is not None
        self.residual = (self._NO_RESIDUAL if residual is None
                         else np.ascontiguousarray(residual, np.float32).reshape(-1))

    def __call__(self, y3: np.ndarray, b0: int, b1: int, r0: int, r1: int, c0: int, c1: int) -> None:
        if b1 > b0 and r1 > r0 and c1 > c0:
            add_columns(y3.reshape(-1), y3.shape[1], y3.shape[2], b0, b1, r0, r1, c0, c1, self.bias, self.residual,
                        self.has_res)

    def put(self, k, ints: np.ndarray, floats: np.ndarray, r: int, y3: np.ndarray, b0: int, b1: int, r0: int,
            r1: int, c0: int, c1: int) -> None:
        """Write this block as row r of the worker pool's tables (k: pool_kernels; threads.Steps.epilogue)."""
        if not (b1 > b0 and r1 > r0 and c1 > c0):
            b1 = b0  # an empty block: the loop runs no row
        k.put_columns(ints, floats, r, y3, b0, b1, r0, r1, c0, c1, self.bias, self.residual, self.has_res)
