"""rlx_format: bytes and data — graph IR, graph.json, RLXBAKE1 container, quant blocks, RLXENC01."""

from .builder import GraphBuilder
from .errors import DecryptError, FormatError, GraphError, QuantError, RlxError
from .graph import Graph, Node, Value
from .ops import OPS, TensorType

__all__ = [
    "Graph", "GraphBuilder", "Node", "Value", "TensorType", "OPS",
    "RlxError", "GraphError", "FormatError", "DecryptError", "QuantError",
]
