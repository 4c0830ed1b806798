"""FusedConv with a residual: Add(Conv(x, w, b), r), and the activation that alone reads the sum (a ResNet block's
Relu), compiled to FusedConv(x, w, b, r) (passes/fuse.py), whose CPU epilogue adds the bias, then the residual,
then applies the activation on each output block while it is in cache.

The fused values must be the unfused ops' bit for bit (assert_array_equal, NaN == NaN), on every CPU conv path
the epilogue runs on (its native rows included, split over two threads), with NaN/Inf in the input and the
residual, the residual as either operand of the Add; and the pass must leave alone what it cannot fuse exactly.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from test_conv_paths import _count_calls, count_direct_calls, count_pointwise_calls, count_taps_calls
from test_fused_conv import _ops, _unfused

from rlx_format import GraphBuilder
from rlx_format.errors import GraphError
from rlx_runtime import Session, conv_direct, conv_pointwise, conv_shifted, threads
from rlx_runtime.kernels import KERNELS, nn
from rlx_runtime.kernels.registry import prepare_attrs

RNG = np.random.default_rng(11)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN inputs
FUSE = importlib.import_module("rlx_runtime.passes.fuse")


@pytest.fixture(autouse=True)
def fuse_small_sums(monkeypatch):
    """These tests' convs are small: fuse their sums however small (test_only_sums_of_large_outputs_are_fused
    checks the shipped threshold)."""
    monkeypatch.setattr(FUSE, "MIN_RESIDUAL_OUTPUTS", 0)


def _graph(xs, ws, attrs, act=None, act_attrs=None, residual_first=False, bias=True, rshape=None,
           extra_reader=None):
    """x -> Conv -> Add(conv, s) (or Add(s, conv)) -> act (None: the sum is the output); s: an input of the conv
    output's shape (rshape: another)."""
    g = GraphBuilder("res")
    x = g.input("x", "f32", list(xs))
    ins = [x, g.constant(RNG.standard_normal(ws).astype(np.float32), name="w")]
    if bias:
        ins.append(g.constant(RNG.standard_normal(ws[0]).astype(np.float32), name="b"))
    c = g.op("Conv", *ins, name="conv", **attrs)
    s = g.input("s", "f32", list(rshape) if rshape is not None else list(_out_shape(xs, ws, attrs)))
    out = g.op("Add", *((s, c) if residual_first else (c, s)), name="add")
    if act is not None:
        out = g.op(act, out, name="act", **(act_attrs or {}))
    g.output(out)
    if extra_reader == "conv":
        g.output(g.op("Neg", c, name="neg"))
    elif extra_reader == "output":
        g.output(c)
    return g.build()


def _out_shape(xs, ws, attrs):
    a = prepare_attrs("Conv", {"strides": None, "pads": None, "dilations": None, "group": 1, **attrs})
    nsp = len(xs) - 2
    strides, dil, pads = nn._spatial(a, nsp)
    sp = [nn.window_count(xs[2 + i], ws[2 + i], strides[i], dil[i], pads[i], pads[i + nsp]) for i in range(nsp)]
    return (xs[0], ws[0], *sp)


def _specials(shape, every: int = 23):
    """Normal values with NaN, +-Inf and -0.0 every `every`-th element or so (a conv input wants them sparse:
    each output reads channels x taps of its elements, and a NaN among them makes the whole output NaN)."""
    v = RNG.standard_normal(shape).astype(np.float32) * 3
    flat = v.reshape(-1)
    flat[::every] = np.nan
    flat[4::every + 6] = np.inf
    flat[9::every + 8] = -np.inf
    flat[2::every + 14] = -0.0
    return v


def _direct(m):
    return count_direct_calls(m)


def _direct_in_pieces(m):
    m.setattr(conv_direct, "PIECE_BYTES", 1)  # one grid row a piece
    return _direct(m)


def _depthwise(m):
    return count_taps_calls(m)


def _depthwise_blocked(m):
    return count_taps_calls(m, blocked=True)


def _shifted(m):
    m.setattr(conv_direct, "MAX_INNER", 0)
    m.setattr(conv_shifted, "MIN_COLUMN_BYTES", 0)
    m.setattr(conv_shifted, "MIN_OUT_WIDTH", 1)
    m.setattr(conv_shifted, "WITH_NATIVE_POOL", True)
    return _count_calls(m, conv_shifted, "conv2d_shifted")


def _im2col(m):
    m.setattr(conv_direct, "MAX_INNER", 0)
    m.setattr(conv_shifted, "MIN_COLUMN_BYTES", 1 << 62)
    return _count_calls(m, nn, "conv_nobias")


def _skinny(m):
    m.setattr(conv_pointwise, "MIN_PIXELS", 0)  # a 14x15 plane would go to the BLAS
    return count_pointwise_calls(m)


def _blas_pointwise(m):
    m.setattr(conv_pointwise, "MAX_CHANNELS", 0)
    return _count_calls(m, threads, "matmul")


def _generic(m):
    return _count_calls(m, nn, "conv_nobias")


# (path, its set-up, x shape, w shape, conv attrs)
PATHS = [
    ("direct", _direct, (2, 16, 10, 12), (44, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # 2 threads: blocks of 8
    ("direct-strided", _direct, (1, 6, 13, 11), (10, 6, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("direct-pieces", _direct_in_pieces, (2, 16, 10, 12), (20, 16, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("direct-row-bands", _direct_in_pieces, (2, 6, 33, 20), (10, 6, 3, 3), {"pads": [1, 1, 1, 1]}),  # 2 threads
    ("direct-stem", _direct, (2, 3, 17, 15), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("depthwise", _depthwise, (2, 12, 11, 13), (12, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 12}),
    ("depthwise-blocked", _depthwise_blocked, (2, 20, 11, 13), (20, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 20}),
    ("shifted", _shifted, (2, 5, 9, 11), (6, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("im2col", _im2col, (2, 4, 9, 9), (6, 4, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("im2col-grouped", _im2col, (1, 8, 9, 9), (6, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),
    ("im2col-one-image", _im2col, (1, 4, 9, 9), (6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),  # a 2-D GEMM: native rows
    ("skinny-pointwise", _skinny, (2, 24, 14, 15), (37, 24, 1, 1), {}),
    ("blas-pointwise", _blas_pointwise, (2, 24, 14, 15), (37, 24, 1, 1), {}),
    ("blas-pointwise-one-image", _blas_pointwise, (1, 24, 14, 15), (37, 24, 1, 1), {}),
    ("strided-pointwise", _generic, (2, 8, 9, 9), (12, 8, 1, 1), {"strides": [2, 2]}),
    ("tiny-pointwise", None, (1, 16, 4, 4), (32, 16, 1, 1), {}),  # <= TINY_OUTPUT: the unfused ops' kernels
    ("1-D", _generic, (2, 4, 13), (6, 4, 3), {"pads": [1, 1]}),
]
ACTS = [(None, {}), ("Relu", {}), ("Sigmoid", {}), ("Silu", {}), ("LeakyRelu", {"alpha": 0.07}),
        ("Clip", {"min": -0.5, "max": 0.75})]


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("act,act_attrs", ACTS, ids=str)
@pytest.mark.parametrize("path,setup,xs,ws,attrs", PATHS, ids=[p[0] for p in PATHS])
def test_residual_fused_equals_unfused(path, setup, xs, ws, attrs, act, act_attrs, n_threads, monkeypatch):
    """Each path's epilogue (native rows at two threads, every split taken however small) adds the residual of
    exactly its block: the unfused Conv, Add and activation's bits."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the numba paths are taken once it is loaded
    monkeypatch.setattr(threads, "_MIN_SPLIT_WORK", 0)
    first = ACTS.index((act, act_attrs)) % 2 == 1  # the residual as the Add's first operand for half of them
    g = _graph(xs, ws, attrs, act, act_attrs, residual_first=first)
    ref = _unfused(g, monkeypatch)
    calls = setup(monkeypatch) if setup else count_pointwise_calls(monkeypatch)
    fused = Session().compile(g)
    assert [(n.op, len(n.inputs)) for n in fused.graph.nodes] == [("FusedConv", 4)]
    assert _ops(ref) == sorted(["Conv", "Add"] + ([act] if act else []))
    out = _out_shape(xs, ws, attrs)
    for feeds in ({"x": _specials(xs, 997), "s": _specials(out)},
                  {"x": RNG.standard_normal(xs).astype(np.float32), "s": RNG.standard_normal(out).astype(np.float32)}):
        with threadpool_limits(n_threads, "blas"):  # both at n_threads: a BLAS GEMM's split can move its roundings
            got = fused.run(feeds)[fused.graph.outputs[0]]
            assert bool(calls) == (setup is not None), "the path under test did not run"
            want = ref.run(feeds)[ref.graph.outputs[0]]
        assert np.isnan(want).mean() < 0.5  # most values are numbers
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("residual_first", [False, True])
def test_a_resnet_block_is_one_fused_conv_per_conv(residual_first):
    """conv-relu, conv-relu, conv + shortcut -> relu: three FusedConvs, the last with the block input as its
    residual and the Relu after the sum as its activation."""
    g = GraphBuilder("block")
    x = g.input("x", "f32", [1, 8, 6, 6])
    y = x
    for i, act in enumerate(("Relu", "Relu", None)):
        y = g.op("Conv", y, g.constant((RNG.standard_normal((8, 8, 3, 3)) / 8).astype(np.float32), name=f"w{i}"),
                 g.constant(RNG.standard_normal(8).astype(np.float32), name=f"b{i}"), pads=[1, 1, 1, 1])
        if act:
            y = g.op(act, y)
    y = g.op("Relu", g.op("Add", *((x, y) if residual_first else (y, x))), name="out")
    g.output(y)
    compiled = Session().compile(g.build())
    nodes = compiled.graph.nodes
    assert [n.op for n in nodes] == ["FusedConv"] * 3
    assert [n.attrs["activation"] for n in nodes] == ["Relu", "Relu", "Relu"]
    assert nodes[-1].inputs[3] == "x" and len(nodes[0].inputs) == len(nodes[1].inputs) == 3
    xv = RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)
    w = [compiled.graph.constants[n.inputs[1]].value for n in nodes]
    b = [compiled.graph.constants[n.inputs[2]].value for n in nodes]
    a = {"strides": None, "pads": [1, 1, 1, 1], "dilations": None, "group": 1}
    h = xv
    for i in range(3):  # numpy's own float32 steps, from the generic Conv kernel
        h = KERNELS["Conv"](np, a, h, w[i], b[i])
        h = np.maximum(h, np.float32(0)) if i < 2 else np.maximum(h + xv, np.float32(0))
    np.testing.assert_allclose(compiled.run({"x": xv})["out"], h, rtol=1e-5, atol=1e-5)


def test_two_convs_summed_fuse_one_and_keep_the_other_as_the_residual(monkeypatch):
    """A downsampling block's sum of the main path's conv and the shortcut's conv: one of them takes the Add."""
    g = GraphBuilder("down")
    x = g.input("x", "f32", [1, 4, 8, 8])
    c1 = g.op("Conv", x, g.constant(RNG.standard_normal((6, 4, 1, 1)).astype(np.float32), name="w1"),
              g.constant(RNG.standard_normal(6).astype(np.float32), name="b1"))
    c2 = g.op("Conv", x, g.constant(RNG.standard_normal((6, 4, 3, 3)).astype(np.float32), name="w2"),
              g.constant(RNG.standard_normal(6).astype(np.float32), name="b2"), pads=[1, 1, 1, 1])
    g.output(g.op("Relu", g.op("Add", c2, c1), name="out"))
    graph = g.build()
    compiled = Session().compile(graph)
    assert sorted((n.op, len(n.inputs)) for n in compiled.graph.nodes) == [("Conv", 3), ("FusedConv", 4)]
    xv = _specials((1, 4, 8, 8))
    ref = _unfused(graph, monkeypatch)
    np.testing.assert_array_equal(compiled.run({"x": xv})["out"], ref.run({"x": xv})["out"])


@pytest.mark.parametrize("case", ["no-bias", "conv-read-elsewhere", "broadcast", "conv-is-an-output"])
def test_not_fused_where_the_sum_is_not_exactly_conv_plus_residual(case, monkeypatch):
    """Without a bias (the epilogue would add a -0.0 bias where the Conv adds none: the same values, but the rule
    stays Conv's own), with the conv read by another node or a graph output, or a broadcast residual: no
    residual fusion (the values stay the unfused ones)."""
    xs, ws = (1, 4, 6, 6), (5, 4, 3, 3)
    kw = {"bias": case != "no-bias", "rshape": (1, 5, 1, 1) if case == "broadcast" else (1, 5, 6, 6),
          "extra_reader": {"conv-read-elsewhere": "conv", "conv-is-an-output": "output"}.get(case)}
    g = _graph(xs, ws, {"pads": [1, 1, 1, 1]}, "Relu", **kw)
    compiled = Session().compile(g)
    assert all(len(n.inputs) <= 3 for n in compiled.graph.nodes if n.op == "FusedConv")
    assert "Add" in _ops(compiled)
    feeds = {"x": _specials(xs), "s": _specials(kw["rshape"])}
    ref = _unfused(g, monkeypatch)
    for name in compiled.graph.outputs:
        np.testing.assert_array_equal(compiled.run(feeds)[name], ref.run(feeds)[name])


def test_a_sum_read_twice_fuses_without_the_activation(monkeypatch):
    """The Add's result is read by the Relu and by another node: the FusedConv stops at the sum (Identity) and
    the Relu stays."""
    g = GraphBuilder("twice")
    x = g.input("x", "f32", [1, 3, 5, 5])
    s = g.input("s", "f32", [1, 4, 5, 5])
    c = g.op("Conv", x, g.constant(RNG.standard_normal((4, 3, 1, 1)).astype(np.float32), name="w"),
             g.constant(RNG.standard_normal(4).astype(np.float32), name="b"))
    add = g.op("Add", c, s, name="add")
    g.output(g.op("Relu", add, name="relu"))
    g.output(g.op("Neg", add, name="neg"))
    graph = g.build()
    compiled = Session().compile(graph)
    assert _ops(compiled) == ["FusedConv", "Neg", "Relu"]
    assert [n.attrs["activation"] for n in compiled.graph.nodes if n.op == "FusedConv"] == ["Identity"]
    feeds = {"x": _specials((1, 3, 5, 5)), "s": _specials((1, 4, 5, 5))}
    ref = _unfused(graph, monkeypatch)
    for name in ("relu", "neg"):
        np.testing.assert_array_equal(compiled.run(feeds)[name], ref.run(feeds)[name])


def test_generic_kernel_is_conv_then_add_then_activation():
    conv_attrs = {"strides": None, "pads": [1, 1, 1, 1], "dilations": None, "group": 1}
    a = {**conv_attrs, "activation": "Sigmoid"}
    x, w, b = _specials((1, 3, 6, 6)), RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), RNG.standard_normal(4)
    b = b.astype(np.float32)
    r = _specials((1, 4, 6, 6))
    conv = KERNELS["Conv"](np, conv_attrs, x, w, b)
    want = KERNELS["Sigmoid"](np, {}, KERNELS["Add"](np, {}, conv, r))
    np.testing.assert_array_equal(KERNELS["FusedConv"](np, a, x, w, b, r), want)
    ident = {**conv_attrs, "activation": "Identity"}
    np.testing.assert_array_equal(KERNELS["FusedConv"](np, ident, x, w, b, r), conv + r)


def test_a_residual_of_the_wrong_shape_is_refused_with_both_shapes_named():
    g = GraphBuilder("bad")
    x = g.input("x", "f32", [1, 3, 5, 5])
    s = g.input("s", "f32", [1, 4, 5, 6])
    g.output(g.op("FusedConv", x, g.constant(np.zeros((4, 3, 1, 1), np.float32), name="w"),
                  g.constant(np.zeros(4, np.float32), name="b"), s, activation="Relu", name="y"))
    with pytest.raises(GraphError, match=r"residual f32\[1, 4, 5, 6\]; expected the conv's output f32\[1, 4, 5, 5\]"):
        g.build()


@pytest.mark.parametrize("channels,fused", [(7, False), (8, True)])
def test_only_sums_of_large_outputs_are_fused(channels, fused, monkeypatch):
    """At the shipped MIN_RESIDUAL_OUTPUTS (32 K values): a 7x64x64 sum stays an Add (a small sum in cache cost as
    much fused as apart), an 8x64x64 one (32 K) is fused."""
    monkeypatch.setattr(FUSE, "MIN_RESIDUAL_OUTPUTS", 1 << 15)
    g = _graph((1, 4, 64, 64), (channels, 4, 1, 1), {}, "Relu")
    assert _ops(Session().compile(g)) == (["FusedConv"] if fused else ["Add", "Conv", "Relu"])
