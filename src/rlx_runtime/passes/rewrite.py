"""Small graph-editing helpers shared by the passes."""

from __future__ import annotations

from rlx_format.graph import Graph


def replace_uses(graph: Graph, old: str, new: str) -> None:
    """Point every consumer of `old` at `new` (graph outputs keep their names: callers check)."""
    for n in graph.nodes:
        if old in n.inputs:
            n.inputs = [new if i == old else i for i in n.inputs]
