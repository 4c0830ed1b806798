"""Backends: everything that differs between the places a compiled graph runs, in one object.

A Backend names its array module (`xp`: numpy, cupy, or the tests' CPU stand-in for cupy), how values
cross the host boundary (upload / to_host), the device scope kernels run under, its capabilities
(host arrays, in-place numpy ufuncs in generated code, custom fused kernels), its special functions
(erf, expit) and its per-op kernel overrides. Kernels stay `fn(xp, attrs, *inputs)`; the generic one
in KERNELS is used unless the backend overrides the op (rlx_runtime.kernels.registry.kernel(...,
backend=NAME)). Everything that needs to know where it runs asks `backend_of(xp)` or holds a Backend;
nothing else compares array modules.

Adding a backend: build a Backend (see `cuda_backend`), register overrides for the ops whose generic
kernel does not suit it, and return it from `backend_for` for its Device. docs/architecture.md,
"Extending rlx", has a worked example.
"""

from __future__ import annotations

import contextlib
import functools
import types
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_format.errors import RlxError

from .device import CUDA_EXTRA_HINT, Device

@dataclass(frozen=True, eq=False)
class Backend:
    name: str                    # key of its kernel overrides: "cpu", "cuda"
    device: Device
    xp: Any                      # the array module kernels are written against
    index: int = 0               # device ordinal (CUDA)
    host_arrays: bool = False    # its arrays are numpy arrays in host memory: no upload or download
    inplace_ufuncs: bool = False  # generated code may call numpy ufuncs with out= on a dying buffer
    fused_kernels: bool = False  # custom fused kernels can run (numba on CPU, RawModule on CUDA)
    special_module: str | None = None  # module providing erf / expit (None: rlx's numba ufuncs)

    # ------------------------------------------------------------------ kernels
    def kernel(self, op: str):
        """The kernel this backend runs for `op`: its override, else the generic one."""
        kernels, overrides = _registry()
        return overrides.get(self.name, {}).get(op) or kernels[op]

    def binder(self, op: str):
        """The binder of `op` on this backend (kernels.registry.BINDERS), or None."""
        from .kernels.registry import BINDERS
        return BINDERS.get(self.name, {}).get(op)

    @functools.cached_property
    def special(self) -> Any:
        """erf(x) and expit(x) on this backend's arrays."""
        if self.special_module is None:
            from . import ufuncs
            return types.SimpleNamespace(erf=ufuncs.erf, expit=ufuncs.sigmoid)
        import importlib
        return importlib.import_module(self.special_module)

    # ------------------------------------------------------------------ values
    def upload(self, a) -> Any:
        """A host array as this backend's array (no copy on the host)."""
        return a if self.host_arrays else self.xp.asarray(a)

    def owns(self, a) -> bool:
        """Whether `a` is already one of this backend's arrays."""
        return isinstance(a, np.ndarray) if self.host_arrays else isinstance(a, self.xp.ndarray)

    def to_host(self, a) -> np.ndarray:
        return a if self.host_arrays or isinstance(a, np.ndarray) else a.get()

    def scope(self) -> contextlib.AbstractContextManager:
        """The context a forward (or a weight upload) runs in: on CUDA it makes this backend's device current;
        on the CPU it holds rlx's thread count for the forward (threads.py). A fresh context per call, so
        concurrent runs from several threads do not share one."""
        if self.host_arrays:
            from .threads import forward_threads
            return forward_threads()
        return self.xp.cuda.Device(self.index)


@functools.cache
def _registry() -> tuple[dict, dict]:
    """(KERNELS, OVERRIDES), imported on first use (the kernels import this module); cached because kernel() runs
    per op call in some kernels, and an import statement there cost ~1 us."""
    from .kernels.registry import KERNELS, OVERRIDES
    return KERNELS, OVERRIDES


CPU = Backend("cpu", Device.CPU, np, host_arrays=True, inplace_ufuncs=True, fused_kernels=True)
_BY_MODULE: dict[int, Backend] = {id(np): CPU}  # array module -> the backend that last used it


def backend_of(xp) -> Backend:
    """The backend whose array module is `xp` (any module that is not numpy is a device module)."""
    b = _BY_MODULE.get(id(xp))
    if b is None:
        b = _BY_MODULE[id(xp)] = Backend("cuda", Device.CUDA, xp, special_module="cupyx.scipy.special",
                                          fused_kernels=hasattr(xp, "RawModule"))
    return b


def host_ints(xp, a) -> list[int]:
    """Values of a small integer tensor as Python ints (syncs on a device)."""
    return [int(v) for v in np.asarray(backend_of(xp).to_host(a)).ravel()]


def special(xp) -> Any:
    """erf / expit for the arrays of `xp` (the backend's special functions)."""
    return backend_of(xp).special


def cuda_backend(index: int = 0) -> Backend:
    """cupy on GPU `index`, after checking that it imports and that the GPU exists. When the imported
    `cupy` lacks RawModule (the tests' CPU stand-in), the custom kernels are off and array ops run."""
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
    b = Backend("cuda", Device.CUDA, cupy, index, special_module="cupyx.scipy.special",
                fused_kernels=hasattr(cupy, "RawModule"))
    _BY_MODULE[id(cupy)] = b
    return b


def backend_for(device: Device, index: int = 0) -> Backend:
    """The backend that runs graphs on `device` (GPU `index` for CUDA)."""
    if device is Device.CPU:
        if index:
            raise RlxError(f"a device index ({index}) applies to CUDA only; use Device.CPU without one")
        return CPU
    return cuda_backend(index)
