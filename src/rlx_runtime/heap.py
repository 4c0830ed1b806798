"""Freed memory kept for the next forward instead of going back to the OS (glibc).

A forward allocates and frees its intermediate arrays in the same order every time. By default glibc maps a
large array with mmap and unmaps it when freed (its threshold adapts only to sizes it has seen freed), and it
returns freed memory at the heap's top to the OS beyond a small trim threshold, so the next forward takes the
same pages again, one page fault each: about 1000 faults a forward for MobileNetV3-small, 3 us apiece on this
project's VMs (8 -> 11 ms a forward; counted with getrusage). With the mmap threshold at its largest (arrays up
to 32 MiB come from the heap) and a trim threshold of 256 MiB, a forward's pages stay mapped and reused: no
faults after the first forward (tests/test_heap.py). The price: up to TRIM_THRESHOLD of freed memory stays
mapped per malloc arena, as an inference server's arena allocator keeps it.

This is process-wide and done once, at the first CPU forward; RLX_KEEP_FREED_MEMORY=0 leaves malloc alone.
Elsewhere than glibc nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
import sys

MMAP_THRESHOLD = 32 << 20   # arrays up to this size come from the heap (glibc's largest allowed value)
TRIM_THRESHOLD = 256 << 20  # and up to this much freed heap top stays mapped
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
_applied: bool | None = None  # None until the first forward; then whether the thresholds were set


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once (see the module doc); True if they are set."""
    global _applied
    if _applied is None:
        _applied = _set_thresholds()
    return _applied


def _set_thresholds() -> bool:
    if os.environ.get("RLX_KEEP_FREED_MEMORY", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):  # glibc only (musl's mallopt is a stub)
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
