"""rlx_bake: load a model, bake it (fold, value-aware packing), write one .rlx file; the rlx-bake CLI.

Names are imported on first use (PEP 562), so `rlx-bake --help` does not load the passes.
"""

from __future__ import annotations

from rlx_format.lazy import lazy_exports

BakeProfile = str  # one of PROFILES: "merge" | "fold" | "exact" | "size"

_WHERE = {"bake": "pipeline", "BakeOptions": "options", "PROFILES": "options", "BakeReport": "report",
          "load_graph": "loader", "load_safetensors": "weights"}
__all__ = ["bake", "BakeOptions", "BakeProfile", "BakeReport", "load_graph", "load_safetensors", "PROFILES"]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
