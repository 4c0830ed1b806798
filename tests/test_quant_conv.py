"""The size profile quantizes Conv / ConvTranspose weights: rows by the weight's first axis (C·kh·kw long,
zero-padded to the block where that still saves bytes), stored packed, dequantized once at compile."""

import os

import numpy as np
import pytest
from test_bake import run_baked

from rlx_bake import BakeOptions, bake
from rlx_format import GraphBuilder, write_rlx
from rlx_format.quants import dequantize, quantize
from rlx_runtime import Session
from rlx_runtime.backend import CPU
from rlx_runtime.kernels import OVERRIDES

R = np.random.default_rng(11)


def _conv_graph(cout, cin, k, op="Conv"):
    g = GraphBuilder()
    x = g.input("x", "f32", [1, cin if op == "Conv" else cout, 9, 9])
    wshape = [cout, cin, k, k]
    y = g.op(op, x, g.param("w", "f32", wshape), g.param("b", "f32", [cin if op == "ConvTranspose" else cout]),
             name="y", pads=[1, 1, 1, 1])
    g.output(g.relu(y, name="out"))
    return g.build()


def _dense_ref(w, enc):
    """The weight the runtime convolves with: each row (first axis) quantized, zero-padded to the block."""
    rows = w.reshape(w.shape[0], -1)
    pad = -rows.shape[1] % 32
    back = dequantize(quantize(np.pad(rows, ((0, 0), (0, pad))), enc), enc)[:, :rows.shape[1]]
    return back.reshape(w.shape).astype(np.float32)


@pytest.mark.parametrize("cin,k,padded", [(4, 4, 0), (3, 3, 5), (8, 3, 24)])
@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_conv_weight_quantized_and_run_as_dequantized(cin, k, padded, op):
    cout = 6
    w = R.standard_normal((cout, cin, k, k)).astype(np.float32)
    ws = {"w": w, "b": R.standard_normal(cin if op == "ConvTranspose" else cout).astype(np.float32)}
    graph = _conv_graph(cout, cin, k, op)
    rf, rep = bake(graph, ws, BakeOptions.from_profile("size"))
    assert rep.quant == ["w"]
    (wr,) = [x for x in rep.weights if x.name == "w.q8_0"]
    kk = cin * k * k
    assert wr.encoding == "gguf_q8_0" and wr.shape == [cout, kk + padded]
    assert wr.bytes_before == w.nbytes and wr.bytes_after == cout * (kk + padded) // 32 * 34 < w.nbytes
    ops = [n.op for n in rf.graph.nodes]
    assert ops[:2] == ["Dequantize", "Slice" if padded else "Reshape"] and op in ops
    assert ("padded with" in rf.weights["w.q8_0"].note) == bool(padded)
    dense = _dense_ref(w, "gguf_q8_0")
    assert 0 < wr.max_abs_err == pytest.approx(float(np.abs(dense - w).max())) and wr.cosine > 0.9999
    x = R.standard_normal(graph.inputs[0].shape).astype(np.float32)
    want = Session().compile(_conv_graph(cout, cin, k, op))
    want.set_param("w", dense)
    want.set_param("b", ws["b"])
    np.testing.assert_array_equal(run_baked(rf, {"x": x})["out"], want.run({"x": x})["out"])


def test_padding_that_saves_nothing_keeps_the_weight_dense():
    # C·kh·kw = 8: one padded Q8_0 block is 34 bytes, the f32 row 32
    rf, rep = bake(_conv_graph(6, 8, 1), {"w": R.standard_normal((6, 8, 1, 1)).astype(np.float32),
                                          "b": np.zeros(6, np.float32)}, BakeOptions.from_profile("size"))
    assert rep.quant == [] and rf.weights["w"].encoding == "f32"
    assert "weight 'w': C·kh·kw=8 is not a multiple of 32; padded to the block it would not be smaller than f32; " \
           "kept dense" in rep.notes


def test_dequantized_once_at_compile_not_per_forward(monkeypatch):
    w = R.standard_normal((6, 4, 4, 4)).astype(np.float32)
    rf, _ = bake(_conv_graph(6, 4, 4), {"w": w, "b": np.zeros(6, np.float32)}, BakeOptions.from_profile("size"))
    calls = []
    real = CPU.kernel("Dequantize")
    monkeypatch.setitem(OVERRIDES["cpu"], "Dequantize", lambda *a: calls.append(1) or real(*a))
    c = Session().compile(rf)
    assert calls == [1] and c.plan_ops() == ["FusedConv"]
    x = R.standard_normal((1, 4, 9, 9)).astype(np.float32)
    c.run({"x": x})
    c.run({"x": x})
    assert calls == [1]


def test_auto_and_overrides_cover_conv_weights():
    w = R.standard_normal((6, 4, 4, 4)).astype(np.float32)
    ws = {"w": w, "b": np.zeros(6, np.float32)}
    rf, rep = bake(_conv_graph(6, 4, 4), ws, BakeOptions.from_profile("size", quant_weights=(("w", "dense"),)))
    assert rep.quant == [] and rf.weights["w"].encoding == "f32"
    rf, rep = bake(_conv_graph(6, 4, 4), ws, BakeOptions.from_profile("size", quant_type="auto",
                                                                       quant_min_cosine=0.99))
    (wr,) = [x for x in rep.weights if x.name.startswith("w.")]
    assert wr.encoding == "gguf_mxfp4" and wr.cosine >= 0.99


@pytest.mark.parametrize("name,ratio", [("light_squeezenet", 3.0), ("light_shufflenet", 2.5)])
def test_size_shrinks_onnx_cnns_and_matches_onnxruntime(tmp_path, name, ratio):
    ort = pytest.importorskip("onnxruntime")
    import export_corpus as corpus

    from rlx_bake.onnx import import_onnx
    path = corpus.light(name, corpus.cache_dir())
    graph, weights = import_onnx(path)
    x = {v.name: R.standard_normal([d if isinstance(d, int) else 1 for d in v.shape]).astype(np.float32)
         for v in graph.inputs}
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, x)[0]
    sizes = {}
    for profile in ("exact", "size"):
        rf, rep = bake(graph, weights, BakeOptions.from_profile(profile))
        write_rlx(tmp_path / f"{profile}.rlx", rf)
        sizes[profile] = os.path.getsize(tmp_path / f"{profile}.rlx")
        c = Session().compile(rf)
        assert "Dequantize" not in c.plan_ops()
        out = c.run(x)[c.output_names[0]].astype(np.float64).ravel()
        cos = out @ ref.ravel() / (np.linalg.norm(out) * np.linalg.norm(ref))
        # measured: exact 1 - 1e-13; size (Q8_0 weights) 0.99998 (squeezenet), 0.999998 (shufflenet)
        assert cos >= (0.9999999 if profile == "exact" else 0.9999), (profile, cos)
    convs = sum(n.op == "Conv" for n in graph.nodes)
    assert len(rep.quant) >= convs  # every Conv weight is packed (shufflenet's 9-long depthwise rows too)
    # measured: squeezenet 4.96 MB -> 1.37 MB (3.6x), shufflenet 5.57 MB -> 1.94 MB (2.9x; depthwise rows of 9)
    assert sizes["exact"] / sizes["size"] >= ratio, sizes


@pytest.mark.parametrize("name", ["cnn", "unet"])
def test_size_on_torch_exported_cnn_and_unet_matches_onnxruntime(name):
    """Convs with BatchNorm folded in (CNN) and with Resize/Concat around them (UNet): every conv weight packed
    (C·kh·kw = 27, 72, 16, ... padded to the block), outputs within Q8_0's error of onnxruntime at each of the
    corpus' shapes."""
    pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    import export_corpus as corpus

    from rlx_bake.onnx import import_onnx
    path = corpus.export(name, False, corpus.cache_dir())
    graph, weights = import_onnx(path)
    rf, rep = bake(graph, weights, BakeOptions.from_profile("size"))
    assert len(rep.quant) == sum(n.op in ("Conv", "ConvTranspose") for n in graph.nodes) >= 2
    assert rep.total_bytes < 0.5 * rep.total_bytes_before
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    c = Session().compile(rf)
    for shapes in corpus.MODELS[name].shapes:
        x = {k: R.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        ref = sess.run(None, x)[0].astype(np.float64).ravel()
        out = c.run(x)[c.output_names[0]].astype(np.float64).ravel()
        # measured: cosine 0.999999 (CNN), 0.99999 (UNet)
        assert out @ ref / (np.linalg.norm(out) * np.linalg.norm(ref)) >= 0.9999, shapes
