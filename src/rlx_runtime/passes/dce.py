"""Dead-code elimination by backward liveness. Inputs, params and outputs always stay."""

from __future__ import annotations

from rlx_format.graph import Graph


def dead_code_elimination(graph: Graph, report=None) -> Graph:
    live = set(graph.outputs)
    kept = []
    for n in reversed(graph.nodes):  # nodes are topologically sorted: one backward sweep suffices
        if n.name in live:
            kept.append(n)
            live.update(n.inputs)
    removed = len(graph.nodes) - len(kept)
    graph.nodes = kept[::-1]
    graph.constants = {k: c for k, c in graph.constants.items() if k in live}
    if report is not None:
        report.dce_removed += removed
    return graph.validate()
