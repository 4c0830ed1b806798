"""Quantization (opt-in, lossy): the remaining MatMul weights and Gather (embedding) tables whose row
length K is a multiple of the codec's block, and Conv / ConvTranspose weights (rows: the weight's first
axis, C·kh·kw long; a length that is not a multiple of the block is padded with zeros to one, where that
still stores fewer bytes than f32, else the weight stays dense).

The type per weight: `quant_type` (any registered lossy codec, Q8_0 by default), or `auto`: the
smallest registered lossy codec (bits per weight) whose weight cosine, dequantized vs f32, is at least
`quant_min_cosine`; `quant_weights` overrides the type by glob (`emb.*=q8_0`, `=dense` keeps it dense).
The chosen type, max abs error and cosine of every weight go to the report (`ctx.quality`).
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import numpy as np

from rlx_format.codecs import BY_SHORT, Codec
from rlx_format.errors import QuantError, RlxError
from rlx_format.graph import Graph
from rlx_runtime.passes import PassContext, PassResult, in_bodies
from rlx_runtime.passes.inbodies import everywhere

from ..quant_choice import AUTO, DENSE, check_quant_choice, lossy_codecs
from .packing import conv_uses, gather_uses, matmul_uses, pack_weight

def _padded_row_bytes(codec: Codec, k: int) -> int:
    return -(-k // codec.block) * codec.nbytes


def _pad(rows: np.ndarray, block: int) -> np.ndarray:
    """`rows` with zero columns appended up to a multiple of `block` (the same array if there is none)."""
    pad = -rows.shape[1] % block
    return np.pad(rows, ((0, 0), (0, pad))) if pad else rows


def _measure(codec: Codec, rows: np.ndarray, wname: str, k: int) -> tuple[np.ndarray, float, float] | None:
    """(packed bytes, max abs error, cosine) of `rows` in `codec`, measured on the first `k` columns (the
    rest is padding); None where a block scale overflows fp16."""
    from rlx_format.quants import dequantize, quantize  # numba: loaded when a bake quantizes
    try:
        packed = quantize(rows, codec.name)
    except QuantError as e:
        raise RlxError(f"weight {wname!r} cannot be quantized to {codec.ggml}: {e}") from None
    full = dequantize(packed, codec.name)
    back = full[:, :k]
    if not np.isfinite(back).all():  # e.g. Q8_0 amax / 127 > 65504: the fp16 scale (or min) is inf
        return None
    if _collapsed(rows, full, codec.block):  # e.g. Q6_K at |x| >= ~1e18: the block decodes to zeros
        return None
    rows = rows[:, :k]
    diff = float(np.max(np.abs(back - rows))) if rows.size else 0.0
    num = float(np.dot(back.ravel().astype(np.float64), rows.ravel().astype(np.float64)))
    den = float(np.linalg.norm(back.astype(np.float64)) * np.linalg.norm(rows.astype(np.float64)))
    return packed, diff, num / den if den else 1.0


# a block whose largest |value| is at least this never decodes to all zeros in a registered codec unless its
# fp16 scale overflowed (the finite check catches most of those; a Q6_K block at |x| >= ~1e18 instead
# decodes to zeros)
_COLLAPSE_FLOOR = 2.0 ** -8


def _collapsed(rows: np.ndarray, back: np.ndarray, block: int) -> bool:
    """Whether some block of `rows` with real magnitude came back as all zeros."""
    n = rows.shape[0]
    amax = np.abs(rows.reshape(n, -1, block)).max(axis=2)
    bmax = np.abs(back.reshape(n, -1, block)).max(axis=2)
    return bool(((bmax == 0) & (amax >= _COLLAPSE_FLOOR)).any())


def _candidates(graph: Graph) -> list[tuple[str, list, str]]:
    """(weight, its uses, how its rows are laid out) for every weight the pass can pack."""
    out = [(w, nodes, "matmul") for w, nodes in matmul_uses(graph).items()]
    out += [(w, nodes, "gather") for w, nodes in gather_uses(graph).items()]
    return out + [(w, nodes, "conv") for w, nodes in conv_uses(graph).items()]


def _rows(w: np.ndarray, kind: str) -> np.ndarray:
    if kind == "matmul":
        return np.ascontiguousarray(w.T)  # DequantMatMul rows are output channels: (N, K)
    return np.ascontiguousarray(w.reshape(w.shape[0], -1))  # table rows; conv: W's first axis by C·kh·kw


def quantize_weights(graph: Graph, ctx: PassContext) -> PassResult:
    """The weights of the graph and of its bodies; a glob is checked against all of them at once."""
    o = ctx.options
    overrides = tuple(getattr(o, "quant_weights", ()) or ())
    check_quant_choice(o.quant_type, overrides, o.quant_min_cosine)
    if overrides:
        names: set[str] = set()
        everywhere(graph.copy(), lambda g, _: names.update(ctx.folded_from.get(w, w) for w, _, _ in _candidates(g)))
        _check_globs(overrides, names, ctx)
    return _quantize_everywhere(graph, ctx)


def _quantize_here(graph: Graph, ctx: PassContext) -> PassResult:
    o = ctx.options
    overrides = tuple(getattr(o, "quant_weights", ()) or ())
    cands = _candidates(graph)
    source = {w: ctx.folded_from.get(w, w) for w, _, _ in cands}
    packed_names, notes = [], []
    for wname, nodes, kind in cands:
        src = source[wname]
        choice = next((t for glob, t in reversed(overrides) if fnmatchcase(src, glob)), o.quant_type)
        if choice == DENSE:
            notes.append(f"weight {src!r}: kept dense (override)")
            continue
        rows = _rows(graph.constants[wname].value, kind)
        k = rows.shape[1]
        what = {"matmul": "K", "gather": "row length", "conv": "C·kh·kw"}[kind]
        codecs = lossy_codecs() if choice == AUTO else [BY_SHORT[choice]]
        fits = [c for c in codecs if k % c.block == 0 or (kind == "conv" and _padded_row_bytes(c, k) < 4 * k)]
        if not fits:
            blocks = sorted({c.block for c in codecs})
            why = "; padded to the block it would not be smaller than f32" if kind == "conv" else ""
            notes.append(f"weight {src!r}: {what}={k} is not a multiple of {' or '.join(map(str, blocks))}{why}; "
                         "kept dense")
            continue
        got = None
        for codec in fits:
            m = _measure(codec, _pad(rows, codec.block), src, k)
            if m is None:
                notes.append(f"weight {src!r}: max |value| {float(np.abs(rows).max()):.6g} is more than a "
                             f"{codec.ggml} block's fp16 scale can hold" + ("; kept dense" if choice != AUTO else ""))
                continue
            if choice != AUTO or m[2] >= o.quant_min_cosine:
                got = codec, m
                break
        if got is None:
            if choice == AUTO:
                notes.append(f"weight {src!r}: no registered type keeps its cosine >= {o.quant_min_cosine} "
                             f"(tried {', '.join(c.short for c in fits)}); kept dense")
            continue
        codec, (packed, diff, cos) = got
        pad = -k % codec.block
        pname = pack_weight(graph, ctx, wname, nodes, packed, codec.name, f".{codec.short}", notes, pad)
        ctx.quality[pname] = {"type": codec.short, "max_abs_err": diff, "cosine": cos, "auto": choice == AUTO,
                              "dense_bytes": int(rows.size) * 4, "padded": pad}
        packed_names.append(wname)
    return PassResult(graph.validate(), bool(packed_names), packed_names, notes)


_quantize_everywhere = in_bodies(_quantize_here)


def _check_globs(overrides: tuple, sources: set[str], ctx: PassContext) -> None:
    """A glob that matches no weight the pass can pack (nor one an earlier pass packed) is a mistake."""
    names = sorted(sources)
    packed = {ctx.folded_from.get(d, d) for d in ctx.packed_from.values()}
    for glob, t in overrides:
        if not any(fnmatchcase(n, glob) for n in names) and not any(fnmatchcase(n, glob) for n in packed):
            shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
            raise RlxError(f"quant override {glob}={t}: the glob matches none of the weights the quantization pass "
                           f"can pack ({shown or 'there are none'}); fix the pattern (fnmatch syntax, case-sensitive)")
