"""Find weights that can be stored packed, and rewrite their uses to the Dequant* ops.

- MatMul(x, W) with W a 2-D f32 constant [K, N]  -> DequantMatMul(x, pack(Wᵀ)) (rows = output channels)
- Gather(T, idx, axis=0) with T a 2-D f32 constant [N, K] -> DequantGather(pack(T), idx)
Uses of the same weight that are not rewritten keep the dense constant (and are reported).
"""

from __future__ import annotations

import numpy as np

from rlx_format.graph import Graph, Node, Value


def _f32_2d(graph: Graph, name: str) -> np.ndarray | None:
    c = graph.constants.get(name)
    if c is None or c.value is None or c.dtype != "f32" or len(c.shape) != 2:
        return None
    return c.value


def matmul_uses(graph: Graph) -> dict[str, list[Node]]:
    """Weight name -> MatMul nodes using it as their constant right operand (with an f32 left operand)."""
    out: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if n.op == "MatMul" and n.inputs[0] != n.inputs[1] and _f32_2d(graph, n.inputs[1]) is not None:
            x = graph.types[n.inputs[0]]
            if x.dtype == "f32" and x.rank >= 1:
                out.setdefault(n.inputs[1], []).append(n)
    return out


def gather_uses(graph: Graph) -> dict[str, list[Node]]:
    """Table name -> Gather nodes reading rows (axis 0) of it."""
    out: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if n.op == "Gather" and n.attrs.get("axis", 0) in (0, -2) and n.inputs[0] != n.inputs[1] \
                and _f32_2d(graph, n.inputs[0]) is not None:
            out.setdefault(n.inputs[0], []).append(n)
    return out


def pack_weight(graph: Graph, report, weight: str, nodes: list[Node], packed: np.ndarray, encoding: str,
                suffix: str) -> str:
    """Add `packed` as a constant and rewrite `nodes` (MatMul or Gather uses of `weight`) to read it."""
    dense = graph.constants[weight].value
    pname = report.folded_from.get(weight, weight) + suffix  # name packed weights after their source param
    while pname in graph.constants or pname in graph.types:
        pname += "_"
    graph.constants[pname] = Value(pname, "u8", tuple(packed.shape), packed)
    for node in nodes:
        if node.op == "MatMul":
            k, n = dense.shape
            node.op, node.inputs = "DequantMatMul", [node.inputs[0], pname]
        else:
            n, k = dense.shape
            node.op, node.inputs = "DequantGather", [pname, node.inputs[1]]
        node.attrs = {"encoding": encoding, "N": int(n), "K": int(k)}
    report.packed_from[pname] = weight
    rewritten = {id(n) for n in nodes}
    others = [n.name for n in graph.nodes if weight in n.inputs and id(n) not in rewritten]
    others += ["<graph output>"] if weight in graph.outputs else []
    if others:
        report.notes.append(f"weight {weight!r} is also used by {others}; those uses keep a dense copy")
    else:
        del graph.constants[weight]
    return pname
