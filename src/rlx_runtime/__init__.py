"""rlx_runtime: execution — op table, Session/CompiledGraph, compiler passes, hoisting, PECache."""

from .device import Device
from .options import CompileOptions
from .session import CompiledGraph, Session

__all__ = ["Session", "Device", "CompileOptions", "CompiledGraph"]
