"""Kernels: If, Loop, Scan (ONNX semantics) and Item (spec/ops.md, Control flow).

Each body is planned once, when the enclosing Plan is built (plan.py puts the sub-plans, on the same backend
and with the same codegen, in the step's attrs); every branch taken or iteration is one call of that sub-plan. A control
node returns a tuple of arrays; Item picks one.

A Loop runs until its trip count is reached or its condition turns false, as ONNX specifies: a trip count
of 2^63-1 with a condition that never turns false runs until interrupted (KeyboardInterrupt stops it
between iterations). Scan outputs are collected per iteration actually run and stacked at the end, so a
huge trip count never allocates anything up front.
"""

from __future__ import annotations

import numpy as np

from rlx_format.dtypes import compute_dtype
from rlx_format.errors import RlxError

from ..backend import host_ints
from .registry import kernel


def _plan(a: dict, key: str, xp):
    """The body's sub-plan, made by the enclosing Plan at compile (plan.py: `_plans`, on the same backend)."""
    plans = a.get("_plans")
    if plans is None:
        raise RlxError("a control-flow op runs only inside a compiled plan (its bodies are planned at compile)")
    return plans[key]


def _call(plan, args: list, what: str) -> list:
    vals = list(plan.base)
    for (_, slot, *_), v in zip(plan.input_slots, args):
        vals[slot] = v
    try:
        return plan.run_fast(vals)
    except RlxError as e:
        raise RlxError(f"{what}: {e}") from e


def _flag(xp, v) -> bool:
    return bool(host_ints(xp, v)[0])


def _empty_scan(xp, body, name: str, args: list, axis: int = 0):
    """A scan output of no iterations: 0 inserted into the body's per-iteration shape at `axis`. A symbolic dim
    takes its size from the body inputs that the arguments would have bound; one that no input binds is 0."""
    sizes: dict = {}
    for v, arr in zip(body.inputs, args):
        for d, got in zip(v.shape, getattr(arr, "shape", ())):
            sizes.setdefault(d, got)
    dims = [d if isinstance(d, int) else sizes.get(d, 0) for d in body.types[name].shape]
    dims.insert(axis, 0)
    return xp.zeros(tuple(dims), dtype=compute_dtype(body.types[name].dtype))


@kernel("Item", aliases=True)  # the array may be a body output that is an outer value (a capture)
def _item(xp, a, t):
    return t[a["index"]]


@kernel("If")
def _if(xp, a, cond, *caps):
    key = "then_branch" if _flag(xp, cond) else "else_branch"
    return tuple(_call(_plan(a, key, xp), list(caps), f"If {key}"))


@kernel("Loop")
def _loop(xp, a, *ins):
    opt, n_caps = a["optional"], a["num_captures"]
    pos, trips, cond = 0, None, True
    if "M" in opt:
        trips, pos = host_ints(xp, ins[0])[0], 1
    if "cond" in opt:
        cond, pos = _flag(xp, ins[pos]), pos + 1
    body = a["body"]
    plan = _plan(a, "body", xp)
    carried = list(ins[pos:len(ins) - n_caps])
    caps = list(ins[len(ins) - n_caps:])
    n = len(carried)
    scans: list[list] = [[] for _ in body.outputs[1 + n:]]
    i = 0
    it_shape, cond_v = tuple(body.inputs[0].shape), xp.ones(tuple(body.inputs[1].shape), dtype=bool)
    while (trips is None or i < trips) and cond:
        it = xp.full(it_shape, i, dtype=np.int64)
        out = _call(plan, [it, cond_v.reshape(body.inputs[1].shape), *carried, *caps], f"Loop body, iteration {i}")
        cond_v, carried = out[0], out[1:1 + n]
        cond = _flag(xp, cond_v)  # also without a cond input, as onnxruntime and onnx's reference do
        for acc, v in zip(scans, out[1 + n:]):
            acc.append(v)
        i += 1
    args = [None, None, *carried, *caps]
    stacked = [xp.stack(acc) if acc else _empty_scan(xp, body, o, args) for acc, o in zip(scans, body.outputs[1 + n:])]
    return (*carried, *stacked)


@kernel("Scan")
def _scan(xp, a, *ins):
    m, n_caps = a["num_scan_inputs"], a["num_captures"]
    n = len(ins) - m - n_caps
    body = a["body"]
    plan = _plan(a, "body", xp)
    states = list(ins[:n])
    xs = ins[n:n + m]
    caps = list(ins[n + m:])
    in_axes = [ax % x.ndim for ax, x in zip(a["scan_input_axes"] or [0] * m, xs)]
    in_dirs = a["scan_input_directions"] or [0] * m
    lengths = {x.shape[ax] for x, ax in zip(xs, in_axes)}
    if len(lengths) != 1:
        raise RlxError(f"Scan: scan inputs have lengths {sorted(lengths)} along their scan axes; expected one length")
    seq = lengths.pop()
    outs = body.outputs[n:]
    scans: list[list] = [[] for _ in outs]
    for t in range(seq):
        slices = [x[(slice(None),) * ax + (seq - 1 - t if d else t,)] for x, ax, d in zip(xs, in_axes, in_dirs)]
        out = _call(plan, [*states, *slices, *caps], f"Scan body, iteration {t}")
        states = out[:n]
        for acc, v in zip(scans, out[n:]):
            acc.append(v)
    k = len(outs)
    out_axes = a["scan_output_axes"] or [0] * k
    out_dirs = a["scan_output_directions"] or [0] * k
    stacked = []
    for acc, o, ax, d in zip(scans, outs, out_axes, out_dirs):
        ax = ax % (body.types[o].rank + 1)
        if acc:
            stacked.append(xp.stack(acc[::-1] if d else acc, axis=ax))
        else:  # a scan slice of length 0 still has the other dims of its scan input
            slices = [x[(slice(None),) * a_ + (0,)] if x.shape[a_] else
                      xp.zeros(x.shape[:a_] + x.shape[a_ + 1:], x.dtype) for x, a_ in zip(xs, in_axes)]
            stacked.append(_empty_scan(xp, body, o, [*states, *slices, *caps], ax))
    return (*states, *stacked)
