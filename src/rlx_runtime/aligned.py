"""float32 arrays that start on a 64-byte cache line, for the outputs of the CPU's numba conv and GEMM kernels.

numpy's and glibc's large arrays start 16 bytes past a cache line (malloc's header), so every 64-byte vector
load or store of their rows spans two lines. The pointwise conv kernel (simd.skinny_f32) reading and writing such
rows ran at 0.55-0.75x its speed on aligned ones (64->256 channels at 512 pixels, output in L2: 33 against 58
GMAC/s; at 3136 pixels, output to memory, 29 against 38; a C loop of the same shape measured the same, Xeon
AVX-512). A conv's output is the next conv's input, so aligning the outputs aligns both sides.
"""

from __future__ import annotations

import functools
import math

import numpy as np

LINE = 64  # bytes
SLACK = LINE // 4  # float32 elements of room to slide the start onto a line


@functools.cache
def _flat():
    """aligned_kernels.flat, imported on first use: this module is numpy's alone until then (compile aligns the
    weights it copies without loading numba)."""
    from .aligned_kernels import flat
    return flat


def zeros(shape: tuple[int, ...]) -> np.ndarray:
    """np.zeros(shape, np.float32) starting on a cache line (numpy alone; for weights packed or copied once per
    compile, where the extra line of memory is nothing)."""
    count = math.prod(shape)
    buf = np.zeros(count + SLACK, np.float32)
    skip = (-buf.ctypes.data % LINE) // 4  # numpy's arrays start on 4-byte multiples at the least
    return buf[skip:skip + count].reshape(shape)


COPY_BLOCK = 64  # columns of a transposed matrix copied at a time (array)


def array(a: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 copy of `a` starting on a cache line (zeros, then filled). A transposed matrix (a
    weight's column-major copy at compile) is copied COPY_BLOCK columns at a time: numpy's copy in the output's order
    read one element of each source row per output element, a cache line each (3072x768 float32 weights, Xeon:
    16 ms; by 64 columns, 64 source rows that stay in cache: 1.5 ms; GPT-2's compile 0.25 s of such copies)."""
    out = zeros(a.shape)
    if a.ndim == 2 and a.flags.f_contiguous and not a.flags.c_contiguous:
        for j in range(0, a.shape[1], COPY_BLOCK):
            out[:, j:j + COPY_BLOCK] = a[:, j:j + COPY_BLOCK]
    else:
        out[...] = a
    return out


def empty(shape: tuple[int, ...], run: int | None = None) -> np.ndarray:
    """np.empty(shape, np.float32), starting on a cache line when `run` (the length of the rows its readers and
    writers go along: a GEMM's rows, a conv's planes; default the last axis) is a whole number of lines, so that
    every run starts on one. Other shapes gain little (a 14x14 plane's runs start on a line one time in four) and
    take numpy's array (the aligned one costs ~2 us more to make)."""
    if (shape[-1] if run is None else run) % SLACK:
        return np.empty(shape, np.float32)
    return _flat()(math.prod(shape), LINE, SLACK).reshape(shape)
