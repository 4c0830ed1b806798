"""rlx_runtime.heap: after the first CPU forward, a forward's arrays reuse mapped memory (no page faults), and
RLX_KEEP_FREED_MEMORY=0 leaves glibc's malloc alone (where the same forward faults on every run)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest


def _glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _glibc(), reason="glibc's malloc only")

# arrays of 4-8 MiB made and freed in a fixed order, as a CNN's forward does (getrusage counts the faults). Whether
# glibc's own heuristics keep such a forward's pages depends on the order of its allocations: with this graph
# they do not (~12000 faults a forward); with a MaxPool in place of the AveragePool, since MaxPool folds one axis
# at a time, they happen to (under 1)
_FORWARD_FAULTS = textwrap.dedent("""
    import resource
    import numpy as np
    from rlx_format import GraphBuilder
    from rlx_runtime import Session, heap

    g = GraphBuilder("t")
    x = g.input("x", "f32", [1, 16, 256, 256])
    y = x
    for _ in range(6):
        y = g.op("Relu", g.op("Mul", g.op("Concat", y, y, axis=1), g.constant(np.float32(0.5))))
        y = g.op("AveragePool", y, kernel_shape=[2, 2], strides=[2, 2])
        y = g.op("Tile", y, g.constant(np.array([1, 1, 2, 2], np.int64)))
        y = g.op("Add", g.op("ReduceMax", y, axes=[1], keepdims=1), x)
    g.output(y)
    compiled = Session().compile(g.build())
    feeds = {"x": np.ones((1, 16, 256, 256), np.float32)}
    for _ in range(3):
        compiled.run(feeds)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        compiled.run(feeds)
    print(heap.keep_freed_memory(), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
""")


def _faults(**env: str) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", _FORWARD_FAULTS], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}, timeout=120).stdout.split()
    return out[0], float(out[1])


def test_a_forward_reuses_its_pages():
    applied, faults = _faults()
    assert applied == "True"
    assert faults < 50  # measured 0.8 (the interpreter's own small arenas)


def test_the_opt_out_leaves_malloc_alone_and_then_every_forward_faults():
    applied, faults = _faults(RLX_KEEP_FREED_MEMORY="0")
    assert applied == "False"
    assert faults > 500  # measured ~12000: the forward's big arrays mapped afresh each time
