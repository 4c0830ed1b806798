"""ternary: MatMul weights that are exactly {-a, 0, +a} per 256-block pack losslessly as TQ2_0."""

from __future__ import annotations

import numpy as np

from rlx_format.graph import Graph
from rlx_format.quants import TQ2_0_BLOCK, is_lossless_ternary, quantize_tq2_0

from .matmul_weights import constant_matmul_weights, other_uses, rewrite_to_dequant


def pack_ternary_weights(graph: Graph, report, packed_suffix: str = ".tq2_0") -> Graph:
    by_weight: dict[str, list] = {}
    for node, wname, _ in constant_matmul_weights(graph):
        by_weight.setdefault(wname, []).append(node)
    for wname, nodes in by_weight.items():
        w = graph.constants[wname].value
        k = w.shape[0]
        if k % TQ2_0_BLOCK:
            if k >= TQ2_0_BLOCK and is_lossless_ternary(np.ascontiguousarray(w[: k - k % TQ2_0_BLOCK].T)):
                report.notes.append(f"weight {wname!r} looks ternary but K={k} is not a multiple of "
                                    f"{TQ2_0_BLOCK}; kept dense")
            continue
        if not is_lossless_ternary(np.ascontiguousarray(w[:TQ2_0_BLOCK, 0])):  # cheap probe: first block
            continue
        wt = np.ascontiguousarray(w.T)  # DequantMatMul rows are output channels: (N, K)
        if not is_lossless_ternary(wt):
            continue
        packed = quantize_tq2_0(wt)
        others = other_uses(graph, wname)
        rewrite_to_dequant(graph, wname, packed, "gguf_tq2_0", nodes, lambda s: s + packed_suffix)
        report.ternary.append(wname)
        if others:
            report.notes.append(f"weight {wname!r} is also used by {others}; those uses keep a dense copy")
    return graph.validate()
