"""Weight-value-aware bake passes (they look at the numbers, not only the graph), each
`(graph, ctx) -> PassResult`; registry.py declares them with the generic ones."""

from .quant import quantize_weights
from .skip_zero import skip_zero_matmuls
from .ternary import pack_ternary_weights

__all__ = ["skip_zero_matmuls", "pack_ternary_weights", "quantize_weights"]
