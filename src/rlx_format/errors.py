"""The one error hierarchy of rlx. Every library error derives from RlxError."""

from __future__ import annotations


class RlxError(Exception):
    """Base of every error rlx raises on bad input or misuse."""


class GraphError(RlxError):
    """A graph (graph.json or the graph inside an .rlx file) is invalid."""


class FormatError(RlxError):
    """An .rlx container is malformed, truncated or inconsistent."""


class OutputError(RlxError):
    """An output path cannot be written safely (missing directory, or an existing non-regular file)."""


class EncryptedFileError(FormatError):
    """A sealed (RLXENC01) file was given where a password is needed."""


class DecryptError(RlxError):
    """Wrong password or a tampered sealed file (deliberately one opaque message)."""


class QuantError(RlxError):
    """A tensor cannot be encoded with the requested block quantization."""


class RuntimeInputError(RlxError):
    """A run() / set_param() argument does not match the compiled graph."""


def brief(v: object, limit: int = 80) -> str:
    """repr(v) for an error message, cut to `limit` characters. Never raises: Python refuses to print
    integers of more than 4300 digits, which a hostile document can hold."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 256:
        return f"an integer of about {int(v.bit_length() * 0.30103) + 1} digits"
    try:
        text = repr(v)
    except ValueError:  # a huge integer somewhere inside a container
        return f"a {type(v).__name__} holding an integer too long to print"
    return text if len(text) <= limit else text[:limit - 3] + "..."
