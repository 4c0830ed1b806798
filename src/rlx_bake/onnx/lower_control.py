"""Lowerings: If, Loop, Scan (opset 9+ form) with their bodies.

An If whose condition is known at import (a constant, or folded from constants and static shapes) inlines the
taken branch. Otherwise each body is lowered through the same op table into a closed rlx body graph
(spec/graph-json.md, Bodies): the outer values an ONNX body reads by name (enclosing scopes included) become
the node's captured inputs, declared as the body's last inputs. Constants and initializers met inside a body
live in the top graph (params keep their weights, so the bake folds and packs them) and are captured like any
outer value. Body-local names that clash with a name seen before are renamed (ONNX scoping allows shadowing).
Every unsupported op inside a body is reported, with where it is, in the importer's one error.
"""

from __future__ import annotations

import numpy as np

from rlx_format.dtypes import dtype_of_array
from rlx_format.errors import GraphError
from rlx_format.graph import Graph, Node, Value
from rlx_format.ops import OPS, InferCtx, TensorType, normalize_attrs

from .context import ONNX_DTYPES, LOWER, Unsupported, onnx_attrs, onnx


class BodyUnsupported(Unsupported):
    """Ops inside bodies that cannot be lowered: (op key, where) for each, reported by the importer."""

    def __init__(self, items: list[tuple[str, str]]):
        super().__init__(f"{len(items)} unsupported node(s) inside its bodies")
        self.items = items


class _Scope:
    """One body being lowered: ONNX name -> rlx name for what it defines, and the rlx types it declares."""

    def __init__(self, parent: _Scope | None, where: str):
        self.parent, self.where = parent, where
        self.alias: dict[str, str] = {}
        self.defined: set[str] = set()
        self.types: dict[str, TensorType] = {}
        self.nodes: list[Node] = []


def _resolve(scope: _Scope | None, name: str) -> str:
    while scope is not None:
        if name in scope.alias:
            return scope.alias[name]
        scope = scope.parent
    return name


def _scope(ctx) -> _Scope | None:
    return getattr(ctx, "_body_scope", None)


# ------------------------------------------------------------------ rlx types of values lowered so far

def _top_types(ctx) -> dict:
    if not hasattr(ctx, "_rlx_types"):
        ctx._rlx_types = {}
    return ctx._rlx_types


def rlx_type(ctx, scope: _Scope | None, name: str) -> TensorType:
    """The rlx type of `name` as seen from `scope` (None: the top graph), inferred on demand with the catalogue
    from what has been lowered so far (iterative; memoized per scope)."""
    memo = scope.types if scope is not None else _top_types(ctx)
    if name in memo:
        return memo[name]
    if scope is not None and name not in scope.defined:
        return rlx_type(ctx, scope.parent, name)
    if name in ctx.consts:
        v = ctx.consts[name]
        return memo.setdefault(name, TensorType(dtype_of_array(v), tuple(v.shape)))
    if name in ctx.inits:
        return memo.setdefault(name, TensorType(ctx.init_dtype[name], tuple(ctx.inits[name].shape)))
    owner = scope if scope is not None else ctx  # a name -> node index, rebuilt when nodes were added
    nodes = scope.nodes if scope is not None else ctx.nodes
    if getattr(owner, "_node_index_len", -1) != len(nodes):
        owner._node_index = {n.name: n for n in nodes}
        owner._node_index_len = len(nodes)
    index = owner._node_index
    if name not in index:
        t = ctx.types.get(name)  # a graph input
        if t is None or t[1] is None:
            raise Unsupported(f"the type of {name!r} is unknown")
        return memo.setdefault(name, TensorType(t[0], tuple(t[1])))
    consts = memo.setdefault("\0shapes", {})  # Shape of a static value: known, as in Graph.validate
    stack = [name]
    while stack:
        cur = stack[-1]
        n = index[cur]
        todo = [i for i in n.inputs if i in index and i not in memo]
        if todo:
            stack.extend(todo)
            continue
        stack.pop()
        if cur in memo:
            continue
        ins = [rlx_type(ctx, scope, i) for i in n.inputs]
        vals = [ctx.consts.get(i, consts.get(i)) for i in n.inputs]
        try:
            ictx = InferCtx(n.name, n.op, ins, normalize_attrs(n.op, n.attrs, f"node {n.name!r}"), vals)
            memo[cur] = OPS[n.op].infer(ictx)
        except GraphError as e:
            raise Unsupported(f"cannot type {n.name!r} ({n.op}): {e}") from None
        if n.op == "Shape" and ins[0].is_static():
            consts[cur] = np.array(ins[0].shape, np.int64)
    return memo[name]


# ------------------------------------------------------------------ bodies

def _symbolic(t: TensorType, name: str) -> tuple:
    """A body-local value's type for the lowerings: dtype and rank only, so no Shape folds at import (a
    loop-carried value may change shape between iterations)."""
    return t.dtype, tuple(f"{name}:d{i}" for i in range(t.rank))


def _main_names(ctx) -> set[str]:
    """Every name the main graph defines (also those not lowered yet): a body name never takes one."""
    if not hasattr(ctx, "_main_names"):
        g = ctx.model.graph
        ctx._main_names = ({o for n in g.node for o in n.output} | {v.name for v in g.input}
                           | {t.name for t in g.initializer})
    return ctx._main_names


def _local(ctx, scope: _Scope, onnx_name: str) -> str:
    clash = onnx_name in ctx.names or onnx_name in _main_names(ctx)
    rn = ctx.fresh(onnx_name) if clash else onnx_name
    ctx.names.add(rn)
    scope.alias[onnx_name] = rn
    scope.defined.add(rn)
    return rn


def _lower_body(ctx, g, formal: list[TensorType], where: str, bad: list) -> tuple[_Scope, list[str], list[str]]:
    """Lower body `g` (formal input types given) into a new scope; returns (scope, formal input names, output
    names). Unsupported nodes are appended to `bad` and skipped."""
    parent = _scope(ctx)
    scope = _Scope(parent, where)
    if len(g.input) != len(formal):
        raise Unsupported(f"{where} declares {len(g.input)} inputs; expected {len(formal)}")
    names = []
    for vi, t in zip(g.input, formal):
        rn = _local(ctx, scope, vi.name)
        scope.types[rn] = t
        ctx.types[rn] = _symbolic(t, rn)
        names.append(rn)
    for t in g.initializer:
        if t.name in ctx.names:
            raise Unsupported(f"{where} initializer {t.name!r} shadows another value")
        ctx.inits[t.name] = ctx.tensor(t)
        ctx.init_dtype[t.name] = ONNX_DTYPES.get(t.data_type, "?")
        ctx.types[t.name] = (ctx.init_dtype[t.name], tuple(ctx.inits[t.name].shape))
        ctx.names.add(t.name)
    saved_nodes, saved_scope = ctx.nodes, parent
    ctx.nodes, ctx._body_scope = scope.nodes, scope
    try:
        for i, sub in enumerate(g.node):
            label = sub.name or (sub.output[0] if sub.output else f"#{i}")
            sub_where = f"{label} (in {where})"
            op = sub.op_type if sub.domain in ("", "ai.onnx") else f"{sub.domain}.{sub.op_type}"
            node = onnx.NodeProto()
            node.CopyFrom(sub)
            del node.input[:]
            node.input.extend(_resolve(scope, x) if x else "" for x in sub.input)
            for x in node.input:
                if x and x in scope.defined and x not in ctx.types:
                    try:
                        ctx.types[x] = _symbolic(rlx_type(ctx, scope, x), x)
                    except Unsupported:
                        pass
            del node.output[:]
            node.output.extend(_local(ctx, scope, x) if x else "" for x in sub.output)
            lower = LOWER.get(sub.op_type) if sub.domain in ("", "ai.onnx") else None
            if lower is None:
                bad.append((f"{op} (inside a subgraph)", sub_where))
                continue
            k0 = len(scope.nodes)
            try:
                lower(ctx, node, onnx_attrs(node))
            except BodyUnsupported as e:
                bad.extend(e.items)
            except Unsupported as e:
                bad.append((f"{op} inside a subgraph ({e})", sub_where))
            except KeyError as e:
                bad.append((f"{op} inside a subgraph (missing attribute {e})", sub_where))
            scope.defined.update(nd.name for nd in scope.nodes[k0:])
    finally:
        ctx.nodes, ctx._body_scope = saved_nodes, saved_scope
    # what the body computes: its inputs and nodes (a value folded at import is a top-level constant: captured)
    scope.defined = set(names) | {nd.name for nd in scope.nodes}
    return scope, names, [_resolve(scope, o.name) for o in g.output]


def _free_names(scope: _Scope, outputs: list[str]) -> list[str]:
    """Outer names the body reads (in first-use order): these become its captures."""
    out: dict[str, None] = {}
    for n in scope.nodes:
        for i in n.inputs:
            if i not in scope.defined:
                out[i] = None
    for o in outputs:
        if o not in scope.defined:
            out[o] = None
    return list(out)


def _body_graph(ctx, scope: _Scope, formal: list[str], captures: list[str], outputs: list[str], name: str) -> Graph:
    inputs = [Value(x, scope.types[x].dtype, scope.types[x].shape) for x in formal]
    for c in captures:
        t = rlx_type(ctx, scope.parent, c)
        inputs.append(Value(c, t.dtype, t.shape))
    nodes = [Node(n.name, n.op, list(n.inputs), dict(n.attrs)) for n in scope.nodes]
    outs, seen = [], set()
    for o in outputs:  # rlx outputs are distinct names: a repeated one goes through an Identity
        if o in seen:
            o2 = ctx.fresh(f"{o}/again")
            nodes.append(Node(o2, "Identity", [o], {}))
            o = o2
        seen.add(o)
        outs.append(o)
    try:
        return Graph(name, inputs, [], [], nodes, outs)
    except GraphError as e:
        raise Unsupported(f"its body {name!r} is not valid: {e}") from None


def _emit_control(ctx, n, op: str, inputs: list[str], attrs: dict) -> None:
    """The control node (never folded at import) and one Item per ONNX output, named like it."""
    name = ctx.fresh(op.lower())
    ctx.nodes.append(Node(name, op, inputs, attrs))
    for k, out in enumerate(n.output):
        if out:
            ctx.nodes.append(Node(out, "Item", [name], {"index": k}))
            ctx.names.add(out)


def _where(ctx, n, key: str) -> str:
    label = n.name or (n.output[0] if n.output else "?")
    scope = _scope(ctx)
    return f"{label}.{key}" if scope is None else f"{label}.{key} in {scope.where}"


def _formal_rank(vi, default: int = 0) -> int:
    tt = vi.type.tensor_type
    return len(tt.shape.dim) if tt.HasField("shape") else default


# ------------------------------------------------------------------ If

def _inline_if(ctx, n, branch) -> None:
    for t in branch.initializer:
        ctx.inits[t.name] = ctx.tensor(t)
        ctx.init_dtype[t.name] = ONNX_DTYPES.get(t.data_type, "?")
        ctx.types[t.name] = (ctx.init_dtype[t.name], tuple(ctx.inits[t.name].shape))
        ctx.names.add(t.name)
    for sub in branch.node:
        lower = LOWER.get(sub.op_type) if sub.domain in ("", "ai.onnx") else None
        if lower is None:
            raise Unsupported(f"{sub.op_type} inside the taken branch")
        lower(ctx, sub, onnx_attrs(sub))
    if len(branch.output) != len(n.output):
        raise Unsupported(f"the taken branch has {len(branch.output)} outputs; the If has {len(n.output)}")
    made = {node.name: node for node in ctx.nodes}
    for out, sub_out in zip(n.output, branch.output):
        if not out:
            continue
        src = made.get(sub_out.name)
        if src is None:  # the branch passes an outer value through
            ctx.emit("Identity", [sub_out.name], {}, out)
            continue
        src.name = out  # only the branch read its internal name: rename in place
        for node in ctx.nodes:
            node.inputs = [out if i == sub_out.name else i for i in node.inputs]


def _if(ctx, n, a):
    cond = ctx.value(n.input[0])
    if cond is not None and _scope(ctx) is None:
        if np.asarray(cond).size != 1:
            raise Unsupported(f"If condition of shape {list(np.asarray(cond).shape)}; expected one value")
        _inline_if(ctx, n, a["then_branch"] if bool(np.asarray(cond).reshape(-1)[0]) else a["else_branch"])
        return
    bad: list = []
    lowered = [(key, *_lower_body(ctx, a[key], [], _where(ctx, n, key), bad)) for key in ("then_branch", "else_branch")]
    if bad:
        raise BodyUnsupported(bad)
    captures = list(dict.fromkeys(c for _, scope, _, outs in lowered for c in _free_names(scope, outs)))
    base = n.name or n.output[0]
    attrs = {key: _body_graph(ctx, scope, [], captures, outs, f"{base}.{key}") for key, scope, _, outs in lowered}
    _emit_control(ctx, n, "If", [n.input[0], *captures], attrs)


# ------------------------------------------------------------------ Loop and Scan

def _carried_fixpoint(ctx, scope, formal, captures, outputs, name, first_in: int, first_out: int, count: int):
    """Build the body; where a loop-carried value's dims change between iterations, declare those dims as fresh
    symbols and build again (a second round always holds: fresh symbols are free)."""
    for _ in range(2):
        body = _body_graph(ctx, scope, formal, captures, outputs, name)
        changed = False
        for j in range(count):
            x = formal[first_in + j]
            t_in, t_out = scope.types[x], body.types[body.outputs[first_out + j]]
            if t_out.rank != t_in.rank or t_out.dtype != t_in.dtype:
                raise Unsupported(f"loop-carried value {j} goes in as {t_in.dtype}{list(t_in.shape)} and comes out "
                                  f"as {t_out.dtype}{list(t_out.shape)}")
            dims = tuple(d if d == e else f"{x}:carried{i}" for i, (d, e) in enumerate(zip(t_in.shape, t_out.shape)))
            if dims != t_in.shape:
                scope.types[x] = TensorType(t_in.dtype, dims)
                changed = True
        if not changed:
            return body
    return _body_graph(ctx, scope, formal, captures, outputs, name)


def _loop(ctx, n, a):
    inputs = list(n.input) + [""] * max(0, 2 - len(n.input))
    m_name, c_name, inits = inputs[0], inputs[1], inputs[2:]
    outer = _scope(ctx)
    body_g = a["body"]
    if len(body_g.input) != 2 + len(inits):
        raise Unsupported(f"body declares {len(body_g.input)} inputs; expected {2 + len(inits)}")
    formal = [TensorType("i64", (1,) * min(1, _formal_rank(body_g.input[0]))),
              TensorType("bool", (1,) * min(1, _formal_rank(body_g.input[1])))]
    formal += [rlx_type(ctx, outer, x) for x in inits]
    bad: list = []
    scope, names, outs = _lower_body(ctx, body_g, formal, _where(ctx, n, "body"), bad)
    if bad:
        raise BodyUnsupported(bad)
    captures = _free_names(scope, outs)
    base = n.name or n.output[0]
    body = _carried_fixpoint(ctx, scope, names, captures, outs, f"{base}.body", 2, 1, len(inits))
    optional = [k for k, x in (("M", m_name), ("cond", c_name)) if x]
    given = [x for x in (m_name, c_name) if x]
    _emit_control(ctx, n, "Loop", [*given, *inits, *captures],
                  {"body": body, "optional": optional, "num_captures": len(captures)})


def _scan(ctx, n, a):
    if ctx.opset < 9:
        raise Unsupported("Scan of opset 8 (the batched form with sequence_lens)")
    m = a["num_scan_inputs"]
    ins = list(n.input)
    n_state = len(ins) - m
    outer = _scope(ctx)
    states = [rlx_type(ctx, outer, x) for x in ins[:n_state]]
    scans = [rlx_type(ctx, outer, x) for x in ins[n_state:]]
    axes = list(a.get("scan_input_axes", [0] * m))
    slices = []
    for t, ax in zip(scans, axes):
        if not -t.rank <= ax < t.rank:
            raise Unsupported(f"scan_input_axes {axes} out of range for a rank-{t.rank} scan input")
        ax %= t.rank
        slices.append(TensorType(t.dtype, t.shape[:ax] + t.shape[ax + 1:]))
    bad: list = []
    scope, names, outs = _lower_body(ctx, a["body"], states + slices, _where(ctx, n, "body"), bad)
    if bad:
        raise BodyUnsupported(bad)
    captures = _free_names(scope, outs)
    base = n.name or n.output[0]
    body = _carried_fixpoint(ctx, scope, names, captures, outs, f"{base}.body", 0, 0, n_state)
    attrs = {"body": body, "num_scan_inputs": m, "num_captures": len(captures)}
    for key in ("scan_input_axes", "scan_input_directions", "scan_output_axes", "scan_output_directions"):
        if key in a:
            attrs[key] = list(a[key])
    _emit_control(ctx, n, "Scan", [*ins, *captures], attrs)


LOWER["If"] = _if
LOWER["Loop"] = _loop
LOWER["Scan"] = _scan
