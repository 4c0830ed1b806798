"""Constant folding: evaluate deterministic nodes whose inputs are all constants.

Uses the runtime's own kernels on numpy, so folded values equal run-time values bit for bit.
A size guard refuses folds whose output would be much larger than their inputs (and says why
in the report) without allocating the output. Constants consumed only by folded nodes are
dropped as soon as their last consumer is folded, so peak memory stays near the weights' size.
"""

from __future__ import annotations

import math

import numpy as np

from rlx_format.dtypes import NUMPY_DTYPES, f32_to_bf16
from rlx_format.errors import RlxError
from rlx_format.graph import Graph, Value
from rlx_format.ops import RANDOM_OPS

from ..kernels import KERNELS, prepare_attrs
from ..plan import leaf_array


def _bytes(t) -> int | None:
    if not t.is_static():
        return None
    return math.prod(t.shape) * NUMPY_DTYPES[t.dtype].itemsize


def constant_fold(graph: Graph, report=None, growth_limit: float = 16, min_bytes: int = 1 << 20) -> Graph:
    consts = graph.constants
    remaining = {}
    for n in graph.nodes:
        for i in n.inputs:
            remaining[i] = remaining.get(i, 0) + 1
    outputs = set(graph.outputs)
    kept = []
    for n in graph.nodes:
        foldable = n.op not in RANDOM_OPS and all(i in consts and consts[i].value is not None for i in n.inputs)
        if foldable and n.inputs == [] and n.op not in ("ConstantOfShape",):
            foldable = False
        reason = None
        if foldable:
            t = graph.types[n.name]
            out_b = _bytes(t)
            in_b = sum(consts[i].value.nbytes for i in set(n.inputs))
            if out_b is None:
                reason = "output shape is not static"
            elif out_b > max(min_bytes, growth_limit * in_b):
                reason = (f"output {t.dtype}{list(t.shape)} is {out_b} bytes, more than {growth_limit:g}x its "
                          f"inputs ({in_b} bytes); raise fold_growth_limit to allow it")
        if not foldable or reason:
            if reason and report is not None:
                report.fold_refused.append({"node": n.name, "op": n.op, "reason": reason})
            kept.append(n)
            continue
        args = [leaf_array(np, consts[i].value, consts[i].dtype) for i in n.inputs]  # as the runtime holds them
        try:
            val = KERNELS[n.op](np, prepare_attrs(n.op, n.attrs), *args)
        except Exception as e:  # noqa: BLE001
            raise RlxError(f"constant folding node {n.name!r} ({n.op}) failed: {type(e).__name__}: {e}") from e
        t = graph.types[n.name]
        val = np.asarray(val)
        val = f32_to_bf16(val) if t.dtype == "bf16" else np.require(val, dtype=NUMPY_DTYPES[t.dtype], requirements="C")
        consts[n.name] = Value(n.name, t.dtype, tuple(val.shape), val)
        if report is not None:
            report.folded += 1
            big = [i for i in dict.fromkeys(n.inputs) if consts[i].value.size > 1]
            if len(big) == 1:  # remember where a weight-derived tensor came from (for readable names)
                report.folded_from[n.name] = report.folded_from.get(big[0], big[0])
        for i in set(n.inputs):  # free inputs whose last consumer was just folded
            remaining[i] -= n.inputs.count(i)
            if remaining[i] == 0 and i not in outputs and i in consts:
                del consts[i]
    graph.nodes = kept
    return graph.validate()
