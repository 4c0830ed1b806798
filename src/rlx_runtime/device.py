"""Device names. What runs where (array module, kernels, capabilities) is a Backend: rlx_runtime.backend."""

from __future__ import annotations

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


def to_host(value: Any) -> Any:
    """A device array (or dict/list of them) as numpy; numpy arrays pass through."""
    if isinstance(value, dict):
        return {k: to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_host(v) for v in value)
    get = getattr(value, "get", None)
    return get() if get is not None and not isinstance(value, np.ndarray) else value
