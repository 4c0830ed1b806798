"""FusedMatMul: Add(MatMul(x, w), b) with b one value per output column, and then the residual Add that alone reads
that sum, compiled to FusedMatMul(x, w, b[, r]) (passes/fuse.py fuse_linear), whose CPU kernel adds the bias and the
residual to each block of the GEMM output on the thread that computed it (linear.py).

The fused values must be the unfused ops' bit for bit (assert_array_equal, NaN == NaN): at 1 and 2 threads (native
pool rows), with NaN/Inf in the input, the bias and the residual, either operand order of both Adds, every CPU path
(the epilogue, few rows, numba not loaded); and the pass must leave alone what it cannot fuse exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from test_conv_paths import _count_calls
from test_fused_residual import _specials

from rlx_format import GraphBuilder
from rlx_format.errors import GraphError
from rlx_runtime import Session, linear, threads
from rlx_runtime.backend import backend_of
from rlx_runtime.plan import MIN_COLUMN_MAJOR, matmul_weights
from rlx_runtime.kernels import KERNELS, nn
from rlx_runtime.passes import pipeline

RNG = np.random.default_rng(5)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN inputs


def _graph(xs, n, bias_shape=None, bias_first=False, residual=False, residual_first=False, extra=None):
    """x (xs) @ w (K, n) + b (bias_shape, default (n,)), then + s (an input of the product's shape) with residual."""
    g = GraphBuilder("lin")
    x = g.input("x", "f32", list(xs))
    w = g.constant(RNG.standard_normal((xs[-1], n)).astype(np.float32), name="w")
    b = g.constant(RNG.standard_normal(bias_shape or (n,)).astype(np.float32), name="b")
    m = g.op("MatMul", x, w, name="mm")
    y = g.op("Add", *((b, m) if bias_first else (m, b)), name="biased")
    if residual:
        s = g.input("s", "f32", [*xs[:-1], n])
        y = g.op("Add", *((s, y) if residual_first else (y, s)), name="summed")
    g.output(y)
    if extra == "matmul":
        g.output(g.op("Neg", m, name="neg"))
    elif extra == "output":
        g.output(m)
    return g.build()


def _unfused(graph, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(pipeline, "FUSE_LINEAR", pipeline.Pass("fuse_linear", lambda g, ctx: pipeline.PassResult(g, False)))
        return Session().compile(graph)


def _feeds(xs, n, residual, special):
    # x's specials sparse enough that most output rows stay numbers (each reads a whole row of x)
    make = ((lambda s: _specials(s, max(997, 8 * xs[-1]))) if special
            else (lambda s: RNG.standard_normal(s).astype(np.float32)))
    feeds = {"x": make(xs)}
    if residual:
        feeds["s"] = _specials((*xs[:-1], n), 29) if special else make((*xs[:-1], n))
    return feeds


CASES = [  # (x shape, N, bias shape)
    ((40, 24), 37, None),
    ((24, 520), 130, None),           # a weight compile holds column-major (plan.MIN_COLUMN_MAJOR, taller than wide)
    ((20, 16), 70, None),             # more columns than rows: the split (2 threads) is by columns
    ((3, 20, 16), 50, None),          # a stack of rows: one tall GEMM
    ((2, 3, 9, 8), 33, (1, 1, 33)),   # a bias with leading 1s
]


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("xs,n,bshape", CASES, ids=str)
def test_fused_equals_unfused(xs, n, bshape, residual, n_threads, monkeypatch):
    from rlx_format.numba_setup import numba  # noqa: F401 - the epilogue path is taken once numba is loaded
    monkeypatch.setattr(threads, "_MIN_SPLIT_WORK", 0)  # split however small: native rows at 2 threads
    flip = len(xs) % 2 == 1  # the bias (and residual) as the Adds' first operand for some cases
    g = _graph(xs, n, bshape, bias_first=flip, residual=residual, residual_first=not flip)
    ref = _unfused(g, monkeypatch)
    called, put = (_count_calls(monkeypatch, linear.ColumnBias, name) for name in ("__call__", "put"))
    fused = Session().compile(g)
    assert [(n_.op, len(n_.inputs)) for n_ in fused.graph.nodes] == [("FusedMatMul", 4 if residual else 3)]
    by_columns = xs[-1] * n >= MIN_COLUMN_MAJOR and xs[-1] > n
    assert matmul_weights(fused.graph) == ({"w"} if by_columns else set())  # held as the unfused MatMul holds it
    assert sorted(n_.op for n_ in ref.graph.nodes) == ["Add"] * (1 + residual) + ["MatMul"]
    for special in (True, False):
        feeds = _feeds(xs, n, residual, special)
        with threadpool_limits(n_threads, "blas"):  # both at n_threads: a BLAS GEMM's split can move its roundings
            got = fused.run(feeds)[fused.graph.outputs[0]]
            want = ref.run(feeds)[ref.graph.outputs[0]]
        assert np.isnan(want).mean() < 0.5
        np.testing.assert_array_equal(got, want)
    # the epilogue ran: in Python on one thread, as native pool rows (one per block) on two
    assert (len(called), len(put)) == ((2, 0) if n_threads == 1 else (0, 4))


def test_few_rows_and_numba_not_loaded_take_the_unfused_kernels(monkeypatch):
    """At most SKINNY_MAX_ROWS rows (the few-rows kernel), or before numba is loaded: the unfused kernels, the same
    values, and no epilogue."""
    called = _count_calls(monkeypatch, linear.ColumnBias, "__call__")
    x, w = RNG.standard_normal((3, 4, 16)).astype(np.float32), RNG.standard_normal((16, 40)).astype(np.float32)
    b, r = RNG.standard_normal(40).astype(np.float32), RNG.standard_normal((3, 4, 40)).astype(np.float32)
    matmul = backend_of(np).kernel("MatMul")  # the few-rows GEMM: its sums need not be the BLAS's (np.matmul's)
    want = (matmul(np, {}, x, w) + b) + r
    np.testing.assert_array_equal(KERNELS["FusedMatMul"](np, {}, x, w, b, r), want)  # 12 rows
    monkeypatch.setattr(nn, "_numba_loaded", lambda: False)
    x = RNG.standard_normal((30, 16)).astype(np.float32)
    np.testing.assert_array_equal(KERNELS["FusedMatMul"](np, {}, x, w, b), np.matmul(x, w) + b)
    assert called == []


def test_a_transformer_block_fuses_every_biased_linear():
    """q/k/v/out projections and the MLP: every MatMul + bias becomes one FusedMatMul, the two residual sums fold
    into the out projection and the second MLP layer."""
    g = GraphBuilder("block")
    x = g.input("x", "f32", [2, 16, 32])

    def lin(t, k, n, name):
        w = g.constant((RNG.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), name=f"{name}.w")
        return g.op("Add", g.op("MatMul", t, w), g.constant(RNG.standard_normal(n).astype(np.float32),
                                                              name=f"{name}.b"))
    q, k, v = (lin(x, 32, 32, s) for s in "qkv")
    att = g.op("Softmax", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 2, 1])))
    h = g.op("Add", lin(g.op("MatMul", att, v), 32, 32, "o"), x)
    out = g.op("Add", h, lin(g.op("Relu", lin(h, 32, 64, "up")), 64, 32, "down"), name="out")
    g.output(out)
    compiled = Session().compile(g.build())
    fused = [n for n in compiled.graph.nodes if n.op == "FusedMatMul"]
    assert [len(n.inputs) for n in fused] == [3, 3, 3, 4, 3, 4]
    assert "Add" not in compiled.plan_ops()
    xv = RNG.standard_normal((2, 16, 32)).astype(np.float32)
    c = {n: t.value for n, t in compiled.graph.constants.items()}

    def ref(t, name):
        return t @ c[f"{name}.w"] + c[f"{name}.b"]
    q, k, v = (ref(xv, s) for s in "qkv")
    s = q @ k.transpose(0, 2, 1)
    e = np.exp(s - s.max(-1, keepdims=True))
    h = ref((e / e.sum(-1, keepdims=True)) @ v, "o") + xv
    want = h + ref(np.maximum(ref(h, "up"), 0), "down")
    np.testing.assert_allclose(compiled.run({"x": xv})["out"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["matmul-read-elsewhere", "matmul-is-an-output", "bias-per-row", "bias-one-value",
                                  "bias-widens", "batched-weights", "float64"])
def test_left_unfused(case):
    """What fuse_linear must not touch: the product read by another node or a graph output, a bias that is not one
    value per column (or widens the product), a stack of weight matrices, other dtypes than float32."""
    if case == "batched-weights":
        g = GraphBuilder("b")
        x = g.input("x", "f32", [2, 5, 8])
        m = g.op("MatMul", x, g.constant(RNG.standard_normal((2, 8, 6)).astype(np.float32), name="w"))
        g.output(g.op("Add", m, g.constant(RNG.standard_normal(6).astype(np.float32), name="b"), name="y"))
        graph = g.build()
    elif case == "float64":
        g = GraphBuilder("d")
        x = g.input("x", "f64", [5, 8])
        m = g.op("MatMul", x, g.constant(RNG.standard_normal((8, 6)), name="w", dtype="f64"))
        g.output(g.op("Add", m, g.constant(RNG.standard_normal(6), name="b", dtype="f64"), name="y"))
        graph = g.build()
    else:
        shapes = {"bias-per-row": (5, 1), "bias-one-value": (1,), "bias-widens": (3, 5, 6)}
        graph = _graph((5, 8), 6, shapes.get(case), extra={"matmul-read-elsewhere": "matmul",
                                                            "matmul-is-an-output": "output"}.get(case))
    assert "FusedMatMul" not in Session().compile(graph).plan_ops()


@pytest.mark.parametrize("bias,residual,wshape,message", [
    ([5, 6], None, [8, 6], r"bias f32\[5, 6\]; expected one f32 value per output column \(\[6\]"),
    ([7], None, [8, 6], r"bias f32\[7\]"),
    ([6], [5, 7], [8, 6], r"residual f32\[5, 7\]; expected the product's f32\[5, 6\]"),
    ([6], None, [2, 8, 6], r"takes x of rank >= 2 and a matrix w; got ranks 2 and 3"),
])
def test_inference_refuses_what_the_kernel_cannot_take(bias, residual, wshape, message):
    g = GraphBuilder("bad")
    x = g.input("x", "f32", [5, 8])
    ins = [x, g.constant(np.zeros(wshape, np.float32), name="w"), g.constant(np.zeros(bias, np.float32), name="b")]
    if residual is not None:
        ins.append(g.input("s", "f32", residual))
    g.output(g.op("FusedMatMul", *ins, name="y"))
    with pytest.raises(GraphError, match=message):
        g.build()
