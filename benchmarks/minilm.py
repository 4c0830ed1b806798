"""all-MiniLM-L6-v2 showcase numbers: forward latency (batch 8, seq 128) vs onnxruntime on the same
weights, bake time, artifact sizes and open time. The ONNX model is written with the onnx helper API
from the same safetensors tensors (the standard BERT export: Gather embeddings, MatMul/Add linears,
LayerNormalization, Softmax attention with an additive mask, Erf GELU, mean pooling, L2 normalize).
Goal: forward <= 1.5x onnxruntime."""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from safetensors import safe_open

from common import Row, best_of, env_note, print_rows

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "minilm"))
import model as minilm  # noqa: E402

from rlx_bake import BakeOptions, bake, load_safetensors  # noqa: E402
from rlx_format import read_rlx, write_rlx, write_rlx_encrypted  # noqa: E402
from rlx_runtime import Session  # noqa: E402


def onnx_minilm(weights: dict, config: dict) -> onnx.ModelProto:
    d, heads = config["hidden_size"], config["num_attention_heads"]
    hd, eps = d // heads, config["layer_norm_eps"]
    nodes, inits = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def nd(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], **kw))
        return out

    for k, v in weights.items():
        if k.startswith("encoder") and k.endswith(".weight") and v.ndim == 2:
            init(k + ".T", np.asarray(v).T)  # exporters store linear weights as [in, out] for MatMul
        elif k.startswith(("embeddings", "encoder")) and k != "embeddings.position_ids":
            init(k, np.asarray(v))
    init("c_heads", np.array([0, 0, heads, hd], np.int64))
    init("c_back", np.array([0, 0, d], np.int64))
    init("c_scale", np.array(1 / np.sqrt(hd), np.float32))
    init("c_sqrt2", np.array(np.sqrt(2.0), np.float32))
    init("c_one", np.array(1.0, np.float32))
    init("c_half", np.array(0.5, np.float32))
    init("c_neg", np.array(-1e9, np.float32))
    init("c_tt", np.zeros((1, 1), np.int64))  # token type 0 for every position
    init("c_ax1", np.array([1], np.int64))
    init("c_eps", np.array(1e-12, np.float32))
    init("c_cnt", np.array(1e-9, np.float32))
    init("c_s1", np.array([1], np.int64))
    init("c_s2", np.array([2], np.int64))
    init("c_ax0", np.array([0], np.int64))
    nd("Slice", [nd("Shape", ["input_ids"], "shape"), "c_s1", "c_s2"], "seq1")
    pos = nd("Slice", ["embeddings.position_embeddings.weight", "c_zero1", "seq1", "c_ax0"], "pe")
    init("c_zero1", np.array([0], np.int64))
    x = nd("Add", [nd("Add", [nd("Gather", ["embeddings.word_embeddings.weight", "input_ids"], "we"), pos], "wp"),
                   nd("Gather", ["embeddings.token_type_embeddings.weight", "c_tt"], "te")], "emb")
    x = nd("LayerNormalization", [x, "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"], "emb_ln", epsilon=eps)
    maskf = nd("Cast", ["attention_mask"], "maskf", to=TensorProto.FLOAT)
    add_mask = nd("Mul", [nd("Sub", ["c_one", nd("Unsqueeze", [maskf, "c_ax12"], "m4")], "inv"), "c_neg"], "addmask")
    init("c_ax12", np.array([1, 2], np.int64))
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"

        def lin(t, name, tag):
            return nd("Add", [nd("MatMul", [t, f"{name}.weight.T"], f"{tag}_mm"), f"{name}.bias"], tag)

        def heads_of(t, tag):
            return nd("Transpose", [nd("Reshape", [t, "c_heads"], f"{tag}_r")], f"{tag}_t", perm=[0, 2, 1, 3])

        q = heads_of(lin(x, f"{p}.attention.self.query", f"q{i}"), f"q{i}")
        k = nd("Transpose", [nd("Reshape", [lin(x, f"{p}.attention.self.key", f"k{i}"), "c_heads"], f"k{i}_r")],
               f"k{i}_t", perm=[0, 2, 3, 1])
        v = heads_of(lin(x, f"{p}.attention.self.value", f"v{i}"), f"v{i}")
        s = nd("Add", [nd("Mul", [nd("MatMul", [q, k], f"qk{i}"), "c_scale"], f"s{i}"), add_mask], f"sm{i}")
        a = nd("MatMul", [nd("Softmax", [s], f"p{i}", axis=-1), v], f"a{i}")
        a = nd("Reshape", [nd("Transpose", [a], f"at{i}", perm=[0, 2, 1, 3]), "c_back"], f"ab{i}")
        x = nd("LayerNormalization", [nd("Add", [lin(a, f"{p}.attention.output.dense", f"o{i}"), x], f"r1_{i}"),
                                      f"{p}.attention.output.LayerNorm.weight", f"{p}.attention.output.LayerNorm.bias"],
               f"ln1_{i}", epsilon=eps)
        f = lin(x, f"{p}.intermediate.dense", f"f1_{i}")
        erf = nd("Erf", [nd("Div", [f, "c_sqrt2"], f"gd{i}")], f"ge{i}")
        gelu = nd("Mul", [nd("Mul", [f, nd("Add", [erf, "c_one"], f"ga{i}")], f"gm{i}"), "c_half"], f"gelu{i}")
        x = nd("LayerNormalization", [nd("Add", [lin(gelu, f"{p}.output.dense", f"f2_{i}"), x], f"r2_{i}"),
                                      f"{p}.output.LayerNorm.weight", f"{p}.output.LayerNorm.bias"],
               f"ln2_{i}", epsilon=eps)
    m3 = nd("Unsqueeze", [maskf, "c_ax2"], "m3")
    init("c_ax2", np.array([2], np.int64))
    summed = nd("ReduceSum", [nd("Mul", [x, m3], "xm"), "c_ax1"], "summed", keepdims=0)
    count = nd("Max", [nd("ReduceSum", [m3, "c_ax1"], "cnt", keepdims=0), "c_cnt"], "cntc")
    pooled = nd("Div", [summed, count], "pooled")
    norm = nd("Max", [nd("Sqrt", [nd("ReduceSum", [nd("Mul", [pooled, pooled], "sq"), "c_ax1"], "ss", keepdims=1)],
                         "nrm"), "c_eps"], "nrmc")
    nd("Div", [pooled, norm], "embeddings")
    g = helper.make_graph(nodes, "minilm",
                          [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
                           helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
                          [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", d])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _safe_open_keys(path: Path) -> list:
    with safe_open(str(path), framework="numpy") as f:
        return list(f.keys())


def main() -> list[Row]:
    config = minilm.load_config()
    src = minilm.model_dir() / "model.safetensors"
    weights = load_safetensors(src)
    graph = minilm.build_graph(config)
    r = np.random.default_rng(0)
    ids = r.integers(1000, 29000, (8, 128)).astype(np.int64)
    mask = np.ones((8, 128), np.int64)
    mask[4:, 100:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    rows = []
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tmp = Path(tmp)
        sizes = {"safetensors (f32)": src.stat().st_size}
        t0 = time.perf_counter()
        rf_exact, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
        write_rlx(tmp / "exact.rlx", rf_exact)
        t_bake = time.perf_counter() - t0
        rf_size, _ = bake(graph, weights, BakeOptions.from_profile("size"))
        write_rlx(tmp / "size.rlx", rf_size)
        write_rlx_encrypted(tmp / "sealed.rlx", rf_size, "pw")
        for name in ("exact", "size", "sealed"):
            sizes[name] = (tmp / f"{name}.rlx").stat().st_size
        t_open = best_of(lambda: read_rlx(tmp / "exact.rlx"), number=5)
        t_open_st = best_of(lambda: _safe_open_keys(src), number=5)
        model_path = tmp / "minilm.onnx"
        onnx.save(onnx_minilm(weights, config), model_path)
        sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)[0]
        for name in ("exact", "size"):
            c = Session().compile(read_rlx(tmp / f"{name}.rlx"))
            out = c.run(feeds)["embeddings"]
            cos = float(((out * ref).sum(1) / np.linalg.norm(out, axis=1) / np.linalg.norm(ref, axis=1)).min())
            assert cos > (0.99999 if name == "exact" else 0.999), cos
            t = best_of(lambda c=c: c.run(feeds), repeat=5, number=3)
            t_ort = best_of(lambda: sess.run(None, feeds), repeat=5, number=3)
            rows.append(Row("minilm", f"forward b8 s128 ({name}, min cos {cos:.6f})", t, t_ort, "onnxruntime",
                            "<= 1.5x", origin="target set with the MiniLM showcase (e242781)"))
    rows.append(Row("minilm", "open: read_rlx(exact) vs safe_open", t_open, t_open_st, "safetensors safe_open",
                    "<= 1.0x", origin="the load benchmark's safe_open target (ef6ed04), on a real model"))
    for k, v in sizes.items():
        print(f"minilm artifact {k:20} {v / 2**20:7.1f} MiB")
    print(f"minilm bake exact + write          {t_bake * 1e3:7.1f} ms (no peer: information only)")
    return rows


if __name__ == "__main__":
    print(env_note())
    print_rows(main())
