"""CompileOptions: what compile_with does beyond planning."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

DEFAULT_FOLD_GROWTH_LIMIT = 16          # a folded value written to a file may be at most this x its constants ...
DEFAULT_FOLD_MIN_BYTES = 1 << 20        # ... unless it is below this size anyway


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class CompileOptions:
    """Options for Session.compile_with.

    param_bindings: params to turn into constants before planning (then folded).
    cache_param_invariant: hoist the weight-only part of the graph so it runs once
        (default: the RLX_CACHE_PARAM_INVARIANT environment variable).
    cache_shape_invariant: also prepare what depends only on input *shapes* (through Shape), once
        per distinct shape key (implies the param-invariant hoisting).
    unpack_quantized: dequantize packed (GGML block) weights once at compile and run plain matmuls:
        small file on disk, f32 weights in RAM, unquantized speed.
    optimize: run simplify/fold/DCE/dedupe even without bindings.
    precompute: evaluate constant-only work once here, bound into the plan, so no forward redoes it
        (on by default, also for a plain `compile`; passes/evaluate.py).
    profile: record per-op call counts and time from the first run.
    fold_memory_budget: bytes that folding may hold at once (default: 1/8 of the memory this process
        may use); a closure that needs more is left to run per forward and reported.
    fold_growth_limit / fold_min_bytes: the growth guard the bake applies to what it writes; off at
        compile (None), where folded values only live in RAM and count against the budget instead.
    """

    param_bindings: dict[str, np.ndarray] | None = None
    cache_param_invariant: bool = field(default_factory=lambda: _env_flag("RLX_CACHE_PARAM_INVARIANT"))
    cache_shape_invariant: bool = False
    unpack_quantized: bool = False
    optimize: bool = True
    precompute: bool = True
    profile: bool = False
    fold_memory_budget: int | None = None
    fold_growth_limit: float | None = None
    fold_min_bytes: int = DEFAULT_FOLD_MIN_BYTES
