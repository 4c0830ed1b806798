"""Algebraic simplification: x+0, x-0, x*1, x/1, Identity, same-shape Reshape, Transpose pairs.
(The exact-equivalent fusions are fuse.py; the nodes left without readers go in DCE.)

A rewrite only happens when the result keeps x's exact shape and dtype (a broadcasting `x + 0`
that widens x stays). Nodes that are graph outputs keep their names, so they are left alone.
"""

from __future__ import annotations

import numpy as np

from rlx_format.graph import Graph

from .rewrite import replace_uses

_NEUTRAL = {"Add": (0, (0, 1)), "Sub": (0, (1,)), "Mul": (1, (0, 1)), "Div": (1, (1,))}


def _const_all(graph: Graph, name: str, value: float) -> bool:
    c = graph.constants.get(name)
    return c is not None and c.value is not None and c.value.size > 0 and bool(np.all(c.value == value))


def simplify(graph: Graph, report=None) -> Graph:
    outputs = set(graph.outputs)
    producers = {n.name: n for n in graph.nodes}
    changed = 0
    for n in graph.nodes:
        if n.name in outputs:
            continue
        t = graph.types[n.name]
        keep_as = None
        if n.op == "Identity":
            keep_as = n.inputs[0]
        elif n.op in _NEUTRAL:
            value, positions = _NEUTRAL[n.op]
            for pos in positions:
                other = n.inputs[1 - pos]
                if _const_all(graph, n.inputs[pos], value) and graph.types[other] == t:
                    keep_as = other
                    break
        elif n.op == "Reshape" and graph.types[n.inputs[0]] == t and t.is_static():
            keep_as = n.inputs[0]
        elif n.op == "Transpose":
            src = producers.get(n.inputs[0])
            if src is not None and src.op == "Transpose":
                rank = t.rank
                p1 = src.attrs["perm"] or list(range(rank))[::-1]
                p2 = n.attrs["perm"] or list(range(rank))[::-1]
                combined = [p1[i] for i in p2]
                if combined == list(range(rank)):
                    keep_as = src.inputs[0]
                else:
                    n.inputs = [src.inputs[0]]
                    n.attrs = {"perm": combined}
                    changed += 1
        if keep_as is not None:
            replace_uses(graph, n.name, keep_as)
            changed += 1
    if report is not None:
        report.simplified += changed
    return graph.validate()
