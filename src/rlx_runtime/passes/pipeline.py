"""The pass contract and the declared compile pipeline.

Every pass is `(graph, ctx) -> PassResult(graph, changed, entries)`: it may edit the graph it is given
(the pipeline works on a copy), says whether it changed anything, and lists what it did (`entries`,
names for a report section) and anything worth telling (`notes`). `ctx` carries the options and the
provenance later passes and the writer read: `folded_from` (fold), `packed_from` and `quality` (the
bake's packing passes), `digests` (dedupe), plus the counters of `PassReport`.

A group of passes runs to a fixed point (`run_group`): after a pass changed the graph, the others run
again; it stops once every pass has run since the last change, or after `max_rounds` sweeps. Each
pass is idempotent, so a pass is never rerun on a graph it left unchanged.

Compile: [unpack] -> (simplify, fuse, affine, fold)* -> fuse_conv -> (DCE, dedupe)*; without `optimize`: fold alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlx_format.graph import Graph

from .affine import fold_affine
from .dce import dead_code_elimination
from .dedupe import dedupe_constants
from .fold import constant_fold
from .fuse import fuse, fuse_conv_activation, fuse_linear, fuse_squeeze_excite
from .inbodies import BodyView, each_body
from .report import PassReport
from .simplify import simplify
from .specialize import specialize_params
from .unpack import unpack_quantized

MAX_ROUNDS = 4  # sweeps of a group; two suffice for the graphs seen so far (the second one confirms)


@dataclass
class PassResult:
    graph: Graph
    changed: bool
    entries: list[str] = field(default_factory=list)  # what it did, for its report section
    notes: list[str] = field(default_factory=list)


@dataclass
class PassContext:
    options: Any  # BakeOptions or CompileOptions: the passes read fold_* and the bake's own flags
    report: PassReport = field(default_factory=PassReport)
    packed_from: dict[str, str] = field(default_factory=dict)  # packed constant -> the dense weight it replaces
    quality: dict[str, dict] = field(default_factory=dict)  # packed constant -> {"type", "max_abs_err", "cosine"}

    @property
    def folded_from(self) -> dict[str, str]:
        """Folded constant -> the one param/constant it was computed from (fold fills it)."""
        return self.report.folded_from

    @property
    def digests(self) -> dict[str, str]:
        """Constant -> xxh3-64 digest of its bytes (dedupe fills it; the writer reuses them)."""
        return self.report.digests


PassFn = Callable[[Graph, PassContext], PassResult]


@dataclass(frozen=True)
class Pass:
    name: str
    run: PassFn


def _fold(graph: Graph, ctx: PassContext) -> PassResult:
    r, o = ctx.report, ctx.options
    folded, n_refused, inlined = r.folded, len(r.fold_refused), len(r.inlined)
    g = constant_fold(graph, r, o.fold_growth_limit, o.fold_min_bytes, o.fold_memory_budget)
    seen = {(x["node"], x["reason"]) for x in r.fold_refused[:n_refused]}
    fresh = [x for x in r.fold_refused[n_refused:] if (x["node"], x["reason"]) not in seen]
    r.fold_refused[n_refused:] = fresh  # a rerun refuses the same boundaries again: list each once
    return PassResult(g, r.folded > folded or len(r.inlined) > inlined, notes=r.inlined[inlined:])


def _affine(graph: Graph, ctx: PassContext) -> PassResult:
    start = len(ctx.report.affine_folded)
    g = fold_affine(graph, ctx.report)
    done = ctx.report.affine_folded[start:]
    return PassResult(g, bool(done), [f["node"] for f in done],
                      [f"{f['op']} {f['node']!r} folded into the weights of {f['into_op']} {f['into']!r} "
                       "(same values in exact arithmetic; float rounding differs slightly)" for f in done])


def _counted(fn: Callable, counter: str) -> PassFn:
    """A pass whose work shows as a PassReport counter going up."""
    def run(graph: Graph, ctx: PassContext) -> PassResult:
        before = getattr(ctx.report, counter)
        g = fn(graph, ctx.report)
        return PassResult(g, getattr(ctx.report, counter) > before)
    return run


def _dce(graph: Graph, ctx: PassContext) -> PassResult:
    n_consts, removed = len(graph.constants), ctx.report.dce_removed
    g = dead_code_elimination(graph, ctx.report)
    return PassResult(g, ctx.report.dce_removed > removed or len(g.constants) < n_consts)


def in_bodies(one: PassFn) -> PassFn:
    """`one` (a pass on one graph, blind to bodies) run on the graph and then inside every If/Loop/Scan body, nested
    ones included, through views (inbodies.py). Entries and notes from a body are prefixed with its path
    (`loop.body/if.then_branch/<entry>`); the packed weights a body pass made are recorded under the names they
    take in the top graph, as packed from the top graph's weight."""
    def run(graph: Graph, ctx: PassContext) -> PassResult:
        res = one(graph, ctx)
        done: list[tuple[BodyView, PassContext, PassResult]] = []

        def edit(view: BodyView) -> None:
            sub = PassContext(ctx.options, ctx.report)  # its own provenance: names are the body's until put back
            r = run(view.graph, sub)
            view.graph = r.graph
            done.append((view, sub, r))

        each_body(res.graph, edit)
        entries, notes, changed = list(res.entries), list(res.notes), res.changed
        for view, sub, r in done:
            entries += [f"{view.where}/{e}" for e in r.entries]
            notes += [f"{view.where}: {x}" for x in r.notes]
            changed |= r.changed
            for local, dense in sub.packed_from.items():
                if local in view.renamed:
                    ctx.packed_from[view.renamed[local]] = view.captured.get(dense, dense)
            for local, q in sub.quality.items():
                if local in view.renamed:
                    ctx.quality[view.renamed[local]] = q
        return PassResult(res.graph, changed, entries, notes)
    return run


FOLD = Pass("fold", _fold)
AFFINE = Pass("affine", _affine)
SIMPLIFY = Pass("simplify", _counted(simplify, "simplified"))
FUSE = Pass("fuse", _counted(fuse, "simplified"))
FUSE_CONV = Pass("fuse_conv", _counted(fuse_conv_activation, "simplified"))
FUSE_LINEAR = Pass("fuse_linear", _counted(fuse_linear, "simplified"))
FUSE_SE = Pass("fuse_squeeze_excite", _counted(fuse_squeeze_excite, "simplified"))
DCE = Pass("dce", _dce)
DEDUPE = Pass("dedupe", _counted(dedupe_constants, "deduped"))
UNPACK = Pass("unpack", _counted(unpack_quantized, "simplified"))


def run_group(graph: Graph, passes: Sequence[Pass], ctx: PassContext, *, max_rounds: int = MAX_ROUNDS,
              before: Callable[[Pass], None] | None = None,
              after: Callable[[Pass, PassResult], None] | None = None) -> Graph:
    """Run `passes` in order until none changes the graph (see the module docstring)."""
    last = None  # index of the pass that changed the graph last
    for i in range(max_rounds * len(passes)):
        k = i % len(passes)
        if k == last or (last is None and i == len(passes)):
            break  # everything ran since the last change (or a whole sweep changed nothing)
        p = passes[k]
        if before is not None:
            before(p)
        res = p.run(graph, ctx)
        graph = res.graph
        ctx.report.passes.append((p.name, len(graph.nodes)))
        if after is not None:
            after(p, res)
        if res.changed:
            last = k
    return graph


def compile_pipeline(graph: Graph, options) -> tuple[Graph, PassReport]:
    ctx = PassContext(options, PassReport(nodes_before=len(graph.nodes)))
    if options.param_bindings:
        graph = specialize_params(graph, options.param_bindings, ctx.report)
        ctx.report.passes.append(("specialize", len(graph.nodes)))
    g = graph.copy()
    if options.unpack_quantized:
        g = run_group(g, [UNPACK], ctx)
    if options.optimize or options.param_bindings or options.unpack_quantized:
        g = run_group(g, [SIMPLIFY, FUSE, AFFINE, FOLD], ctx)
        # after affine: a BatchNorm or scale is in the Conv weights by now
        g = run_group(g, [FUSE_CONV, FUSE_LINEAR, FUSE_SE], ctx)
        g = run_group(g, [DCE, DEDUPE], ctx)
    elif options.precompute:
        g = run_group(g, [FOLD], ctx)
    ctx.report.nodes_after = len(g.nodes)
    return g, ctx.report
