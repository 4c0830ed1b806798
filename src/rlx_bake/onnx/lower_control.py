"""Lowerings: If whose condition is known at import (a constant, or folded from constants and static
shapes): the taken branch is inlined, its outputs renamed to the If's. A condition computed from input
values at run time is reported as unsupported (rlx plans are straight-line)."""

from __future__ import annotations

import numpy as np

from .context import _DTYPES, LOWER, Unsupported, _attrs


def _if(ctx, n, a):
    cond = ctx.value(n.input[0])
    if cond is None:
        raise Unsupported("If with a condition computed at run time")
    if np.asarray(cond).size != 1:
        raise Unsupported(f"If condition of shape {list(np.asarray(cond).shape)}; expected one value")
    branch = a["then_branch"] if bool(np.asarray(cond).reshape(-1)[0]) else a["else_branch"]
    for t in branch.initializer:
        ctx.inits[t.name] = ctx.tensor(t)
        ctx.init_dtype[t.name] = _DTYPES.get(t.data_type, "?")
        ctx.types[t.name] = (ctx.init_dtype[t.name], tuple(ctx.inits[t.name].shape))
        ctx.names.add(t.name)
    for sub in branch.node:
        lower = LOWER.get(sub.op_type) if sub.domain in ("", "ai.onnx") else None
        if lower is None:
            raise Unsupported(f"{sub.op_type} inside the taken branch")
        lower(ctx, sub, _attrs(sub))
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


LOWER["If"] = _if
