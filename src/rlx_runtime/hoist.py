"""cache_param_invariant / cache_shape_invariant: run weight-only (and shape-only) work once.

split_param_invariant divides a graph into `prepare` (everything computable from params and
constants alone) and `main` (the rest, with each boundary tensor turned into an input).
split_shape_invariant also lets `Shape(input)` into prepare, so tensors built from input
*shapes* (RoPE tables from Shape(x) -> Range -> Sin/Cos) are prepared too, keyed by those shapes.
HoistedGraph runs prepare lazily, binds its outputs into main by reference, and recomputes a
boundary only when a param it depends on changes or (shape mode) its input shapes change; the
boundaries live in a PECache keyed by (param versions, input shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlx_format.errors import RlxError
from rlx_format.graph import Graph, Node, Value, unique_name

from .backend import Backend
from .compiled import CompiledGraph
from .options import CompileOptions
from .passes.evaluate import PARAM, SHAPE, binding_times, boundaries, closure, reads
from .pecache import PECache, PECacheKey
from .plan import Plan, check_array, check_feeds

BOUNDARY_PREFIX = "__hoisted__/"


@dataclass
class HoistSplit:
    prepare: Graph
    main: Graph | None          # None when every output is weight-only
    boundary: list[str]         # names in the original graph
    boundary_inputs: dict[str, str]  # boundary name -> main input name
    prepare_params: list[str]
    main_params: list[str]
    deps: dict[str, list[str]]  # boundary -> params it depends on
    outputs: list[str]          # the original graph's outputs, in order
    inputs: list[Value]         # the original graph's inputs (the signature run() checks)
    params: list[Value]         # the original graph's params (set_param accepts each, used or not)
    graph: Graph                # the graph that was split


def split_param_invariant(graph: Graph) -> HoistSplit | None:
    """Split off everything computable from params and constants alone (None: nothing to hoist)."""
    return _split(graph, through_shape=False)


def split_shape_invariant(graph: Graph) -> HoistSplit | None:
    """Like split_param_invariant, but `Shape(input)` counts as static: shape-only work is prepared."""
    return _split(graph, through_shape=True)


def _split(graph: Graph, through_shape: bool) -> HoistSplit | None:
    bt = binding_times(graph, through_shape)  # the partial evaluator's analysis (passes/evaluate.py)
    level = SHAPE if through_shape else PARAM
    dynamic = {name for name, t in bt.items() if t > level}
    boundary = boundaries(graph, bt, level)
    if not boundary:
        return None
    nodes = graph.node_map()
    need = closure(graph, nodes, boundary)  # prepare: everything the boundary tensors are computed from
    prep_nodes, prep_consts = [], [_vcopy(c) for k, c in graph.constants.items() if k in need]
    for n in graph.nodes:
        if n.name in need:
            if n.op == "Shape" and not reads(n, graph):  # a static shape: a constant, not a read of x
                shape = np.asarray(graph.types[n.inputs[0]].shape, np.int64)
                prep_consts.append(Value(n.name, "i64", shape.shape, shape))
            else:
                prep_nodes.append(_clone(n))
    prep_params = [p for p in graph.params if p.name in need]
    prep_inputs = [_vcopy(v) for v in graph.inputs if v.name in need]  # read through Shape only
    prepare = Graph(f"{graph.name}.prepare", prep_inputs, [_vcopy(p) for p in prep_params], prep_consts,
                    prep_nodes, list(boundary))
    # per-boundary param dependencies
    deps: dict[str, list[str]] = {}
    for b in boundary:
        seen = closure(graph, nodes, [b])
        deps[b] = [p.name for p in graph.params if p.name in seen]
    # main: dynamic nodes, boundary names replaced by fresh inputs
    taken = graph.names()
    bmap = {b: unique_name(BOUNDARY_PREFIX + b, taken) for b in boundary}
    main_nodes = [Node(n.name, n.op, [bmap.get(i, i) for i in n.inputs], dict(n.attrs))
                  for n in graph.nodes if n.name in dynamic]
    prepared = {n.name for n in graph.nodes if n.name not in dynamic}
    main_outputs = [o for o in graph.outputs if o not in prepared]  # an output naming a leaf stays in main
    used = {i for n in main_nodes for i in n.inputs} | set(main_outputs)
    main_params = [p for p in graph.params if p.name in used]
    main = None
    if main_outputs:
        b_inputs = [Value(bmap[b], graph.types[b].dtype, graph.types[b].shape) for b in boundary
                    if bmap[b] in used]
        main = Graph(f"{graph.name}.main", [_vcopy(v) for v in graph.inputs] + b_inputs,
                     [_vcopy(p) for p in main_params],
                     [_vcopy(c) for k, c in graph.constants.items() if k in used], main_nodes, main_outputs)
    return HoistSplit(prepare, main, boundary, bmap, [p.name for p in prep_params],
                      [p.name for p in main_params] if main is not None else [], deps, list(graph.outputs),
                      [_vcopy(v) for v in graph.inputs], [_vcopy(p) for p in graph.params], graph)


def _clone(n: Node) -> Node:
    return Node(n.name, n.op, list(n.inputs), dict(n.attrs))


def _vcopy(v: Value) -> Value:
    return Value(v.name, v.dtype, tuple(v.shape), v.value)


class HoistedGraph:
    """The CompiledGraph interface over a split graph: prepare runs once per invalidation, and the main
    half, itself a CompiledGraph, every forward (tests check that the public attributes match)."""

    def __init__(self, split: HoistSplit, backend: Backend, options: CompileOptions, report=None):
        self.split = split
        self.backend = backend
        self.device = backend.device
        self.device_index = backend.index
        self.options = options
        self.pass_report = report
        self._input_decls = [(v.name, v.dtype, tuple(v.shape)) for v in split.inputs]
        self._profile: dict | None = {} if options.profile else None
        # one small plan per boundary tensor, so invalidation is per boundary
        self._prep: dict[str, Plan] = {}
        for b in split.boundary:
            sub = _restrict(split.prepare, b)
            self._prep[b] = Plan(sub, backend)
        self._version = dict.fromkeys(split.boundary, 0)  # bumped by set_param on a param it depends on
        # boundary tensors are computed on the device and stay there: the cache holds device arrays
        self.cache = PECache(capacity=1, backend=backend)
        self._cache: dict[str, object] = {}  # the boundary values bound into the current forward
        plain = CompileOptions(optimize=False, cache_param_invariant=False, profile=options.profile)
        self._main = CompiledGraph(split.main, backend, plain) if split.main is not None else None
        self._main_inputs = set(self._main.input_names) if self._main is not None else set()

    # ------------------------------------------------------------------ API
    @property
    def graph(self) -> Graph:
        return self.split.graph

    @property
    def input_names(self) -> list[str]:
        return [v.name for v in self.split.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.split.outputs)

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.split.params]

    def plan_ops(self) -> list[str]:
        """Ops of the per-forward plan (main half only: prepare is not per forward)."""
        return self._main.plan_ops() if self._main is not None else []

    def prepare_ops(self) -> list[str]:
        return [s.op for p in self._prep.values() for s in p.steps]

    def set_param(self, name: str, array) -> None:
        with self.backend.scope():
            self._set_param(name, array)

    def _set_param(self, name: str, array) -> None:
        decl = next((p for p in self.split.params if p.name == name), None)
        if decl is None:
            raise RlxError(f"set_param: unknown param {name!r}; expected one of {self.param_names or 'none'}")
        checked = check_array(self.backend, f"param {name!r}", array, decl.dtype, tuple(decl.shape), {})
        owners = [b for b, deps in self.split.deps.items() if name in deps]
        for b in owners:
            plan = self._prep[b]
            plan.base[plan.param_slot[name]] = checked
            self._version[b] += 1  # invalidates only what depends on this param
        if name in self.split.main_params:
            self._main.set_param(name, checked)

    def run(self, feeds: dict) -> dict:
        """As CompiledGraph.run; prepare runs first when a boundary is missing or stale."""
        with self.backend.scope():
            return self._run(feeds)

    def _run(self, feeds: dict) -> dict:
        # the unsplit graph's signature, whichever half reads each input
        feeds = check_feeds(self.backend, self._input_decls, feeds)
        for b in self.split.boundary:
            plan = self._prep[b]
            names = [n for n, *_ in plan.input_slots]  # inputs a Shape-keyed boundary reads (shape mode)
            key = PECacheKey(b).add(self._version[b]).add_shapes([np.shape(feeds[n]) for n in names])
            self._cache[b] = self.cache.get_or_create(key, lambda plan=plan, names=names: self._prepare(plan, names,
                                                                                                         feeds))
        out = {}
        if self._main is not None:
            merged = dict(feeds)
            for b, name in self.split.boundary_inputs.items():
                if name in self._main_inputs:
                    merged[name] = self._cache[b]  # by reference: no copy per forward
            out = self._main.run(merged)
        return {o: out[o] if o in out else self._cache[o].copy() for o in self.split.outputs}

    def _prepare(self, plan: Plan, names: list[str], feeds: dict):
        with np.errstate(all="ignore"):  # IEEE results are the semantics, as in CompiledGraph.run
            vals = plan.execute(plan.bind_inputs({n: feeds[n] for n in names}), self._profile)
        return vals[plan.output_slots[0][1]]

    # ------------------------------------------------------------------ profiling
    def enable_profiling(self, on: bool = True) -> None:
        self._profile = {} if on else None
        if self._main is not None:
            self._main.enable_profiling(on)

    def profile(self) -> dict[str, tuple[int, float]]:
        merged: dict[str, list] = {k: list(v) for k, v in (self._profile or {}).items()}
        if self._main is not None:
            for k, (c, t) in self._main.profile().items():
                rec = merged.setdefault(k, [0, 0.0])
                rec[0] += c
                rec[1] += t
        return {k: (v[0], v[1]) for k, v in merged.items()}

    def reset_profile(self) -> None:
        if self._profile is not None:
            self._profile.clear()
        if self._main is not None:
            self._main.reset_profile()


def _restrict(prepare: Graph, output: str) -> Graph:
    """The part of `prepare` that computes one boundary tensor."""
    need = closure(prepare, prepare.node_map(), [output])
    return Graph(f"{prepare.name}[{output}]", [_vcopy(v) for v in prepare.inputs if v.name in need],
                 [_vcopy(p) for p in prepare.params if p.name in need],
                 [_vcopy(c) for k, c in prepare.constants.items() if k in need],
                 [_clone(n) for n in prepare.nodes if n.name in need], [output])
