"""The custom kernels of kernels.cu, through cupy.RawModule (compiled by NVRTC on first use, cached on disk
by cupy). Used for DequantMatMul with at most FUSED_MAX_ROWS input rows, where reading the packed
weight once beats dequantizing it and calling cuBLAS."""

from __future__ import annotations

import importlib.resources

import numpy as np

from rlx_format.codecs import CODECS
from rlx_format.errors import RlxError

FUSED_MAX_ROWS = 8     # RLX_MAX_M in kernels.cu: input rows one weight load serves
ROWS_PER_BLOCK = 8     # warps (= output rows) per thread block
_ENTRY = {c.name: c.cuda_gemv for c in CODECS.values() if c.cuda_gemv}  # codecs with a fused kernel
_modules: dict = {}    # GPU id -> RawModule


def source() -> str:
    return importlib.resources.files(__package__).joinpath("kernels.cu").read_text()


def supports(encoding: str) -> bool:
    """Whether kernels.cu has a fused kernel for `encoding` (the codec names it); others take the tiled path."""
    return encoding in _ENTRY


def _module(xp):
    dev = xp.cuda.Device().id
    mod = _modules.get(dev)
    if mod is None:
        try:
            mod = xp.RawModule(code=source(), options=("--std=c++14",))
            for name in _ENTRY.values():
                mod.get_function(name)  # compile now, so a toolchain problem surfaces here
        except Exception as e:  # noqa: BLE001 - NVRTC/driver errors come in several types
            raise RlxError(f"compiling rlx's CUDA kernels failed ({type(e).__name__}: {e}); the cuda extra "
                           "installs NVRTC: pip install 'rlx[cuda]'") from e
        _modules[dev] = mod
    return mod


def gemv(xp, x2, packed, encoding: str, N: int, K: int):
    """x2 [M <= FUSED_MAX_ROWS, K] f32 @ dequant(packed [N, K]).T -> [M, N] f32, one pass over the bytes."""
    M = x2.shape[0]
    fn = _module(xp).get_function(_ENTRY[encoding])
    y = xp.empty((M, N), dtype=xp.float32)
    grid = ((N + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK,)
    fn(grid, (32 * ROWS_PER_BLOCK,), (xp.ascontiguousarray(packed), xp.ascontiguousarray(x2, dtype=xp.float32),
                                      y, np.int32(N), np.int32(K), np.int32(M)))
    return y
