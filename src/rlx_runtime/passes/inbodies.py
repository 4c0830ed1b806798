"""Passes inside If/Loop/Scan bodies, through views.

A body is closed: the weights it reads are captures, constants of the enclosing graph. A pass edits a body
through a *view*: the body with every capture that is a constant outside turned into a constant of the same
name, so the pass sees a body's weights as it sees the enclosing graph's. Putting the view back: a captured
constant still read stays a capture of the same outer value; a constant the pass made (a packed weight, an
inlined branch's constant) becomes a constant of the enclosing graph, captured; a capture nothing reads any more
is dropped, so a weight only a rewritten body read leaves the file. Bodies nest: `each_body` views the bodies of
one graph; callers recurse on the view (a view's own bodies are put back into it first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rlx_format.graph import Graph, Node, Value, unique_name
from rlx_format.ops import CONTROL_OPS, body_attrs

from .rewrite import replace_uses


def n_captures(n: Node) -> int:
    """How many of a control node's inputs are captures (its last ones; spec/ops.md, Control flow)."""
    return len(n.inputs) - 1 if n.op == "If" else n.attrs["num_captures"]


@dataclass
class BodyView:
    graph: Graph                   # the body, captured constants materialized (edit this)
    where: str                     # "node.key" path from the top graph, for reports
    captured: dict[str, str]       # view constant (a capture) -> the outer constant it is
    renamed: dict[str, str] = field(default_factory=dict)  # after put-back: view constant -> outer constant name


def _view(graph: Graph, n: Node, key: str, where: str) -> BodyView:
    body = n.attrs[key]
    c = n_captures(n)
    first = len(body.inputs) - c
    inputs = list(body.inputs[:first])
    consts = [Value(v.name, v.dtype, tuple(v.shape), v.value) for v in body.constants.values()]
    captured: dict[str, str] = {}
    for v, outer in zip(body.inputs[first:], n.inputs[len(n.inputs) - c:]):
        oc = graph.constants.get(outer)
        if oc is not None and oc.value is not None:
            consts.append(Value(v.name, oc.dtype, tuple(oc.shape), oc.value))  # the operand's static shape
            captured[v.name] = outer
        else:
            inputs.append(Value(v.name, v.dtype, tuple(v.shape)))
    nodes = [Node(b.name, b.op, list(b.inputs), dict(b.attrs)) for b in body.nodes]
    return BodyView(Graph(body.name, inputs, [], consts, nodes, list(body.outputs)), where, captured)


def _reads(g: Graph) -> set[str]:
    return {i for b in g.nodes for i in b.inputs} | set(g.outputs)


def _put_back(graph: Graph, n: Node, views: dict[str, BodyView], taken: set[str]) -> None:
    """Rebuild n's bodies from the views, all with one capture list (If branches share theirs)."""
    c = n_captures(n)
    outer_caps = n.inputs[len(n.inputs) - c:]
    old = {k: n.attrs[k] for k in views}
    for v in views.values():  # a captured constant the pass replaced by another value: a new constant, renamed
        for name in [x for x in v.captured if v.graph.constants.get(x) is not None
                     and v.graph.constants[x].value is not graph.constants[v.captured[x]].value]:
            fresh = unique_name(name, v.graph.names())
            cv = v.graph.constants.pop(name)
            v.graph.constants[fresh] = Value(fresh, cv.dtype, tuple(cv.shape), cv.value)
            replace_uses(v.graph, name, fresh)
            v.graph.outputs = [fresh if o == name else o for o in v.graph.outputs]
    reads = {k: _reads(v.graph) for k, v in views.items()}
    keep = [j for j in range(c) if any(old[k].inputs[len(old[k].inputs) - c + j].name in reads[k] for k in views)]
    new_caps: list[tuple[str, str, Value]] = []  # (key, view name, outer constant)
    for k, v in views.items():
        body = old[k]
        for name, cv in v.graph.constants.items():
            mine = body.constants.get(name)
            if name in v.captured and cv.value is graph.constants[v.captured[name]].value:
                continue  # still the captured weight
            if mine is not None and mine.value is cv.value:
                continue  # a body constant it had
            if name not in reads[k]:
                continue
            outer = unique_name(name, taken)
            graph.constants[outer] = Value(outer, cv.dtype, tuple(cv.shape), cv.value)
            v.renamed[name] = outer
            new_caps.append((k, name, graph.constants[outer]))
    attrs = dict(n.attrs)
    for k, v in views.items():
        body, vg = old[k], v.graph
        first = len(body.inputs) - c
        ins = list(body.inputs[:first]) + [body.inputs[first + j] for j in keep]
        moved = {name for kk, name, _ in new_caps if kk == k}
        local = vg.names()
        for kk, name, oc in new_caps:
            nm = name if kk == k else unique_name(name, local)
            ins.append(Value(nm, oc.dtype, tuple(oc.shape)))
        consts = [cv for name, cv in vg.constants.items()
                  if name not in v.captured and name not in moved and name in reads[k]]
        attrs[k] = Graph(body.name, ins, [], consts, vg.nodes, vg.outputs)
    n.inputs = n.inputs[:len(n.inputs) - c] + [outer_caps[j] for j in keep] + [oc.name for _, _, oc in new_caps]
    if n.op != "If":
        attrs["num_captures"] = len(keep) + len(new_caps)
    n.attrs = attrs


def each_body(graph: Graph, edit: Callable[[BodyView], None], where: str = "") -> None:
    """`edit` every body of every control node of `graph` (not nested ones: `edit` recurses on the view if it
    wants them), through views put back afterwards; `graph` is changed in place and validated."""
    controls = [n for n in graph.nodes if n.op in CONTROL_OPS]
    if not controls:
        return
    taken = graph.names()
    for n in controls:
        views = {k: _view(graph, n, k, f"{where}{n.name}.{k}") for k in body_attrs(n.op)}
        for v in views.values():
            edit(v)
        _put_back(graph, n, views, taken)
    graph.validate()


def everywhere(graph: Graph, run: Callable[[Graph, str], None], where: str = "") -> Graph:
    """`run(g, where)` on `graph` ("" for it) and then on every body, nested ones included (`where` is the body's
    path, e.g. "loop.body/if.then_branch"). Returns `graph`, changed in place."""
    run(graph, where)
    each_body(graph, lambda v: everywhere(v.graph, run, v.where + "/"), where)
    return graph


def resolve_all(graph: Graph) -> Iterator[tuple[Node, str, Callable[[str], str | None]]]:
    """Every node of `graph` and its bodies (nested), with its body path ("" at the top) and a function mapping a
    name it reads to the top graph's name of that value (None for a value local to a body)."""
    stack: list[tuple[Graph, str, Callable[[str], str | None]]] = [(graph, "", lambda name: name)]
    while stack:
        g, where, up = stack.pop()
        for n in g.nodes:
            yield n, where, up
            if n.op not in CONTROL_OPS:
                continue
            c = n_captures(n)
            outer = n.inputs[len(n.inputs) - c:]
            for k in body_attrs(n.op):
                body = n.attrs[k]
                to_outer = {v.name: o for v, o in zip(body.inputs[len(body.inputs) - c:], outer)}
                stack.append((body, f"{where}{n.name}.{k}/",
                              lambda name, m=to_outer, up=up: up(m[name]) if name in m else None))
