"""Find MatMul(x, W) nodes whose W is a constant 2-D f32 weight, and rewrite them to DequantMatMul."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from rlx_format.graph import Graph, Node, Value


def constant_matmul_weights(graph: Graph) -> Iterator[tuple[Node, str, np.ndarray]]:
    """(node, weight name, W[K, N]) for every MatMul whose right operand is a 2-D f32 constant."""
    for n in graph.nodes:
        if n.op != "MatMul":
            continue
        w = graph.constants.get(n.inputs[1])
        if w is None or w.value is None or w.dtype != "f32" or len(w.shape) != 2:
            continue
        if graph.types[n.inputs[0]].dtype != "f32" or graph.types[n.inputs[0]].rank < 1:
            continue
        yield n, w.name, w.value


def other_uses(graph: Graph, name: str) -> list[str]:
    """Nodes that use `name` other than as the weight of a MatMul (or that output it)."""
    uses = [n.name for n in graph.nodes if name in n.inputs and not (n.op == "MatMul" and n.inputs[1] == name
                                                                          and name != n.inputs[0])]
    return uses + (["<graph output>"] if name in graph.outputs else [])


def rewrite_to_dequant(graph: Graph, weight: str, packed: np.ndarray, encoding: str,
                       nodes: list[Node], packed_name: Callable[[str], str]) -> str:
    """Add the packed constant and turn each MatMul in `nodes` into DequantMatMul."""
    k, n = graph.constants[weight].shape
    pname = packed_name(weight)
    graph.constants[pname] = Value(pname, "u8", tuple(packed.shape), packed)
    for node in nodes:
        node.op = "DequantMatMul"
        node.inputs = [node.inputs[0], pname]
        node.attrs = {"encoding": encoding, "N": int(n), "K": int(k)}
    if not other_uses(graph, weight):
        del graph.constants[weight]
    return pname


def matmul_nodes_by_weight(graph: Graph) -> dict[str, list[Node]]:
    """Weight name -> the MatMul nodes that use it as their constant right operand."""
    by_weight: dict[str, list[Node]] = {}
    for node, wname, _ in constant_matmul_weights(graph):
        by_weight.setdefault(wname, []).append(node)
    return by_weight


def pack_matmul_weight(graph: Graph, report, weight: str, nodes: list[Node], packed: np.ndarray, encoding: str,
                       suffix: str) -> None:
    """Rewrite `nodes` to DequantMatMul on `packed`; note other uses that keep the dense weight."""
    others = other_uses(graph, weight)
    rewrite_to_dequant(graph, weight, packed, encoding, nodes, lambda s: s + suffix)
    if others:
        report.notes.append(f"weight {weight!r} is also used by {others}; those uses keep a dense copy")
