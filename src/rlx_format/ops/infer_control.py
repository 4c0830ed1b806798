"""Control flow: If, Loop, Scan (ONNX semantics) and Item (spec/ops.md, Control flow).

A body is a nested, *closed* Graph held by an attr of kind "graph": it reads nothing from outside. The outer
values a body needs (weights, earlier results) are the node's last inputs, its captures, and are declared as
the body's last inputs in the same order; inside the body they are read by name like any input. So every outer
value a body reads is an ordinary input of the node (toposort, DCE, hoisting and renames see it) and every body
compiles and validates on its own.

A control-flow node's value is a tuple (TupleType) of its results; only Item(index) may read it.
Body input declarations are checked against the operands: dtypes and ranks equal, a static body dim equals
the operand's, and a symbolic body dim stands for one operand dim throughout the body.
"""

from __future__ import annotations

from dataclasses import dataclass

from .core import InferCtx, TensorType

LOOP_OPTIONAL = ("M", "cond")


@dataclass(frozen=True)
class TupleType:
    """The type of a control-flow node's value: the types of its results, in order."""

    items: tuple[TensorType, ...]
    dtype: str = "tuple"
    shape: tuple = ()

    @property
    def rank(self) -> int:
        return 0

    def is_static(self) -> bool:
        return all(t.is_static() for t in self.items)

    def to_json(self) -> dict:
        return {"dtype": "tuple", "items": [t.to_json() for t in self.items]}


def _check_body(ctx: InferCtx, key: str):
    body = ctx.attrs[key]
    if body.params:
        raise ctx.fail(f"{key} declares params {body.param_names[:3]}; a body reads weights as captured inputs "
                       "(pass them as the node's last inputs and declare them as the body's last inputs)")
    for c in body.constants.values():
        if c.value is None:
            raise ctx.fail(f"{key} constant {c.name!r} has no data; constants inside a body carry their data inline")
    return body


def _one_value(ctx: InferCtx, t: TensorType, what: str, dtypes: tuple[str, ...]) -> None:
    if t.dtype not in dtypes or not all(d == 1 for d in t.shape):
        raise ctx.fail(f"{what} is {t.dtype}{list(t.shape)}; expected one {'/'.join(dtypes)} value (shape [] or [1])")


def _bind(ctx: InferCtx, key: str, body, first: int, operands: list[TensorType], what: str,
          binding: dict) -> None:
    """Check body inputs first.. against the operand types; record what each body symbol stands for."""
    for j, t in enumerate(operands):
        b = body.inputs[first + j]
        where = f"{key} input {first + j} ({b.name!r}, {what} {j})"
        if b.dtype != t.dtype or len(b.shape) != len(t.shape):
            raise ctx.fail(f"{where} is declared {b.dtype}{list(b.shape)}; the operand is {t.dtype}{list(t.shape)}")
        for bd, od in zip(b.shape, t.shape):
            if isinstance(bd, int):
                if bd != od:
                    raise ctx.fail(f"{where} is declared {b.dtype}{list(b.shape)}; the operand is "
                                   f"{t.dtype}{list(t.shape)} (a static body dim must equal the operand's)")
            elif binding.setdefault(bd, od) != od:
                raise ctx.fail(f"{where}: body dim {bd!r} stands for both {binding[bd]!r} and {od!r}; "
                               "use a separate symbol for each")


def _out_dims(ctx: InferCtx, shape: tuple, binding: dict) -> tuple:
    return tuple(d if isinstance(d, int) else binding[d] if d in binding else ctx.fresh() for d in shape)


def _carried(ctx: InferCtx, key: str, body, in_first: int, out_first: int, n: int, binding: dict,
             inits: list[TensorType]) -> list[TensorType]:
    """Loop-carried values: the body's output j keeps input j's dtype and rank; a dim that may change between
    iterations must be a symbol that no other body input uses (it is free for the body). Returns the final
    types (a dim that may change is a fresh symbol)."""
    counts: dict[str, int] = {}
    for v in body.inputs:
        for d in v.shape:
            if isinstance(d, str):
                counts[d] = counts.get(d, 0) + 1
    out = []
    for j in range(n):
        bi = body.inputs[in_first + j]
        bo = body.types[body.outputs[out_first + j]]
        where = f"{key} loop-carried value {j} ({bi.name!r} -> {body.outputs[out_first + j]!r})"
        if bo.dtype != bi.dtype or bo.rank != len(bi.shape):
            raise ctx.fail(f"{where}: the body returns {bo.dtype}{list(bo.shape)} for an input declared "
                           f"{bi.dtype}{list(bi.shape)}; expected the same dtype and rank")
        dims = []
        for i, (di, do) in enumerate(zip(bi.shape, bo.shape)):
            if di == do:
                dims.append(inits[j].shape[i])
            elif isinstance(di, str) and counts[di] == 1:
                binding.pop(di, None)  # varies between iterations: stands for no outer dim
                dims.append(ctx.fresh())
            else:
                raise ctx.fail(f"{where}: dim {i} is {di!r} going in and {do!r} coming out; a dim that changes "
                               "between iterations must be declared as a symbol no other body input uses")
        out.append(TensorType(bi.dtype, tuple(dims)))
    return out


def infer_if(ctx: InferCtx) -> TensorType:
    cond, caps = ctx.inputs[0], ctx.inputs[1:]
    _one_value(ctx, cond, "the condition (input 0)", ("bool",))
    branches = []
    for key in ("then_branch", "else_branch"):
        body = _check_body(ctx, key)
        if len(body.inputs) != len(caps):
            raise ctx.fail(f"{key} declares {len(body.inputs)} inputs; the node passes {len(caps)} captured values "
                           "(inputs after the condition)")
        binding: dict = {}
        _bind(ctx, key, body, 0, list(caps), "captured value", binding)
        branches.append((body, binding))
    (tb, tbind), (eb, ebind) = branches
    if len(tb.outputs) != len(eb.outputs):
        raise ctx.fail(f"then_branch has {len(tb.outputs)} outputs and else_branch {len(eb.outputs)}; expected "
                       "the same number")
    items = []
    for k, (to, eo) in enumerate(zip(tb.outputs, eb.outputs)):
        tt, et = tb.types[to], eb.types[eo]
        if tt.dtype != et.dtype or tt.rank != et.rank:
            raise ctx.fail(f"output {k}: then_branch gives {tt.dtype}{list(tt.shape)} and else_branch "
                           f"{et.dtype}{list(et.shape)}; expected one dtype and one rank")
        td, ed = _out_dims(ctx, tt.shape, tbind), _out_dims(ctx, et.shape, ebind)
        items.append(TensorType(tt.dtype, tuple(a if a == b else ctx.fresh() for a, b in zip(td, ed))))
    return TupleType(tuple(items))


def infer_loop(ctx: InferCtx) -> TensorType:
    a = ctx.attrs
    opt = list(a["optional"])
    if len(set(opt)) != len(opt) or opt != [o for o in LOOP_OPTIONAL if o in opt]:
        raise ctx.fail(f"optional = {opt}; expected a subset of {list(LOOP_OPTIONAL)} in that order")
    n_caps, n_formal = a["num_captures"], len(opt)
    n = len(ctx.inputs) - n_formal - n_caps
    if n < 0:
        raise ctx.fail(f"{len(ctx.inputs)} inputs for optional = {opt} and num_captures = {n_caps}; expected at "
                       f"least {n_formal + n_caps}")
    for k, name in enumerate(opt):
        _one_value(ctx, ctx.inputs[k], f"{name} (input {k})", ("i64",) if name == "M" else ("bool",))
    body = _check_body(ctx, "body")
    if len(body.inputs) != 2 + n + n_caps:
        raise ctx.fail(f"body declares {len(body.inputs)} inputs; expected {2 + n + n_caps} (iteration number, "
                       f"condition, {n} loop-carried, {n_caps} captured)")
    for k, (want, what) in enumerate((("i64", "iteration number"), ("bool", "condition"))):
        v = body.inputs[k]
        if v.dtype != want or tuple(v.shape) not in ((), (1,)):
            raise ctx.fail(f"body input {k} ({v.name!r}, the {what}) is declared {v.dtype}{list(v.shape)}; "
                           f"expected {want}[] or {want}[1]")
    inits = list(ctx.inputs[n_formal:n_formal + n])
    binding: dict = {}
    _bind(ctx, "body", body, 2, inits, "loop-carried value", binding)
    _bind(ctx, "body", body, 2 + n, list(ctx.inputs[n_formal + n:]), "captured value", binding)
    k_scan = len(body.outputs) - 1 - n
    if k_scan < 0:
        raise ctx.fail(f"body has {len(body.outputs)} outputs; expected at least {1 + n} (condition, "
                       f"{n} loop-carried)")
    _one_value(ctx, body.types[body.outputs[0]], "body output 0 (the condition)", ("bool",))
    items = _carried(ctx, "body", body, 2, 1, n, binding, inits)
    trips = ctx.fresh()  # the body's condition may end the loop early (with or without a cond input)
    for o in body.outputs[1 + n:]:
        t = body.types[o]
        items.append(TensorType(t.dtype, (trips, *_out_dims(ctx, t.shape, binding))))
    return TupleType(tuple(items))


def infer_scan(ctx: InferCtx) -> TensorType:
    a = ctx.attrs
    m, n_caps = a["num_scan_inputs"], a["num_captures"]
    n = len(ctx.inputs) - m - n_caps
    if n < 0:
        raise ctx.fail(f"{len(ctx.inputs)} inputs for num_scan_inputs = {m} and num_captures = {n_caps}; "
                       f"expected at least {m + n_caps}")
    body = _check_body(ctx, "body")
    if len(body.inputs) != n + m + n_caps:
        raise ctx.fail(f"body declares {len(body.inputs)} inputs; expected {n + m + n_caps} ({n} state, {m} scan, "
                       f"{n_caps} captured)")
    k_scan = len(body.outputs) - n
    if k_scan < 0:
        raise ctx.fail(f"body has {len(body.outputs)} outputs; expected at least {n} (the state values)")
    scans = ctx.inputs[n:n + m]
    in_axes = _axes_attr(ctx, "scan_input_axes", m, [t.rank for t in scans], 0)
    _directions(ctx, "scan_input_directions", m)
    out_types = [body.types[o] for o in body.outputs[n:]]
    out_axes = _axes_attr(ctx, "scan_output_axes", k_scan, [t.rank + 1 for t in out_types], 0)
    _directions(ctx, "scan_output_directions", k_scan)
    lengths = {t.shape[ax] for t, ax in zip(scans, in_axes)}
    static = {d for d in lengths if isinstance(d, int)}
    if len(static) > 1:
        raise ctx.fail(f"scan inputs have lengths {sorted(static)} along their scan axes; expected one length")
    seq = static.pop() if static else sorted(lengths)[0]
    slices = [TensorType(t.dtype, t.shape[:ax] + t.shape[ax + 1:]) for t, ax in zip(scans, in_axes)]
    inits = list(ctx.inputs[:n])
    binding: dict = {}
    _bind(ctx, "body", body, 0, inits, "state value", binding)
    _bind(ctx, "body", body, n, slices, "scan slice", binding)
    _bind(ctx, "body", body, n + m, list(ctx.inputs[n + m:]), "captured value", binding)
    items = _carried(ctx, "body", body, 0, 0, n, binding, inits)
    for t, ax in zip(out_types, out_axes):
        dims = list(_out_dims(ctx, t.shape, binding))
        dims.insert(ax, seq)
        items.append(TensorType(t.dtype, tuple(dims)))
    return TupleType(tuple(items))


def _axes_attr(ctx: InferCtx, key: str, count: int, ranks: list[int], default: int) -> list[int]:
    axes = ctx.attrs[key]
    if axes is None:
        axes = [default] * count
    if len(axes) != count:
        raise ctx.fail(f"{key} has {len(axes)} entries; expected {count}")
    return [ctx.axis(ax, r, key) for ax, r in zip(axes, ranks)]


def _directions(ctx: InferCtx, key: str, count: int) -> None:
    d = ctx.attrs[key]
    if d is not None and (len(d) != count or any(v not in (0, 1) for v in d)):
        raise ctx.fail(f"{key} = {d}; expected {count} entries, each 0 (forward) or 1 (reverse)")


def infer_item(ctx: InferCtx) -> TensorType:
    t = ctx.inputs[0]
    if not isinstance(t, TupleType):
        raise ctx.fail(f"input is {t.dtype}{list(t.shape)}; Item reads one result of an If, Loop or Scan node")
    i = ctx.attrs["index"]
    if i >= len(t.items):
        raise ctx.fail(f"index {i} out of range; the node it reads has {len(t.items)} results")
    return t.items[i]
