"""ternary: MatMul weights that are exactly {-a, 0, +a} per 256-block pack losslessly, in the smallest
ternary codec of the registry (TQ1_0, 1.69 bits per weight; TQ2_0 is 2.06)."""

from __future__ import annotations

import numpy as np

from rlx_format.codecs import ternary_codecs
from rlx_format.graph import Graph
from rlx_runtime.passes import PassContext, PassResult, in_bodies

from .packing import matmul_uses, pack_weight


def _pack_ternary_here(graph: Graph, ctx: PassContext) -> PassResult:
    from rlx_format.quants import is_lossless_ternary, quantize  # numba: loaded when a bake runs, not by --help

    packed, notes = [], []
    codec = ternary_codecs()[0]  # every ternary codec is lossless on these weights: take the smallest
    block = codec.block
    for wname, nodes in matmul_uses(graph).items():
        w = graph.constants[wname].value
        k = w.shape[0]
        if k % block:
            if k >= block and is_lossless_ternary(np.ascontiguousarray(w[: k - k % block].T), block):
                notes.append(f"weight {wname!r} looks ternary but K={k} is not a multiple of "
                                    f"{block}; kept dense")
            continue
        if not is_lossless_ternary(np.ascontiguousarray(w[:block, 0]), block):  # cheap probe: first block
            continue
        wt = np.ascontiguousarray(w.T)  # DequantMatMul rows are output channels: (N, K)
        if not is_lossless_ternary(wt, block):
            continue
        pack_weight(graph, ctx, wname, nodes, quantize(wt, codec.name), codec.name, f".{codec.short}", notes)
        packed.append(wname)
    return PassResult(graph.validate(), bool(packed), packed, notes)


pack_ternary_weights = in_bodies(_pack_ternary_here)  # bodies too: a body's captured weights are seen as constants
