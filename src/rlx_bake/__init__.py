"""rlx_bake: load a model, bake it (fold, value-aware packing), write one .rlx file; the rlx-bake CLI.

Names are imported on first use (PEP 562), so `rlx-bake --help` does not load the passes.
"""

from __future__ import annotations

import importlib

BakeProfile = str  # one of PROFILES: "merge" | "fold" | "exact" | "size"

_WHERE = {"bake": "pipeline", "BakeOptions": "options", "PROFILES": "options", "BakeReport": "report",
          "load_graph": "loader", "load_safetensors": "weights"}
__all__ = ["bake", "BakeOptions", "BakeProfile", "BakeReport", "load_graph", "load_safetensors", "PROFILES"]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rlx_bake' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
