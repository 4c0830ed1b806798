"""skip-zero: MatMul(x, W) with W all zeros -> zeros of the output shape (dynamic dims included).

IEEE caveat: x @ 0 is NaN where x holds NaN or Inf; the rewrite gives 0 there. Bake with
--no-skip for graphs that rely on NaN propagation.
"""

from __future__ import annotations

import numpy as np

from rlx_format.container import release_pages
from rlx_format.graph import Graph, Node, Value

from .matmul_weights import constant_matmul_weights


def skip_zero_matmuls(graph: Graph, report) -> Graph:
    new_nodes: list[Node] = []
    rewrites: dict[str, list[Node]] = {}
    for node, wname, w in list(constant_matmul_weights(graph)):
        flat = w.reshape(-1)
        # probe the first and last 4 KiB before reading everything (a strided probe would fault in the
        # whole memory-mapped weight through the kernel's fault-around)
        if np.any(flat[:1024]) or np.any(flat[-1024:]):
            continue
        nonzero = bool(np.any(flat))
        release_pages(w)
        if nonzero:
            continue
        out_t = graph.types[node.name]
        x = node.inputs[0]
        if out_t.is_static():
            repl = [Node(node.name, "ConstantOfShape", [], {"shape": list(out_t.shape), "value": 0.0, "dtype": "f32"})]
        else:  # shape = Shape(x)[:-1] ++ [N], computed at run time
            n_const = f"{node.name}/skip_n"
            graph.constants[n_const] = Value(n_const, "i64", (1,), np.array([w.shape[1]], np.int64))
            repl = [
                Node(f"{node.name}/skip_shape", "Shape", [x]),
                Node(f"{node.name}/skip_lead", "Slice", [f"{node.name}/skip_shape"], {"starts": [0], "ends": [-1]}),
                Node(f"{node.name}/skip_out_shape", "Concat", [f"{node.name}/skip_lead", n_const], {"axis": 0}),
                Node(node.name, "ConstantOfShape", [f"{node.name}/skip_out_shape"], {"value": 0.0, "dtype": "f32"}),
            ]
        rewrites[node.name] = repl
        report.skipped.append(node.name)
        report.notes.append(f"MatMul {node.name!r}: weight {wname!r} is all zeros; replaced by zeros "
                            "(IEEE caveat: NaN/Inf in the input no longer propagate)")
    if rewrites:
        for n in graph.nodes:
            new_nodes.extend(rewrites.get(n.name, [n]))
        graph.nodes = new_nodes
    return graph.validate()
