"""The declared compile pipeline: specialize -> simplify -> fold -> DCE -> dedupe."""

from __future__ import annotations

from collections.abc import Callable

from rlx_format.graph import Graph

from .affine import fold_affine
from .dce import dead_code_elimination
from .dedupe import dedupe_constants
from .fold import constant_fold
from .report import PassReport
from .simplify import simplify
from .specialize import specialize_params
from .unpack import unpack_quantized

Pass = Callable[[Graph, PassReport], Graph]


def run_passes(graph: Graph, passes: list[tuple[str, Pass]], report: PassReport) -> Graph:
    """Run passes in order on a copy; each pass re-validates the graph (types re-inferred)."""
    g = graph.copy()
    for name, p in passes:
        g = p(g, report)
        report.passes.append((name, len(g.nodes)))
    return g


def compile_pipeline(graph: Graph, options) -> tuple[Graph, PassReport]:
    report = PassReport(nodes_before=len(graph.nodes))
    if options.param_bindings:
        graph = specialize_params(graph, options.param_bindings, report)
        report.passes.append(("specialize", len(graph.nodes)))

    def fold(g, r):
        return constant_fold(g, r, options.fold_growth_limit, options.fold_min_bytes, options.fold_memory_budget)

    passes: list[tuple[str, Pass]] = [("unpack", unpack_quantized)] if options.unpack_quantized else []
    if options.optimize or options.param_bindings or options.unpack_quantized:
        passes += [("simplify", simplify), ("affine", fold_affine), ("fold", fold), ("simplify", simplify),
                   ("dce", dead_code_elimination), ("dedupe", dedupe_constants)]
    elif options.precompute:
        passes.append(("fold", fold))
    g = run_passes(graph, passes, report)
    report.nodes_after = len(g.nodes)
    return g, report
