"""rlx_runtime: execution — op table, Session/CompiledGraph, compiler passes, hoisting, PECache.

Names are imported on first use (PEP 562), so `import rlx_runtime.options` (the CLI) does not load the
kernels, numba or the compiler.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "Session": "session", "Device": "device", "to_host": "device", "CompileOptions": "options",
    "CompiledGraph": "compiled", "Backend": "backend",
    "HoistedGraph": "hoist", "HoistSplit": "hoist", "split_param_invariant": "hoist",
    "split_shape_invariant": "hoist", "specialize_params": "passes", "PECache": "pecache", "PECacheKey": "pecache",
}
__all__ = list(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rlx_runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
