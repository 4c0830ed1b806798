"""Bound kernels (kernels.registry.BINDERS, codegen._binding): a step's first run binds its op's kernel to the step's
attrs and inputs, and every later run calls what was bound.

What was bound must give the registered kernel's values bit for bit (assert_array_equal, NaN == NaN) on every path
it binds (pointwise GEMM and skinny kernel, depthwise taps, direct convs, squeeze-excite 1x1-pixel convs with each
activation, residual epilogues, batches, one and two threads), and must hand any call it was not bound for (another
input shape, a param set anew) to the registered kernel. The reference is the same graph compiled with
codegen.BIND off.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import rlx_format.numba_setup  # noqa: F401 - the conv binder binds once numba is loaded
from rlx_format import GraphBuilder
from rlx_runtime import Session, codegen
from rlx_runtime.backend import CPU

RNG = np.random.default_rng(23)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN inputs

# (x shape, w shape, conv attrs): each conv path the binder binds, and one it leaves to the kernel
CONVS = [
    ((1, 24, 20, 20), (72, 24, 1, 1), {}),  # pointwise, the skinny kernel (>= 256 pixels)
    ((2, 16, 18, 18), (40, 16, 1, 1), {}),  # pointwise, two images
    ((1, 96, 7, 7), (160, 96, 1, 1), {}),  # pointwise, a small plane: the skinny kernel (a small weight matrix)
    ((1, 256, 7, 7), (1024, 256, 1, 1), {}),  # pointwise, a small plane's large weight matrix: the BLAS GEMM
    ((1, 32, 1, 1), (8, 32, 1, 1), {}),  # a squeeze-excite 1x1-pixel conv: pixel_conv
    ((1, 16, 1, 1), (5000, 16, 1, 1), {}),  # a 1x1-pixel conv of more than TINY_OUTPUT outputs: pixel_conv too
    ((1, 40, 14, 14), (40, 1, 5, 5), {"group": 40, "pads": [2, 2, 2, 2]}),  # depthwise
    ((2, 24, 15, 13), (24, 1, 3, 3), {"group": 24, "pads": [1, 0, 2, 1], "strides": [2, 2]}),  # depthwise strided
    ((1, 16, 30, 30), (16, 1, 3, 3), {"group": 16, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),  # dilated
    ((1, 3, 33, 29), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # an RGB stem: direct
    ((1, 4, 9, 9), (6, 2, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),  # grouped: left to the kernel
]
ACTS = [None, ("Relu", {}), ("HardSwish", {}), ("Sigmoid", {}), ("Silu", {}), ("Clip", {"min": 0.0, "max": 1.0}),
        ("LeakyRelu", {"alpha": 0.1})]


def _conv_graph(xs, ws, attrs, act, bias=True, residual=False, batch=None):
    """x -> Conv (-> Add(conv, s) with `residual`) (-> act); `batch`: x's first dim symbolic."""
    g = GraphBuilder("bound")
    x = g.input("x", "f32", [batch or xs[0], *xs[1:]])
    ins = [x, g.constant(RNG.standard_normal(ws).astype(np.float32), name="w")]
    if bias:
        ins.append(g.constant(RNG.standard_normal(ws[0]).astype(np.float32), name="b"))
    out = g.op("Conv", *ins, name="conv", **attrs)
    if residual:
        out = g.op("Add", out, g.input("s", "f32", list(_out_shape(xs, ws, attrs))), name="add")
    if act is not None and act[0] == "HardSwish":  # as the ONNX import lowers it (the fusion pass finds it)
        t = g.op("Mul", out, g.constant(np.array(1 / 6, np.float32), name="alpha"), name="m")
        t = g.op("Clip", g.op("Add", t, g.constant(np.array(0.5, np.float32), name="beta"), name="s"), name="h",
                 min=0.0, max=1.0)
        out = g.op("Mul", out, t, name="act")
    elif act is not None:
        out = g.op(act[0], out, name="act", **act[1])
    g.output(out)
    return g.build()


def _out_shape(xs, ws, attrs):
    s = attrs.get("strides", [1, 1])
    d = attrs.get("dilations", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    return (xs[0], ws[0], *((xs[2 + i] + p[i] + p[i + 2] - d[i] * (ws[2 + i] - 1) - 1) // s[i] + 1 for i in range(2)))


def _inputs(shape):
    x = RNG.standard_normal(shape).astype(np.float32) * 3
    flat = x.reshape(-1)
    flat[::7] = np.nan
    flat[1::11] = np.inf
    flat[3::17] = -0.0
    return x


def _compiled(graph, monkeypatch, bind: bool):
    with monkeypatch.context() as m:
        m.setattr(codegen, "BIND", bind)
        return Session().compile(graph)


def _bound_steps(compiled) -> list[str]:
    """The ops of the steps whose generated call is no longer the registered kernel (after a run)."""
    plan = compiled._plan
    names = plan._fast.__globals__
    return [st.op for i, st in enumerate(plan.steps) if names[f"K{i}"] is not st.fn]


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def _threads(threads, monkeypatch) -> int:
    """1, 2, or "2-split": 2 with every split taken however small (bound pointwise and depthwise convs run their
    prepared jobs over the pool, threads.Prepared)."""
    if threads == "2-split":
        monkeypatch.setattr(importlib.import_module("rlx_runtime.threads"), "_MIN_SPLIT_WORK", 0)
        return 2
    return threads


@pytest.mark.parametrize("threads", [1, 2, "2-split"])
@pytest.mark.parametrize("act", ACTS, ids=lambda v: str(v))
@pytest.mark.parametrize("xs,ws,attrs", CONVS, ids=lambda v: str(v))
def test_bound_conv_gives_the_kernels_values(xs, ws, attrs, act, threads, monkeypatch):
    g = _conv_graph(xs, ws, attrs, act)
    bound, ref = _compiled(g, monkeypatch, True), _compiled(g, monkeypatch, False)
    with threadpool_limits(_threads(threads, monkeypatch), "blas"):
        for feed in (_inputs(xs), RNG.standard_normal(xs).astype(np.float32)):
            want = ref.run({"x": feed})
            for _ in range(2):  # the first run binds, the second calls what was bound
                _same(bound.run({"x": feed}), want)
    assert not _bound_steps(ref)
    grouped = attrs.get("group", 1) not in (1, xs[1])
    tiny_unfused = ws[2] == ws[3] == 1 and np.prod(_out_shape(xs, ws, attrs)) <= 4096 and act is None
    assert _bound_steps(bound) == ([] if grouped or tiny_unfused else [compiled_op(bound)])


def compiled_op(compiled) -> str:
    (op,) = [n.op for n in compiled.graph.nodes]
    return op


@pytest.mark.parametrize("threads", [1, 2, "2-split"])
@pytest.mark.parametrize("xs,ws,attrs", [c for c in CONVS if c[1][1] == c[0][1] or c[1][1] == 1][:7],
                         ids=lambda v: str(v))
def test_bound_residual_conv_gives_the_kernels_values(xs, ws, attrs, threads, monkeypatch):
    monkeypatch.setattr(importlib.import_module("rlx_runtime.passes.fuse"), "MIN_RESIDUAL_OUTPUTS", 0)
    g = _conv_graph(xs, ws, attrs, ("Relu", {}), residual=True)
    bound, ref = _compiled(g, monkeypatch, True), _compiled(g, monkeypatch, False)
    assert [n.op for n in bound.graph.nodes] == ["FusedConv"] and len(bound.graph.nodes[0].inputs) == 4
    rs = _out_shape(xs, ws, attrs)
    with threadpool_limits(_threads(threads, monkeypatch), "blas"):
        # NaN-laden and finite inputs (a NaN reaches every output of a 1x1-pixel conv)
        finite = {"x": RNG.standard_normal(xs).astype(np.float32), "s": RNG.standard_normal(rs).astype(np.float32)}
        for feeds in ({"x": _inputs(xs), "s": _inputs(rs)}, finite):
            want = ref.run(feeds)
            _same(bound.run(feeds), want)
            _same(bound.run(feeds), want)
    tiny = np.prod(_out_shape(xs, ws, attrs)) <= 4096 and ws[2] == ws[3] == 1
    assert _bound_steps(bound) == ([] if tiny else ["FusedConv"])


@pytest.mark.parametrize("xs,ws,attrs", [CONVS[i] for i in (0, 2, 3, 4, 6, 8)], ids=lambda v: str(v))
def test_other_input_shapes_go_to_the_kernel(xs, ws, attrs, monkeypatch):
    """Bound at batch 1, the step is called at batch 2, then 1 again: every result is the kernel's."""
    g = _conv_graph((1, *xs[1:]), ws, attrs, ("HardSwish", {}), batch="n")
    bound, ref = _compiled(g, monkeypatch, True), _compiled(g, monkeypatch, False)
    for n in (1, 2, 3, 1):
        for x in (_inputs((n, *xs[1:])), RNG.standard_normal((n, *xs[1:])).astype(np.float32)):
            _same(bound.run({"x": x}), ref.run({"x": x}))
    assert _bound_steps(bound) == [compiled_op(bound)]


@pytest.mark.parametrize("xs,ws,attrs", [((1, 24, 20, 20), (24, 1, 3, 3), {"group": 24, "pads": [1, 1, 1, 1]}),
                                          ((1, 96, 1, 1), (24, 96, 1, 1), {})], ids=str)
def test_a_param_set_anew_goes_to_the_kernel(xs, ws, attrs):
    """A conv weight that is a param: bound to the first array, a later set_param's array gives what the graph
    with that weight as a constant gives (a depthwise conv; a 1x1-pixel one, whose transposed weights pixel_conv
    keeps per weight array)."""
    bias = RNG.standard_normal(ws[0]).astype(np.float32)

    def graph(weight=None):
        g = GraphBuilder("param")
        x = g.input("x", "f32", list(xs))
        w = g.param("w", "f32", list(ws)) if weight is None else g.constant(weight, name="w")
        g.output(g.op("Relu", g.op("Conv", x, w, g.constant(bias, name="b"), name="conv", **attrs), name="act"))
        return g.build()

    bound = Session().compile(graph())
    feed = {"x": RNG.standard_normal(xs).astype(np.float32)}  # finite: a NaN would reach every 1x1-pixel output
    for _ in range(3):
        weight = RNG.standard_normal(ws).astype(np.float32)
        bound.set_param("w", weight)
        want = Session().compile(graph(weight)).run(feed)
        _same(bound.run(feed), want)
        _same(bound.run(feed), want)


def test_float64_convs_are_not_bound(monkeypatch):
    g = GraphBuilder("f64")
    x = g.input("x", "f64", [1, 8, 16, 16])
    g.output(g.op("Conv", x, g.constant(RNG.standard_normal((8, 1, 3, 3)), name="w", dtype="f64"), name="conv", group=8,
                  pads=[1, 1, 1, 1]))
    bound = _compiled(g.build(), monkeypatch, True)
    bound.run({"x": RNG.standard_normal((1, 8, 16, 16))})
    assert _bound_steps(bound) == []


def test_binders_are_registered_for_the_cpu_only():
    assert CPU.binder("Conv") is not None and CPU.binder("FusedConv") is not None
    assert CPU.binder("Relu") is None


# a squeeze-excite block's 1x1-pixel convs: conv_kernels.pixel_conv once numba is loaded (nn._pixel_conv_applies)
PIXEL_CASES = [(8, 32), (24, 96), (144, 576), (576, 144), (37, 5)]


def _pixel_graph(o, c, act, fused_input=False):
    g = GraphBuilder("se")
    x = g.input("x", "f32", [1, c, 1, 1])
    w = g.constant(RNG.standard_normal((o, c, 1, 1)).astype(np.float32), name="w")
    out = g.op("Conv", x, w, g.constant(RNG.standard_normal(o).astype(np.float32), name="b"), name="conv")
    if act is not None:
        out = g.op(act[0], out, name="act", **act[1])
    g.output(out)
    return g.build()


@pytest.mark.parametrize("act", [None, ("Relu", {}), ("Clip", {"min": 0.0, "max": 1.0}), ("Sigmoid", {}),
                                 ("LeakyRelu", {"alpha": 0.1})], ids=str)
@pytest.mark.parametrize("o,c", PIXEL_CASES, ids=str)
def test_pixel_conv_is_each_outputs_fma_chain(o, c, act, monkeypatch):
    """Each output: its products added by fma in input-channel order from 0.0, then the bias, then the
    activation's kernel (what the unfused graph computes from that conv), fused and unfused alike."""
    from exact_fma import fma32

    from rlx_runtime.kernels import KERNELS
    import rlx_runtime.passes.pipeline as pipeline
    g = _pixel_graph(o, c, act)
    fused = Session().compile(g)
    with monkeypatch.context() as m:
        m.setattr(pipeline, "FUSE_CONV", pipeline.Pass("fuse_conv", lambda g, ctx: pipeline.PassResult(g, False)))
        unfused = Session().compile(g)
    assert [n.op for n in fused.graph.nodes] == (["Conv"] if act is None else ["FusedConv"])
    w = g.constants["w"].value.reshape(o, c)
    b = g.constants["b"].value
    for _ in range(3):
        x = RNG.standard_normal((1, c, 1, 1)).astype(np.float32)
        chain = np.zeros(o, np.float32)
        for i in range(c):
            chain = fma32(w[:, i], np.full(o, x.reshape(-1)[i], np.float32), chain)
        want = (chain + b).reshape(1, o, 1, 1)
        if act is not None:
            want = KERNELS[act[0]](np, {"alpha": 0.01, "min": None, "max": None, **act[1]}, want)
        for compiled in (fused, unfused):
            (got,) = compiled.run({"x": x}).values()
            np.testing.assert_array_equal(got, want)


def test_pixel_conv_keeps_nan_and_inf_as_the_unfused_ops(monkeypatch):
    import rlx_runtime.passes.pipeline as pipeline
    for act in (("Relu", {}), ("Clip", {"min": -0.5, "max": 0.5}), ("Silu", {})):
        g = _pixel_graph(24, 96, act)
        fused = Session().compile(g)
        with monkeypatch.context() as m:
            m.setattr(pipeline, "FUSE_CONV", pipeline.Pass("fuse_conv", lambda g, ctx: pipeline.PassResult(g, False)))
            unfused = Session().compile(g)
        x = _inputs((1, 96, 1, 1))
        _same(fused.run({"x": x}), unfused.run({"x": x}))


def test_pixel_conv_only_up_to_its_work_limit(monkeypatch):
    """Above PIXEL_MAX_WORK multiply-adds a 1x1-pixel conv is the GEMM threads.matmul splits."""
    from rlx_runtime import conv_kernels
    from rlx_runtime.kernels import nn
    calls = []
    real = conv_kernels.pixel_conv
    monkeypatch.setattr(conv_kernels, "pixel_conv", lambda *args: calls.append(1) or real(*args))
    for o, c, used in ((512, 512, True), (513, 512, False)):
        calls.clear()
        g = _pixel_graph(o, c, ("Relu", {}))
        Session().compile(g).run({"x": RNG.standard_normal((1, c, 1, 1)).astype(np.float32)})
        assert bool(calls) == used == (o * c <= nn.PIXEL_MAX_WORK)


@pytest.mark.parametrize("threads", [1, "2-split"])
def test_a_bound_step_run_from_two_threads_at_once_gives_each_its_values(threads, monkeypatch):
    """A bound step's prepared job (its rows and scratch: threads.Prepared) is run by one caller at a time; a
    second caller meanwhile takes the per-call kernel. Two threads run the same compiled model on their own
    inputs at once, again and again: each gets the values of its own input."""
    import threading

    g = GraphBuilder("two")
    x = g.input("x", "f32", [1, 24, 60, 60])
    y = g.op("Conv", x, g.constant(RNG.standard_normal((24, 1, 3, 3)).astype(np.float32), name="dw"),
             name="dwconv", group=24, pads=[1, 1, 1, 1])
    y = g.op("Relu", y, name="r")
    g.output(g.op("Conv", y, g.constant(RNG.standard_normal((48, 24, 1, 1)).astype(np.float32), name="pw"),
                  name="pwconv"))
    graph = g.build()
    bound, ref = _compiled(graph, monkeypatch, True), _compiled(graph, monkeypatch, False)
    feeds = [RNG.standard_normal((1, 24, 60, 60)).astype(np.float32) for _ in range(2)]
    n = _threads(threads, monkeypatch)
    with threadpool_limits(n, "blas"):
        wants = [ref.run({"x": f}) for f in feeds]
        bound.run({"x": feeds[0]})  # binds
        assert len(_bound_steps(bound)) == 2
        wrong = []

        def worker(i):
            with threadpool_limits(n, "blas"):
                for _ in range(300):
                    got = bound.run({"x": feeds[i]})
                    if not all(np.array_equal(got[k], wants[i][k]) for k in got):
                        wrong.append(i)

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    assert not wrong


@pytest.mark.parametrize("threads", [1, "2-split"])
def test_a_bound_conv_runs_its_prepared_job_from_its_second_call(threads, monkeypatch):
    """The first call of a bound pointwise, depthwise or direct conv takes the per-call path (a one-shot forward
    does not pay for making the job); every later call runs the job (threads.Prepared.run)."""
    from rlx_runtime import threads as rlx_threads

    ran = []
    real = rlx_threads.Prepared.run
    monkeypatch.setattr(rlx_threads.Prepared, "run", lambda self, *a: ran.append(real(self, *a)) or ran[-1])
    for xs, ws, attrs in (CONVS[0], CONVS[6], CONVS[9]):  # pointwise, depthwise, direct
        g = _conv_graph(xs, ws, attrs, ("Relu", {}))
        bound, ref = _compiled(g, monkeypatch, True), _compiled(g, monkeypatch, False)
        x = RNG.standard_normal(xs).astype(np.float32)
        with threadpool_limits(_threads(threads, monkeypatch), "blas"):
            want = ref.run({"x": x})
            ran.clear()
            _same(bound.run({"x": x}), want)
            assert ran == []
            for _ in range(2):
                _same(bound.run({"x": x}), want)
            assert ran and all(ran), (xs, ws)  # a direct conv's job is two (its fill and its rows): one call each


@pytest.mark.parametrize("threads", [1, "2-split"])
@pytest.mark.parametrize("scale_first", [False, True])
def test_bound_squeeze_excite_means_and_scale_give_the_kernels_values(scale_first, threads, monkeypatch):
    """A squeeze-excite block's GlobalAveragePool and scale Mul, bound (their row width and operand roles decided
    once), give the registered kernels' bits (NaN and Inf inputs too), split over two threads or not; at another
    batch or height the steps go to the kernels."""
    g = GraphBuilder("se")
    x = g.input("x", "f32", ["n", 24, "h", 11])
    m = g.op("GlobalAveragePool", x, name="gap")
    s = g.op("Sigmoid", m, name="gate")
    g.output(g.op("Mul", *((s, x) if scale_first else (x, s)), name="scale"))
    graph = g.build()
    bound, ref = _compiled(graph, monkeypatch, True), _compiled(graph, monkeypatch, False)
    with threadpool_limits(_threads(threads, monkeypatch), "blas"):
        for batch, h in ((1, 9), (1, 9), (2, 9), (1, 7), (1, 9)):
            v = RNG.standard_normal((batch, 24, h, 11)).astype(np.float32)
            v.reshape(-1)[::53] = np.nan
            v.reshape(-1)[7::61] = np.inf
            got, want = bound.run({"x": v}), ref.run({"x": v})
            for k in got:
                np.testing.assert_array_equal(got[k].view(np.uint32), want[k].view(np.uint32))
    assert sorted(_bound_steps(bound)) == ["GlobalAveragePool", "Mul"]
