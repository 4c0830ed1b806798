"""Constant dedupe: identical dtype, shape and bytes -> one constant."""

from __future__ import annotations

import numpy as np

from rlx_format.container import byte_view, digest_bytes, release_pages
from rlx_format.graph import Graph

from .rewrite import replace_uses


def dedupe_constants(graph: Graph, report=None) -> Graph:
    seen: dict[tuple, list[str]] = {}
    outputs = set(graph.outputs)
    removed = 0
    for name, c in list(graph.constants.items()):
        if c.value is None or name in outputs:
            continue
        data = np.ascontiguousarray(c.value)
        digest = digest_bytes(byte_view(data))
        release_pages(data)  # hashing a memory-mapped weight must not keep it resident
        if report is not None:
            report.digests[name] = digest
        key = (c.dtype, tuple(c.shape), digest)
        twin = next((o for o in seen.get(key, []) if np.array_equal(graph.constants[o].value, c.value)), None)
        if twin is None:
            seen.setdefault(key, []).append(name)
            continue
        replace_uses(graph, name, twin)
        del graph.constants[name]
        removed += 1
    if report is not None:
        report.deduped += removed
    return graph.validate()
