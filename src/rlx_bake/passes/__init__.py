"""Weight-value-aware bake passes (they look at the numbers, not only the graph), each
`(graph, ctx) -> PassResult`; registry.py declares them with the generic ones. The pass functions are
imported on first use (PEP 562), so the registry and the CLI stay light."""

from __future__ import annotations

import importlib

_WHERE = {"skip_zero_matmuls": "skip_zero", "pack_ternary_weights": "ternary", "quantize_weights": "quant"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rlx_bake.passes' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
