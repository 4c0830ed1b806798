"""FusedConv: the compile pass that fuses Conv with its only reader activation, and its kernels.

The fused graph must give the unfused graph's values: the CPU kernel runs the same float32 steps
(Conv's GEMM and `y += b`, then the activation's own loop), so results are compared bitwise
(assert_array_equal, NaN == NaN), with NaN/Inf in the input, odd shapes, strides, pads, dilations and
groups. The unfused reference is the same graph compiled with the fusion pass switched off.
"""

from __future__ import annotations

import numpy as np
import pytest

import rlx_runtime.passes.pipeline as pipeline
from rlx_bake import BakeOptions, bake
from rlx_format import GraphBuilder
from rlx_runtime import Session, codegen
from rlx_runtime.backend import CPU
from rlx_runtime.kernels import KERNELS
from rlx_runtime.kernels.registry import prepare_attrs
from vector_code import MASKED_STORE, stores_back_a_select_of_the_load

RNG = np.random.default_rng(7)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # NaN inputs

ACTS = [("Relu", {}), ("Sigmoid", {}), ("Silu", {}), ("LeakyRelu", {"alpha": 0.07}),
        ("Clip", {"min": -0.5, "max": 0.75}), ("Clip", {"min": 0.0}), ("Clip", {"max": float("nan")}),
        ("Clip", {"min": float("nan"), "max": 1.0}), ("Clip", {"min": 1.0, "max": -1.0})]
# (x shape, w shape, conv attrs)
CONVS = [
    ((2, 3, 11, 7), (5, 3, 3, 3), {"pads": [1, 0, 2, 1], "strides": [2, 1]}),
    ((1, 4, 9, 9), (6, 2, 3, 3), {"group": 2, "dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    ((1, 6, 8, 5), (6, 1, 3, 3), {"group": 6, "pads": [1, 1, 1, 1]}),  # depthwise
    ((3, 4, 13), (7, 4, 1), {"strides": [3]}),  # 1-D, strided 1x1
    ((1, 2, 5, 4, 3), (3, 2, 2, 2, 1), {}),  # 3-D
    ((1, 8, 6, 6), (4, 8, 1, 1), {}),  # 1x1 as a plain GEMM, few outputs: the unfused ops' kernels
    ((1, 8, 40, 30), (5, 8, 1, 1), {}),  # 1x1 with more than TINY_OUTPUT outputs: the GEMM's epilogue
]


def _graph(xs, ws, attrs, act, act_attrs, bias=True, extra_reader=False):
    g = GraphBuilder("fc")
    x = g.input("x", "f32", list(xs))
    ins = [x, g.constant(RNG.standard_normal(ws).astype(np.float32), name="w")]
    if bias:
        ins.append(g.constant(RNG.standard_normal(ws[0]).astype(np.float32), name="b"))
    c = g.op("Conv", *ins, name="conv", **attrs)
    out = g.op(act, c, name="act", **act_attrs)
    g.output(out)
    if extra_reader:
        g.output(g.op("Neg", c, name="neg"))
    return g.build()


def _inputs(shape):
    x = RNG.standard_normal(shape).astype(np.float32) * 3
    flat = x.reshape(-1)
    flat[::7] = np.nan
    flat[1::11] = np.inf
    flat[2::13] = -np.inf
    flat[3::17] = -0.0
    return x


def _unfused(graph, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(pipeline, "FUSE_CONV", pipeline.Pass("fuse_conv", lambda g, ctx: pipeline.PassResult(g, False)))
        return Session().compile(graph)


def _ops(compiled):
    return sorted(n.op for n in compiled.graph.nodes)


@pytest.mark.parametrize("act,act_attrs", ACTS, ids=lambda v: str(v))
@pytest.mark.parametrize("xs,ws,attrs", CONVS, ids=lambda v: str(v))
def test_fused_equals_unfused(xs, ws, attrs, act, act_attrs, monkeypatch):
    g = _graph(xs, ws, attrs, act, act_attrs)
    fused, ref = Session().compile(g), _unfused(g, monkeypatch)
    assert _ops(fused) == ["FusedConv"] and _ops(ref) == sorted(["Conv", act])
    for feed in (_inputs(xs), RNG.standard_normal(xs).astype(np.float32)):
        np.testing.assert_array_equal(fused.run({"x": feed})["act"], ref.run({"x": feed})["act"])


@pytest.mark.parametrize("act,act_attrs", ACTS[:5], ids=lambda v: str(v))
def test_fused_without_bias(act, act_attrs, monkeypatch):
    xs, ws, attrs = CONVS[0]
    g = _graph(xs, ws, attrs, act, act_attrs, bias=False)
    fused, ref = Session().compile(g), _unfused(g, monkeypatch)
    assert _ops(fused) == ["FusedConv"]
    feed = _inputs(xs)
    np.testing.assert_array_equal(fused.run({"x": feed})["act"], ref.run({"x": feed})["act"])


def test_yolo_style_silu_is_fused_after_the_mul_sigmoid_fusion(monkeypatch):
    g = GraphBuilder("silu")
    x = g.input("x", "f32", [1, 3, 10, 10])
    c = g.op("Conv", x, g.constant(RNG.standard_normal((4, 3, 3, 3)).astype(np.float32), name="w"),
             name="conv", pads=[1, 1, 1, 1])
    g.output(g.op("Mul", c, g.op("Sigmoid", c, name="sig"), name="act"))
    graph = g.build()
    fused, ref = Session().compile(graph), _unfused(graph, monkeypatch)
    assert _ops(fused) == ["FusedConv"] and fused.graph.nodes[0].attrs["activation"] == "Silu"
    feed = _inputs((1, 3, 10, 10))
    np.testing.assert_array_equal(fused.run({"x": feed})["act"], ref.run({"x": feed})["act"])


def test_not_fused_when_the_conv_result_is_read_elsewhere():
    g = _graph((1, 3, 6, 6), (4, 3, 3, 3), {}, "Relu", {}, extra_reader=True)
    assert _ops(Session().compile(g)) == ["Conv", "Neg", "Relu"]


def test_not_fused_when_the_conv_result_is_a_graph_output():
    g = GraphBuilder("out")
    x = g.input("x", "f32", [1, 3, 6, 6])
    c = g.op("Conv", x, g.constant(np.ones((4, 3, 3, 3), np.float32), name="w"), name="conv")
    g.output(c)
    g.output(g.op("Relu", c, name="act"))
    assert _ops(Session().compile(g.build())) == ["Conv", "Relu"]


def test_clip_with_run_time_bounds_is_not_fused():
    g = GraphBuilder("clip")
    x = g.input("x", "f32", [1, 3, 6, 6])
    lo = g.input("lo", "f32", [])
    c = g.op("Conv", x, g.constant(np.ones((4, 3, 3, 3), np.float32), name="w"), name="conv")
    g.output(g.op("Clip", c, lo, name="act"))
    assert _ops(Session().compile(g.build())) == ["Clip", "Conv"]


def test_bake_keeps_plain_conv():
    """The fusion is compile-only: a baked file holds Conv and the activation, readable by older runtimes."""
    g = _graph((1, 3, 6, 6), (4, 3, 3, 3), {}, "Relu", {})
    rf, _ = bake(g, {}, BakeOptions.from_profile("exact"))
    assert sorted(n.op for n in rf.graph.nodes) == ["Conv", "Relu"]


@pytest.mark.parametrize("act,act_attrs", ACTS, ids=lambda v: str(v))
def test_generic_kernel_is_conv_then_activation(act, act_attrs):
    """The kernel every other backend runs: the backend's Conv, then its activation kernel."""
    xs, ws, attrs = CONVS[1]
    a = {"strides": None, "dilations": None, "pads": None, "group": 1, "alpha": 0.01, "beta": 0.5, "min": None,
         "max": None,
         **attrs, **act_attrs, "activation": act}
    x, w = _inputs(xs), RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    want = CPU.kernel(act)(np, a, KERNELS["Conv"](np, a, x, w, b))
    np.testing.assert_array_equal(KERNELS["FusedConv"](np, a, x, w, b), want)
    np.testing.assert_array_equal(CPU.kernel("FusedConv")(np, a, x, w, b), want)


@pytest.mark.parametrize("dtype", ["f64", "f16"])
def test_other_float_dtypes_match_unfused(dtype, monkeypatch):
    g = GraphBuilder("wide")
    np_t = {"f64": np.float64, "f16": np.float16}[dtype]
    x = g.input("x", dtype, [1, 3, 7, 7])
    c = g.op("Conv", x, g.constant(RNG.standard_normal((4, 3, 3, 3)).astype(np_t), name="w", dtype=dtype),
             g.constant(RNG.standard_normal(4).astype(np_t), name="b", dtype=dtype), name="conv", strides=[2, 2])
    g.output(g.op("Silu", c, name="act"))
    graph = g.build()
    fused, ref = Session().compile(graph), _unfused(graph, monkeypatch)
    assert _ops(fused) == ["FusedConv"]
    feed = _inputs((1, 3, 7, 7)).astype(np_t)
    np.testing.assert_array_equal(fused.run({"x": feed})["act"], ref.run({"x": feed})["act"])


def test_empty_batch():
    g = _graph((0, 3, 6, 6), (4, 3, 3, 3), {}, "Silu", {})
    assert Session().compile(g).run({"x": np.zeros((0, 3, 6, 6), np.float32)})["act"].shape == (0, 4, 4, 4)


@pytest.mark.parametrize("xs,ws,group", [((1, 64, 10, 10), (300, 64, 3, 3), 1),  # rows split: each its own bias
                                         ((1, 16, 64, 64), (32, 16, 3, 3), 1),   # columns split
                                         ((3, 16, 24, 24), (32, 16, 3, 3), 1),   # images split
                                         ((4, 32, 24, 24), (64, 8, 3, 3), 4)])   # images split, 4 groups
@pytest.mark.parametrize("act", ["Sigmoid", "LeakyRelu", "Relu"])
def test_fused_equals_unfused_when_the_gemm_is_split_over_two_threads(xs, ws, group, act, monkeypatch):
    from threadpoolctl import threadpool_limits

    g = _graph(xs, ws, {"pads": [1, 1, 1, 1], "group": group}, act, {"alpha": 0.1} if act == "LeakyRelu" else {})
    fused, ref = Session().compile(g), _unfused(g, monkeypatch)
    feed = RNG.standard_normal(xs).astype(np.float32)  # finite: a NaN input makes most conv outputs NaN
    with threadpool_limits(limits=2, user_api="blas"):
        np.testing.assert_array_equal(fused.run({"x": feed})["act"], ref.run({"x": feed})["act"])



def _hard_swish_graph(swap_mul=False, swap_add=False, swap_outer=False, clip=(0.0, 1.0), alpha=1 / 6, beta=0.5,
                      extra_reader=None):
    """Conv -> Mul(alpha) -> Add(0.5) -> Clip(0, 1) -> Mul with the conv output: HardSwish as the ONNX import lowers
    it, with the commutative operands in either order."""
    g = GraphBuilder("hs")
    x = g.input("x", "f32", [2, 3, 9, 11])
    c = g.op("Conv", x, g.constant(RNG.standard_normal((5, 3, 3, 3)).astype(np.float32), name="w"),
             g.constant(RNG.standard_normal(5).astype(np.float32), name="b"), name="conv", pads=[1, 1, 1, 1])
    a_c = g.constant(np.array(alpha, np.float32), name="alpha")
    b_c = g.constant(np.array(beta, np.float32), name="beta")
    m = g.op("Mul", *((a_c, c) if swap_mul else (c, a_c)), name="m")
    s = g.op("Add", *((b_c, m) if swap_add else (m, b_c)), name="s")
    h = g.op("Clip", s, name="h", min=clip[0], max=clip[1])
    g.output(g.op("Mul", *((h, c) if swap_outer else (c, h)), name="act"))
    if extra_reader:
        g.output(g.op("Neg", extra_reader, name="neg"))
    return g.build()


@pytest.mark.parametrize("swaps", [(False, False, False), (True, True, True), (True, False, True)])
@pytest.mark.parametrize("alpha,beta", [(1 / 6, 0.5), (0.2, 0.375)])
def test_hard_swish_fuses_with_the_unfused_values(swaps, alpha, beta, monkeypatch):
    graph = _hard_swish_graph(*swaps, alpha=alpha, beta=beta)
    fused, ref = Session().compile(graph), _unfused(graph, monkeypatch)
    assert _ops(fused) == ["FusedConv"] and fused.graph.nodes[0].attrs["activation"] == "HardSwish"
    assert not fused.graph.constants.keys() & {"alpha", "beta"}  # the fused-away scalars are dropped
    for feed in (_inputs((2, 3, 9, 11)), RNG.standard_normal((2, 3, 9, 11)).astype(np.float32) * 4):
        np.testing.assert_array_equal(fused.run({"x": feed})["act"], ref.run({"x": feed})["act"])


def test_hard_swish_kernels_give_the_unfused_values(monkeypatch):
    """Both FusedConv kernels (the CPU one and the generic one other backends run: the backend's Conv, then the
    fused ops' own kernels) on the attrs the fusion wrote."""
    graph = _hard_swish_graph()
    fused, ref = Session().compile(graph), _unfused(graph, monkeypatch)
    node = fused.graph.nodes[0]
    w, b = (fused.graph.constants[n].value for n in node.inputs[1:])
    a = prepare_attrs("FusedConv", node.attrs)
    for feed in (_inputs((2, 3, 9, 11)), RNG.standard_normal((2, 3, 9, 11)).astype(np.float32) * 4):
        want = ref.run({"x": feed})["act"]
        np.testing.assert_array_equal(KERNELS["FusedConv"](np, a, feed, w, b), want)
        np.testing.assert_array_equal(CPU.kernel("FusedConv")(np, a, feed, w, b), want)


@pytest.mark.parametrize("kw", [{"clip": (0.0, 2.0)}, {"clip": (-1.0, 1.0)}, {"extra_reader": "m"},
                                {"extra_reader": "conv"}, {"extra_reader": "h"}, {"extra_reader": "s"}])
def test_hard_swish_not_fused_when_it_is_not_exactly_that(kw, monkeypatch):
    graph = _hard_swish_graph(**kw)
    compiled, ref = Session().compile(graph), _unfused(graph, monkeypatch)
    assert not any(n.attrs.get("activation") == "HardSwish" for n in compiled.graph.nodes)
    feed = RNG.standard_normal((2, 3, 9, 11)).astype(np.float32) * 4
    np.testing.assert_array_equal(compiled.run({"x": feed})["act"], ref.run({"x": feed})["act"])


def test_onnx_hard_swish_after_conv_matches_onnxruntime(tmp_path):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from rlx_bake.onnx import import_onnx

    w = RNG.standard_normal((6, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["y"])]
    g = helper.make_graph(nodes, "hs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    x = (RNG.standard_normal((1, 3, 8, 8)) * 3).astype(np.float32)
    ref = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    graph, weights = import_onnx(tmp_path / "m.onnx")
    rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
    compiled = Session().compile(rf)
    assert [n.attrs.get("activation") for n in compiled.graph.nodes] == ["HardSwish"]
    # the conv sums in another order than onnxruntime's MLAS: float32 rounding apart, as the conv-path tests allow
    np.testing.assert_allclose(compiled.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("act,act_attrs", [("Sigmoid", {}), ("Relu", {}), ("Clip", {"min": 0.0, "max": 1.0}),
                                            ("LeakyRelu", {"alpha": 0.07}), ("Silu", {})], ids=str)
@pytest.mark.parametrize("xs,ws,path", [((1, 144, 1, 1), (576, 144, 1, 1), "pixel"),  # a squeeze-excite conv
                                        ((1, 16, 1, 1), (8, 16, 1, 1), "pixel"),
                                        ((2, 8, 16, 16), (8, 8, 1, 1), "unfused"),  # exactly TINY_OUTPUT outputs
                                        ((2, 8, 16, 17), (8, 8, 1, 1), "epilogue"),
                                        ((1, 144, 1, 1), (576, 144, 3, 3), "epilogue")],  # not pointwise
                         ids=str)
def test_small_pointwise_convs_take_the_unfused_kernels(xs, ws, path, act, act_attrs, monkeypatch):
    """Pointwise convs of at most TINY_OUTPUT outputs apply the activation as the unfused ops' own kernels (more
    than one pixel: the generic FusedConv), or, one image's single pixel, as conv_kernels.pixel_conv's epilogue;
    either with the unfused graph's values."""
    from rlx_runtime import conv_kernels
    from rlx_runtime.kernels import nn
    calls = []
    real, real_pixel = nn._unfused_activation, conv_kernels.pixel_conv
    monkeypatch.setattr(nn, "_unfused_activation", lambda *a: calls.append("unfused") or real(*a))
    monkeypatch.setattr(conv_kernels, "pixel_conv", lambda *a: calls.append("pixel") or real_pixel(*a))
    attrs = {"pads": [1, 1, 1, 1]} if ws[2] == 3 else {}
    g = _graph(xs, ws, attrs, act, act_attrs)
    x = _inputs(xs)
    compiled = Session().compile(g)
    assert "FusedConv" in compiled.plan_ops()
    fused = compiled.run({"x": x})["act"]
    assert calls == ([] if path == "epilogue" else [path])
    np.testing.assert_array_equal(fused, _unfused(g, monkeypatch).run({"x": x})["act"])


def test_the_epilogue_follows_a_new_bias():
    """The epilogue object is kept per plan step and bias array: a different bias (a run-time param set anew) must
    be applied, not the first one."""
    from rlx_runtime.kernels import nn
    a = prepare_attrs("FusedConv", {"strides": [1, 1], "pads": [1, 1, 1, 1], "group": 1, "activation": "Sigmoid",
                                    "min": None, "max": None, "alpha": 0.0, "beta": 0.5, "kernel_shape": [3, 3],
                                    "dilations": [1, 1]})
    x = RNG.standard_normal((1, 4, 30, 30)).astype(np.float32)
    w = RNG.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b1, b2 = (RNG.standard_normal(6).astype(np.float32) for _ in range(2))
    first = nn._fused_conv_cpu(np, a, x, w, b1)
    second = nn._fused_conv_cpu(np, a, x, w, b2)
    np.testing.assert_array_equal(second, nn._fused_conv_cpu(np, dict(a, _epilogue=None), x, w, b2))
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("act,kw", [("Relu", {}), ("LeakyRelu", {"alpha": 0.07}), ("Clip", {"lo": 0.0, "hi": 6.0}),
                                    ("Clip", {"lo": -0.0, "hi": 0.0}), ("Clip", {"lo": np.nan, "hi": 1.0}),
                                    ("Clip", {"lo": None, "hi": -0.0}), ("HardSwish", {"alpha": 1.0, "beta": -0.0})],
                         ids=str)
def test_the_numba_epilogue_gives_the_unfused_kernels_bits(act, kw):
    """Bit for bit, signed zeros included (assert_array_equal takes -0.0 == 0.0): numpy's maximum(v, 0) of -0.0 is
    0.0, and a Clip bound ties the same way."""
    from rlx_runtime.conv_kernels import bias_activation
    y = _inputs((2, 5, 61)).reshape(2, 5, 61)
    y.reshape(-1)[5::9] = -0.0
    lo, hi = kw.get("lo"), kw.get("hi")
    ep = bias_activation(None, act, kw.get("alpha", 0.0), lo, hi, beta=kw.get("beta", 0.5))
    got = y.copy()
    ep(got, 0, 2, 0, 5, 0, 61)
    if act == "HardSwish":
        t = np.float32(kw["beta"]) + y * np.float32(kw["alpha"])
        want = y * KERNELS["Clip"](np, {"min": 0.0, "max": 1.0}, t)
    else:
        want = KERNELS[act](np, {"alpha": kw.get("alpha"), "min": lo, "max": hi}, y)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("act", ["Relu", "LeakyRelu"])
def test_the_epilogue_without_a_bias_stores_whole_vectors(act):
    """Relu and LeakyRelu with no bias to add (a residual conv's, whose bias went in with the residual; a conv
    without one) keep every store unmasked: where one side of the select stored back the value just loaded, LLVM's
    x86 back end made the loop a masked store of the other side (vmaskmovps on AVX2: 6.5x slower on Zen 3, ~3% of
    a ResNet-50 forward)."""
    from rlx_format.numba_setup import numba
    from rlx_runtime.conv_kernels import ACTIVATION_CODES, activate
    code = ACTIVATION_CODES[act]

    @numba.njit(error_model="numpy", nogil=True)
    def no_bias(flat, count, alpha):  # the activation a literal: the other activations' loops compile away
        activate(flat, 0, count, np.float32(-0.0), code, alpha, alpha, False, alpha, False, alpha)

    y = np.array([-2.0, -0.0, 0.0, np.nan, 3.0] * 7, np.float32)
    want = KERNELS[act](np, {"alpha": 0.25}, y)
    no_bias(y, y.size, np.float32(0.25))
    np.testing.assert_array_equal(y.view(np.uint32), want.view(np.uint32))
    asm = no_bias.inspect_asm(no_bias.signatures[0])
    assert not MASKED_STORE.findall(asm)
    assert stores_back_a_select_of_the_load(no_bias.inspect_llvm(no_bias.signatures[0])) == 0


@pytest.mark.parametrize("numba_loaded", [False, True])
@pytest.mark.parametrize("xs,ws,attrs", [CONVS[0], CONVS[2], CONVS[6]], ids=str)
def test_relu_fused_conv_before_and_after_numba_loads(xs, ws, attrs, numba_loaded, monkeypatch):
    """Before numba is loaded a Relu FusedConv runs numpy passes, after it the numba epilogue: the same bits."""
    from rlx_runtime.kernels import nn
    g = _graph(xs, ws, attrs, "Relu", {})
    ref = _unfused(g, monkeypatch)
    calls = []
    real = nn._conv_nobias_cpu
    monkeypatch.setattr(nn, "_numba_loaded", lambda: numba_loaded)
    monkeypatch.setattr(nn, "_conv_nobias_cpu", lambda a, x, w, ep=None: calls.append(ep) or real(a, x, w, ep))
    monkeypatch.setattr(codegen, "BIND", False)  # the registered kernel's own paths (test_bound_kernels.py: bound)
    fused = Session().compile(g)
    for feed in (_inputs(xs), RNG.standard_normal(xs).astype(np.float32)):
        want = ref.run({"x": feed})["act"]
        calls.clear()
        np.testing.assert_array_equal(fused.run({"x": feed})["act"].view(np.uint32), want.view(np.uint32))
        assert calls and all((ep is not None) == numba_loaded for ep in calls)
