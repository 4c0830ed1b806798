"""A decoding step's GEMV bound to its weights (kernels.nn._bind_matmul, threads.PreparedGemv): its split job is
written once per thread count and run on each call's row.

It must give the unbound kernel's bits (the same BLAS calls on the same blocks; the reference is the same graph
compiled with codegen.BIND off) at one and two threads, on new rows every call, for 2-D and 3-D rows, and hand a
call it was not bound for (another row shape, another weight) to the kernel.
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import rlx_format.numba_setup  # noqa: F401 - the binder binds once numba is loaded
from rlx_format import GraphBuilder
from rlx_runtime import Session, codegen, threads
from rlx_runtime.kernels import nn

RNG = np.random.default_rng(31)


def _gemv_graph(k: int, n: int, rows, ndim: int = 2):
    """x (rows.., k) -> MatMul by a constant (k, n) weight -> Relu (a fresh buffer: the GEMV's result is read)."""
    g = GraphBuilder("gemv")
    x = g.input("x", "f32", ([rows] if ndim == 2 else [1, rows]) + [k])
    w = g.constant(RNG.standard_normal((k, n)).astype(np.float32), name="w")
    g.output(g.op("Relu", g.op("MatMul", x, w, name="mm"), name="y"))
    return g.build()


def _compiled(graph, bind: bool, monkeypatch):
    monkeypatch.setattr(codegen, "BIND", bind)
    return Session().compile(graph)


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("k,n,ndim", [(768, 2304, 2), (768, 3072, 3), (512, 1000, 2)], ids=str)
def test_bound_gemv_gives_the_kernels_bits(nthreads, k, n, ndim, monkeypatch):
    graph = _gemv_graph(k, n, 1, ndim)
    bound, plain = _compiled(graph, True, monkeypatch), _compiled(graph, False, monkeypatch)
    jobs, used = [], set()
    real = threads.PreparedGemv.__call__

    def call(self, *a):
        jobs.append(self)
        used.add(threads.threads_in_use())
        return real(self, *a)
    monkeypatch.setattr(threads.PreparedGemv, "__call__", call)
    with threadpool_limits(nthreads, "blas"):
        for _ in range(3):  # the first call binds; later ones run the prepared job on new rows
            x = RNG.standard_normal((1, k) if ndim == 2 else (1, 1, k)).astype(np.float32)
            got, want = bound.run({"x": x})["y"], plain.run({"x": x})["y"]
            np.testing.assert_array_equal(got, want)
            np.testing.assert_allclose(got, np.maximum(x.astype(np.float64) @ graph.constants["w"].value, 0),
                                       rtol=1e-4, atol=1e-3)
    assert len(jobs) == 3 and len({id(j) for j in jobs}) == 1  # one bound GEMV, every call
    assert len(used) == 1 and list(jobs[0].jobs) == [t for t in used if t > 1]  # the split job, written once


def test_bound_gemv_hands_other_calls_to_the_kernel(monkeypatch):
    graph = _gemv_graph(768, 768, "N")
    bound, plain = _compiled(graph, True, monkeypatch), _compiled(graph, False, monkeypatch)
    with threadpool_limits(2, "blas"):
        for rows in (1, 3, 1, 5):  # bound at one row; three and five rows are GEMMs
            x = RNG.standard_normal((rows, 768)).astype(np.float32)
            np.testing.assert_array_equal(bound.run({"x": x})["y"], plain.run({"x": x})["y"])
    step = nn._bind_matmul({}, np.zeros((1, 768), np.float32), graph.constants["w"].value)
    assert step is not None
    other = RNG.standard_normal((768, 768)).astype(np.float32)  # not the weight it was bound to
    x = RNG.standard_normal((1, 768)).astype(np.float32)
    np.testing.assert_array_equal(step(np, {}, x, other), nn._matmul_cpu(np, {}, x, other))


def test_small_batched_or_column_major_products_are_not_bound():
    w = RNG.standard_normal((64, 64)).astype(np.float32)  # below the GEMV split's work
    assert nn._bind_matmul({}, np.zeros((1, 64), np.float32), w) is None
    w = RNG.standard_normal((768, 768)).astype(np.float32)
    assert nn._bind_matmul({}, np.zeros((4, 768), np.float32), w) is None  # four rows: not a GEMV
    assert nn._bind_matmul({}, np.zeros((1, 768), np.float64), w) is None
    tall = np.asfortranarray(RNG.standard_normal((3072, 768)).astype(np.float32))  # as compile holds tall weights
    assert nn._bind_matmul({}, np.zeros((1, 3072), np.float32), tall) is None
