"""skip-zero: MatMul(x, W) with W all zeros -> zeros of the output shape (dynamic dims included).

IEEE caveat: x @ 0 is NaN where x holds NaN or Inf; the rewrite gives 0 there. Bake with
--no-skip for graphs that rely on NaN propagation.
"""

from __future__ import annotations

import numpy as np

from rlx_format.container import release_pages
from rlx_format.graph import Graph, Node, Value, unique_name
from rlx_runtime.passes import PassContext, PassResult, in_bodies

from .packing import matmul_uses


def _all_zero(w: np.ndarray) -> bool:
    flat = w.reshape(-1)
    # probe the first and last 4 KiB before reading everything (a strided probe would fault in the
    # whole memory-mapped weight through the kernel's fault-around)
    if np.any(flat[:1024]) or np.any(flat[-1024:]):
        return False
    zero = not np.any(flat)
    release_pages(w)
    return zero


def _i64(graph: Graph, taken: set[str], base: str, values: list[int]) -> str:
    name = unique_name(base, taken)
    graph.constants[name] = Value(name, "i64", (len(values),), np.array(values, np.int64))
    return name


def _shape_source(graph: Graph, node: Node, n_out: int, taken: set[str]) -> tuple[list[Node], str]:
    """Nodes computing the output shape of MatMul `node` as an i64 tensor, and its name.

    Symbolic dims are read from the graph inputs that declare them (the runtime binds each symbol to
    those dims), so the zeros no longer depend on the MatMul's input values: whatever only fed it
    becomes dead. Dims no input declares come from Shape(x) of the MatMul's own input."""
    out_t = graph.types[node.name]
    where = {}
    for v in graph.inputs:
        for pos, d in enumerate(v.shape):
            if isinstance(d, str):
                where.setdefault(d, (v.name, pos))
    base = f"{node.name}/skip"
    nodes: list[Node] = []

    def add(op: str, tag: str, inputs: list[str], attrs: dict | None = None) -> str:
        nodes.append(Node(unique_name(f"{base}_{tag}", taken), op, inputs, attrs or {}))
        return nodes[-1].name

    if all(isinstance(d, int) or d in where for d in out_t.shape):
        pieces, shapes = [], {}
        for i, d in enumerate(out_t.shape):
            if isinstance(d, int):
                pieces.append(_i64(graph, taken, f"{base}_dim{i}", [d]))
                continue
            inp, pos = where[d]
            if inp not in shapes:
                shapes[inp] = add("Shape", f"shape_{inp}", [inp])
            pieces.append(add("Slice", f"dim{i}", [shapes[inp]], {"starts": [pos], "ends": [pos + 1]}))
    else:  # Shape(x)[:-1] ++ [N]
        lead = add("Slice", "lead", [add("Shape", "xshape", [node.inputs[0]])], {"starts": [0], "ends": [-1]})
        pieces = [lead, _i64(graph, taken, f"{base}_n", [n_out])]
    return nodes, add("Concat", "out_shape", pieces, {"axis": 0})


def _zeros_like_output(graph: Graph, node: Node, n_out: int,
                       taken: set[str]) -> tuple[list[Node], tuple[str, str] | None]:
    """The nodes replacing MatMul `node` by zeros; and, for a run-time shape, (zero scalar, shape) so
    that its readers can be rewritten (`_propagate`)."""
    out_t = graph.types[node.name]
    if out_t.is_static():
        zeros = Node(node.name, "ConstantOfShape", [], {"shape": list(out_t.shape), "value": 0.0, "dtype": "f32"})
        return [zeros], None  # static: the fold and simplify that follow remove what it makes trivial
    nodes, shape = _shape_source(graph, node, n_out, taken)
    zero = unique_name(f"{node.name}/skip_zero", taken)
    graph.constants[zero] = Value(zero, "f32", (), np.zeros((), np.float32))
    return nodes + [Node(node.name, "Expand", [zero, shape])], (zero, shape)


_BINARY = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"}


def _propagate(graph: Graph, expanded: dict[str, tuple[str, str]], types: dict, taken: set[str],
               notes: list[str]) -> None:
    """Readers of Expand(k, shape) with k known compute on k and expand the result: Relu(Expand(b, s))
    -> Expand(Relu(b), s) (the fold then evaluates Relu(b)), x + zeros -> x, and MatMul of a broadcast row
    by a constant weight -> the expanded product. One forward sweep; exact for elementwise ops (each
    output element is the same operation on the same operands). `types` are the graph's types before
    the MatMuls became Expand (an Expand's dims come from a run-time tensor, so re-inference would
    forget that they are the MatMul's)."""
    from rlx_format.ops import UNARY_ELEMENTWISE, TensorType
    from rlx_runtime.passes.evaluate import KNOWN, binding_times

    bt = binding_times(graph)
    zeros = {k for k, _ in expanded.values()}
    out_nodes: list[Node] = []
    rewritten = 0

    def known(name: str) -> bool:
        return bt.get(name) == KNOWN

    def type_of(name: str):
        c = graph.constants.get(name)
        return TensorType(c.dtype, tuple(c.shape)) if c is not None else types[name]

    for n in graph.nodes:
        hits = [i for i in n.inputs if i in expanded]
        if not hits:
            out_nodes.append(n)
            continue
        new: list[Node] | None = None
        t = types[n.name]
        if len(n.inputs) == 1 and n.op in UNARY_ELEMENTWISE:
            k, s = expanded[n.inputs[0]]
            new = _on_row(n, n.op, [k], dict(n.attrs), s, expanded, taken)
            types[new[0].name] = TensorType(t.dtype, type_of(k).shape)
        elif n.op in _BINARY and len(hits) == 1:
            e = hits[0]
            other = n.inputs[1] if n.inputs[0] == e else n.inputs[0]
            k, s = expanded[e]
            if k in zeros and n.op == "Add" and type_of(other) == t and n.name not in graph.outputs:
                for m in graph.nodes:  # 0 + y = y
                    m.inputs = [other if i == n.name else i for i in m.inputs]
                rewritten += 1
                continue
            if known(other) and type_of(other).is_static() and type_of(k).is_static():
                new = _on_row(n, n.op, [k, other] if n.inputs[0] == e else [other, k], dict(n.attrs), s, expanded,
                              taken)
                types[new[0].name] = TensorType(t.dtype, np.broadcast_shapes(type_of(k).shape, type_of(other).shape))
        elif n.op == "Softmax" and n.inputs[0] in expanded:
            k, s = expanded[n.inputs[0]]
            kt = type_of(k)
            if kt.rank and n.attrs.get("axis", -1) % t.rank == t.rank - 1 and kt.shape[-1] == t.shape[-1]:
                new = _on_row(n, n.op, [k], {"axis": -1}, s, expanded, taken)
                types[new[0].name] = kt
        elif hits == [n.inputs[0]] and n.op == "MatMul" and known(n.inputs[1]) and type_of(n.inputs[1]).rank == 2:
            # a broadcast row times a constant weight: one row's product, expanded
            k, s = expanded[n.inputs[0]]
            kt, wt = type_of(k), type_of(n.inputs[1])
            if kt.rank >= 1 and kt.shape[-1] == wt.shape[0] and isinstance(wt.shape[1], int):
                row, lead, shape = (unique_name(f"{n.name}/on_row{tag}", taken) for tag in ("", "_lead", "_shape"))
                ncol = _i64(graph, taken, f"{n.name}/on_row_n", [wt.shape[1]])
                new = [Node(row, "MatMul", [k, n.inputs[1]]), Node(lead, "Slice", [s], {"starts": [0], "ends": [-1]}),
                       Node(shape, "Concat", [lead, ncol], {"axis": 0}), Node(n.name, "Expand", [row, shape])]
                expanded[n.name] = (row, shape)
                types[row] = TensorType(t.dtype, tuple(kt.shape[:-1]) + (wt.shape[1],))
        if new is None:
            out_nodes.append(n)
            continue
        out_nodes.extend(new)
        rewritten += 1
        for m in new[:-1]:
            bt[m.name] = KNOWN if all(known(i) for i in m.inputs) else bt.get(n.name, KNOWN)
    graph.nodes = out_nodes
    if rewritten:
        notes.append(f"skip-zero: {rewritten} reader(s) of skipped MatMuls computed on one row and expanded")


def _on_row(n: Node, op: str, ins: list[str], attrs: dict, shape: str, expanded: dict, taken: set[str]) -> list[Node]:
    """`op` on the unexpanded operands, then Expand to n's shape under n's name."""
    row = unique_name(f"{n.name}/on_row", taken)
    expanded[n.name] = (row, shape)
    return [Node(row, op, ins, attrs), Node(n.name, "Expand", [row, shape])]


def _skip_zero_here(graph: Graph, ctx: PassContext) -> PassResult:
    skipped, notes = [], []
    rewrites: dict[str, list[Node]] = {}
    expanded: dict[str, tuple[str, str]] = {}
    taken = graph.names()
    for wname, nodes in matmul_uses(graph).items():
        w = graph.constants[wname].value
        if not _all_zero(w):
            continue
        for node in nodes:
            rewrites[node.name], exp = _zeros_like_output(graph, node, w.shape[1], taken)
            if exp is not None:
                expanded[node.name] = exp
            skipped.append(node.name)
            notes.append(f"MatMul {node.name!r}: weight {wname!r} is all zeros; replaced by zeros "
                                "(IEEE caveat: NaN/Inf in the input no longer propagate)")
    if rewrites:
        types = dict(graph.types)
        graph.nodes = [m for n in graph.nodes for m in rewrites.get(n.name, [n])]
        if expanded:
            _propagate(graph, expanded, types, taken, notes)
    return PassResult(graph.validate(), bool(skipped), skipped, notes)


skip_zero_matmuls = in_bodies(_skip_zero_here)  # bodies too: a body's captured weights are seen as constants
