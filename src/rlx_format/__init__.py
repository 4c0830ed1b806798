"""rlx_format: bytes and data — graph IR, graph.json, RLXBAKE1 container, quant blocks, RLXENC01."""

from .builder import GraphBuilder
from .container import RlxFile, Weight, read_rlx_bytes, write_rlx
from .errors import DecryptError, EncryptedFileError, FormatError, GraphError, QuantError, RlxError
from .graph import Graph, Node, Value
from .ops import OPS, TensorType
from .reader import read_rlx
from .sealed import (KdfParams, decrypt_file, encrypt_file, is_encrypted, read_rlx_with_password,
                     write_rlx_encrypted)

__all__ = [
    "Graph", "GraphBuilder", "Node", "Value", "TensorType", "OPS",
    "RlxFile", "Weight", "read_rlx", "read_rlx_bytes", "write_rlx",
    "read_rlx_with_password", "write_rlx_encrypted", "is_encrypted", "encrypt_file", "decrypt_file", "KdfParams",
    "RlxError", "GraphError", "FormatError", "EncryptedFileError", "DecryptError", "QuantError",
]
