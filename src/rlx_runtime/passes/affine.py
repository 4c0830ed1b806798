"""Affine folds: a per-channel scale and shift after a linear op moves into its weight and bias.

  Conv / ConvTranspose (group 1) -> BatchNormalization, or Mul / Add by a per-output-channel tensor
  MatMul (constant 2-D weight)   -> Mul by a per-column tensor, or BatchNormalization on a 2-D output

when the weight, the bias and the scale/shift operands are known (constants, or computable from
them: the partial evaluator's KNOWN). The rewrite only emits the weight arithmetic as ordinary
nodes (s = scale / sqrt(var + eps); W' = W * s; b' = (b - mean) * s + beta); the fold that runs next
evaluates it, so the folded weights come from the runtime's own kernels. BatchNorm(Conv(x)) and
Conv'(x) are equal in exact arithmetic but round differently (the report says which nodes moved).
Repeated until nothing changes, so Conv -> BN -> Mul -> Add chains fold completely.
"""

from __future__ import annotations

import numpy as np

from rlx_format.dtypes import NUMPY_DTYPES
from rlx_format.graph import Graph, Node, Value, unique_name

from .evaluate import KNOWN, binding_times
from .inbodies import everywhere

_FLOATS = ("f32", "f64", "f16")


class _Emitter:
    """Appends weight-arithmetic nodes (inserted right before the node being rewritten)."""

    def __init__(self, graph: Graph, base: str, taken: set[str]):
        self.graph, self.base, self.nodes, self._taken = graph, base, [], taken

    def _name(self, tag: str) -> str:
        return unique_name(f"{self.base}/{tag}", self._taken)

    def op(self, op: str, *inputs: str, **attrs) -> str:
        name = self._name(op.lower())
        self.nodes.append(Node(name, op, list(inputs), attrs))
        return name

    def const(self, value: np.ndarray, dtype: str) -> str:
        name = self._name("c")
        arr = np.asarray(value, NUMPY_DTYPES[dtype])
        self.graph.constants[name] = Value(name, dtype, tuple(arr.shape), arr)
        return name


def _per_channel(graph: Graph, name: str, out_rank: int, axis: int, channels: int) -> bool:
    """`name` broadcasts against the output along `axis` only (or is a scalar)."""
    shape = graph.types[name].shape
    if len(shape) > out_rank or not all(isinstance(d, int) for d in shape):
        return False
    full = (1,) * (out_rank - len(shape)) + tuple(shape)
    return all(d == 1 for i, d in enumerate(full) if i != axis) and full[axis] in (1, channels)


def fold_affine(graph: Graph, report=None) -> Graph:
    """Also inside If/Loop/Scan bodies (the weight arithmetic emitted there is lifted out and folded by the fold)."""
    def here(g: Graph, where: str) -> None:
        while _round(g, report, where):  # a round folds every independent match; chains take one round per link
            pass
    return everywhere(graph, here).validate()


def _round(graph: Graph, report, where: str = "") -> bool:
    bt = binding_times(graph)
    producers = graph.node_map()
    users = graph.consumers()
    outputs = set(graph.outputs)
    known = {k for k, t in bt.items() if t == KNOWN}
    rewrites: dict[str, list[Node]] = {}
    removed: set[str] = set()
    taken = graph.names()
    for node in graph.nodes:
        src = producers.get(node.inputs[0]) if node.inputs else None
        if src is None or src.name in outputs or len(users.get(src.name, [])) != 1:
            continue
        if src.op not in ("Conv", "ConvTranspose", "MatMul") or len(src.inputs) < 2 or src.name in rewrites:
            continue  # (a node rewritten in this round is matched again in the next one)
        t = graph.types[src.name]
        if t.dtype not in _FLOATS or any(i not in known for i in src.inputs[1:]):
            continue
        new = _rewrite(graph, node, src, known, t, taken)
        if new is not None:
            rewrites[node.name] = new
            removed.add(src.name)
            if report is not None:
                report.affine_folded.append({"node": where + node.name, "op": node.op, "into": where + src.name,
                                             "into_op": src.op})
    if not rewrites:
        return False
    graph.nodes = [m for n in graph.nodes if n.name not in removed for m in rewrites.get(n.name, [n])]
    graph.validate()
    return True


def _rewrite(graph: Graph, node: Node, src: Node, known: set[str], t, taken: set[str]) -> list[Node] | None:
    rank = t.rank
    wt = graph.types[src.inputs[1]]
    if not wt.is_static():
        return None
    if src.op == "MatMul":
        if wt.rank != 2 or rank < 1:
            return None
        axis, channels = rank - 1, wt.shape[1]
        w_shape = [1, -1]
    elif src.op == "Conv":
        axis, channels = 1, wt.shape[0]
        w_shape = [-1] + [1] * (wt.rank - 1)
    else:  # ConvTranspose: weight [Cin, Cout / group, k...]
        if src.attrs.get("group", 1) != 1:
            return None
        axis, channels = 1, wt.shape[1]
        w_shape = [1, -1] + [1] * (wt.rank - 2)
    e = _Emitter(graph, node.name, taken)
    dtype = t.dtype
    bias = src.inputs[2] if len(src.inputs) > 2 else None
    if node.op == "BatchNormalization":
        if node.inputs[0] != src.name or any(i not in known for i in node.inputs[1:]):
            return None
        if src.op == "MatMul" and rank != 2:  # BatchNormalization normalizes axis 1: the columns only when 2-D
            return None
        scale, beta, mean, var = node.inputs[1:]
        s = e.op("Div", scale, e.op("Sqrt", e.op("Add", var, e.const(node.attrs["epsilon"], dtype))))
        shift = e.op("Add", e.op("Mul", e.op("Sub", bias, mean) if bias else e.op("Neg", mean), s), beta)
    elif node.op in ("Mul", "Add") and len(node.inputs) == 2:
        other = node.inputs[1] if node.inputs[0] == src.name else node.inputs[0]
        if other == src.name or other not in known or graph.types[node.name] != t:
            return None
        if not _per_channel(graph, other, rank, axis, channels):
            return None
        vec = e.op("Reshape", other, shape=[-1])  # [channels] or [1]
        if node.op == "Mul":
            s, shift = vec, (e.op("Mul", bias, vec) if bias else None)
        else:
            if src.op == "MatMul":
                return None  # MatMul has no bias operand to absorb the shift
            s = None
            zeros = e.const(np.zeros(channels), dtype)
            shift = e.op("Add", bias if bias else zeros, vec)
    else:
        return None
    w = src.inputs[1]
    if s is not None:
        w = e.op("Mul", w, e.op("Reshape", s, shape=w_shape))
    if src.op == "MatMul":
        out = Node(node.name, "MatMul", [src.inputs[0], w]) if shift is None else None
        if out is None:  # BatchNormalization after a MatMul: the shift stays an Add
            mm = e.op("MatMul", src.inputs[0], w)
            return e.nodes + [Node(node.name, "Add", [mm, shift])]
        return e.nodes + [out]
    ins = [src.inputs[0], w] + ([shift] if shift else [bias] if bias else [])
    return e.nodes + [Node(node.name, src.op, ins, dict(src.attrs))]
