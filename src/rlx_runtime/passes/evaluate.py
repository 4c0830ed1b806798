"""The partial evaluator: one analysis of what every value depends on, and the fold built on it.

Each value gets a binding time, the earliest moment it can be computed:
  KNOWN    now: constants, `Shape` of a statically shaped value (and the static dims picked out of any Shape:
           pick_static_dims), and deterministic nodes of known values
  PARAM    once the params are set: weight-only work
  SHAPE    once the input *shapes* are known (`Shape(input)` and what is computed from it)
  DYNAMIC  only per forward: depends on input values or on an RNG op

Folding (bake, `param_bindings`, compile) evaluates KNOWN values; `cache_param_invariant` prepares
values up to PARAM, `cache_shape_invariant` up to SHAPE (hoist.py). All three read `binding_times`.

What to fold is decided per *boundary* (a known value that unknown work or a graph output reads),
for the whole closure behind it:
- growth guard (bake: the value is written to the file): the boundary may be at most
  `growth_limit` x the bytes of the constants its closure reads (or `min_bytes`), so W + A@B folds
  into one W-sized constant while ConstantOfShape -> huge does not. A refused boundary's inputs
  become boundaries in turn, so the foldable part below it still folds.
- memory budget: before anything is allocated, the sweep is simulated with static shapes; the
  bytes live at once (intermediates, and at compile the folded results too) must stay within
  `budget`. Boundaries that would exceed it are refused, largest first, and reported.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from rlx_format.dtypes import NUMPY_DTYPES, f32_to_bf16
from rlx_format.errors import RlxError
from rlx_format.graph import Graph, Node, Value
from rlx_format.ops import CONTROL_OPS, RANDOM_OPS

from ..backend import CPU
from ..kernels import prepare_attrs
from ..plan import leaf_array

KNOWN, PARAM, SHAPE, DYNAMIC = range(4)
BUDGET_FRACTION = 8  # default budget: 1/8 of the memory this process may use


def binding_times(graph: Graph, through_shape: bool = False) -> dict[str, int]:
    """value name -> KNOWN / PARAM / SHAPE / DYNAMIC, in one forward sweep (nodes are topological).

    through_shape: `Shape` of a graph input is SHAPE (else it is DYNAMIC like the input)."""
    bt: dict[str, int] = {v.name: DYNAMIC for v in graph.inputs}
    bt.update({p.name: PARAM for p in graph.params})
    bt.update({k: KNOWN if c.value is not None else PARAM for k, c in graph.constants.items()})
    inputs = set(graph.input_names)
    for n in graph.nodes:
        if n.op in RANDOM_OPS or n.op in CONTROL_OPS:  # control flow: never folded across an iteration/branch
            bt[n.name] = DYNAMIC
        elif n.op == "Shape" and graph.types[n.inputs[0]].is_static():
            bt[n.name] = KNOWN  # the shape is in the graph's types already
        elif n.op == "Shape" and n.inputs[0] in inputs:
            bt[n.name] = SHAPE if through_shape else DYNAMIC
        else:
            bt[n.name] = max((bt[i] for i in n.inputs), default=KNOWN)
    return bt


def _picked_dims(graph: Graph, producers: dict[str, Node], n: Node) -> np.ndarray | None:
    """The value of Gather / Slice (attr form) of `Shape(x)` when every dim it picks is static in x's type."""
    src = producers.get(n.inputs[0]) if n.inputs else None
    if src is None or src.op != "Shape":
        return None
    dims = list(graph.types[src.inputs[0]].shape)
    if n.op == "Gather" and n.attrs.get("axis", 0) in (0, -1):
        idx = graph.constants.get(n.inputs[1])
        if idx is None or idx.value is None or not all(-len(dims) <= int(i) < len(dims) for i in idx.value.flat):
            return None  # an index out of range stays a run-time error
        picked = [dims[int(i)] for i in idx.value.flat]
        shape = tuple(idx.shape)
    elif n.op == "Slice" and len(n.inputs) == 1 and n.attrs.get("axes") in (None, [0], [-1]):
        steps = n.attrs.get("steps") or [1]
        if steps[0] <= 0:
            return None
        picked = dims[slice(n.attrs["starts"][0], n.attrs["ends"][0], steps[0])]
        shape = (len(picked),)
    else:
        return None
    if not all(isinstance(d, int) for d in picked):
        return None
    return np.array(picked, np.int64).reshape(shape)


def pick_static_dims(graph: Graph, report=None) -> Graph:
    """`Shape(x)[k]` (Gather) or `Shape(x)[a:b]` (Slice) that picks only static dims of x becomes a constant, though
    other dims of x are symbolic (torch's `x.shape[1] == 4` guards): the value is in x's type."""
    producers = graph.node_map()
    kept: list[Node] = []
    for n in graph.nodes:
        v = _picked_dims(graph, producers, n) if n.op in ("Gather", "Slice") else None
        if v is None:
            kept.append(n)
            continue
        graph.constants[n.name] = Value(n.name, "i64", tuple(v.shape), v)
        if report is not None:
            report.folded += 1
    if len(kept) == len(graph.nodes):
        return graph
    graph.nodes = kept
    return graph.validate()


def reads(n: Node, graph: Graph) -> list[str]:
    """The values a node's result is computed from (a static Shape needs none)."""
    return [] if n.op == "Shape" and graph.types[n.inputs[0]].is_static() else n.inputs


def closure(graph: Graph, nodes: dict[str, Node], roots: list[str]) -> set[str]:
    """Every value the roots are computed from, themselves included (iterative, linear time)."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        if v not in seen:
            seen.add(v)
            if v in nodes:
                stack.extend(reads(nodes[v], graph))
    return seen


def boundaries(graph: Graph, bt: dict[str, int], level: int) -> list[str]:
    """Node values computable by `level` that later work or a graph output reads, in graph order."""
    out: dict[str, None] = {}
    for n in graph.nodes:
        if bt[n.name] > level:
            for i in reads(n, graph):
                if bt[i] <= level:
                    out[i] = None
    for o in graph.outputs:
        if bt[o] <= level:
            out[o] = None
    names = {n.name for n in graph.nodes}
    return [b for b in out if b in names]


def default_budget() -> int:
    """1/BUDGET_FRACTION of the memory this process may use: physical RAM, lowered by an address-space
    or data rlimit and by a cgroup v2 memory limit."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        pass
    try:
        import resource

        for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                limits.append(soft)
    except (ImportError, ValueError, OSError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            text = f.read().strip()
        if text.isdigit():
            limits.append(int(text))
    except OSError:
        pass
    return (min(limits) if limits else 8 << 30) // BUDGET_FRACTION


def _nbytes(graph: Graph, name: str) -> int | None:
    t = graph.types[name]
    if not t.is_static():
        return None
    return math.prod(t.shape) * NUMPY_DTYPES[t.dtype].itemsize


@dataclass
class _Closure:
    nodes: list[Node]       # the known nodes behind one boundary, in graph order
    leaves: dict[str, Value]  # the constants they read


def fold_known(graph: Graph, report=None, *, growth_limit: float | None, min_bytes: int,
               budget: int | None = None) -> Graph:
    """Evaluate every known boundary that passes the guards; the boundary becomes a constant, and
    constants nothing else reads are dropped as soon as their last reader ran (peak stays low).

    growth_limit None: no growth guard (compile: nothing is written, folded values only live in RAM, so
    they count against the budget instead)."""
    budget = default_budget() if budget is None else budget
    bt = binding_times(graph)
    nodes = {n.name: n for n in graph.nodes}
    order = {n.name: i for i, n in enumerate(graph.nodes)}
    candidates = boundaries(graph, bt, KNOWN)
    if not candidates:
        return graph
    refused: list[dict] = []
    origin = report.fold_origin_bytes if report is not None else {}

    def closure_of(b: str) -> _Closure:
        vals = closure(graph, nodes, [b])
        return _Closure(sorted((nodes[v] for v in vals if v in nodes), key=lambda n: order[n.name]),
                        {v: graph.constants[v] for v in vals if v in graph.constants})

    accepted: dict[str, _Closure] = {}
    seen: set[str] = set()

    def consider(queue: list[str]) -> None:
        """Accept what passes the growth guard; for a refused value, consider the values below it."""
        while queue:
            b = queue.pop(0)
            if b in seen or b not in nodes:
                continue
            seen.add(b)
            c = closure_of(b)
            reason = _growth_refusal(graph, b, c, growth_limit, min_bytes, origin)
            if reason is None:
                accepted[b] = c
            else:
                refused.append({"node": b, "op": nodes[b].op, "reason": reason})
                queue.extend(reads(nodes[b], graph))

    consider(list(candidates))
    keep_results = growth_limit is None  # at compile the folded values stay in RAM: they use the budget
    while accepted:
        peak = _simulate(graph, order, accepted, keep_results)
        if peak <= budget:
            break
        # refuse the boundary that needs the most on its own, then try again without it
        worst = max(accepted, key=lambda b: _simulate(graph, order, {b: accepted[b]}, keep_results))
        alone = _simulate(graph, order, {worst: accepted.pop(worst)}, keep_results)
        refused.append({"node": worst, "op": nodes[worst].op,
                        "reason": f"evaluating it needs {alone} bytes at once, more than the fold memory budget "
                                  f"({budget} bytes); raise fold_memory_budget to allow it"})
        consider(list(reads(nodes[worst], graph)))
    if report is not None:
        report.fold_refused.extend(refused)
    if accepted:
        for b, c in accepted.items():
            origin[b] = _source_bytes(c, origin)
        _evaluate(graph, nodes, order, accepted, report)
    return graph.validate()


def _source_bytes(c: _Closure, origin: dict[str, int]) -> int:
    """Bytes of the original constants behind a closure (a constant an earlier pass folded counts as
    what it was computed from)."""
    return sum(origin.get(k, v.value.nbytes) for k, v in c.leaves.items())


def _growth_refusal(graph: Graph, b: str, c: _Closure, growth_limit: float | None, min_bytes: int,
                    origin: dict[str, int]) -> str | None:
    out_b = _nbytes(graph, b)
    if out_b is None:
        return "output shape is not static"
    if growth_limit is None:
        return None
    in_b = _source_bytes(c, origin)
    if out_b > max(min_bytes, growth_limit * in_b):
        t = graph.types[b]
        return (f"output {t.dtype}{list(t.shape)} is {out_b} bytes, more than {growth_limit:g}x the constants it is "
                f"computed from ({in_b} bytes); raise fold_growth_limit to allow it")
    return None


def _readers(graph: Graph, todo: list[Node]) -> dict[str, int]:
    """How many nodes of the sweep read each value (each node counts once per distinct input)."""
    count: dict[str, int] = {}
    for n in todo:
        for i in dict.fromkeys(reads(n, graph)):
            count[i] = count.get(i, 0) + 1
    return count


def _sweep(accepted: dict[str, _Closure]) -> list[Node]:
    seen: dict[str, Node] = {}
    for c in accepted.values():
        for n in c.nodes:
            seen.setdefault(n.name, n)
    return list(seen.values())


def _simulate(graph: Graph, order: dict[str, int], accepted: dict[str, _Closure], keep_results: bool) -> int:
    """Peak bytes of newly computed tensors live at once during the sweep (static shapes; no allocation).

    A value is live from its node until its last reader in the sweep; a folded result stays live for
    good when `keep_results` (at compile it is bound into the plan), else it leaves with its last reader."""
    todo = sorted(_sweep(accepted), key=lambda n: order[n.name])
    left = _readers(graph, todo)
    live = peak = 0
    sizes: dict[str, int] = {}

    def release(v: str) -> int:
        return 0 if keep_results and v in accepted else sizes[v]

    for n in todo:
        sizes[n.name] = _nbytes(graph, n.name) or 0
        live += sizes[n.name]
        peak = max(peak, live)
        for i in dict.fromkeys(reads(n, graph)):
            left[i] -= 1
            if left[i] == 0 and i in sizes:
                live -= release(i)
        if left.get(n.name, 0) == 0:
            live -= release(n.name)
    return peak


def _evaluate(graph: Graph, nodes: dict[str, Node], order: dict[str, int], accepted: dict[str, _Closure],
              report) -> None:
    todo = sorted(_sweep(accepted), key=lambda n: order[n.name])
    left = _readers(graph, todo)
    swept = {n.name for n in todo}
    # what the remaining graph still reads, through swept nodes that are not folded (a refused value that a
    # folded boundary is also computed from stays a node); folded boundaries are leaves from now on
    still_read: set[str] = set()
    stack = [i for n in graph.nodes if n.name not in swept for i in n.inputs] + list(graph.outputs)
    while stack:
        v = stack.pop()
        if v not in still_read:
            still_read.add(v)
            if v in swept and v not in accepted:
                stack.extend(nodes[v].inputs)
    vals: dict[str, np.ndarray] = {}
    consts = graph.constants
    for n in todo:
        t = graph.types[n.name]
        if n.op == "Shape":
            val = np.asarray(graph.types[n.inputs[0]].shape, np.int64)
        else:
            args = [vals[i] if i in vals else leaf_array(CPU, consts[i].value, consts[i].dtype) for i in n.inputs]
            try:
                with np.errstate(all="ignore"):  # IEEE results are the semantics, as at run time
                    val = CPU.kernel(n.op)(np, prepare_attrs(n.op, n.attrs), *args)
            except Exception as e:  # noqa: BLE001
                raise RlxError(f"constant folding node {n.name!r} ({n.op}) failed: {type(e).__name__}: {e}") from e
        vals[n.name] = np.asarray(val)
        if n.name in accepted:
            v = vals[n.name]
            v = f32_to_bf16(v) if t.dtype == "bf16" else np.require(v, dtype=NUMPY_DTYPES[t.dtype], requirements="C")
            consts[n.name] = Value(n.name, t.dtype, tuple(v.shape), v)
            vals[n.name] = leaf_array(CPU, v, t.dtype)  # later readers see it as the runtime holds it
            if report is not None:
                big = [k for k, c in accepted[n.name].leaves.items() if c.value.size > 1]
                if len(big) == 1:  # remember where a weight-derived tensor came from (for readable names)
                    report.folded_from[n.name] = report.folded_from.get(big[0], big[0])
        if report is not None:
            report.folded += 1
        for i in dict.fromkeys(reads(n, graph)):
            left[i] -= 1
            if left[i] == 0:
                vals.pop(i, None)  # intermediates die at their last reader
                if i in consts and i not in still_read and i not in accepted:
                    del consts[i]  # a constant only folded nodes read: free it now
    graph.nodes = [n for n in graph.nodes if n.name not in swept or (n.name in still_read and n.name not in accepted)]
