"""CUDA-only code: the custom kernels in kernels.cu (fused dequant+GEMV for small batches), loaded with
cupy.RawModule on first use (fused.py). The array-op path every backend shares is rlx_runtime.packed.
Nothing here imports cupy at import time; the array module arrives as `xp`.
"""
