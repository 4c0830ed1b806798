"""Q8_0 (opt-in): remaining MatMul weights with K a multiple of 32; error measured per weight."""

from __future__ import annotations

import numpy as np

from rlx_format.errors import RlxError
from rlx_format.graph import Graph
from rlx_format.quants import Q8_0_BLOCK, QuantError, dequantize_q8_0, quantize_q8_0

from .matmul_weights import constant_matmul_weights, other_uses, rewrite_to_dequant


def quantize_matmul_weights(graph: Graph, report, errors: dict, packed_suffix: str = ".q8_0") -> Graph:
    """`errors` receives name -> (max_abs_err, cosine) for the report."""
    by_weight: dict[str, list] = {}
    for node, wname, _ in constant_matmul_weights(graph):
        by_weight.setdefault(wname, []).append(node)
    for wname, nodes in by_weight.items():
        w = graph.constants[wname].value
        k = w.shape[0]
        if k % Q8_0_BLOCK:
            report.notes.append(f"weight {wname!r}: K={k} is not a multiple of {Q8_0_BLOCK}; kept dense")
            continue
        wt = np.ascontiguousarray(w.T)
        try:
            packed = quantize_q8_0(wt)
        except QuantError as e:
            raise RlxError(f"weight {wname!r} cannot be quantized to Q8_0: {e}") from None
        back = dequantize_q8_0(packed)
        diff = float(np.max(np.abs(back - wt))) if wt.size else 0.0
        num = float(np.dot(back.ravel().astype(np.float64), wt.ravel().astype(np.float64)))
        den = float(np.linalg.norm(back.astype(np.float64)) * np.linalg.norm(wt.astype(np.float64)))
        errors[wname] = (diff, num / den if den else 1.0)
        others = other_uses(graph, wname)
        rewrite_to_dequant(graph, wname, packed, "gguf_q8_0", nodes, lambda s: s + packed_suffix)
        report.quant.append(wname)
        if others:
            report.notes.append(f"weight {wname!r} is also used by {others}; those uses keep a dense copy")
    return graph.validate()
