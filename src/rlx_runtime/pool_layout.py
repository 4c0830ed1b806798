"""The tables threads.py's worker pool hands to its compiled half (pool_kernels.py): the control words and the
rows that describe a native job's steps. Both sides import these; neither imports the other for them.
"""

from __future__ import annotations

# control words (int64 indices), a cache line apart (a worker polling NEXT shares no line with FINISHED)
NEXT, FINISHED, KIND, WORKED = 0, 8, 16, 24  # WORKED: chunks the workers ran (for tests and reports)
YIELD, CTRL_SIZE = 32, 40  # YIELD: idle workers stop polling (a numba parallel kernel wants the cores)
KIND_NATIVE, KIND_PYTHON, KIND_CLOSED = 0, 1, 2
# table rows: column 0 is the kind; the columns of each, then its floats
ROW_GEMM, ROW_GEMV, ROW_BIAS_ACT, ROW_TAPS, ROW_SKINNY, ROW_DIRECT, ROW_FILL, ROW_COLUMNS = 1, 2, 3, 4, 5, 6, 7, 8
ROW_SCALE, ROW_MEANS, ROW_BLOCKED = 9, 10, 11
INT_COLUMNS, FLOAT_COLUMNS = 40, 4
# ROW_GEMM: fn, wide, order, transa, transb, m, n, k, a, lda, b, ldb, c, ldc | alpha, beta
# ROW_GEMV: fn, wide, order, trans, m, n, a, lda, x, incx, y, incy | alpha, beta
# ROW_BIAS_ACT: y, B, M, N, b0, b1, r0, r1, c0, c1, groups, bias, nbias, has_bias, act, has_lo, has_hi, res,
#   nres, has_res | alpha, beta, lo, hi (res: the residual added after the bias)
# ROW_TAPS: phases, L, taps, T, offsets, y, OH, OW, n, c0, c1, grid, wq, grid size, O, N, x, C, H, W, sh, sw,
#   top, left, hq, bias, nbias, has_bias, act, has_lo, has_hi, res, nres, has_res | alpha, beta, lo, hi
#   (phases: one channel's scratch; act -1: no epilogue)
# ROW_SKINNY: out, x, wt, rows, k, n, c0, c1, r0, r1, bias, nbias, has_bias, act, has_lo, has_hi, res, nres,
#   has_res | alpha, beta, lo, hi (simd.skinny_epilogue_f32 over blocks of SKINNY_ROWS rows, with ROW_BIAS_ACT's
#   epilogue unless act is -1)
# ROW_DIRECT: phases, N, L, w, w's rows, w's columns, offsets, y, OH, OW, b, r0, r1, wq, piece_rows, bias, nbias,
#   has_bias, act, has_lo, has_hi, res, nres, has_res, g_lo, g_hi, K, O | alpha, beta, lo, hi (conv_kernels.direct_rows:
#   w (O, K) or in channel blocks; act -1: no epilogue)
# ROW_FILL: x, N, C, H, W, phases, L, sh, sw, top, left, hq, wq, q0, q1 (conv_kernels.fill_phases on rows q0..q1
#   of every phase plane)
# ROW_COLUMNS: y, B, M, N, b0, b1, r0, r1, c0, c1, bias, nbias, res, nres, has_res (linear.add_columns: a FusedMatMul's
#   bias per column, then its residual)
# ROW_SCALE: big, small, out, width, r0, r1 (conv_kernels.scale_rows on rows r0..r1: a squeeze-excite block's scale)
# ROW_MEANS: x, out, width, r0, r1 (conv_kernels.row_means on rows r0..r1: GlobalAveragePool)
# ROW_BLOCKED: x, N, C, H, W, taps, blocks, T x BLOCK, offsets, T, where, H x W, y, OH, OW, n, k0, k1, g0, g1, buf,
#   buf size, out_rows, out_rows size, sh, sw, top, wp, reach, band, bias, nbias, has_bias, act, has_lo, has_hi,
#   res, nres, has_res | alpha, beta, lo, hi (conv_kernels.dw_blocks; act -1: no epilogue)
