"""rlx_format: bytes and data — graph IR, graph.json, RLXBAKE1 container, quant blocks, RLXENC01.

Names are imported on first use (PEP 562): reading a graph does not load the sealing libraries.
"""

from __future__ import annotations

from .lazy import lazy_exports

from .errors import DecryptError, EncryptedFileError, FormatError, GraphError, QuantError, RlxError

_WHERE = {
    "Graph": "graph", "Node": "graph", "Value": "graph", "GraphBuilder": "builder", "TensorType": "ops", "OPS": "ops",
    "RlxFile": "container", "Weight": "container", "read_rlx_bytes": "container", "write_rlx": "container",
    "read_rlx": "reader",
    "read_rlx_with_password": "sealed", "write_rlx_encrypted": "sealed", "is_encrypted": "sealed",
    "encrypt_file": "sealed", "decrypt_file": "sealed", "KdfParams": "sealed",
}
__all__ = [*_WHERE, "RlxError", "GraphError", "FormatError", "EncryptedFileError", "DecryptError", "QuantError"]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
