"""The quantization choices (types, `auto`, per-weight overrides) and their checks: light, so the CLI can
build its options without loading the passes."""

from __future__ import annotations

from rlx_format.codecs import CODECS, Codec
from rlx_format.errors import RlxError

AUTO = "auto"
DENSE = "dense"
DEFAULT_QUANT_TYPE = "q8_0"
DEFAULT_MIN_COSINE = 0.999


def quant_types() -> tuple[str, ...]:
    """CLI names of the lossy codecs, in registry order (read each time: a codec registered later counts)."""
    return tuple(c.short for c in CODECS.values() if not c.ternary)


def lossy_codecs() -> list[Codec]:
    """The lossy codecs, smallest (bits per weight) first: the order `auto` tries them in."""
    return sorted((c for c in CODECS.values() if not c.ternary), key=lambda c: c.bits_per_weight)


def check_quant_choice(quant_type: str, overrides: tuple, min_cosine: float) -> None:
    """RlxError for an unknown type (naming the choices) or a malformed override or cosine."""
    types = quant_types()
    if quant_type != AUTO and quant_type not in types:
        raise RlxError(f"unknown quant type {quant_type!r}; expected one of {', '.join(types)} or {AUTO}")
    for glob, t in overrides:
        if not glob:
            raise RlxError(f"quant override {glob!r}={t!r}: empty weight glob; expected GLOB=TYPE, e.g. 'emb.*=q8_0'")
        if t not in (*types, AUTO, DENSE):
            raise RlxError(f"quant override {glob}={t}: unknown type {t!r}; expected one of {', '.join(types)}, "
                           f"{AUTO} or {DENSE}")
    if not (isinstance(min_cosine, (int, float)) and -1.0 <= min_cosine <= 1.0):
        raise RlxError(f"quant_min_cosine {min_cosine!r}: a cosine is a number in [-1, 1] (default "
                       f"{DEFAULT_MIN_COSINE})")
