"""Weight-value-aware bake passes (they look at the numbers, not only the graph), each
`(graph, ctx) -> PassResult`; registry.py declares them with the generic ones. The pass functions are
imported on first use (PEP 562), so the registry and the CLI stay light."""

from __future__ import annotations

from rlx_format.lazy import lazy_exports

_WHERE = {"skip_zero_matmuls": "skip_zero", "pack_ternary_weights": "ternary", "quantize_weights": "quant"}
__all__ = list(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
