"""ternary: MatMul weights that are exactly {-a, 0, +a} per 256-block pack losslessly as TQ2_0."""

from __future__ import annotations

import numpy as np

from rlx_format.graph import Graph
from rlx_format.quants import TQ2_0_BLOCK, is_lossless_ternary, quantize_tq2_0

from .packing import matmul_uses, pack_weight


def pack_ternary_weights(graph: Graph, report, packed_suffix: str = ".tq2_0") -> Graph:
    for wname, nodes in matmul_uses(graph).items():
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
        pack_weight(graph, report, wname, nodes, quantize_tq2_0(wt), "gguf_tq2_0", packed_suffix)
        report.ternary.append(wname)
    return graph.validate()
