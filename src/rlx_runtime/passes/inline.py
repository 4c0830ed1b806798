"""Control flow the fold decided: an If whose condition is a constant becomes its taken branch, inlined; a Loop
known to run zero times becomes its initial values.

The importer inlines an If whose condition is known at import (lower_control.py, on the ONNX branch before it
is lowered); this is the same rule for conditions that only the bake's fold computes (from weights, or from a
shape that folds). The branch's nodes join the enclosing graph ahead of the If: its captures read the If's
operands, its constants become the graph's, and each `Item(If, k)` is replaced by branch output k (the node
producing it takes the Item's name, so graph outputs keep theirs). The untaken branch goes, and with it every
capture only it read (DCE then drops those weights). Runs inside bodies too (nested Ifs on captured constants).
"""

from __future__ import annotations

import numpy as np

from rlx_format.graph import Graph, Node, Value, unique_name

from .inbodies import everywhere
from .rewrite import replace_uses


def _known(graph: Graph, name: str) -> np.ndarray | None:
    c = graph.constants.get(name)
    return None if c is None or c.value is None else np.asarray(c.value)


def _one(v: np.ndarray | None) -> bool | None:
    return None if v is None or v.size != 1 else bool(v.reshape(-1)[0])


def _taken(graph: Graph, n: Node) -> str | None:
    """The branch an If takes, when its condition is known."""
    cond = _one(_known(graph, n.inputs[0]))
    return None if cond is None else ("then_branch" if cond else "else_branch")


def _never_runs(graph: Graph, n: Node) -> bool:
    """A Loop whose trip count is a known 0 or whose condition is a known false runs no iteration."""
    given = dict(zip(n.attrs["optional"], n.inputs))
    m = _known(graph, given["M"]) if "M" in given else None
    cond = _one(_known(graph, given["cond"])) if "cond" in given else None
    return (m is not None and m.size == 1 and int(m.reshape(-1)[0]) <= 0) or cond is False


def _items(graph: Graph, control: str) -> list[Node]:
    return [m for m in graph.nodes if m.op == "Item" and m.inputs == [control]]


def _inline_if(graph: Graph, n: Node, key: str, taken: set[str]) -> list[Node]:
    """The nodes replacing If `n` by its branch `key` (and the renames they imply, applied to `graph`)."""
    body = n.attrs[key]
    names = {v.name: o for v, o in zip(body.inputs, n.inputs[1:])}
    for name, cv in body.constants.items():
        outer = unique_name(f"{n.name}/{name}", taken)
        graph.constants[outer] = Value(outer, cv.dtype, tuple(cv.shape), cv.value)
        names[name] = outer
    items = _items(graph, n.name)
    made = {b.name for b in body.nodes}
    for m in items:  # the producer of a result takes the Item's name (one Item per result keeps it)
        o = body.outputs[m.attrs["index"]]
        if o in made and o not in names:
            names[o] = m.name
    for b in body.nodes:
        if b.name not in names:
            names[b.name] = unique_name(b.name, taken)
    nodes = [Node(names[b.name], b.op, [names[i] for i in b.inputs], dict(b.attrs)) for b in body.nodes]
    outputs = set(graph.outputs)
    for m in items:
        src = names[body.outputs[m.attrs["index"]]]
        if src == m.name:
            continue
        if m.name in outputs:  # a graph output keeps its name
            nodes.append(Node(m.name, "Identity", [src]))
        else:
            replace_uses(graph, m.name, src)
    return nodes


def _skip_loop(graph: Graph, n: Node) -> list[Node] | None:
    """The nodes replacing a Loop of no iterations: its carried results are the initial values; a scan output is an
    empty tensor (only when its per-iteration shape is static)."""
    body = n.attrs["body"]
    k0 = len(n.attrs["optional"])
    n_carried = len(body.inputs) - 2 - n.attrs["num_captures"]
    items = _items(graph, n.name)
    out: list[Node] = []
    for m in items:
        i = m.attrs["index"]
        if i >= n_carried:
            t = body.types[body.outputs[1 + i]]
            if not t.is_static():
                return None
            out.append(Node(m.name, "ConstantOfShape", [], {"shape": [0, *t.shape], "value": 0.0, "dtype": t.dtype}))
        else:
            out.append(Node(m.name, "Identity", [n.inputs[k0 + i]]))
    return out


def _one_level(graph: Graph, report, where: str) -> None:
    taken = graph.names()
    rewrites: dict[str, list[Node]] = {}
    for n in graph.nodes:
        new = None
        if n.op == "If" and (key := _taken(graph, n)) is not None:
            new = _inline_if(graph, n, key, taken)
            what = f"If {where}{n.name}: condition known, {key} inlined"
        elif n.op == "Loop" and _never_runs(graph, n):
            new = _skip_loop(graph, n)
            what = f"Loop {where}{n.name}: runs no iteration, replaced by its initial values"
        if new is None:
            continue
        rewrites[n.name] = new
        for m in _items(graph, n.name):
            rewrites.setdefault(m.name, [])
        if report is not None:
            report.inlined.append(what)
    if rewrites:
        graph.nodes = [m for x in graph.nodes for m in rewrites.get(x.name, [x])]
        graph.validate()


def inline_known_control(graph: Graph, report=None) -> Graph:
    """Inline every If with a known condition and drop every Loop known to run no iteration, in bodies too."""
    return everywhere(graph, lambda g, where: _one_level(g, report, where))
