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


def _skip_loop(graph: Graph, n: Node, taken: set[str]) -> list[Node]:
    """The nodes replacing a Loop of no iterations: its carried results are the initial values; a scan output is
    empty, its other dims the body's declared ones (a symbol bound by a body input is that operand's dim, read with
    Shape where it is not static; an unbound one is 0), as the kernel gives (spec/ops.md, Loop)."""
    body = n.attrs["body"]
    k0 = len(n.attrs["optional"])
    n_carried = len(body.inputs) - 2 - n.attrs["num_captures"]
    operands = dict(zip((v.name for v in body.inputs[2:]), n.inputs[k0:]))
    bound: dict[str, tuple[str, int]] = {}
    for v in body.inputs[2:]:
        for pos, d in enumerate(v.shape):
            if isinstance(d, str):
                bound.setdefault(d, (operands[v.name], pos))
    out: list[Node] = []
    for m in _items(graph, n.name):
        i = m.attrs["index"]
        if i < n_carried:
            out.append(Node(m.name, "Identity", [n.inputs[k0 + i]]))
            continue
        t = body.types[body.outputs[1 + i]]
        dims = [0]
        for d in t.shape:
            if isinstance(d, str) and d in bound:
                src, pos = bound[d]
                d = graph.types[src].shape[pos]
                if isinstance(d, str):  # known only at run time: from the operand's shape
                    dims.append((src, pos))
                    continue
            dims.append(d if isinstance(d, int) else 0)
        attrs = {"value": 0.0, "dtype": t.dtype}
        if all(isinstance(d, int) for d in dims):
            out.append(Node(m.name, "ConstantOfShape", [], {"shape": dims, **attrs}))
            continue
        pieces = []
        for j, d in enumerate(dims):
            if isinstance(d, int):
                pieces.append(unique_name(f"{m.name}/dim{j}", taken))
                graph.constants[pieces[-1]] = Value(pieces[-1], "i64", (1,), np.array([d], np.int64))
            else:
                shape = unique_name(f"{m.name}/shape{j}", taken)
                pieces.append(unique_name(f"{m.name}/dim{j}", taken))
                out += [Node(shape, "Shape", [d[0]]), Node(pieces[-1], "Slice", [shape],
                                                            {"starts": [d[1]], "ends": [d[1] + 1]})]
        shape = unique_name(f"{m.name}/shape", taken)
        out += [Node(shape, "Concat", pieces, {"axis": 0}), Node(m.name, "ConstantOfShape", [shape], attrs)]
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
            new = _skip_loop(graph, n, taken)
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
