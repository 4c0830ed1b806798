"""Text that came from a file, made safe to show: no raw control characters, no rich markup.

Names, notes and meta in an .rlx (or graph.json / ONNX) file are arbitrary Unicode. Printed raw they can
recolour or erase the terminal (ESC, C1 controls), reorder what is shown (bidi overrides U+202A-U+202E,
U+2066-U+2069) or, through rich, be read as markup (`[bold red]w[/]` shown as `w`, `[/]` crashing).
"""

from __future__ import annotations

from typing import Any


MAX_DEPTH = 32  # meta nested deeper than this is summarized (json/repr would hit the recursion limit)


def printable(text: str, *, newlines: bool = False) -> str:
    """`text` with every character that str.isprintable() rejects written as its Python escape.

    Covers C0/C1 controls, DEL, bidi and other format characters, line/paragraph separators and lone
    surrogates (shown as `\\x1b`, `\\u202e`, `\\udcff`); `newlines=True` keeps `\\n` (multi-line messages)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or (newlines and ch == "\n") else ascii(ch)[1:-1] for ch in text)


def markup_safe(value: Any) -> str:
    """Any value as text for rich: printable() and then markup-escaped (`[` can never open a tag)."""
    from rich.markup import escape  # rich loads with the first table, not for --help

    return escape(printable(value if isinstance(value, str) else str(value)))


def plain(value: Any, depth: int = 0) -> Any:
    """A copy of msgpack-decoded data that json.dumps and repr can always handle: map keys become
    str (msgpack allows bytes keys), bytes become their repr, nesting is cut at MAX_DEPTH."""
    if depth >= MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        return f"<{type(value).__name__} nested deeper than {MAX_DEPTH} levels>"
    if isinstance(value, dict):
        return {k if isinstance(k, str) else repr(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return repr(bytes(value))
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
