"""Generic compiler passes. Each takes a Graph (mutated copy) and a PassReport; see pipeline.py."""

from .affine import fold_affine
from .dce import dead_code_elimination
from .dedupe import dedupe_constants
from .fold import constant_fold
from .pipeline import PassReport, compile_pipeline, run_passes
from .simplify import simplify
from .specialize import specialize_params

__all__ = ["specialize_params", "fold_affine", "constant_fold", "simplify", "dead_code_elimination", "dedupe_constants",
           "compile_pipeline", "run_passes", "PassReport"]
