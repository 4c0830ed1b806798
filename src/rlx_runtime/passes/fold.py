"""Constant folding: evaluate the known part of a graph (the partial evaluator's KNOWN values).

Uses the runtime's own kernels on numpy, so folded values equal run-time values bit for bit. Which
closures fold is decided at their boundary, under the growth guard and the memory budget
(evaluate.py); refusals are listed in the report with their reason. Control flow the fold decides (an If
whose condition folded, a Loop of no iterations) is inlined (inline.py), and what that exposes folds in turn.
"""

from __future__ import annotations

from rlx_format.graph import Graph

from ..bodies import lift_known_work
from .evaluate import fold_known, pick_static_dims
from .inbodies import everywhere
from .inline import inline_known_control
from .report import PassReport


def constant_fold(graph: Graph, report=None, growth_limit: float | None = 16, min_bytes: int = 1 << 20,
                  budget: int | None = None) -> Graph:
    """growth_limit None: fold whatever fits the memory budget (compile-time precompute: nothing is written)."""
    report = report if report is not None else PassReport()
    while True:
        graph = everywhere(graph, lambda g, _: pick_static_dims(g, report))
        graph = lift_known_work(graph)  # known work inside If/Loop/Scan bodies moves out, to be folded here
        graph = fold_known(graph, report, growth_limit=growth_limit, min_bytes=min_bytes, budget=budget)
        inlined = len(report.inlined)
        graph = inline_known_control(graph, report)
        if len(report.inlined) == inlined:
            return graph
