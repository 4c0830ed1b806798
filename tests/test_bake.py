import json
import struct
import warnings

import numpy as np
import pytest

from rlx_bake import BakeOptions, bake, load_graph
from rlx_format import GraphBuilder, RlxError, read_rlx, write_rlx
from rlx_format.dtypes import f32_to_bf16
from rlx_runtime import Session

R = np.random.default_rng(11)


def f32(*s):
    return R.standard_normal(s).astype(np.float32)


def tern(*s, a=1.0):
    return (np.sign(R.standard_normal(s)) * (R.random(s) < 0.6) * a).astype(np.float32)


def run_baked(rf, feeds, tmp_path=None):
    if tmp_path is not None:
        write_rlx(tmp_path / "m.rlx", rf)
        rf = read_rlx(tmp_path / "m.rlx", verify=True)
    return Session().compile(rf).run(feeds)


def run_ref(graph, weights, feeds):
    c = Session().compile(graph)
    for k, v in weights.items():
        c.set_param(k, v)
    return c.run(feeds)


def test_skip_zero_with_dynamic_dims(tmp_path):
    g = GraphBuilder()
    x = g.input("x", "f32", ["batch", "seq", 8])
    g.output(g.matmul(x, g.param("w", "f32", [8, 5]), name="y"))
    rf, rep = bake(g.build(), {"w": np.zeros((8, 5), np.float32)})
    assert rep.skipped == ["y"] and "MatMul" not in [n.op for n in rf.graph.nodes]
    assert rf.graph.input_names == ["x"]
    for shape in ((2, 3, 8), (1, 7, 8)):
        out = run_baked(rf, {"x": f32(*shape)}, tmp_path)["y"]
        assert out.shape == shape[:2] + (5,) and not out.any()
    assert "IEEE" in " ".join(rep.notes)
    rf2, rep2 = bake(g.build(), {"w": np.zeros((8, 5), np.float32)}, BakeOptions.from_profile("exact", skip=False))
    assert rep2.skipped == [] and "MatMul" in [n.op for n in rf2.graph.nodes]


def test_skip_zero_static_shape():
    g = GraphBuilder()
    x = g.input("x", "f32", [3, 8])
    g.output(g.matmul(x, g.param("w", "f32", [8, 5]), name="y"))
    rf, _ = bake(g.build(), {"w": np.zeros((8, 5), np.float32)})
    assert [n.op for n in rf.graph.nodes] == []  # the zeros fold into a constant output
    np.testing.assert_array_equal(run_baked(rf, {"x": f32(3, 8)})["y"], np.zeros((3, 5)))


def test_ternary_packs_losslessly_and_scaled(tmp_path):
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 512])
    h = g.matmul(x, g.param("w1", "f32", [512, 256]))
    g.output(g.matmul(h, g.param("w2", "f32", [256, 16]), name="y"))
    w = {"w1": tern(512, 256), "w2": tern(256, 16, a=0.125)}
    rf, rep = bake(g.build(), w)
    assert sorted(rep.ternary) == ["w1", "w2"]
    assert [n.op for n in rf.graph.nodes] == ["DequantMatMul", "DequantMatMul"]
    assert {wt.encoding for wt in rf.weights.values()} == {"gguf_tq1_0"}  # the smaller lossless packing
    back = read_rlx(tmp_path / "x.rlx") if write_rlx(tmp_path / "x.rlx", rf) is None else None
    np.testing.assert_array_equal(back.weights["w1.tq1_0"].dense(), w["w1"].T)
    X = f32(3, 512)
    np.testing.assert_allclose(run_baked(rf, {"x": X})["y"], run_ref(g.build(), w, {"x": X})["y"], rtol=1e-5, atol=1e-3)
    assert rep.total_bytes < 0.1 * sum(v.nbytes for v in w.values())


def test_ternary_k_not_multiple_stays_dense():
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 300])
    g.output(g.matmul(x, g.param("w", "f32", [300, 4]), name="y"))
    rf, rep = bake(g.build(), {"w": tern(300, 4)})
    assert rep.ternary == [] and "K=300 is not a multiple of 256" in " ".join(rep.notes)
    assert rf.weights["w"].encoding == "f32"


def test_shared_weight_keeps_dense_copy_for_other_use():
    g = GraphBuilder()
    x = g.input("x", "f32", [2, 256])
    z = g.input("z", "f32", [256, 256])
    w = g.param("w", "f32", [256, 256])
    g.output(g.matmul(x, w, name="y"), g.mul(z, w, name="masked"))
    wt = tern(256, 256)
    for prof in ("exact", "size"):
        rf, rep = bake(g.build(), {"w": wt}, BakeOptions.from_profile(prof))
        assert "w" in rf.weights and rf.weights["w"].encoding == "f32"
        assert "keep a dense copy" in " ".join(rep.notes)
        z = f32(256, 256)
        out = run_baked(rf, {"x": f32(2, 256), "z": z})
        np.testing.assert_array_equal(out["masked"], z * wt)


def test_q8_0_report_and_accuracy():
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 64])
    g.output(g.matmul(x, g.param("w", "f32", [64, 32]), name="y"))
    w = {"w": f32(64, 32)}
    rf, rep = bake(g.build(), w, BakeOptions.from_profile("size"))
    assert rep.quant == ["w"]
    (wr,) = rep.weights
    assert wr.encoding == "gguf_q8_0" and wr.cosine > 0.9999 and 0 < wr.max_abs_err < 0.05
    assert wr.bytes_before == 64 * 32 * 4 and wr.bytes_after == 32 * 2 * 34
    X = f32(10, 64)
    a, b = run_baked(rf, {"x": X})["y"].ravel(), run_ref(g.build(), w, {"x": X})["y"].ravel()
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.999
    assert rf.meta["bake"]["weights"][0]["encoding"] == "gguf_q8_0"


def test_q8_0_nan_weight_is_an_error():
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 64])
    g.output(g.matmul(x, g.param("w", "f32", [64, 32]), name="y"))
    w = f32(64, 32)
    w[3, 3] = np.nan
    with pytest.raises(RlxError, match="weight 'w' cannot be quantized to Q8_0.*NaN"):
        bake(g.build(), {"w": w}, BakeOptions.from_profile("size"))


def _mlp():
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 4])
    g.output(g.add(g.matmul(x, g.param("w", "f32", [4, 3])), g.param("bias", "f32", [3]), name="y"))
    return g.build()


def test_param_rules():
    rf, rep = bake(_mlp(), {"w": f32(4, 3)})
    assert rep.params_unbound == ["bias"] and rf.graph.param_names == ["bias"]
    with pytest.raises(RlxError, match="--strict: param\\(s\\) \\['bias'\\] have no weight"):
        bake(_mlp(), {"w": f32(4, 3)}, BakeOptions.from_profile("exact", strict=True))
    with pytest.raises(RlxError, match="none of the 1 weights matches a param"):
        bake(_mlp(), {"zzz": f32(4, 3)})
    with pytest.raises(RlxError, match="weight 'w': shape \\[3, 4\\]; the graph declares \\[4, 3\\]"):
        bake(_mlp(), {"w": f32(3, 4)})
    with pytest.raises(RlxError, match="weight 'w': dtype f16; the graph declares param 'w' as f32"):
        bake(_mlp(), {"w": f32(4, 3).astype(np.float16)})
    with pytest.warns(UserWarning, match="not used by any param.*extra"):
        _, rep = bake(_mlp(), {"w": f32(4, 3), "bias": f32(3), "extra": f32(2)})
    assert rep.extra_weights == ["extra"]


def _profile_graph():
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 256])
    z = g.matmul(x, g.param("zero", "f32", [256, 8]))
    t = g.matmul(x, g.transpose(g.param("tern_t", "f32", [8, 256]), perm=[1, 0]))
    d = g.matmul(x, g.param("dense", "f32", [256, 8]))
    g.output(g.add(g.add(z, t), d, name="y"))
    w = {"zero": np.zeros((256, 8), np.float32), "tern_t": tern(8, 256), "dense": f32(256, 8)}
    return g.build(), w


@pytest.mark.parametrize("profile,flags,expect", [
    ("merge", {}, {"Transpose": 1, "MatMul": 3}),
    ("fold", {}, {"MatMul": 3}),
    # the skipped MatMul's zeros vanish: 0 + t is t
    ("exact", {}, {"DequantMatMul": 1, "MatMul": 1, "Add": 1, "Expand": 0, "ConstantOfShape": 0}),
    ("size", {}, {"DequantMatMul": 2, "Add": 1, "Expand": 0}),
    ("exact", {"ternary": False}, {"MatMul": 2, "Add": 1, "Expand": 0}),
    ("merge", {"fold": True, "quant": True}, {"DequantMatMul": 3}),
    ("size", {"quant": False, "skip": False}, {"DequantMatMul": 2, "MatMul": 1}),  # all-zero W is ternary too
])
def test_profile_matrix(profile, flags, expect):
    graph, w = _profile_graph()
    rf, rep = bake(graph, w, BakeOptions.from_profile(profile, **flags))
    counts = {}
    for n in rf.graph.nodes:
        counts[n.op] = counts.get(n.op, 0) + 1
    for op, k in expect.items():
        assert counts.get(op, 0) == k, (counts, expect)
    X = f32(2, 256)
    ref = run_ref(graph, w, {"x": X})["y"].ravel()
    got = run_baked(rf, {"x": X})["y"].ravel()
    cos = got @ ref / np.linalg.norm(got) / np.linalg.norm(ref)
    if rf.meta["bake"]["counts"]["quant"]:
        assert cos > 0.999
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


def test_flags_override_profile_regardless_of_order():
    a = BakeOptions.from_profile("size", quant=False)
    assert not a.quant and a.ternary
    assert BakeOptions.from_profile("merge", ternary=True).ternary
    with pytest.raises(RlxError, match="unknown profile 'tiny'"):
        BakeOptions.from_profile("tiny")


@pytest.mark.parametrize("seed", range(3))
def test_parity_random_conv_graph(seed):
    r = np.random.default_rng(seed)
    g = GraphBuilder()
    x = g.input("x", "f32", ["n", 3, 10, 10])
    w, gamma, var = g.param("w", "f32", [6, 3, 3, 3]), g.param("gamma", "f32", [6]), g.param("var", "f32", [6])
    scale = g.div(gamma, g.sqrt(var))
    y = g.relu(g.conv(x, g.mul(w, g.reshape(scale, shape=[6, 1, 1, 1])), pads=[1, 1, 1, 1]))
    flat = g.flatten(g.global_average_pool(y))
    g.output(g.softmax(g.matmul(flat, g.param("fc", "f32", [6, 4])), name="p"))
    wts = {"w": r.standard_normal((6, 3, 3, 3)).astype(np.float32), "gamma": r.standard_normal(6).astype(np.float32),
           "var": (r.random(6) + 0.5).astype(np.float32), "fc": r.standard_normal((6, 4)).astype(np.float32)}
    X = r.standard_normal((2, 3, 10, 10)).astype(np.float32)
    ref = run_ref(g.build(), wts, {"x": X})["p"]
    for prof in ("merge", "fold", "exact"):
        rf, _ = bake(g.build(), wts, BakeOptions.from_profile(prof))
        np.testing.assert_allclose(run_baked(rf, {"x": X})["p"], ref, rtol=1e-5, atol=1e-6)


def test_load_bundle_keeps_dtypes(tmp_path):
    g = GraphBuilder("b")
    x = g.input("x", "f32", [2, 4])
    wb = g.param("wb", "bf16", [4])
    wi = g.param("wi", "i64", [4])
    g.output(g.add(g.mul(x, g.cast(wb, to="f32")), g.cast(wi, to="f32"), name="y"))
    g.build().to_json(tmp_path / "graph.json")
    bits = f32_to_bf16(np.array([1.5, -2, 0.25, 3], np.float32))
    ints = np.arange(4, dtype=np.int64)
    # numpy has no bf16, so write the safetensors file by its published layout: u64 header length, JSON, data
    header = json.dumps({"wb": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
                         "wi": {"dtype": "I64", "shape": [4], "data_offsets": [8, 40]}}).encode()
    header += b" " * (-len(header) % 8)
    (tmp_path / "weights.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bits.tobytes()
                                                   + ints.tobytes())
    graph, ws = load_graph(tmp_path)
    assert ws.dtypes == {"wb": "bf16", "wi": "i64"}
    assert ws["wi"].dtype == np.int64 and not ws["wi"].flags.owndata and ws["wb"].dtype == np.uint16
    merged, _ = bake(graph, ws, BakeOptions.from_profile("merge"))
    assert merged.weights["wb"].encoding == "bf16" and merged.weights["wi"].encoding == "i64"
    X = f32(2, 4)
    want = X * np.array([1.5, -2, 0.25, 3], np.float32) + ints.astype(np.float32)
    for rf in (merged, bake(graph, ws)[0]):
        np.testing.assert_array_equal(run_baked(rf, {"x": X})["y"], want)


def test_load_graph_errors(tmp_path):
    with pytest.raises(RlxError, match="no such file or directory"):
        load_graph(tmp_path / "none")
    with pytest.raises(RlxError, match="directory has no graph.json"):
        load_graph(tmp_path)
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(RlxError, match="not a valid ONNX model"):
        load_graph(tmp_path / "m.onnx")
    (tmp_path / "graph.json").write_text(_mlp().to_json())
    (tmp_path / "w.safetensors").write_bytes(b"garbage")
    with pytest.raises(RlxError, match="not a valid safetensors file"):
        load_graph(tmp_path, tmp_path / "w.safetensors")


def test_report_in_meta_and_reproducible(tmp_path):
    graph, w = _profile_graph()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rf1, rep = bake(graph, w)
        rf2, _ = bake(graph, w)
    assert rf1.to_bytes() == rf2.to_bytes()
    meta = rf1.meta["bake"]
    assert meta["nodes_before"] == rep.nodes_before and meta["counts"] == {"skipped": 1, "ternary": 1, "quant": 0}
    assert {w["name"] for w in meta["weights"]} == set(rf1.weights)
    assert meta["total_bytes"] == sum(wt.nbytes for wt in rf1.weights.values())


def test_q8_0_packs_gather_tables_and_keeps_tied_uses_dense():
    g = GraphBuilder()
    ids = g.input("ids", "i64", ["b", "s"])
    table = g.param("emb", "f32", [100, 64])
    h = g.gather(table, ids)                                   # [b, s, 64]
    logits = g.matmul(h, g.transpose(table, perm=[1, 0]))      # tied output head: folded transpose
    g.output(g.identity(logits, name="logits"), g.reduce_sum(table, axes=[0], keepdims=0, name="colsum_dyn"))
    emb = f32(100, 64)
    rf, rep = bake(g.build(), {"emb": emb}, BakeOptions.from_profile("size"))
    ops = [n.op for n in rf.graph.nodes]
    assert "DequantGather" in ops and "DequantMatMul" in ops
    assert set(rep.packed_from.values()) == {"emb", "transpose_2"} and rep.folded_from["transpose_2"] == "emb"
    assert all(name.startswith("emb.q8_0") for name in rep.packed_from)  # named after the source param
    # the tied head packs Wᵀᵀ = the table rows: identical bytes, so dedupe stores the table once
    packed = [w for w in rep.weights if w.encoding == "gguf_q8_0"]
    assert len(packed) == 1 and packed[0].cosine > 0.9999
    dg = next(n for n in rf.graph.nodes if n.op == "DequantGather")
    dm = next(n for n in rf.graph.nodes if n.op == "DequantMatMul")
    assert dg.inputs[0] == dm.inputs[1] == packed[0].name
    idx = np.array([[1, 5, 99]], np.int64)
    out = run_baked(rf, {"ids": idx}, None)
    ref = run_ref(g.build(), {"emb": emb}, {"ids": idx})
    a, b = out["logits"].ravel(), ref["logits"].ravel()
    assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.999
    np.testing.assert_allclose(out["colsum_dyn"], ref["colsum_dyn"], rtol=1e-6)  # folded from the dense table


@pytest.mark.parametrize("variant", ["float", "ternary"])
def test_parity_shipped_example(variant):
    from pathlib import Path
    bundle = Path(__file__).parent.parent / "examples" / "digits" / variant
    graph, ws = load_graph(bundle)
    from sklearn.datasets import load_digits
    x = load_digits().data[:200].astype(np.float32)  # the data the example was trained on
    ref = run_ref(graph, ws, {"x": x})["probs"]
    for prof in ("merge", "fold", "exact", "size"):
        rf, rep = bake(graph, ws, BakeOptions.from_profile(prof))
        out = run_baked(rf, {"x": x})["probs"]
        if prof == "size":
            a, b = out.ravel().astype(np.float64), ref.ravel().astype(np.float64)
            assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) >= 0.999
            assert (out.argmax(1) == ref.argmax(1)).mean() >= 0.99
        else:
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
        if variant == "ternary" and prof in ("exact", "size"):
            assert len(rep.ternary) == 2


def test_skip_zero_shrinks_the_digits_mlp():
    """With the middle layer's weight all zero, everything before it only fed that MatMul (its zeros take
    the batch dim from the input's shape), and the layers after it compute on one row: the graph gets
    smaller, not larger (it grew from 10 to 13 nodes before), and the output is unchanged."""
    from pathlib import Path

    from safetensors.numpy import load_file

    from rlx_format import Graph

    root = Path(__file__).parent.parent / "examples" / "digits" / "float"
    graph = Graph.from_json(root / "graph.json")
    w = load_file(str(root / "weights.safetensors"))
    w["w2"] = np.zeros_like(w["w2"])
    plain, _ = bake(graph, w, BakeOptions.from_profile("fold"))
    rf, rep = bake(graph, w, BakeOptions.from_profile("exact"))
    assert rep.skipped and len(rf.graph.nodes) < len(plain.graph.nodes) == 10
    ops = [n.op for n in rf.graph.nodes]
    assert ops.count("MatMul") <= 1 and "Relu" not in ops, ops  # the first layer is gone
    x = np.random.default_rng(0).random((7, 64)).astype(np.float32) * 16
    np.testing.assert_allclose(run_baked(rf, {"x": x})["probs"], run_baked(plain, {"x": x})["probs"],
                               rtol=1e-6, atol=1e-7)


def test_names_added_by_skip_zero_never_collide_with_the_model_s():
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 8])
    z = g.matmul(x, g.param("w", "f32", [8, 4]), name="mm")
    taken = g.relu(g.constant(np.ones(4, np.float32), name="mm/skip_zero"), name="mm/skip_shape_x")
    g.output(g.add(g.relu(z), taken, name="y"))
    rf, _ = bake(g.build(), {"w": np.zeros((8, 4), np.float32)})
    x = f32(3, 8)
    np.testing.assert_array_equal(run_baked(rf, {"x": x})["y"], np.ones((3, 4), np.float32))


def test_unique_name():
    from rlx_format.graph import unique_name

    taken = {"a", "a_2"}
    assert unique_name("a", taken) == "a_3" and unique_name("b", taken) == "b" and {"a_3", "b"} <= taken
