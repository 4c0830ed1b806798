"""Devices and their array modules (numpy on CPU, cupy on CUDA; cupy is imported only when asked for)."""

from __future__ import annotations

import contextlib
import enum
from typing import Any

import numpy as np

from rlx_format.errors import RlxError

CUDA_EXTRA_HINT = "install the CUDA extra: pip install 'rlx[cuda]' (or run on Device.CPU)"


class Device(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"

    @classmethod
    def parse(cls, text: str) -> Device:
        """'cpu', 'cuda' or 'cuda:N' -> the kind (the index is read by parse_device)."""
        return parse_device(text)[0]


def parse_device(text: str) -> tuple[Device, int]:
    """'cpu' -> (CPU, 0); 'cuda' -> (CUDA, 0); 'cuda:N' -> (CUDA, N)."""
    kind, _, index = str(text).strip().lower().partition(":")
    try:
        device = Device(kind)
    except ValueError:
        raise RlxError(f"unknown device {text!r}; expected 'cpu', 'cuda' or 'cuda:N'") from None
    if not index:
        return device, 0
    if device is Device.CPU or not index.isdigit():
        raise RlxError(f"bad device {text!r}: a GPU index is 'cuda:N' with N a non-negative integer")
    return device, int(index)


def array_module(device: Device, index: int = 0) -> Any:
    """numpy for CPU; cupy for CUDA after checking that it imports and that GPU `index` exists."""
    if device is Device.CPU:
        return np
    try:
        import cupy
    except ImportError:
        raise RlxError(f"Device.CUDA needs cupy, which is not installed; {CUDA_EXTRA_HINT}") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - cupy raises several driver error types
        raise RlxError(f"Device.CUDA: cupy is installed but no usable GPU/driver was found ({e}); "
                       "check nvidia-smi and that the cupy package matches the CUDA driver, or run on Device.CPU"
                       ) from None
    if n == 0:
        raise RlxError("Device.CUDA: cupy is installed but no GPU is visible; run on Device.CPU")
    if not 0 <= index < n:
        raise RlxError(f"Device.CUDA: GPU index {index} requested but {n} GPU(s) are visible (cuda:0..cuda:{n - 1})")
    return cupy


_NO_SCOPE = contextlib.nullcontext()


def device_scope(xp: Any, index: int) -> contextlib.AbstractContextManager:
    """Context that makes GPU `index` current for allocations and launches (nothing on CPU).
    A fresh cupy context per call, so concurrent runs from several threads do not share one."""
    if xp is np:
        return _NO_SCOPE
    return xp.cuda.Device(index)


def to_host(value: Any) -> Any:
    """A device array (or dict/list of them) as numpy; numpy arrays pass through."""
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    get = getattr(value, "get", None)
    return get() if get is not None and not isinstance(value, np.ndarray) else value
