"""Devices and their array modules."""

from __future__ import annotations

import enum

import numpy as np

from rlx_format.errors import RlxError


class Device(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"

    @classmethod
    def parse(cls, text: str) -> Device:
        """'cpu', 'cuda' or 'cuda:N' (the index is accepted and selects the GPU)."""
        kind = text.split(":", 1)[0].lower()
        try:
            return cls(kind)
        except ValueError:
            raise RlxError(f"unknown device {text!r}; expected 'cpu', 'cuda' or 'cuda:N'") from None


def array_module(device: Device):
    if device is Device.CPU:
        return np
    try:
        import cupy
    except ImportError:
        raise RlxError("Device.CUDA needs cupy, which is not installed; install the CUDA extra: "
                       "pip install 'rlx[cuda]' (or run on Device.CPU)") from None
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - cupy raises several driver error types
        raise RlxError(f"Device.CUDA: cupy is installed but no usable GPU/driver was found ({e})") from None
    if n == 0:
        raise RlxError("Device.CUDA: cupy is installed but no GPU is visible; run on Device.CPU")
    return cupy
