"""Exact-equivalent fusions: op sequences that exporters emit, replaced by one catalogue op.

GELU: Mul(Mul(x, Add(Erf(Div(x, √2)), 1)), 0.5) (operands of Add/Mul in either order) -> Gelu(x).
Only fused when the constants are exactly f32(√2), 1 and 0.5 and the intermediates feed nothing
else, so the fused kernel reproduces the same float32 steps.

SiLU: Mul(x, Sigmoid(x)) (either order) -> Silu(x) when the Sigmoid feeds nothing else; the Silu kernel
multiplies x by the same Sigmoid result, so the values are equal.

Conv + activation (`fuse_conv_activation`, compile only, so baked files keep plain Conv): Conv whose only
reader is a Relu/Sigmoid/Silu/LeakyRelu/Clip -> FusedConv(activation=...), with equal values; and
Mul(c, Clip(c * alpha + beta, 0, 1)) over a Conv c (HardSwish as the ONNX import lowers it) -> FusedConv
(activation=HardSwish). Add(Conv, r) (a residual block's sum; the activation that alone reads it, if any) ->
FusedConv(x, w, b, r) (`_fuse_conv_residual`). Then a squeeze-excite block, x times the gate made from its
channel means by two 1x1 FusedConvs, -> SqueezeExcite (`fuse_squeeze_excite`).

MatMul + bias (`fuse_linear`, compile only): Add(MatMul(x, w), b) (either order) over a float32 MatMul that nothing
else reads, w a matrix, b one value per output column -> FusedMatMul(x, w, b); then Add(that, r) (either order, r of
its type) -> FusedMatMul(x, w, b, r). The same float32 sums in the same order, so equal values.
"""

from __future__ import annotations

import math

import numpy as np

from rlx_format.graph import Graph, Node
from rlx_format.ops.catalogue import FUSED_CONV_ACTIVATIONS

_SQRT2 = np.float32(math.sqrt(2.0))


def _scalar(graph: Graph, name: str, value) -> bool:
    c = graph.constants.get(name)
    return (c is not None and c.value is not None and c.value.size == 1 and c.dtype in ("f32", "f64")
            and c.value.reshape(()) == value)


def _other(node: Node, graph: Graph, value) -> str | None:
    """For a binary node with one scalar-constant operand equal to `value`, the other operand."""
    a, b = node.inputs
    if _scalar(graph, b, value):
        return a
    if _scalar(graph, a, value):
        return b
    return None


def _drop(graph: Graph, absorbed: set[str], read: set[str]) -> None:
    """Remove the absorbed nodes, and the constants among `read` (what the nodes read before) that nothing
    reads any more."""
    graph.nodes = [n for n in graph.nodes if n.name not in absorbed]
    still = {i for n in graph.nodes for i in n.inputs} | set(graph.outputs)
    for name in read - still:
        graph.constants.pop(name, None)


def _sole_reader_lookup(graph: Graph, absorbed: set[str]):
    """lookup(name, op, readers=1): the node that makes `name` if it is an `op`, no graph output, not absorbed, and
    read by exactly `readers` nodes (so a fusion may take it over); else None. Of the graph as it is now."""
    nodes, users, outputs = graph.node_map(), graph.consumers(), set(graph.outputs)

    def lookup(name: str, op: str, readers: int = 1) -> Node | None:
        n = nodes.get(name)
        ok = (n is not None and n.op == op and name not in outputs and name not in absorbed
              and len(users.get(name, [])) == readers)
        return n if ok else None
    return lookup


def fuse(graph: Graph, report=None) -> Graph:
    """Both fusions; the nodes a fusion absorbed (they fed only the fused node) are removed with it."""
    absorbed: set[str] = set()
    read = {i for n in graph.nodes for i in n.inputs}
    fused = _fuse_gelu(graph, absorbed) + _fuse_silu(graph, absorbed)
    if report is not None:
        report.simplified += fused
    if not fused:
        return graph
    _drop(graph, absorbed, read)  # with the fused-away constants (0.5, 1, sqrt 2)
    return graph.validate()


def _fuse_gelu(graph: Graph, absorbed: set[str]) -> int:
    single = _sole_reader_lookup(graph, absorbed)

    fused = 0
    for m2 in graph.nodes:
        if m2.op != "Mul":
            continue
        m1 = single(_other(m2, graph, 0.5) or "", "Mul")
        if m1 is None:
            continue
        for x, add_name in ((m1.inputs[0], m1.inputs[1]), (m1.inputs[1], m1.inputs[0])):
            add = single(add_name, "Add")
            erf = single(_other(add, graph, 1.0) or "", "Erf") if add is not None else None
            div = single(erf.inputs[0], "Div") if erf is not None else None
            if div is not None and div.inputs[0] == x and _scalar(graph, div.inputs[1], _SQRT2):
                if graph.types[x] != graph.types[m2.name] or graph.types[x].dtype not in ("f32", "f64"):
                    continue
                m2.op, m2.inputs, m2.attrs = "Gelu", [x], {"approximate": "none"}
                absorbed.update((m1.name, add.name, erf.name, div.name))
                fused += 1
                break
    return fused


def _fuse_silu(graph: Graph, absorbed: set[str]) -> int:
    nodes = graph.node_map()
    users = graph.consumers()
    outputs = set(graph.outputs)
    fused = 0
    for m in graph.nodes:
        if m.op != "Mul" or len(m.inputs) != 2 or m.name in absorbed:
            continue
        for x, s_name in ((m.inputs[0], m.inputs[1]), (m.inputs[1], m.inputs[0])):
            s = nodes.get(s_name)
            if (s is not None and s.op == "Sigmoid" and s.inputs[0] == x and len(users.get(s_name, [])) == 1
                    and s_name not in outputs and graph.types[x] == graph.types[m.name]):
                m.op, m.inputs, m.attrs = "Silu", [x], {}
                absorbed.add(s_name)
                fused += 1
                break
    return fused



def _scalar_value(graph: Graph, name: str):
    c = graph.constants.get(name)
    if c is None or c.value is None or c.value.size != 1 or c.dtype != "f32":
        return None
    return float(c.value.reshape(()))


def _fuse_conv_hard_swish(graph: Graph, absorbed: set[str]) -> int:
    """Mul(c, Clip(Add(Mul(c, alpha), beta), min=0, max=1)) over a float32 Conv c (operands in either order; the
    ONNX HardSwish / HardSigmoid lowering) -> FusedConv(activation=HardSwish, alpha, beta), when c and the
    intermediates feed nothing else. The kernel repeats the same float32 steps."""
    only = _sole_reader_lookup(graph, absorbed)

    def split(node: Node) -> tuple[str, float] | None:
        """(the other operand, the f32 scalar) of a binary node with one f32 scalar-constant operand."""
        a, b = node.inputs
        for other, const in ((a, b), (b, a)):
            v = _scalar_value(graph, const)
            if v is not None:
                return other, v
        return None

    fused = 0
    for y in graph.nodes:
        if y.op != "Mul" or len(y.inputs) != 2 or y.name in absorbed:
            continue
        for c_name, h_name in ((y.inputs[0], y.inputs[1]), (y.inputs[1], y.inputs[0])):
            conv, clip = only(c_name, "Conv", readers=2), only(h_name, "Clip")
            if conv is None or clip is None or len(clip.inputs) != 1 or clip.attrs.get("min") != 0.0 \
                    or clip.attrs.get("max") != 1.0 or graph.types[c_name].dtype != "f32":
                continue
            add = only(clip.inputs[0], "Add")
            lin = split(add) if add is not None else None
            mul = only(lin[0], "Mul") if lin is not None else None
            slope = split(mul) if mul is not None else None
            if slope is None or slope[0] != c_name or graph.types[y.name] != graph.types[c_name]:
                continue
            y.op, y.inputs = "FusedConv", list(conv.inputs)
            y.attrs = {**conv.attrs, "activation": "HardSwish", "alpha": slope[1], "beta": lin[1]}
            absorbed.update((conv.name, mul.name, add.name, clip.name))
            fused += 1
            break
    return fused


# outputs (known dims) from which a residual Add is fused into its conv: ResNet-50's sums (100 K - 800 K values)
# were passes through memory of their own; MobileNetV3's (4.7 K - 19 K values, in cache) cost as much fused as
# apart (the epilogue's per-call set-up, ~3 us, against an Add of 4-10 us), and measured slower in whole forwards
MIN_RESIDUAL_OUTPUTS = 1 << 15


def _fuse_conv_residual(graph: Graph, absorbed: set[str]) -> int:
    """Add(c, r) over a float32 Conv c with a bias (operands in either order, no broadcasting) of at least
    MIN_RESIDUAL_OUTPUTS outputs, c read by nothing else -> FusedConv(x, w, b, r): with the activation that alone
    reads the Add (a ResNet block's Relu), else activation Identity. The CPU epilogue adds the bias, then the
    residual, then applies the activation on each output block while it is in cache (a residual Add and its Relu
    were two passes over the whole output). IEEE addition commutes, so either operand order gives the same values
    (a NaN's payload aside)."""
    nodes = graph.node_map()
    users = graph.consumers()
    outputs = set(graph.outputs)
    fused = 0
    for add in graph.nodes:
        if add.op != "Add" or len(add.inputs) != 2 or add.name in absorbed or graph.types[add.name].dtype != "f32":
            continue
        for c_name, r_name in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            conv = nodes.get(c_name)
            if (conv is None or conv.op != "Conv" or len(conv.inputs) != 3 or conv.name in absorbed
                    or c_name in outputs or len(users.get(c_name, [])) != 1 or r_name == c_name
                    or not graph.types[c_name] == graph.types[r_name] == graph.types[add.name]
                    or math.prod(d for d in graph.types[c_name].shape if isinstance(d, int)) < MIN_RESIDUAL_OUTPUTS):
                continue
            node, extra = add, {"activation": "Identity"}
            readers = users.get(add.name, [])
            act = readers[0] if len(readers) == 1 and add.name not in outputs else None
            if (act is not None and act.op in FUSED_CONV_ACTIVATIONS and act.name not in absorbed
                    and (act.op != "Clip" or len(act.inputs) == 1) and graph.types[act.name] == graph.types[add.name]):
                node, extra = act, {**{k: act.attrs[k] for k in ("alpha", "min", "max") if k in act.attrs},
                                    "activation": act.op}
                absorbed.add(add.name)
            node.op, node.inputs, node.attrs = "FusedConv", [*conv.inputs, r_name], {**conv.attrs, **extra}
            absorbed.add(conv.name)
            fused += 1
            break
    return fused


def fuse_conv_activation(graph: Graph, report=None) -> Graph:
    """Conv followed by an activation that alone reads it -> one FusedConv (compile only: the CPU kernel
    adds the bias and applies the activation in one pass; every kernel gives the unfused values). Clip is
    fused when its bounds are attrs (run-time bound operands stay unfused); HardSwish from its lowered ops."""
    absorbed: set[str] = set()
    read = {i for n in graph.nodes for i in n.inputs}
    _fuse_conv_residual(graph, absorbed)
    _fuse_conv_hard_swish(graph, absorbed)
    nodes = graph.node_map()
    users = graph.consumers()
    outputs = set(graph.outputs)
    for act in graph.nodes:
        if (act.op not in FUSED_CONV_ACTIVATIONS or (act.op == "Clip" and len(act.inputs) != 1)
                or act.name in absorbed):
            continue
        conv = nodes.get(act.inputs[0])
        if (conv is None or conv.op != "Conv" or conv.name in absorbed or conv.name in outputs
                or len(users.get(conv.name, [])) != 1 or graph.types[conv.name] != graph.types[act.name]):
            continue
        extra = {k: act.attrs[k] for k in ("alpha", "min", "max") if k in act.attrs}
        act.op, act.inputs, act.attrs = "FusedConv", list(conv.inputs), {**conv.attrs, **extra,
                                                                         "activation": act.op}
        absorbed.add(conv.name)
    if report is not None:
        report.simplified += len(absorbed)
    if not absorbed:
        return graph
    _drop(graph, absorbed, read)  # with HardSwish's fused-away scalars
    return graph.validate()


_ACTIVATION_ATTRS = ("activation", "alpha", "beta", "min", "max")


def _pixel_conv_of(graph: Graph, lookup, name: str, channels) -> Node | None:
    """The FusedConv that makes `name` (read by one node) from a one-pixel float32 input: a 1x1 kernel, group 1,
    a bias, no residual, its output one pixel of `channels` channels (None: any); else None."""
    conv = lookup(name, "FusedConv")
    if conv is None or len(conv.inputs) != 3 or conv.attrs.get("group", 1) != 1:
        return None
    w, t = graph.types[conv.inputs[1]], graph.types[name]
    ok = (t.dtype == "f32" and len(t.shape) == 4 and t.shape[2:] == (1, 1) and w.shape[2:] == (1, 1)
          and graph.types[conv.inputs[0]].shape[2:] == (1, 1) and (channels is None or t.shape[1] == channels))
    return conv if ok else None


def fuse_squeeze_excite(graph: Graph, report=None) -> Graph:
    """Mul(x, s) (either order) with s = FusedConv(FusedConv(GlobalAveragePool(x), w1, b1), w2, b2), each 1x1
    conv on one pixel with a bias and no residual, x float32 (N, C, H, W) of known dims, and the pool, the first
    conv and s read by nothing else -> SqueezeExcite(x, w1, b1, w2, b2) with the convs' activations (the second's
    as gate_*). Compile only, after fuse_conv_activation (MobileNetV3's and EfficientNet's blocks: four steps,
    each with its own dispatch, where the CPU runs one); every kernel gives the unfused values."""
    lookup = _sole_reader_lookup(graph, set())
    absorbed: set[str] = set()
    for mul in graph.nodes:
        if mul.op != "Mul" or len(mul.inputs) != 2 or mul.name in absorbed:
            continue
        for x, s in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            t = graph.types[x]
            if not (t.dtype == "f32" and len(t.shape) == 4 and all(isinstance(d, int) for d in t.shape)
                    and graph.types[mul.name] == t and x != s):
                continue
            gate = _pixel_conv_of(graph, lookup, s, t.shape[1])
            squeeze = gate and _pixel_conv_of(graph, lookup, gate.inputs[0], None)
            pool = squeeze and lookup(squeeze.inputs[0], "GlobalAveragePool")
            if not pool or pool.inputs[0] != x or absorbed & {gate.name, squeeze.name, pool.name}:
                continue
            attrs = {k: squeeze.attrs[k] for k in _ACTIVATION_ATTRS if k in squeeze.attrs}
            attrs.update({f"gate_{k}": gate.attrs[k] for k in _ACTIVATION_ATTRS if k in gate.attrs})
            mul.op, mul.inputs, mul.attrs = "SqueezeExcite", [x, *squeeze.inputs[1:], *gate.inputs[1:]], attrs
            absorbed.update((gate.name, squeeze.name, pool.name))
            break
    if report is not None:
        report.simplified += len(absorbed)
    if not absorbed:
        return graph
    _drop(graph, absorbed, set())
    return graph.validate()


def _column_bias(graph: Graph, b: str, out: str) -> bool:
    """Whether b is one value per column of `out` (shape (N,) or leading 1s then N), in its dtype."""
    bt, ot = graph.types[b], graph.types[out]
    return (bt.dtype == ot.dtype and 0 < len(bt.shape) <= len(ot.shape) and all(d == 1 for d in bt.shape[:-1])
            and bt.shape[-1] == ot.shape[-1])


def fuse_linear(graph: Graph, report=None) -> Graph:
    """A linear layer's MatMul and the bias Add that alone reads it -> FusedMatMul(x, w, b), then the residual Add
    that alone reads that -> FusedMatMul(x, w, b, r) (compile only: the CPU kernel adds both to each block of the
    GEMM output while it is in cache, on the thread that computed it; every kernel gives the unfused values)."""
    absorbed: set[str] = set()
    single = _sole_reader_lookup(graph, absorbed)
    fused: list[Node] = []
    for add in graph.nodes:
        if add.op != "Add" or len(add.inputs) != 2 or graph.types[add.name].dtype != "f32":
            continue
        for m_name, b_name in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            mm = single(m_name, "MatMul")
            if (mm is None or b_name == m_name or graph.types[m_name] != graph.types[add.name]
                    or len(graph.types[mm.inputs[1]].shape) != 2 or len(graph.types[mm.inputs[0]].shape) < 2
                    or not _column_bias(graph, b_name, m_name)):
                continue
            add.op, add.inputs, add.attrs = "FusedMatMul", [*mm.inputs, b_name], {}
            absorbed.add(mm.name)
            fused.append(add)
            break
    users, outputs = graph.consumers(), set(graph.outputs)
    for f in fused:
        readers = users.get(f.name, [])
        res = readers[0] if len(readers) == 1 and f.name not in outputs else None
        if res is None or res.op != "Add" or len(res.inputs) != 2 or res.name in absorbed:
            continue
        r_name = res.inputs[1] if res.inputs[0] == f.name else res.inputs[0]
        if r_name == f.name or not graph.types[r_name] == graph.types[f.name] == graph.types[res.name]:
            continue
        res.op, res.inputs, res.attrs = "FusedMatMul", [*f.inputs, r_name], {}
        absorbed.add(f.name)
    if report is not None:
        report.simplified += len(absorbed)
    if not absorbed:
        return graph
    _drop(graph, absorbed, set())  # the absorbed MatMuls' and Adds' inputs are all read by the fused nodes
    return graph.validate()
