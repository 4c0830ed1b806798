"""The op catalogue: arity, attributes (type + default) and shape/dtype inference.

spec/ops.md is the normative description; this module is its executable form. It never
computes tensor values, only types. Symbolic dims (strings) are carried through; a dim that
cannot be known statically gets a fresh symbolic name derived from the node name.
"""

from .catalogue import (BODY_TYPES, CONTROL_OPS, LEAF_OPS, OPS, RANDOM_OPS, UNARY_ELEMENTWISE, bodies, body_attrs,
                        normalize_attrs)
from .core import REQUIRED, Attr, Dim, InferCtx, OpSpec, Shape, TensorType, broadcast_shapes, dims_equal_or_symbolic
from .infer_nn import QUANT_BLOCKS, matmul_shape, window_count
from .infer_shape import parse_einsum, slice_bounds, slice_dim

__all__ = [
    "OPS", "LEAF_OPS", "RANDOM_OPS", "UNARY_ELEMENTWISE", "CONTROL_OPS", "BODY_TYPES", "bodies", "body_attrs",
    "QUANT_BLOCKS", "REQUIRED", "Attr", "Dim", "InferCtx", "OpSpec",
    "Shape", "TensorType", "broadcast_shapes", "dims_equal_or_symbolic", "matmul_shape", "normalize_attrs",
    "parse_einsum", "slice_bounds", "slice_dim", "window_count",
]
