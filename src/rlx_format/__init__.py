"""rlx_format: bytes and data — graph IR, graph.json, RLXBAKE1 container, quant blocks, RLXENC01.

Names are imported on first use (PEP 562): reading a graph does not load the sealing libraries.
"""

from __future__ import annotations

import importlib

from .errors import DecryptError, EncryptedFileError, FormatError, GraphError, QuantError, RlxError

_WHERE = {
    "Graph": "graph", "Node": "graph", "Value": "graph", "GraphBuilder": "builder", "TensorType": "ops", "OPS": "ops",
    "RlxFile": "container", "Weight": "container", "read_rlx_bytes": "container", "write_rlx": "container",
    "read_rlx": "reader",
    "read_rlx_with_password": "sealed", "write_rlx_encrypted": "sealed", "is_encrypted": "sealed",
    "encrypt_file": "sealed", "decrypt_file": "sealed", "KdfParams": "sealed",
}
__all__ = [*_WHERE, "RlxError", "GraphError", "FormatError", "EncryptedFileError", "DecryptError", "QuantError"]


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rlx_format' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
