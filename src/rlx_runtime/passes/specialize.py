"""specialize_params: bound params become constants (same name, shape and dtype)."""

from __future__ import annotations

import numpy as np

from rlx_format.dtypes import NUMPY_DTYPES, f32_to_bf16
from rlx_format.errors import RlxError
from rlx_format.graph import Graph, Value


def _binding_array(name: str, p: Value, value) -> np.ndarray:
    a = np.asarray(value)
    want = NUMPY_DTYPES[p.dtype]
    if p.dtype == "bf16" and a.dtype == np.float32:
        a = f32_to_bf16(a)
    if a.dtype.newbyteorder("=") != want.newbyteorder("="):
        raise RlxError(f"binding for param {name!r}: dtype {a.dtype}; expected {want} ({p.dtype}); "
                       "cast the array before binding (rlx never casts silently)")
    if any(isinstance(d, str) for d in p.shape):
        raise RlxError(f"binding for param {name!r}: declared shape {list(p.shape)} is symbolic; "
                       "params must have static shapes to be bound")
    if tuple(a.shape) != tuple(p.shape):
        raise RlxError(f"binding for param {name!r}: shape {list(a.shape)}; expected {list(p.shape)}")
    return a


def specialize_params(graph: Graph, bindings: dict, report=None) -> Graph:
    """Return a copy of `graph` where each bound Param is a Constant holding the bound array."""
    params = {p.name: p for p in graph.params}
    unknown = sorted(set(bindings) - set(params))
    if unknown:
        raise RlxError(f"param_bindings names unknown param(s) {unknown}; the graph's params are "
                       f"{sorted(params) or 'none'}")
    g = graph.copy()
    g.params = [p for p in g.params if p.name not in bindings]
    for p in graph.params:
        if p.name in bindings:
            arr = _binding_array(p.name, p, bindings[p.name])
            g.constants[p.name] = Value(p.name, p.dtype, tuple(p.shape), arr)
            if report is not None:
                report.specialized.append(p.name)
    return g.validate()
