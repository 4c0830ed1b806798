"""SqueezeExcite: the compile pass that fuses a squeeze-excite block (x times the gate its channel means make through
two 1x1 FusedConvs) into one step, and its CPU kernels.

The fused step must give the unfused steps' bits: the CPU binder runs the unfused ops' kernels (the channel means,
two pixel convs, the row scale) in one call, or as pieces where the unfused means and scale would split over the
threads, and every other block composes the unfused ops' kernels. The reference is the same graph compiled with
the fusion pass switched off. A torchvision SqueezeExcitation exported by torch is checked against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import rlx_runtime.passes.pipeline as pipeline
from rlx_format import GraphBuilder
from rlx_format.errors import RlxError
from rlx_runtime import Session, conv_kernels, threads
from rlx_runtime.plan import loads_numba

RNG = np.random.default_rng(11)
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),  # NaN inputs
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # torch's TorchScript exporter

SQUEEZE = [("Relu", {}), ("Silu", {}), ("Clip", {"min": 0.0, "max": 6.0})]
GATE = [("Sigmoid", {}), ("Clip", {"min": 0.0, "max": 1.0}), ("Relu", {})]


def _se_graph(xs, squeeze=("Relu", {}), gate=("Sigmoid", {}), hidden=None, gate_first=False, share=None):
    """x -> Relu -> (GlobalAveragePool, Conv, act, Conv, act) -> Mul; `share` names an intermediate ("pool", "squeeze"
    or "gate") that a second output reads too."""
    c = xs[1]
    hidden = hidden or max(c // 4, 1)
    g = GraphBuilder("se")
    x = g.op("Relu", g.input("x", "f32", list(xs)), name="r")
    pool = g.op("GlobalAveragePool", x, name="pool")
    w1 = g.constant(RNG.standard_normal((hidden, c, 1, 1)).astype(np.float32) / np.sqrt(c), name="w1")
    b1 = g.constant(RNG.standard_normal(hidden).astype(np.float32), name="b1")
    h = g.op(squeeze[0], g.op("Conv", pool, w1, b1, name="c1"), name="squeeze", **squeeze[1])
    w2 = g.constant(RNG.standard_normal((c, hidden, 1, 1)).astype(np.float32) / np.sqrt(hidden), name="w2")
    b2 = g.constant(RNG.standard_normal(c).astype(np.float32), name="b2")
    s = g.op(gate[0], g.op("Conv", h, w2, b2, name="c2"), name="gate", **gate[1])
    g.output(g.op("Mul", *((s, x) if gate_first else (x, s)), name="y"))
    if share is not None:
        g.output(g.op("Neg", {"pool": pool, "squeeze": h, "gate": s}[share], name="other"))
    return g.build()


def _compile(graph, monkeypatch, fuse: bool):
    with monkeypatch.context() as m:
        if not fuse:
            m.setattr(pipeline, "FUSE_SE", pipeline.Pass("off", lambda g, ctx: pipeline.PassResult(g, False)))
        return Session().compile(graph)


def _inputs(xs, specials: bool):
    x = RNG.standard_normal(xs).astype(np.float32) * 3
    if specials:
        flat = x.reshape(-1)
        flat[::97] = np.nan
        flat[5::131] = np.inf
    return x


def _same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k].view(np.uint32), b[k].view(np.uint32), err_msg=k)


def _threads(threads_, monkeypatch) -> int:
    """1, 2, or "2-split": 2 with every split taken however small (the means and the scale split: the pieces)."""
    if threads_ == "2-split":
        monkeypatch.setattr(threads, "_MIN_SPLIT_WORK", 0)
        return 2
    return threads_


def _count_calls(monkeypatch, module, name: str) -> list:
    calls = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


# (x shape, whether the binder takes the block: one image, rows of >= 16 (the unfused Mul's row scale), tiny convs)
SHAPES = [((1, 16, 56, 56), True), ((1, 96, 14, 14), True), ((1, 576, 7, 7), True), ((1, 40, 4, 4), True),
          ((1, 24, 3, 5), False), ((2, 8, 6, 6), False), ((1, 8, 1, 1), False)]


@pytest.mark.parametrize("threads_", [1, 2, "2-split"])
@pytest.mark.parametrize("xs,bound", SHAPES, ids=lambda v: str(v))
def test_fused_block_gives_the_unfused_bits(xs, bound, threads_, monkeypatch):
    n = _threads(threads_, monkeypatch)
    single = _count_calls(monkeypatch, conv_kernels, "squeeze_excite")
    g = _se_graph(xs)
    fused, ref = _compile(g, monkeypatch, True), _compile(g, monkeypatch, False)
    assert [n.op for n in fused.graph.nodes] == ["Relu", "SqueezeExcite"]
    assert "SqueezeExcite" not in ref.plan_ops()
    with threadpool_limits(n, "blas"):
        for specials in (False, True):
            feed = {"x": _inputs(xs, specials)}
            want = ref.run(feed)
            for _ in range(2):  # the first run binds, the second calls what was bound
                _same_bits(fused.run(feed), want)
    pieces = n > 1 and np.prod(xs) * conv_kernels.STREAM_COST >= threads._MIN_SPLIT_WORK  # as the unfused split
    assert bool(single) == (bound and not pieces), (single, bound, pieces)


@pytest.mark.parametrize("squeeze", SQUEEZE, ids=lambda v: str(v))
@pytest.mark.parametrize("gate", GATE, ids=lambda v: str(v))
@pytest.mark.parametrize("gate_first", [False, True], ids=["mul-x-gate", "mul-gate-x"])
def test_every_activation_pair_and_operand_order(squeeze, gate, gate_first, monkeypatch):
    """Each conv's own activation (a mix-up of the two convs' fields changes the gate), either Mul operand order."""
    xs = (1, 48, 9, 9)
    g = _se_graph(xs, squeeze, gate, gate_first=gate_first)
    fused, ref = _compile(g, monkeypatch, True), _compile(g, monkeypatch, False)
    assert fused.plan_ops() == ["Relu", "SqueezeExcite"]
    for specials in (False, True):
        feed = {"x": _inputs(xs, specials)}
        for _ in range(2):
            _same_bits(fused.run(feed), ref.run(feed))


@pytest.mark.parametrize("share", ["pool", "squeeze", "gate"])
def test_an_intermediate_read_elsewhere_keeps_the_block_unfused(share, monkeypatch):
    g = _se_graph((1, 16, 8, 8), share=share)
    assert "SqueezeExcite" not in Session().compile(g).plan_ops()


def _graph_with(edit) -> object:
    """_se_graph((1, 16, 8, 8)) with edit(builder-made nodes by name) applied before compile."""
    g = _se_graph((1, 16, 8, 8))
    edit({n.name: n for n in g.nodes}, g)
    return g.validate()


def test_the_gate_of_another_tensor_keeps_the_block_unfused():
    """Mul(y, gate) where the pool read x, not y: not a squeeze-excite block."""
    def edit(nodes, g):
        nodes["y"].inputs = ["x" if i == "r" else i for i in nodes["y"].inputs]
    g = _graph_with(edit)
    ops = Session().compile(g).plan_ops()
    assert "SqueezeExcite" not in ops and "GlobalAveragePool" in ops


def test_a_conv_that_is_not_one_pixel_keeps_the_block_unfused():
    """A 3x3 squeeze conv padded to keep its one-pixel output is no pixel conv (the binder's kernel assumes one)."""
    g = GraphBuilder("se3")
    x = g.input("x", "f32", [1, 8, 6, 6])
    pool = g.op("GlobalAveragePool", x)
    h = g.op("Relu", g.op("Conv", pool, g.constant(RNG.standard_normal((2, 8, 3, 3)).astype(np.float32)),
                          g.constant(np.zeros(2, np.float32)), pads=[1, 1, 1, 1]))
    s = g.op("Sigmoid", g.op("Conv", h, g.constant(RNG.standard_normal((8, 2, 1, 1)).astype(np.float32)),
                             g.constant(np.zeros(8, np.float32))))
    g.output(g.op("Mul", x, s, name="y"))
    compiled = Session().compile(g.build())
    assert "SqueezeExcite" not in compiled.plan_ops()


def test_a_squeeze_excite_with_a_sigmoid_gate_loads_numba_at_compile():
    fused = Session().compile(_se_graph((1, 16, 8, 8), ("Relu", {}), ("Clip", {"min": 0.0, "max": 1.0})))
    assert not loads_numba(fused.graph)
    fused = Session().compile(_se_graph((1, 16, 8, 8), ("Relu", {}), ("Sigmoid", {})))
    assert fused.plan_ops()[-1] == "SqueezeExcite" and loads_numba(fused.graph)


def test_wrong_operand_shapes_name_the_operand():
    g = GraphBuilder("bad")
    x = g.input("x", "f32", [1, 8, 4, 4])
    ws = [g.constant(np.zeros(s, np.float32)) for s in ((2, 8, 1, 1), (2,), (8, 3, 1, 1), (8,))]
    g.output(g.op("SqueezeExcite", x, *ws, activation="Relu", gate_activation="Sigmoid"))
    with pytest.raises(RlxError) as e:
        g.build()
    assert "input 3 has shape [8, 3, 1, 1]; expected [8, 2, 1, 1]" in str(e.value)


def test_torchvision_squeeze_excitation_export_fuses_and_matches_onnxruntime(tmp_path):
    """torchvision.ops.SqueezeExcitation (MobileNetV3's: Hardsigmoid gate) as torch.onnx exports it, against
    onnxruntime, at 1 and 2 threads."""
    torch = pytest.importorskip("torch")
    ops = pytest.importorskip("torchvision.ops")
    ort = pytest.importorskip("onnxruntime")
    from rlx_bake import BakeOptions, bake
    from rlx_bake.onnx import import_onnx

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(8, 72, 1), torch.nn.ReLU(),
                                ops.SqueezeExcitation(72, 24, scale_activation=torch.nn.Hardsigmoid)).eval()
    path = tmp_path / "se.onnx"
    torch.onnx.export(block, (torch.zeros(1, 8, 14, 14),), str(path), dynamo=False, input_names=["x"],
                      output_names=["y"])
    graph, weights = import_onnx(path)
    compiled = Session().compile(bake(graph, weights, BakeOptions.from_profile("exact"))[0])
    assert compiled.plan_ops().count("SqueezeExcite") == 1, compiled.plan_ops()
    x = RNG.standard_normal((1, 8, 14, 14)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for n in (1, 2):
        with threadpool_limits(n, "blas"):
            np.testing.assert_allclose(compiled.run({"x": x})["y"], want, rtol=1e-5, atol=1e-6)
