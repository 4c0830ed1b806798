"""Subgraph awareness for the passes: known work inside If/Loop/Scan bodies moves out to the enclosing graph.

A body node whose inputs are all known (body constants, or captured values that are constants outside) computes
the same value on every iteration and in either branch: it is lifted into the enclosing graph, ahead of the
control node, and its result is captured instead. The enclosing graph's constant fold then evaluates it under
the usual growth guard and memory budget, and a weight only the lifted work read stops being captured (so a
transposed weight is stored once, transposed). Values that depend on an iteration's inputs never move: folding
never crosses an iteration or branch boundary. Called by the fold pass (one line) before it folds; it also
drops body nodes no body output needs and captures no body reads.
"""

from __future__ import annotations

from rlx_format.graph import Graph, Node, Value, unique_name
from rlx_format.ops import CONTROL_OPS, RANDOM_OPS

_BODY_KEYS = {"If": ("then_branch", "else_branch"), "Loop": ("body",), "Scan": ("body",)}


def _n_captures(n: Node) -> int:
    return len(n.inputs) - 1 if n.op == "If" else n.attrs["num_captures"]


def _dead_nodes(body: Graph) -> set[str]:
    """Body nodes no body output depends on (nodes are in topological order: one backward sweep)."""
    live = set(body.outputs)
    for b in reversed(body.nodes):
        if b.name in live:
            live.update(b.inputs)
    return {b.name for b in body.nodes if b.name not in live}


def lift_known_work(graph: Graph) -> Graph:
    """Lift known body work out of every control node of `graph` (nested bodies first). Returns `graph`, changed in
    place (new Graph objects replace the bodies; a body is never edited, it may be shared with a copy)."""
    if not any(n.op in CONTROL_OPS for n in graph.nodes):
        return graph
    taken = graph.names()
    out: list[Node] = []
    changed = False
    for n in graph.nodes:
        if n.op in CONTROL_OPS:
            lifted, n2 = _lift_node(graph, n, taken)
            out.extend(lifted)
            changed |= bool(lifted) or n2 is not n
            n = n2
        out.append(n)
    if not changed:
        return graph
    graph.nodes = out
    return graph.validate()


def _lift_node(graph: Graph, n: Node, taken: set[str]) -> tuple[list[Node], Node]:
    keys = _BODY_KEYS[n.op]
    c = _n_captures(n)
    outer_caps = n.inputs[len(n.inputs) - c:]
    new_bodies = {k: lift_known_work(n.attrs[k].copy()) for k in keys}  # nested first
    lifted: list[Node] = []
    new_caps: dict[str, str] = {}  # outer name of a lifted boundary -> its body-local name (per branch: same name)
    boundary_types: dict[str, object] = {}
    for k in keys:
        body = new_bodies[k]
        first = len(body.inputs) - c
        to_outer = {v.name: o for v, o in zip(body.inputs[first:], outer_caps)}
        known = {name for name, o in to_outer.items()
                 if o in graph.constants and graph.constants[o].value is not None}
        known |= {name for name, v in body.constants.items() if v.value is not None}
        moved: dict[str, str] = {}  # body name -> outer name
        for b in body.nodes:
            if b.op in RANDOM_OPS or b.op in CONTROL_OPS or not b.inputs or not all(i in known for i in b.inputs):
                continue
            known.add(b.name)
            ins = []
            for i in b.inputs:
                if i in moved:
                    ins.append(moved[i])
                elif i in to_outer:
                    ins.append(to_outer[i])
                else:  # a body constant: a constant of the enclosing graph now
                    name = unique_name(f"{n.name}/{i}", taken)
                    cv = body.constants[i]
                    graph.constants[name] = Value(name, cv.dtype, tuple(cv.shape), cv.value)
                    moved[i] = name
                    ins.append(name)
            moved[b.name] = unique_name(f"{n.name}/{b.name}", taken)
            lifted.append(Node(moved[b.name], b.op, ins, dict(b.attrs)))
        if not moved:
            continue
        kept = [b for b in body.nodes if b.name not in moved]
        read = {i for b in kept for i in b.inputs} | set(body.outputs)
        for name, outer in moved.items():
            if name in read and outer in {x.name for x in lifted}:
                new_caps.setdefault(outer, name)
                boundary_types[outer] = body.types[name]
        body.nodes = kept
        new_bodies[k] = body
    dead = {k: _dead_nodes(new_bodies[k]) for k in keys}
    for k in keys:
        if dead[k]:
            new_bodies[k].nodes = [b for b in new_bodies[k].nodes if b.name not in dead[k]]
    if not lifted and not any(dead.values()):
        reads = [{i for b in new_bodies[k].nodes for i in b.inputs} | set(new_bodies[k].outputs) for k in keys]
        unused = any(all(new_bodies[k].inputs[len(new_bodies[k].inputs) - c + j].name not in r
                         for k, r in zip(keys, reads)) for j in range(c))
        if not unused and all(new_bodies[k].nodes == n.attrs[k].nodes for k in keys):
            return [], n
    # rebuild every body with the same capture list: the old captures still read, then the lifted boundaries
    reads = [{i for b in new_bodies[k].nodes for i in b.inputs} | set(new_bodies[k].outputs) for k in keys]
    keep_idx = [j for j in range(c) if any(new_bodies[k].inputs[len(new_bodies[k].inputs) - c + j].name in r
                                            for k, r in zip(keys, reads))]
    attrs = dict(n.attrs)
    for k in keys:
        body = new_bodies[k]
        first = len(body.inputs) - c
        ins = body.inputs[:first] + [body.inputs[first + j] for j in keep_idx]
        local = {v.name for v in body.inputs} | {b.name for b in body.nodes}
        for outer, name in new_caps.items():
            t = boundary_types[outer]
            nm = name if name not in local else unique_name(name, set(local))
            local.add(nm)
            ins.append(Value(nm, t.dtype, tuple(t.shape)))
        attrs[k] = Graph(body.name, ins, [], list(body.constants.values()), body.nodes, body.outputs)
    inputs = n.inputs[:len(n.inputs) - c] + [outer_caps[j] for j in keep_idx] + list(new_caps)
    if n.op != "If":
        attrs["num_captures"] = len(keep_idx) + len(new_caps)
    return lifted, Node(n.name, n.op, inputs, attrs)

