"""Q8_0 (opt-in): remaining MatMul weights with K a multiple of 32; error measured per weight."""

from __future__ import annotations

import numpy as np

from rlx_format.errors import RlxError
from rlx_format.graph import Graph
from rlx_format.quants import Q8_0_BLOCK, QuantError, dequantize_q8_0, quantize_q8_0

from .matmul_weights import matmul_nodes_by_weight, pack_matmul_weight


def quantize_matmul_weights(graph: Graph, report, errors: dict, packed_suffix: str = ".q8_0") -> Graph:
    """`errors` receives name -> (max_abs_err, cosine) for the report."""
    for wname, nodes in matmul_nodes_by_weight(graph).items():
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
        pack_matmul_weight(graph, report, wname, nodes, packed, "gguf_q8_0", packed_suffix)
        report.quant.append(wname)
    return graph.validate()
