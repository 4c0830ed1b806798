"""Quantization (opt-in, lossy): remaining MatMul weights and Gather (embedding) tables whose K is a
multiple of the codec's block, in the codec the options name (Q8_0 by default; any registered lossy type).

The per-weight error (max abs and cosine vs f32) goes to the report.
"""

from __future__ import annotations

import numpy as np

from rlx_format.codecs import Codec, get_codec
from rlx_format.errors import RlxError
from rlx_format.graph import Graph
from rlx_format.quants import QuantError

from .packing import gather_uses, matmul_uses, pack_weight


def _quantize(codec: Codec, wname: str, rows: np.ndarray, errors: dict, report) -> np.ndarray | None:
    """The codec's bytes of `rows`, or None (kept dense, with a note) where a block scale overflows fp16."""
    try:
        packed = codec.quantize(rows)
    except QuantError as e:
        raise RlxError(f"weight {wname!r} cannot be quantized to {codec.ggml}: {e}") from None
    back = codec.dequantize(packed)
    if not np.isfinite(back).all():  # e.g. Q8_0 amax / 127 > 65504: the fp16 scale (or min) is inf
        report.notes.append(f"weight {wname!r}: max |value| {float(np.abs(rows).max()):.6g} is more than a "
                            f"{codec.ggml} block's fp16 scale can hold; kept dense")
        return None
    diff = float(np.max(np.abs(back - rows))) if rows.size else 0.0
    num = float(np.dot(back.ravel().astype(np.float64), rows.ravel().astype(np.float64)))
    den = float(np.linalg.norm(back.astype(np.float64)) * np.linalg.norm(rows.astype(np.float64)))
    errors[wname] = (diff, num / den if den else 1.0)
    return packed


def quantize_matmul_weights(graph: Graph, report, errors: dict, encoding: str = "gguf_q8_0") -> Graph:
    """`errors` receives name -> (max_abs_err, cosine) for the report."""
    codec = get_codec(encoding, "quantization pass")
    suffix, block = f".{codec.short}", codec.block
    for wname, nodes in matmul_uses(graph).items():
        w = graph.constants[wname].value
        if w.shape[0] % block:
            report.notes.append(f"weight {wname!r}: K={w.shape[0]} is not a multiple of {block}; kept dense")
            continue
        packed = _quantize(codec, wname, np.ascontiguousarray(w.T), errors, report)  # rows = output channels (N, K)
        if packed is None:
            continue
        pack_weight(graph, report, wname, nodes, packed, codec.name, suffix)
        report.quant.append(wname)
    for tname, nodes in gather_uses(graph).items():
        t = graph.constants[tname].value
        if t.shape[1] % block:
            report.notes.append(f"table {tname!r}: row length {t.shape[1]} is not a multiple of {block}; "
                                "kept dense")
            continue
        packed = _quantize(codec, tname, np.ascontiguousarray(t), errors, report)  # rows = table rows (N, K)
        if packed is None:
            continue
        pack_weight(graph, report, tname, nodes, packed, codec.name, suffix)
        report.quant.append(tname)
    return graph.validate()
