"""skip-zero: MatMul(x, W) with W all zeros -> zeros of the output shape (dynamic dims included).

IEEE caveat: x @ 0 is NaN where x holds NaN or Inf; the rewrite gives 0 there. Bake with
--no-skip for graphs that rely on NaN propagation.
"""

from __future__ import annotations

import numpy as np

from rlx_format.container import release_pages
from rlx_format.graph import Graph, Node, Value

from .packing import matmul_uses


def _all_zero(w: np.ndarray) -> bool:
    flat = w.reshape(-1)
    # probe the first and last 4 KiB before reading everything (a strided probe would fault in the
    # whole memory-mapped weight through the kernel's fault-around)
    if np.any(flat[:1024]) or np.any(flat[-1024:]):
        return False
    zero = not np.any(flat)
    release_pages(w)
    return zero


def _zeros_like_output(graph: Graph, node: Node, n_out: int) -> list[Node]:
    out_t = graph.types[node.name]
    if out_t.is_static():
        return [Node(node.name, "ConstantOfShape", [], {"shape": list(out_t.shape), "value": 0.0, "dtype": "f32"})]
    # dynamic: shape = Shape(x)[:-1] ++ [N], computed at run time (the graph keeps its inputs)
    n_const = f"{node.name}/skip_n"
    graph.constants[n_const] = Value(n_const, "i64", (1,), np.array([n_out], np.int64))
    return [
        Node(f"{node.name}/skip_shape", "Shape", [node.inputs[0]]),
        Node(f"{node.name}/skip_lead", "Slice", [f"{node.name}/skip_shape"], {"starts": [0], "ends": [-1]}),
        Node(f"{node.name}/skip_out_shape", "Concat", [f"{node.name}/skip_lead", n_const], {"axis": 0}),
        Node(node.name, "ConstantOfShape", [f"{node.name}/skip_out_shape"], {"value": 0.0, "dtype": "f32"}),
    ]


def skip_zero_matmuls(graph: Graph, report) -> Graph:
    rewrites: dict[str, list[Node]] = {}
    for wname, nodes in matmul_uses(graph).items():
        w = graph.constants[wname].value
        if not _all_zero(w):
            continue
        for node in nodes:
            rewrites[node.name] = _zeros_like_output(graph, node, w.shape[1])
            report.skipped.append(node.name)
            report.notes.append(f"MatMul {node.name!r}: weight {wname!r} is all zeros; replaced by zeros "
                                "(IEEE caveat: NaN/Inf in the input no longer propagate)")
    if rewrites:
        graph.nodes = [m for n in graph.nodes for m in rewrites.get(n.name, [n])]
    return graph.validate()
