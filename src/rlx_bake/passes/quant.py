"""Q8_0 (opt-in): remaining MatMul weights and Gather (embedding) tables whose K is a multiple of 32.

The per-weight error (max abs and cosine vs f32) goes to the report.
"""

from __future__ import annotations

import numpy as np

from rlx_format.errors import RlxError
from rlx_format.graph import Graph
from rlx_format.quants import Q8_0_BLOCK, QuantError, dequantize_q8_0, quantize_q8_0

from .packing import gather_uses, matmul_uses, pack_weight


def _quantize(wname: str, rows: np.ndarray, errors: dict, report) -> np.ndarray | None:
    """Q8_0 bytes of `rows`, or None (kept dense, with a note) where a block scale overflows fp16."""
    try:
        packed = quantize_q8_0(rows)
    except QuantError as e:
        raise RlxError(f"weight {wname!r} cannot be quantized to Q8_0: {e}") from None
    back = dequantize_q8_0(packed)
    if not np.isfinite(back).all():  # amax / 127 > 65504: the fp16 scale is inf
        report.notes.append(f"weight {wname!r}: max |value| {float(np.abs(rows).max()):.6g} exceeds what a Q8_0 "
                            f"block scale can hold ({65504.0 * 127:.6g}); kept dense")
        return None
    diff = float(np.max(np.abs(back - rows))) if rows.size else 0.0
    num = float(np.dot(back.ravel().astype(np.float64), rows.ravel().astype(np.float64)))
    den = float(np.linalg.norm(back.astype(np.float64)) * np.linalg.norm(rows.astype(np.float64)))
    errors[wname] = (diff, num / den if den else 1.0)
    return packed


def quantize_matmul_weights(graph: Graph, report, errors: dict, packed_suffix: str = ".q8_0") -> Graph:
    """`errors` receives name -> (max_abs_err, cosine) for the report."""
    for wname, nodes in matmul_uses(graph).items():
        w = graph.constants[wname].value
        if w.shape[0] % Q8_0_BLOCK:
            report.notes.append(f"weight {wname!r}: K={w.shape[0]} is not a multiple of {Q8_0_BLOCK}; kept dense")
            continue
        packed = _quantize(wname, np.ascontiguousarray(w.T), errors, report)  # rows = output channels (N, K)
        if packed is None:
            continue
        pack_weight(graph, report, wname, nodes, packed, "gguf_q8_0", packed_suffix)
        report.quant.append(wname)
    for tname, nodes in gather_uses(graph).items():
        t = graph.constants[tname].value
        if t.shape[1] % Q8_0_BLOCK:
            report.notes.append(f"table {tname!r}: row length {t.shape[1]} is not a multiple of {Q8_0_BLOCK}; "
                                "kept dense")
            continue
        packed = _quantize(tname, np.ascontiguousarray(t), errors, report)  # rows = table rows (N, K)
        if packed is None:
            continue
        pack_weight(graph, report, tname, nodes, packed, "gguf_q8_0", packed_suffix)
        report.quant.append(tname)
    return graph.validate()
