"""rlx_runtime: execution — op table, Session/CompiledGraph, compiler passes, hoisting, PECache.

Names are imported on first use (PEP 562), so `import rlx_runtime.options` (the CLI) does not load the
kernels, numba or the compiler.
"""

from __future__ import annotations

from rlx_format.lazy import lazy_exports

_WHERE = {
    "Session": "session", "Device": "device", "to_host": "device", "CompileOptions": "options",
    "CompiledGraph": "compiled", "Backend": "backend",
    "HoistedGraph": "hoist", "HoistSplit": "hoist", "split_param_invariant": "hoist",
    "split_shape_invariant": "hoist", "specialize_params": "passes", "PECache": "pecache", "PECacheKey": "pecache",
}
__all__ = list(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
