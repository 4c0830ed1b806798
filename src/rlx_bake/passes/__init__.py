"""Weight-value-aware bake passes (they look at the numbers, not only the graph)."""

from .quant import quantize_matmul_weights
from .skip_zero import skip_zero_matmuls
from .ternary import pack_ternary_weights

__all__ = ["skip_zero_matmuls", "pack_ternary_weights", "quantize_matmul_weights"]
