"""unpack_quantized: DequantMatMul/DequantGather on constant packed weights -> Dequantize + MatMul/Gather.

With constant folding after it, the packed weights are dequantized once at compile time and every
forward runs plain BLAS matmuls: the file stays small on disk, the process holds f32 weights in RAM
and runs at the speed of an unquantized model. (Results equal dequantize-then-matmul; the fused kernel
sums in a different order.)
"""

from __future__ import annotations

from rlx_format.graph import Graph, Node

from .inbodies import everywhere


def unpack_quantized(graph: Graph, report=None) -> Graph:
    """Also inside If/Loop/Scan bodies, where the packed weight is a captured constant."""
    return everywhere(graph, lambda g, _: _unpack_here(g, report)).validate()


def _unpack_here(graph: Graph, report) -> Graph:
    nodes: list[Node] = []
    changed = 0
    for n in graph.nodes:
        packed = n.inputs[1] if n.op == "DequantMatMul" else n.inputs[0] if n.op == "DequantGather" else None
        if packed is None or packed not in graph.constants:
            nodes.append(n)
            continue
        a = n.attrs
        dense = f"{n.name}/unpacked"
        nodes.append(Node(dense, "Dequantize", [packed], {"encoding": a["encoding"], "shape": [a["N"], a["K"]]}))
        if n.op == "DequantMatMul":  # packed rows are output channels: x @ W[N, K]ᵀ
            nodes.append(Node(f"{dense}/t", "Transpose", [dense], {"perm": [1, 0]}))
            nodes.append(Node(n.name, "MatMul", [n.inputs[0], f"{dense}/t"], {}))
        else:
            nodes.append(Node(n.name, "Gather", [dense, n.inputs[1]], {"axis": 0}))
        changed += 1
    graph.nodes = nodes
    if report is not None:
        report.simplified += changed
    return graph.validate()
