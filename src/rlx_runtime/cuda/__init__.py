"""The CUDA side of the quantized ops: packed GGML blocks on cupy.

blocks.py: packed blocks as array operations (any array module: cupy; numpy for DequantGather and tests);
  row-tile dequantization + BLAS matmul, DequantGather, Dequantize.
fused.py: the custom kernels in kernels.cu (fused dequant+GEMV for small batches), loaded with
  cupy.RawModule on first use.
Nothing here imports cupy at import time; the array module arrives as `xp`.
"""
