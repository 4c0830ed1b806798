"""rlx_runtime: execution — op table, Session/CompiledGraph, compiler passes, hoisting, PECache."""

from .device import Device, to_host
from .options import CompileOptions
from .compiled import CompiledGraph
from .session import Session

__all__ = ["Session", "Device", "CompileOptions", "CompiledGraph", "to_host"]

from .hoist import HoistedGraph, HoistSplit, split_param_invariant, split_shape_invariant  # noqa: E402
from .passes import specialize_params  # noqa: E402
from .pecache import PECache, PECacheKey  # noqa: E402

__all__ += ["split_param_invariant", "split_shape_invariant", "specialize_params", "HoistSplit", "HoistedGraph",
            "PECache", "PECacheKey"]
