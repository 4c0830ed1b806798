"""rlx_bake: load a model, bake it (fold, value-aware packing), write one .rlx file; the rlx-bake CLI."""

from .loader import load_graph, load_safetensors
from .options import PROFILES, BakeOptions
from .pipeline import bake
from .report import BakeReport

BakeProfile = str  # one of PROFILES: "merge" | "fold" | "exact" | "size"

__all__ = ["bake", "BakeOptions", "BakeProfile", "BakeReport", "load_graph", "load_safetensors", "PROFILES"]
