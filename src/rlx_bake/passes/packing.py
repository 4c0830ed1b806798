"""Find weights that can be stored packed, and rewrite their uses to the Dequant* ops.

- MatMul(x, W) with W a 2-D f32 constant [K, N]  -> DequantMatMul(x, pack(Wᵀ)) (rows = output channels)
- Gather(T, idx, axis=0) with T a 2-D f32 constant [N, K] -> DequantGather(pack(T), idx)
- Conv / ConvTranspose with a constant f32 weight [A, B, k...] -> the weight becomes
  Reshape(Dequantize(pack(W as [A, B·k...]))), W's shape): rows are W's first axis (Conv: output channels);
  a row length that is not a multiple of the block is padded with zeros, and a Slice drops the padding
  again. The runtime dequantizes it once at compile (constant-only work is precomputed).
Uses of the same weight that are not rewritten keep the dense constant (and are reported).
"""

from __future__ import annotations

import numpy as np

from rlx_format.graph import Graph, Node, Value, unique_name


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


def conv_uses(graph: Graph) -> dict[str, list[Node]]:
    """Weight name -> Conv / ConvTranspose nodes using it as their constant f32 weight (rank >= 3)."""
    out: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if n.op in ("Conv", "ConvTranspose") and len(n.inputs) >= 2 and n.inputs[1] not in n.inputs[:1] + n.inputs[2:]:
            c = graph.constants.get(n.inputs[1])
            if c is not None and c.value is not None and c.dtype == "f32" and len(c.shape) >= 3:
                out.setdefault(n.inputs[1], []).append(n)
    return out


def pack_weight(graph: Graph, ctx, weight: str, nodes: list[Node], packed: np.ndarray, encoding: str,
                suffix: str, notes: list[str], padded: int = 0) -> str:
    """Add `packed` as a constant and rewrite `nodes` (MatMul, Gather or Conv uses of `weight`) to read it;
    `ctx.packed_from` records which dense weight it replaces."""
    dense = graph.constants[weight].value
    pname = ctx.folded_from.get(weight, weight) + suffix  # name packed weights after their source param
    while pname in graph.constants or pname in graph.types:
        pname += "_"
    graph.constants[pname] = Value(pname, "u8", tuple(packed.shape), packed)
    if nodes[0].op in ("Conv", "ConvTranspose"):
        _dequantize_before(graph, nodes, weight, pname, encoding, padded)
    for node in nodes:
        if node.op == "MatMul":
            k, n = dense.shape
            node.op, node.inputs = "DequantMatMul", [node.inputs[0], pname]
        elif node.op == "Gather":
            n, k = dense.shape
            node.op, node.inputs = "DequantGather", [pname, node.inputs[1]]
        else:
            continue
        node.attrs = {"encoding": encoding, "N": int(n), "K": int(k)}
    ctx.packed_from[pname] = weight
    rewritten = {id(n) for n in nodes}
    others = [n.name for n in graph.nodes if weight in n.inputs and id(n) not in rewritten]
    others += ["<graph output>"] if weight in graph.outputs else []
    if others:
        notes.append(f"weight {weight!r} is also used by {others}; those uses keep a dense copy")
    else:
        del graph.constants[weight]
    return pname


def _dequantize_before(graph: Graph, nodes: list[Node], weight: str, pname: str, encoding: str, padded: int) -> None:
    """Insert Dequantize [-> Slice off the padding] -> Reshape (to the weight's shape) before the first of
    `nodes`; they read it."""
    shape = list(graph.constants[weight].shape)
    k = int(np.prod(shape[1:]))
    taken = graph.names()
    rows = unique_name(f"{pname}/rows", taken)
    new = [Node(rows, "Dequantize", [pname], {"encoding": encoding, "shape": [shape[0], k + padded]})]
    if padded:
        new.append(Node(unique_name(f"{pname}/unpadded", taken), "Slice", [rows],
                        {"starts": [0], "ends": [k], "axes": [1]}))
    dense = unique_name(f"{pname}/dense", taken)
    new.append(Node(dense, "Reshape", [new[-1].name], {"shape": shape}))
    first = min(graph.nodes.index(n) for n in nodes)
    graph.nodes[first:first] = new
    for node in nodes:
        node.inputs = [node.inputs[0], dense, *node.inputs[2:]]
