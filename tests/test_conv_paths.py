"""The CPU conv paths beside im2col + GEMM, checked against onnxruntime, the im2col path, float64 and the
FusedConv contract (fused == unfused, bit for bit):

- stride-1 convs as one GEMM per kernel offset over shifted views of the padded input (conv_shifted.py);
  the size thresholds that pick it are lowered in most tests (so small shapes take it), and one test checks
  which real shapes take it at the shipped thresholds;
- depthwise convs, and dense convs with few weights, by a numba kernel over stride phases (conv_taps.py,
  conv_kernels.tap_planes);
- pointwise convs straight to the GEMM (nn._conv_nobias_cpu).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from threadpoolctl import threadpool_limits
from exact_fma import fma32

import rlx_runtime.passes.pipeline as pipeline
from rlx_format import GraphBuilder
from rlx_runtime import Session, conv_direct, conv_shifted, conv_taps
from rlx_runtime.kernels import nn

RNG = np.random.default_rng(5)
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript exporter
# (x shape, w shape, conv attrs): asymmetric pads, dilation, batch, non-square kernels and inputs, no pads
CASES = [
    ((1, 5, 9, 11), (4, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 8, 13), (6, 3, 3, 3), {"pads": [0, 2, 1, 0]}),
    ((1, 4, 12, 12), (3, 4, 3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 2, 10, 9), (5, 2, 5, 5), {"pads": [2, 2, 2, 2]}),
    ((1, 3, 7, 16), (2, 3, 1, 3), {"pads": [0, 1, 0, 1], "dilations": [1, 3]}),
    ((1, 3, 9, 9), (4, 3, 3, 3), {}),  # no padding: the output is smaller than the input
]


def _count_calls(monkeypatch, module, name: str) -> list:
    """Wrap module.name so that each call appends to the returned list (which path a conv took)."""
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.fixture
def split_small(monkeypatch):
    """Split work over the threads however small (these tests' shapes are below the shipped threshold)."""
    from rlx_runtime import threads
    monkeypatch.setattr(threads, "_MIN_SPLIT_WORK", 0)


@pytest.fixture
def always_shifted(monkeypatch):
    monkeypatch.setattr(conv_direct, "MAX_INNER", 0)  # these small convs would take the direct path (numba loaded)
    monkeypatch.setattr(conv_shifted, "MIN_COLUMN_BYTES", 0)
    monkeypatch.setattr(conv_shifted, "MIN_OUT_WIDTH", 1)
    monkeypatch.setattr(conv_shifted, "WITH_NATIVE_POOL", True)  # its own 2-thread chunks are tested too
    return _count_calls(monkeypatch, conv_shifted, "conv2d_shifted")


def _onnx_conv(xs, w, b, attrs) -> bytes:
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    g = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(xs))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def _rlx_conv(xs, w, b, attrs, act=None):
    g = GraphBuilder("c")
    x = g.input("x", "f32", list(xs))
    y = g.op("Conv", x, g.constant(w, name="w"), g.constant(b, name="b"), name="conv", **attrs)
    g.output(g.op(act, y, name="act") if act else y)
    return g.build()


def _check_against_onnxruntime(xs, w, b, attrs, calls: list) -> None:
    x = RNG.standard_normal(xs).astype(np.float32)
    ref = ort.InferenceSession(_onnx_conv(xs, w, b, attrs), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = Session().compile(_rlx_conv(xs, w, b, attrs)).run({"x": x})["conv"]
    assert calls, "the path under test did not run"
    assert got.shape == ref[0].shape
    np.testing.assert_allclose(got, ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xs,ws,attrs", CASES, ids=str)
def test_matches_onnxruntime(xs, ws, attrs, always_shifted):
    w = RNG.standard_normal(ws).astype(np.float32)
    _check_against_onnxruntime(xs, w, RNG.standard_normal(ws[0]).astype(np.float32), attrs, always_shifted)


@pytest.mark.parametrize("xs,ws,attrs", CASES[:3], ids=str)
def test_agrees_with_im2col_and_float64(xs, ws, attrs, always_shifted, monkeypatch):
    a = {"strides": None, "dilations": None, "pads": None, "group": 1, **attrs}
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    got = nn._conv_nobias_cpu(a, x, w)
    assert always_shifted
    exact = nn._conv_nobias_cpu(a, x.astype(np.float64), w.astype(np.float64))  # float64: im2col
    monkeypatch.setattr(conv_shifted, "MIN_COLUMN_BYTES", 1 << 62)
    im2col = nn._conv_nobias_cpu(a, x, w)
    assert len(always_shifted) == 1
    bound = np.abs(x).max() * np.abs(w).sum(axis=(1, 2, 3)).max() * 1e-6
    assert np.abs(got - exact).max() <= bound and np.abs(im2col - exact).max() <= bound


def _unfused(graph, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(pipeline, "FUSE_CONV", pipeline.Pass("fuse_conv", lambda g, ctx: pipeline.PassResult(g, False)))
        return Session().compile(graph)


def _assert_fused_gives_the_unfused_bits(graph, xs, threads, monkeypatch) -> None:
    """The graph's Conv + activation compiles to one FusedConv whose values, NaN and -Inf inputs included, are
    the unfused ops' bit for bit at `threads` threads."""
    fused, ref = Session().compile(graph), _unfused(graph, monkeypatch)
    assert [n.op for n in fused.graph.nodes] == ["FusedConv"]
    x = RNG.standard_normal(xs).astype(np.float32)
    x.reshape(-1)[::29] = np.nan
    x.reshape(-1)[3::31] = -np.inf
    with threadpool_limits(threads, "blas"):
        np.testing.assert_array_equal(fused.run({"x": x})["act"], ref.run({"x": x})["act"])


def _assert_one_and_two_threads_agree(compiled, xs) -> None:
    x = RNG.standard_normal(xs).astype(np.float32)
    with threadpool_limits(1, "blas"):
        one = compiled.run({"x": x})["conv"]
    with threadpool_limits(2, "blas"):
        two = compiled.run({"x": x})["conv"]
    np.testing.assert_array_equal(two, one)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("act", ["Silu", "Relu", "Sigmoid"])
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_equals_unfused(act, threads, always_shifted, split_small, monkeypatch):
    """The FusedConv epilogue runs on each finished block of rows (several threads at 2): the values must be
    the unfused Conv + activation's, bit for bit, NaN and Inf included."""
    xs, ws, attrs = (1, 6, 23, 30), (8, 6, 3, 3), {"pads": [1, 1, 1, 1]}
    g = _rlx_conv(xs, RNG.standard_normal(ws).astype(np.float32), RNG.standard_normal(8).astype(np.float32),
                  attrs, act)
    fused, ref = Session().compile(g), _unfused(g, monkeypatch)
    assert [n.op for n in fused.graph.nodes] == ["FusedConv"]
    x = RNG.standard_normal(xs).astype(np.float32)
    x.reshape(-1)[::37] = np.nan
    x.reshape(-1)[5::41] = np.inf
    with threadpool_limits(threads, "blas"):
        np.testing.assert_array_equal(fused.run({"x": x})["act"], ref.run({"x": x})["act"])
    assert always_shifted


def test_two_threads_agree_with_one(always_shifted, split_small):
    xs, ws = (2, 16, 40, 37), (24, 16, 3, 3)
    g = _rlx_conv(xs, RNG.standard_normal(ws).astype(np.float32), RNG.standard_normal(24).astype(np.float32),
                  {"pads": [1, 1, 1, 1]})
    c = Session().compile(g)
    x = RNG.standard_normal(xs).astype(np.float32)
    with threadpool_limits(1, "blas"):
        one = c.run({"x": x})["conv"]
    with threadpool_limits(2, "blas"):
        two = c.run({"x": x})["conv"]
    np.testing.assert_allclose(two, one, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("xs,ws,attrs,taken", [
    ((1, 192, 40, 40), (64, 192, 3, 3), {"pads": [1, 1, 1, 1]}, True),  # the YOLO-like neck conv
    ((1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}, True),  # ResNet-50's first stage
    ((1, 512, 7, 7), (512, 512, 3, 3), {"pads": [1, 1, 1, 1]}, False),  # narrow output: im2col measured faster
    ((1, 192, 40, 40), (64, 192, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}, False),
    ((1, 192, 40, 40), (64, 96, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}, False),
    ((1, 192, 40, 40), (64, 192, 1, 1), {}, False),  # 1x1: the input already is the column matrix
    ((1, 16, 40, 40), (16, 16, 3, 3), {"pads": [1, 1, 1, 1]}, False),  # small columns
])
def test_which_shapes_take_the_path(xs, ws, attrs, taken):
    a = {"strides": [1, 1], "group": 1, **attrs}
    out_sp = [nn.window_count(xs[2 + i], ws[2 + i], a["strides"][i], 1, a["pads"][i] if "pads" in a else 0,
                              a["pads"][i + 2] if "pads" in a else 0) for i in range(2)]
    assert conv_shifted.use_shifted(xs, np.float32, np.zeros(ws, np.float32), a["strides"], a["group"], out_sp) is taken
    assert not conv_shifted.use_shifted(xs, np.float64, np.zeros(ws), a["strides"], a["group"], out_sp)


@pytest.mark.parametrize("path", ["shifted", "direct"])
def test_real_exported_model_matches_onnxruntime(path, tmp_path, monkeypatch):
    """A torch export whose two 3x3 convs take the path at the shipped thresholds (the shifted one without the
    direct one, which numba being loaded makes the first choice): onnxruntime's values."""
    torch = pytest.importorskip("torch")
    from rlx_bake import BakeOptions, bake
    from rlx_bake.onnx import import_onnx

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.SiLU(),
                              torch.nn.Conv2d(64, 32, 3, padding=2, dilation=2), torch.nn.ReLU()).eval()
    x = torch.randn(1, 64, 48, 44)
    path = tmp_path / "m.onnx"
    torch.onnx.export(net, (x,), str(path), dynamo=False, opset_version=17)
    name = onnx.load(str(path)).graph.input[0].name
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {name: x.numpy()})[0]
    rf, _ = bake(*import_onnx(path), BakeOptions.from_profile("exact"))
    calls = (_count_calls(monkeypatch, conv_shifted, "conv2d_shifted") if path == "shifted"
             else count_direct_calls(monkeypatch))
    if path == "shifted":
        monkeypatch.setattr(conv_direct, "MAX_INNER", 0)
    with threadpool_limits(1, "blas"):  # at 2 threads, with numba loaded, im2col's GEMM is taken instead
        out = Session().compile(rf).run({name: x.numpy()})
    assert len(calls) == 2
    np.testing.assert_allclose(next(iter(out.values())), ref, rtol=1e-4, atol=1e-4)


def test_at_two_threads_with_the_native_pool_the_shifted_path_gives_way_to_im2col():
    """Its chunks would be Python jobs: at more than one thread, once numba is loaded (the native pool), a conv
    that takes the path at one thread takes im2col + GEMM instead (WITH_NATIVE_POOL)."""
    from rlx_format.numba_setup import numba  # noqa: F401 - loaded: the pool runs native jobs
    from rlx_runtime import threads
    x, w = np.zeros((1, 192, 40, 40), np.float32), np.zeros((64, 192, 3, 3), np.float32)
    assert threads._kernels() is not None
    with threadpool_limits(1, "blas"), threads.forward_threads():
        assert conv_shifted.use_shifted(x.shape, x.dtype, w, [1, 1], 1, [40, 40])
    with threadpool_limits(2, "blas"), threads.forward_threads():
        assert not conv_shifted.use_shifted(x.shape, x.dtype, w, [1, 1], 1, [40, 40])


# (x shape, kernel, conv attrs) of depthwise convs: strides 1-3, asymmetric pads, dilation, 1xk kernels, batch 2,
# widths that leave a scalar tail after the 32-lane vectors and outputs narrower than one vector
DEPTHWISE = [
    ((1, 8, 20, 20), (3, 3), {"pads": [1, 1, 1, 1]}),
    # rows of conv_kernels.MIN_ROW_WIDTH and up go straight into the output (AVX-512): a masked last vector of 29,
    # 13 or 28 columns, none (64), rows left after the groups of 4 (30, 13, 21 rows: 2, 1, 1), dilation
    ((1, 4, 30, 29), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 13, 64), (3, 3), {"pads": [1, 1, 1, 1]}),
    ((1, 5, 15, 90), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 3, 21, 60), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((2, 5, 17, 23), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 6, 33, 31), (5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),
    ((1, 4, 14, 15), (3, 3), {"pads": [0, 2, 1, 0], "strides": [1, 2]}),
    ((1, 3, 19, 19), (3, 3), {"pads": [2, 2, 2, 2], "dilations": [2, 2]}),
    ((1, 3, 21, 22), (3, 3), {"pads": [3, 1, 2, 3], "dilations": [2, 3], "strides": [3, 2]}),
    ((1, 7, 9, 70), (1, 5), {"pads": [0, 2, 0, 2]}),
    ((1, 2, 6, 5), (3, 3), {}),
]


def _assert_taps_summed_in_order(x, w, attrs) -> None:
    """The CPU conv of x and w (finite) equals, bit for bit, its products added by fma in (input channel, ky, kx)
    order from 0.0 in float32, written out in numpy over the zero-padded input (a depthwise conv: one channel per
    output)."""
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], **attrs}
    got = nn._conv_nobias_cpu(a, x, w)
    (sh, sw), (dh, dw), p = a["strides"], a["dilations"], a["pads"]
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    oh, ow = got.shape[2:]
    dense = a["group"] == 1
    want = np.zeros_like(got)
    for c in range(x.shape[1] if dense else 1):
        chans = slice(c, c + 1) if dense else slice(None)  # dense: channel c for every output
        for ky in range(w.shape[2]):
            for kx in range(w.shape[3]):
                win = xp[:, chans, ky * dh:ky * dh + sh * (oh - 1) + 1:sh, kx * dw:kx * dw + sw * (ow - 1) + 1:sw]
                want = fma32(w[:, c, ky, kx][None, :, None, None], win, want)
    np.testing.assert_array_equal(got, want)


def _depthwise(xs, k, attrs):
    c = xs[1]
    return (RNG.standard_normal((c, 1, *k)).astype(np.float32), RNG.standard_normal(c).astype(np.float32),
            {**attrs, "group": c})


@pytest.fixture(params=["phases", "blocked"])
def depthwise_calls(request, monkeypatch):
    """Each depthwise test runs with each kernel (count_taps_calls)."""
    return count_taps_calls(monkeypatch, request.param == "blocked")


@pytest.mark.parametrize("xs,k,attrs", DEPTHWISE, ids=str)
def test_depthwise_matches_onnxruntime(xs, k, attrs, depthwise_calls):
    _check_against_onnxruntime(xs, *_depthwise(xs, k, attrs), depthwise_calls)


@pytest.mark.parametrize("xs,k,attrs", DEPTHWISE[:10], ids=str)
def test_depthwise_sums_the_taps_in_order(xs, k, attrs, depthwise_calls):
    """Every output is the taps' products added by fma in (ky, kx) order from 0.0, in float32: the same bits as that
    sum written out in numpy over the zero-padded input."""
    w, _, attrs = _depthwise(xs, k, attrs)
    _assert_taps_summed_in_order(RNG.standard_normal(xs).astype(np.float32), w, attrs)
    assert depthwise_calls


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("act", ["Silu", "Relu", "Clip"])
@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_fused_equals_unfused(act, threads, depthwise_calls, split_small, monkeypatch):
    xs = (2, 24, 13, 41)
    w, b, attrs = _depthwise(xs, (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]})
    g = GraphBuilder("c")
    xin = g.input("x", "f32", list(xs))
    y = g.op("Conv", xin, g.constant(w, name="w"), g.constant(b, name="b"), name="conv", **attrs)
    g.output(g.op(act, y, name="act", **({"min": -0.5, "max": 0.5} if act == "Clip" else {})))
    _assert_fused_gives_the_unfused_bits(g.build(), xs, threads, monkeypatch)
    assert depthwise_calls


def test_depthwise_two_threads_give_the_same_bits(depthwise_calls, split_small):
    xs = (1, 64, 30, 30)
    w, b, attrs = _depthwise(xs, (3, 3), {"pads": [1, 1, 1, 1]})
    _assert_one_and_two_threads_agree(Session().compile(_rlx_conv(xs, w, b, attrs)), xs)


@pytest.mark.parametrize("ws,group,dtype,taken", [
    ((8, 1, 3, 3), 8, np.float32, True),
    ((16, 1, 3, 3), 8, np.float32, False),  # channel multiplier 2: im2col
    ((8, 2, 3, 3), 4, np.float32, False),  # grouped, not depthwise
    ((8, 1, 3, 3), 8, np.float64, False),
])
def test_which_convs_are_depthwise(ws, group, dtype, taken):
    assert conv_taps.use_depthwise((1, 8, 5, 5), dtype, np.zeros(ws, dtype), group) is taken


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("xs", [(1, 144, 1, 1), (3, 24, 7, 5)], ids=str)
@pytest.mark.parametrize("threads", [1, 2])
def test_pointwise_convs_match_onnxruntime_and_fused_equals_unfused(xs, threads, split_small, monkeypatch):
    """1x1 stride-1 unpadded convs go straight to one GEMM (a squeeze-excite block's 1x1-pixel convs, a batch of
    images): onnxruntime's values, and the fused epilogue gives the unfused bits."""
    o = 40
    w, b = RNG.standard_normal((o, xs[1], 1, 1)).astype(np.float32), RNG.standard_normal(o).astype(np.float32)
    x = RNG.standard_normal(xs).astype(np.float32)
    ref = ort.InferenceSession(_onnx_conv(xs, w, b, {}), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    g = _rlx_conv(xs, w, b, {}, "Sigmoid")
    fused, unfused = Session().compile(g), _unfused(g, monkeypatch)
    plain = Session().compile(_rlx_conv(xs, w, b, {}))
    monkeypatch.setattr(nn, "conv_nobias", lambda *a, **k: pytest.fail("the generic conv ran"))
    with threadpool_limits(threads, "blas"):
        np.testing.assert_allclose(plain.run({"x": x})["conv"], ref, rtol=1e-5, atol=1e-5)
        x.reshape(-1)[::13] = np.nan
        x.reshape(-1)[5::17] = np.inf
        np.testing.assert_array_equal(fused.run({"x": x})["act"], unfused.run({"x": x})["act"])


# ------------------------------------------------------ dense convs straight from the input's phases (conv_direct.py)
DIRECT = CASES + [
    ((2, 3, 33, 30), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),  # an RGB stem
    ((1, 3, 23, 20), (8, 3, 3, 3), {"pads": [0, 1, 2, 1], "strides": [2, 3]}),
    ((2, 3, 17, 23), (12, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 2, 9, 9), (9, 2, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # a ResNet stem's shape of window
    ((1, 2, 8, 40), (17, 2, 5, 5), {"pads": [0, 2, 1, 0], "strides": [3, 2]}),
    ((1, 2, 11, 11), (8, 2, 3, 3), {"pads": [2, 1, 2, 1], "strides": [2, 2], "dilations": [2, 3]}),
    ((1, 40, 12, 12), (20, 40, 3, 3), {"pads": [1, 1, 1, 1]}),  # 20 outputs: two blocks of 8 and a rest of 4
    ((2, 16, 10, 12), (44, 16, 3, 3), {"pads": [1, 1, 1, 1]}),  # split over two threads: channels 0-15, 16-43
    ((1, 6, 33, 20), (10, 6, 3, 3), {"pads": [1, 1, 1, 1]}),  # 33 output rows: two threads take rows 0-15, 16-32
]


@pytest.fixture(params=[False, True], ids=["gather", "channel-blocks"])
def direct_calls(request, monkeypatch):
    """The direct path's calls, with either kernel (conv_direct.CHANNEL_BLOCKS: on any CPU, though only CPUs
    without AVX-512 take the channel blocks by default)."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the path is taken once numba is loaded
    monkeypatch.setattr(conv_direct, "CHANNEL_BLOCKS", request.param)
    return count_direct_calls(monkeypatch)


@pytest.fixture
def direct_default_calls(monkeypatch):
    """The direct path's calls, with the CPU's kernel."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the path is taken once numba is loaded
    return count_direct_calls(monkeypatch)


@pytest.mark.parametrize("xs,ws,attrs", DIRECT + [
    ((1, 3, 224, 224), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]})], ids=str)  # MobileNetV3's stem
def test_direct_convs_sum_each_output_by_fma_in_order(xs, ws, attrs, direct_calls):
    """Every output is its products added by fma in (channel, ky, kx) order from 0.0, in float32: the same bits as
    that sum written out in numpy over the zero-padded input."""
    w = RNG.standard_normal(ws).astype(np.float32)
    _assert_taps_summed_in_order(RNG.standard_normal(xs).astype(np.float32), w, {"group": 1, **attrs})
    assert direct_calls


@pytest.mark.parametrize("xs,ws,attrs", DIRECT, ids=str)
def test_direct_convs_match_onnxruntime_and_sum_each_output_in_order(xs, ws, attrs, direct_calls, split_small):
    """Each output is its products added by fma in (channel, ky, kx) order from 0.0: within a dot product's
    rounding of the float64 value, onnxruntime's values, and the same bits at one and two threads."""
    w = RNG.standard_normal(ws).astype(np.float32)
    b = np.zeros(ws[0], np.float32)
    x = RNG.standard_normal(xs).astype(np.float32)
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1, **attrs}
    ort_out = ort.InferenceSession(_onnx_conv(xs, w, b, attrs),
                                   providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with threadpool_limits(1, "blas"):
        one = Session().compile(_rlx_conv(xs, w, b, attrs)).run({"x": x})["conv"]
    assert direct_calls, "the path under test did not run"
    with threadpool_limits(2, "blas"):
        two = Session().compile(_rlx_conv(xs, w, b, attrs)).run({"x": x})["conv"]
    np.testing.assert_array_equal(one, two)
    k = ws[2:]
    out = [nn.window_count(xs[2 + i], k[i], a["strides"][i], a["dilations"][i], a["pads"][i], a["pads"][i + 2])
           for i in range(2)]
    cols = nn._im2col(np, x.astype(np.float64), k, a["strides"], a["dilations"], a["pads"], out)
    cols = cols.reshape(xs[0], -1, out[0] * out[1])
    w64 = w.reshape(ws[0], -1).astype(np.float64)
    exact = (w64 @ cols).reshape(one.shape)
    bound = w64.shape[1] * np.finfo(np.float32).eps * (np.abs(w64) @ np.abs(cols)).reshape(one.shape)
    assert np.all(np.abs(one - exact) <= bound)
    assert np.all(np.abs(one - ort_out) <= 2 * bound)  # onnxruntime's values: each within a dot's rounding too


@pytest.mark.parametrize("piece_bytes", [1, 2240 * 7], ids=["row-by-row", "5-5-2-rows"])
def test_direct_convs_in_pieces_give_the_same_bits(piece_bytes, direct_calls, monkeypatch):
    """conv_direct.PIECE_BYTES cuts the grid into pieces of rows (each computed by every 8-channel block in
    turn): one row a piece, or for the 40-channel 3x3 case (grid rows of 4 x 40 x 14 bytes) pieces of 5, 5 and 2
    rows (and pieces within each thread's band of rows). The pieces change where the work goes, never a value."""
    for xs, ws, attrs in (DIRECT[-3], DIRECT[-7], DIRECT[-2], DIRECT[-1]):
        w = RNG.standard_normal(ws).astype(np.float32)
        x = RNG.standard_normal(xs).astype(np.float32)
        compiled = Session().compile(_rlx_conv(xs, w, RNG.standard_normal(ws[0]).astype(np.float32), attrs, "Relu"))
        whole = compiled.run({"x": x})["act"]
        with monkeypatch.context() as m:
            m.setattr(conv_direct, "PIECE_BYTES", piece_bytes)
            np.testing.assert_array_equal(compiled.run({"x": x})["act"], whole)
    assert direct_calls


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 40, 12, 12), (8, 40, 3, 3), {"pads": [1, 1, 1, 1]}),  # one vector of channels; 360 steps: 3 step ranges
    ((1, 6, 33, 20), (16, 6, 3, 3), {"pads": [1, 1, 1, 1]}),  # two vectors; 726 grid columns: 3 column ranges
    ((2, 17, 10, 12), (44, 17, 3, 3), {"pads": [1, 1, 1, 1]}),  # a block of 32 and one of 12; split by blocks
    ((1, 8, 38, 41), (72, 8, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2]}),  # 3 blocks, the last 8 wide
    ((1, 33, 7, 7), (64, 33, 3, 3), {"pads": [1, 1, 1, 1]}),  # a 7x7 plane: every grid row a masked transpose
], ids=str)
def test_the_channel_block_kernel_gives_the_gather_kernels_bits(xs, ws, attrs, threads, split_small, monkeypatch):
    """conv_direct.CHANNEL_BLOCKS (output channels in the vector lanes, simd.channels_f32) against gather_f32's
    kernel: the same fma chains in the same order, so the same bits, with a bias, an activation and a residual, at
    one and two threads, across its column and step ranges (conv_kernels.CHANNEL_COLUMNS, CHANNEL_STEPS) and
    blocks of 8, 16 and 32 channels."""
    from rlx_runtime import conv_kernels
    from rlx_runtime import threads as threads_mod
    w = RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    x = RNG.standard_normal(xs).astype(np.float32)
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1, **attrs}
    out = [nn.window_count(xs[2 + i], ws[2 + i], a["strides"][i], a["dilations"][i], a["pads"][i], a["pads"][i + 2])
           for i in range(2)]
    res = RNG.standard_normal((xs[0], ws[0], *out)).astype(np.float32)
    assert np.prod(ws[1:]) > conv_kernels.CHANNEL_STEPS or out[0] * (out[1] + 2) > conv_kernels.CHANNEL_COLUMNS
    ep = nn._epilogue(a, b, "Silu").with_residual(res.reshape(-1))
    results = []
    with threadpool_limits(threads, "blas"), threads_mod.forward_threads():
        for flag in (False, True):
            monkeypatch.setattr(conv_direct, "CHANNEL_BLOCKS", flag)
            plan = conv_direct.DirectPlan(xs, w, a["strides"], a["dilations"], a["pads"], out)
            assert plan.packed is flag
            for epilogue in (None, ep):
                results.append(conv_direct.run_direct(plan, x, epilogue))
    np.testing.assert_array_equal(results[2], results[0])
    np.testing.assert_array_equal(results[3], results[1])
    assert not np.array_equal(results[1], results[0])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Silu", "LeakyRelu"])
@pytest.mark.parametrize("threads", [1, 2])
def test_direct_fused_equals_unfused(act, threads, direct_calls, split_small, monkeypatch):
    xs, ws, attrs = DIRECT[-3]
    w = RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    _assert_fused_gives_the_unfused_bits(_rlx_conv(xs, w, b, attrs, act), xs, threads, monkeypatch)
    xs, ws, attrs = DIRECT[-2]  # and split over the threads (by channels, then by rows)
    w = RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    _assert_fused_gives_the_unfused_bits(_rlx_conv(xs, w, b, attrs, act), xs, threads, monkeypatch)
    xs, ws, attrs = DIRECT[-1]
    w = RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    _assert_fused_gives_the_unfused_bits(_rlx_conv(xs, w, b, attrs, act), xs, threads, monkeypatch)
    assert direct_calls


@pytest.mark.parametrize("xs,ws,group,dtype,grouped_epilogue,taken", [
    ((1, 64, 20, 20), (128, 64, 3, 3), 1, np.float32, False, True),
    ((1, 512, 7, 7), (512, 512, 3, 3), 1, np.float32, False, True),  # K = 4608: MAX_INNER
    ((1, 513, 7, 7), (512, 513, 3, 3), 1, np.float32, False, False),
    ((1, 64, 20, 20), (128, 64, 1, 1), 1, np.float32, False, False),  # pointwise: conv_pointwise's
    ((1, 64, 20, 20), (128, 32, 3, 3), 2, np.float32, False, False),  # grouped
    ((1, 64, 20, 20), (128, 64, 3, 3), 1, np.float64, False, False),
    ((1, 64, 20, 20), (128, 64, 3, 3), 1, np.float32, True, False)], ids=str)
def test_which_convs_take_the_direct_path(xs, ws, group, dtype, grouped_epilogue, taken):
    from rlx_runtime.conv_kernels import bias_activation
    ep = bias_activation(None, "Relu", 0.0, None, None, groups=2 if grouped_epilogue else 1)
    assert conv_direct.use_direct(xs, dtype, np.zeros(ws, dtype), group, ep) is taken


@pytest.mark.parametrize("avx512", [True, False])
@pytest.mark.parametrize("o", [16, 31, 32, 255])
def test_without_avx512_convs_of_32_outputs_and_more_take_the_channel_blocks(o, avx512, monkeypatch):
    from rlx_runtime import simd
    monkeypatch.setattr(simd, "AVX512", avx512)
    plan = conv_direct.DirectPlan((1, 8, 12, 12), np.zeros((o, 8, 3, 3), np.float32), (1, 1), (1, 1), (1, 1, 1, 1),
                                  (12, 12))
    assert plan.packed is (not avx512 and o >= 32)
    assert plan.wk.shape == ((-(-o // 32), 72 * 32) if plan.packed else (o, 72))


@pytest.mark.parametrize("xs,ws,strides,taken", [
    ((1, 32, 80, 80), (16, 32, 3, 3), (2, 2), "avx512"),  # inner 288: AVX2_STRIDED_GEMM_INNER
    ((1, 512, 14, 14), (31, 512, 3, 3), (2, 1), "avx512"),
    ((1, 32, 80, 80), (64, 32, 3, 3), (2, 2), True),  # 32 outputs and more: the channel blocks
    ((1, 512, 14, 14), (512, 512, 3, 3), (2, 1), True),
    ((1, 31, 80, 80), (16, 31, 3, 3), (2, 2), True),  # inner 279
    ((1, 3, 224, 224), (64, 3, 7, 7), (2, 2), True),  # a stem
    ((1, 512, 7, 7), (16, 512, 3, 3), (1, 1), True)], ids=str)
@pytest.mark.parametrize("avx512", [True, False])
def test_without_avx512_strided_convs_of_large_inner_size_and_few_outputs_take_the_gemm(xs, ws, strides, taken,
                                                                                     avx512, monkeypatch):
    from rlx_runtime import simd
    monkeypatch.setattr(simd, "AVX512", avx512)
    want = avx512 if taken == "avx512" else taken
    assert conv_direct.use_direct(xs, np.float32, np.zeros(ws, np.float32), 1, None, strides) is want
    assert conv_direct.use_direct(xs, np.float32, np.zeros(ws, np.float32), 1, None) is True  # stride 1


@pytest.mark.parametrize("avx512", [True, False])
def test_a_strided_conv_of_large_inner_size_matches_onnxruntime_on_either_path(avx512, monkeypatch):
    from rlx_runtime.kernels import nn
    xs, ws, attrs = (1, 40, 15, 13), (24, 40, 3, 3), {"pads": [1, 0, 1, 1], "strides": [2, 2]}
    monkeypatch.setattr("rlx_runtime.simd.AVX512", avx512)
    direct = _count_calls(monkeypatch, conv_direct, "run_direct")
    gemm = _count_calls(monkeypatch, nn, "_im2col_numba")
    w = (RNG.standard_normal(ws) / np.sqrt(40 * 9)).astype(np.float32)  # outputs ~N(0, 1), as a trained layer's
    _check_against_onnxruntime(xs, w, RNG.standard_normal(ws[0]).astype(np.float32), attrs, direct if avx512 else gemm)
    assert not (gemm if avx512 else direct)


# -------------------------------------------------------------- pointwise convs by simd.skinny_f32 (conv_pointwise.py)
# (x shape, outputs): a masked last vector and outputs not a multiple of 8 (210 pixels, 37 channels), two images,
# a 7x7 plane (49 pixels: split by output channels at 2 threads), a single 32-pixel vector, 512 input channels
# (pool_kernels.skinny_rows' panels of 64 columns: 200 pixels in four, the last one part of a vector)
POINTWISE = [((1, 24, 14, 15), 37), ((1, 512, 10, 20), 27), ((2, 16, 9, 9), 72), ((1, 96, 7, 7), 144),
             ((1, 5, 4, 8), 130)]


def test_the_pointwise_cases_cross_panels():
    from rlx_runtime.pool_kernels import panel_columns
    from rlx_runtime.simd import FEW_ROWS_UNIT as u  # panels are whole passes of the CPU's tile (48 or 24 columns)
    assert panel_columns(512) == 64 // u * u and panel_columns(16) == 2048 // u * u and panel_columns(5000) == u


@pytest.fixture
def pointwise_calls(monkeypatch):
    from rlx_format.numba_setup import numba  # noqa: F401 - the path is taken once numba is loaded
    from rlx_runtime import conv_pointwise
    monkeypatch.setattr(conv_pointwise, "MIN_PIXELS", 0)  # the small planes here would go to the BLAS
    monkeypatch.setattr(conv_pointwise, "AVX2_BLAS_PIXELS", 0)  # ...and without AVX-512 the 7x7 ones at one thread
    return count_pointwise_calls(monkeypatch)


def _count_path_calls(monkeypatch, module, per_call: str, prepare: str) -> list:
    """_count_calls of a conv path: its per-call function, or its job prepared for a bound step (made at the step's
    first call at each thread count, run then and at every later call)."""
    calls = _count_calls(monkeypatch, module, per_call)
    real = getattr(module, prepare)
    monkeypatch.setattr(module, prepare, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def count_pointwise_calls(monkeypatch) -> list:
    """The skinny pointwise path's calls (_count_path_calls)."""
    from rlx_runtime import conv_pointwise
    return _count_path_calls(monkeypatch, conv_pointwise, "pointwise", "prepare_pointwise")


def count_direct_calls(monkeypatch) -> list:
    """The direct path's calls (_count_path_calls): direct2d runs run_direct."""
    return _count_path_calls(monkeypatch, conv_direct, "run_direct", "PreparedDirect")


def count_taps_calls(monkeypatch, blocked: bool = False) -> list:
    """The depthwise path's calls (_count_path_calls), its kernel forced: the stride-phase one (taps2d runs
    run_taps) or, `blocked`, the channel-blocked one (run_blocked; on any CPU, though only AVX-512 takes it)."""
    monkeypatch.setattr(conv_taps, "use_blocked", lambda *a: blocked)
    if blocked:
        return _count_path_calls(monkeypatch, conv_taps, "run_blocked", "prepare_blocked")
    return _count_path_calls(monkeypatch, conv_taps, "run_taps", "prepare_taps")


@pytest.mark.parametrize("xs,o", POINTWISE, ids=str)
def test_skinny_pointwise_convs_match_onnxruntime_and_sum_each_dot_in_order(xs, o, pointwise_calls, split_small):
    """Each output is its products added by fma in order of the input channel from 0.0 (within a dot product's
    rounding of the float64 value), onnxruntime's values, and the same bits at one and two threads (split by
    pixels, or by blocks of output channels). Weights scaled as a trained layer's (outputs of unit size, so the
    two engines' different summation orders stay within the onnxruntime check's 1e-5)."""
    w = (RNG.standard_normal((o, xs[1], 1, 1)) / np.sqrt(xs[1])).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    _check_against_onnxruntime(xs, w, b, {}, pointwise_calls)
    x = RNG.standard_normal(xs).astype(np.float32)
    compiled = Session().compile(_rlx_conv(xs, w, b, {}))
    with threadpool_limits(1, "blas"):
        one = compiled.run({"x": x})["conv"]
    with threadpool_limits(2, "blas"):
        two = compiled.run({"x": x})["conv"]
    np.testing.assert_array_equal(one, two)
    x64 = x.reshape(xs[0], xs[1], -1).astype(np.float64)
    w64 = w.reshape(o, -1).astype(np.float64)
    exact = (w64 @ x64).reshape(one.shape) + b.reshape(1, -1, 1, 1)
    bound = (xs[1] + 1) * np.finfo(np.float32).eps * ((np.abs(w64) @ np.abs(x64)).reshape(one.shape)
                                                     + np.abs(b).reshape(1, -1, 1, 1))
    assert np.all(np.abs(one - exact) <= bound)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("act", ["Relu", "Sigmoid", "Silu", "LeakyRelu"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("xs,o", POINTWISE[:4], ids=str)
def test_skinny_pointwise_fused_equals_unfused(xs, o, act, threads, pointwise_calls, split_small, monkeypatch):
    w = RNG.standard_normal((o, xs[1], 1, 1)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    _assert_fused_gives_the_unfused_bits(_rlx_conv(xs, w, b, {}, act), xs, threads, monkeypatch)
    assert pointwise_calls


@pytest.mark.parametrize("xs,o,up_to", [
    ((1, 576, 7, 7), 96, 1),  # 2.7 M multiply-adds: the BLAS at one thread, this kernel split at more
    ((1, 1152, 7, 7), 192, 1 << 30),  # 10.8 M: AVX2_BLAS_ALWAYS
    ((2, 576, 7, 7), 96, 1 << 30),  # the images' too
    ((1, 96, 9, 11), 288, 1),  # 99 pixels
    ((1, 96, 10, 10), 288, 0),  # 100: AVX2_BLAS_PIXELS
    ((1, 240, 14, 14), 40, 0)], ids=str)
def test_without_avx512_small_planes_go_to_the_blas(xs, o, up_to, monkeypatch):
    from rlx_format.numba_setup import numba  # noqa: F401 - the choice is made once numba is loaded
    from rlx_runtime import conv_pointwise
    w = np.zeros((o, xs[1], 1, 1), np.float32)
    assert conv_pointwise.use_pointwise(xs, np.float32, w, None)
    monkeypatch.setattr("rlx_runtime.simd.AVX512", False)
    assert conv_pointwise.blas_up_to(xs, w) == up_to
    monkeypatch.setattr("rlx_runtime.simd.AVX512", True)
    assert conv_pointwise.blas_up_to(xs, w) == 0


@pytest.mark.parametrize("threads,skinny", [(1, False), (2, True)])
def test_a_small_plane_takes_the_blas_at_one_thread_and_this_kernel_split_at_more(threads, skinny, split_small,
                                                                                   monkeypatch):
    from rlx_format.numba_setup import numba  # noqa: F401 - the path is taken once numba is loaded
    monkeypatch.setattr("rlx_runtime.simd.AVX512", False)
    calls = count_pointwise_calls(monkeypatch)
    xs, o = (1, 96, 7, 7), 144
    w = (RNG.standard_normal((o, xs[1], 1, 1)) / np.sqrt(xs[1])).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    with threadpool_limits(threads, "blas"):
        _assert_fused_gives_the_unfused_bits(_rlx_conv(xs, w, b, {}, "Relu"), xs, threads, monkeypatch)
        _check_against_onnxruntime(xs, w, b, {}, [1])
    assert bool(calls) is skinny


def test_skinny_pointwise_clip_and_hard_swish_epilogues(pointwise_calls, monkeypatch):
    """The epilogue's other activations, on the block each 8-channel GEMM block leaves in cache."""
    from rlx_runtime.conv_kernels import bias_activation
    from rlx_runtime.conv_pointwise import pointwise
    x = RNG.standard_normal((2, 24, 70)).astype(np.float32) * 3
    w = RNG.standard_normal((37, 24)).astype(np.float32)
    b = RNG.standard_normal(37).astype(np.float32)
    plain = pointwise(w, x)
    for act, kw in [("Clip", {"lo": -0.5, "hi": 0.75}), ("HardSwish", {"alpha": 1 / 6})]:
        ep = bias_activation(b, act, kw.get("alpha", 0.0), kw.get("lo"), kw.get("hi"))
        want = plain.copy()
        ep(want, 0, 2, 0, 37, 0, 70)
        np.testing.assert_array_equal(pointwise(w, x, ep).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("xs,o,dtype,grouped,taken", [
    ((1, 24, 16, 16), 144, np.float32, False, True),
    ((1, 24, 14, 14), 144, np.float32, False, True),
    ((1, 96, 7, 7), 576, np.float32, False, True),  # MobileNetV3's last blocks
    ((1, 96, 6, 8), 576, np.float32, False, False),  # fewer pixels than MIN_PIXELS: the BLAS
    ((1, 256, 14, 14), 1024, np.float32, False, False),  # a small plane's large weight matrix: the BLAS
    ((1, 256, 16, 16), 1024, np.float32, False, True),
    ((1, 1152, 28, 28), 192, np.float32, False, True),
    ((1, 1153, 28, 28), 192, np.float32, False, False),  # more input channels than MAX_CHANNELS: the BLAS
    ((1, 144, 1, 1), 576, np.float32, False, False),  # a squeeze-excite conv: too few outputs
    ((1, 24, 16, 16), 144, np.float64, False, False),
    ((1, 24, 16, 16), 144, np.float32, True, False)], ids=str)  # a grouped epilogue: not this path's kind
def test_which_pointwise_convs_take_the_skinny_kernel(xs, o, dtype, grouped, taken):
    from rlx_runtime.conv_kernels import bias_activation
    from rlx_runtime.conv_pointwise import use_pointwise
    ep = bias_activation(None, "Relu", 0.0, None, None, groups=2 if grouped else 1)
    assert use_pointwise(xs, dtype, np.zeros((o, xs[1], 1, 1), dtype), ep) is taken


@pytest.mark.parametrize("path,xs,ws,attrs", [
    ("direct_default_calls", (1, 8, 20, 20), (16, 8, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),  # then im2col
    ("pointwise_calls", (1, 24, 14, 14), (144, 24, 1, 1), {})], ids=str)  # then one BLAS GEMM
def test_without_numba_the_numba_conv_paths_give_way(path, xs, ws, attrs, request, monkeypatch):
    import sys
    calls = request.getfixturevalue(path)
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1, **attrs}
    with_numba = nn._conv_nobias_cpu(a, x, w)
    assert calls == [1]
    monkeypatch.setitem(sys.modules, "numba", None)
    without = nn._conv_nobias_cpu(a, x, w)
    assert calls == [1]
    np.testing.assert_allclose(with_numba, without, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- im2col by numba (conv_kernels.im2col_2d)
IM2COL_CASES = CASES + [
    ((2, 3, 17, 23), (4, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ((1, 2, 9, 9), (3, 2, 7, 7), {"pads": [3, 3, 3, 3], "strides": [2, 2]}),  # a ResNet stem's shape of window
    ((1, 2, 8, 40), (2, 2, 5, 5), {"pads": [0, 2, 1, 0], "strides": [3, 2]}),
    ((1, 2, 3, 3), (2, 2, 5, 5), {"pads": [4, 4, 4, 4]}),  # rows and columns wholly in the padding
    ((1, 2, 11, 11), (2, 2, 3, 3), {"pads": [2, 1, 2, 1], "strides": [2, 2], "dilations": [2, 3]}),
]


@pytest.mark.parametrize("xs,ws,attrs", IM2COL_CASES, ids=str)
def test_numba_im2col_gives_numpys_columns(xs, ws, attrs):
    """The column matrix is a copy: numba's must equal numpy's element for element (zeros where the window reads
    padding), for strides, dilations, asymmetric pads and windows wider than the input."""
    x = RNG.standard_normal(xs).astype(np.float32)
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], **attrs}
    k = ws[2:]
    out = [nn.window_count(xs[2 + i], k[i], a["strides"][i], a["dilations"][i], a["pads"][i], a["pads"][i + 2])
           for i in range(2)]
    ref = nn._im2col(np, x, k, a["strides"], a["dilations"], a["pads"], out)
    got = nn._im2col_numba(np, x, k, a["strides"], a["dilations"], a["pads"], out)
    np.testing.assert_array_equal(got, ref)


def test_strided_convs_take_numbas_im2col_once_numba_is_loaded(monkeypatch):
    """A stride-2 3x3 conv (no tap or shifted path) builds its columns with numba when numba is loaded, and with
    numpy when it is not (where numba cannot be imported); the values are the same."""
    import sys
    x = RNG.standard_normal((1, 8, 20, 20)).astype(np.float32)
    w = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32)
    a = {"strides": [2, 2], "dilations": [1, 1], "pads": [1, 1, 1, 1], "group": 1}
    monkeypatch.setattr(conv_direct, "MAX_INNER", 0)  # a conv the direct path would take
    calls = _count_calls(monkeypatch, nn, "_im2col_numba")
    with_numba = nn._conv_nobias_cpu(a, x, w)
    assert calls == [1]
    monkeypatch.setitem(sys.modules, "numba", None)
    without = nn._conv_nobias_cpu(a, x, w)
    assert calls == [1]
    np.testing.assert_array_equal(with_numba, without)


def test_a_mobilenet_sized_depthwise_conv_splits_over_two_threads(monkeypatch):
    """At the shipped thresholds a 576-channel 5x5 depthwise conv on 7x7 (MobileNetV3-small's last blocks, ~100 us
    at one thread) splits over two threads: its taps count TAP_COST GEMM multiply-adds each."""
    from rlx_runtime import threads
    parts = []
    real = threads.chunk_edges
    monkeypatch.setattr(threads, "chunk_edges", lambda n, k, *a, **kw: parts.append(k) or real(n, k, *a, **kw))
    x = RNG.standard_normal((1, 576, 7, 7)).astype(np.float32)
    w = RNG.standard_normal((576, 1, 5, 5)).astype(np.float32)
    with threadpool_limits(2, "blas"), threads.forward_threads():
        two = conv_taps.taps2d(x, w, (1, 1), (1, 1), (2, 2, 2, 2), (7, 7))
    assert parts == [2]
    with threadpool_limits(1, "blas"), threads.forward_threads():
        one = conv_taps.taps2d(x, w, (1, 1), (1, 1), (2, 2, 2, 2), (7, 7))
    np.testing.assert_array_equal(two, one)


# (x shape, kernel, strides, dilations, pads) for the channel-blocked kernel against the phase one: channels a whole
# number of blocks, one short, a block and a bit, fewer than one; planes narrower than a tile (7x7: flat tiles across
# rows), stride 2 and 3, dilation, asymmetric pads, no pads, batch 2
BLOCKED = [
    ((1, 16, 7, 7), (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    ((2, 37, 13, 19), (3, 3), (2, 2), (1, 1), (1, 1, 2, 1)),
    ((1, 5, 30, 33), (3, 3), (1, 1), (2, 2), (2, 2, 2, 2)),
    ((1, 40, 9, 40), (5, 5), (2, 1), (1, 1), (2, 2, 3, 2)),
    ((1, 15, 4, 4), (3, 3), (3, 3), (1, 1), (0, 0, 0, 0)),
    ((2, 33, 28, 17), (7, 7), (1, 1), (1, 1), (3, 1, 3, 0)),
    ((1, 24, 21, 22), (3, 3), (3, 2), (2, 3), (3, 1, 2, 3)),
]


def _blocked_and_phases(xs, k, strides, dil, pads, epilogue=None, x=None):
    """(channel-blocked result, phase-kernel result) of a depthwise conv of random weights."""
    from rlx_runtime.kernels.nn import window_count
    w = RNG.standard_normal((xs[1], 1, *k)).astype(np.float32)
    x = RNG.standard_normal(xs).astype(np.float32) if x is None else x
    out_sp = [window_count(xs[2 + i], k[i], strides[i], dil[i], pads[i], pads[i + 2]) for i in range(2)]
    args = (xs, w, strides, dil, pads, out_sp)
    return (conv_taps.run_blocked(conv_taps.BlockPlan(*args), x, epilogue),
            conv_taps.run_taps(conv_taps.TapPlan(*args), x, epilogue))


@pytest.mark.parametrize("band_bytes", [1, 1 << 20], ids=["a-row-a-band", "one-band"])
@pytest.mark.parametrize("xs,k,strides,dil,pads", BLOCKED, ids=str)
def test_the_blocked_depthwise_kernel_gives_the_phase_kernels_bits(xs, k, strides, dil, pads, band_bytes,
                                                                    monkeypatch):
    """The channel-blocked kernel sums each output's taps by fma in tap order from 0.0, as the phase kernel does
    (test_depthwise_sums_the_taps_in_order checks that order against numpy): the same bits, band by band (one
    output row a band: padding rows in the middle of the plane's bands) or the whole plane in one, with a residual
    and a Silu epilogue too."""
    from rlx_runtime.conv_kernels import bias_activation
    monkeypatch.setattr(conv_taps, "BAND_BYTES", band_bytes)
    got, want = _blocked_and_phases(xs, k, strides, dil, pads)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    ep = bias_activation(RNG.standard_normal(xs[1]).astype(np.float32), "Silu", 0.0, None, None, xs[1])
    ep = ep.with_residual(RNG.standard_normal(want.size).astype(np.float32))
    x = RNG.standard_normal(xs).astype(np.float32)
    got, want = _blocked_and_phases(xs, k, strides, dil, pads, ep, x)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("xs,splits", [((1, 576, 7, 7), "blocks"), ((1, 24, 31, 9), "rows")], ids=str)
def test_the_blocked_depthwise_kernel_splits_by_blocks_or_rows_with_the_same_bits(xs, splits, monkeypatch):
    """At two threads the blocked kernel splits by channel blocks while there are two per thread (MobileNetV3's
    576 channels: 36 blocks), else by output rows (24 channels: 2 blocks); one thread's bits either way, non-finite
    inputs included."""
    from rlx_runtime import threads
    monkeypatch.setattr(threads, "_MIN_SPLIT_WORK", 0)
    x = RNG.standard_normal(xs).astype(np.float32)
    x.reshape(-1)[::97] = np.nan
    x.reshape(-1)[5::89] = -np.inf
    w = RNG.standard_normal((xs[1], 1, 3, 3)).astype(np.float32)
    bp = conv_taps.BlockPlan(xs, w, (1, 1), (1, 1), (1, 1, 1, 1), xs[2:])
    kedges, gedges = bp.edges(2)
    assert (len(kedges), len(gedges)) == ((3, 2) if splits == "blocks" else (2, 3))
    jobs = _count_calls(monkeypatch, threads.Steps, "run")
    with threadpool_limits(2, "blas"), threads.forward_threads():
        two = conv_taps.run_blocked(bp, x)
    assert jobs  # split: a job over the pool
    with threadpool_limits(1, "blas"), threads.forward_threads():
        one = conv_taps.run_blocked(bp, x)
    np.testing.assert_array_equal(two.view(np.uint32), one.view(np.uint32))
    np.testing.assert_array_equal(one, conv_taps.run_taps(conv_taps.TapPlan(xs, w, (1, 1), (1, 1), (1, 1, 1, 1),
                                                                            xs[2:]), x))


@pytest.mark.parametrize("k,strides,ow,avx512,taken", [
    ((5, 5), (1, 1), 56, True, True),  # 25 taps
    ((3, 3), (2, 2), 14, True, True),  # strided to narrow rows
    ((3, 3), (2, 2), 56, True, False),  # strided to wide rows: the phase kernel too (strides do not matter)
    ((3, 3), (1, 1), 14, True, True),  # rows narrower than MIN_ROW_WIDTH: the phase kernel's grid
    ((3, 3), (1, 1), 28, True, False),  # the phase kernel straight into the output
    ((3, 3), (1, 1), 112, True, False),
    ((5, 5), (1, 1), 7, False, True),  # AVX2 (8-channel blocks): all but 3x3 stride 1 to wide rows
    ((5, 5), (1, 1), 112, False, True),
    ((3, 3), (2, 2), 56, False, True),
    ((3, 3), (1, 1), 28, False, True),
    ((3, 3), (1, 1), 56, False, False),
    ((3, 3), (1, 1), 112, False, False),
])
def test_which_depthwise_convs_take_the_blocked_kernel(k, strides, ow, avx512, taken, monkeypatch):
    from rlx_runtime import simd
    monkeypatch.setattr(simd, "AVX512", avx512)
    assert conv_taps.use_blocked((8, 1, *k), (ow, ow), strides) is taken


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("xs,ws,attrs", [
    ((1, 24, 13, 11), (20, 24, 3, 3), {"pads": [1, 1, 1, 1]}),  # direct
    ((2, 16, 16, 17), (72, 16, 1, 1), {}),  # pointwise, the few-rows GEMM
    ((2, 16, 9, 9), (72, 16, 1, 1), {}),  # pointwise on a small plane: the BLAS with the epilogue
    ((1, 12, 19, 23), (12, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 12}),  # depthwise taps
    ((1, 8, 10, 10), (12, 4, 3, 3), {"pads": [1, 1, 1, 1], "group": 2}),  # grouped: im2col + GEMM
    ((1, 4, 6, 6), (8, 4, 1, 1), {}),  # a squeeze-excite-sized one: the GEMM, then y += b
], ids=str)
def test_a_plain_convs_bias_added_in_the_kernels_is_y_plus_b(xs, ws, attrs):
    """Once numba is loaded a float32 Conv's bias is added by the conv kernels' epilogue ("Identity"): the values
    of its unbiased result plus b (numpy's add), bit for bit, NaN and Inf inputs included."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the epilogue paths are taken once numba is loaded
    from rlx_runtime.kernels.registry import prepare_attrs
    a = prepare_attrs("Conv", {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1, **attrs})
    x = RNG.standard_normal(xs).astype(np.float32)
    x.reshape(-1)[::37] = np.nan
    x.reshape(-1)[5::41] = np.inf
    w = RNG.standard_normal(ws).astype(np.float32)
    b = RNG.standard_normal(ws[0]).astype(np.float32)
    want = nn._conv_nobias_cpu(a, x, w) + b.reshape(1, -1, 1, 1)
    got = nn._conv_cpu(np, a, x, w, b)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert a.get("_epilogue") is not None or xs == (1, 4, 6, 6)  # the kernels' epilogue, but for the tiny one
