"""all-MiniLM-L6-v2 baked with `size` in every registered lossy quant type (and `--quant auto` at two cosine
floors): file size and the sentence-embedding cosine against the `exact` bake (the min over a batch of 8
sequences of 128 tokens). Information rows for the README table (issue #23); no peer, no goal."""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from common import env_note

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "minilm"))
import model as minilm  # noqa: E402

from rlx_bake import BakeOptions, bake, load_safetensors  # noqa: E402
from rlx_bake.quant_choice import quant_types  # noqa: E402
from rlx_format import write_rlx  # noqa: E402
from rlx_runtime import Session  # noqa: E402


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def table() -> list[tuple[str, float, float, float]]:
    """(setting, MiB, min cosine vs exact, seconds to bake)"""
    import time

    config = minilm.load_config()
    weights = load_safetensors(minilm.model_dir() / "model.safetensors")
    graph = minilm.build_graph(config)
    r = np.random.default_rng(0)
    feeds = {"input_ids": r.integers(1000, 29000, (8, 128)).astype(np.int64),
             "attention_mask": np.ones((8, 128), np.int64)}
    feeds["attention_mask"][4:, 100:] = 0
    settings = [("exact", {})] + [(t, {"quant_type": t}) for t in quant_types() if t != "auto"]
    settings += [("auto, cosine >= 0.999", {"quant_type": "auto", "quant_min_cosine": 0.999}),
                 ("auto, cosine >= 0.99", {"quant_type": "auto", "quant_min_cosine": 0.99})]
    rows, ref = [], None
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, opts in settings:
            t0 = time.perf_counter()
            rf, _ = bake(graph, weights, BakeOptions.from_profile("exact" if name == "exact" else "size", **opts))
            dt = time.perf_counter() - t0
            path = Path(tmp) / "m.rlx"
            write_rlx(path, rf)
            out = Session().compile(rf).run(feeds)["embeddings"]
            ref = out if ref is None else ref
            rows.append((name, path.stat().st_size / 2**20, _cosine(out, ref), dt))
    return rows


def main() -> list:
    for name, mib, cos, dt in table():
        print(f"minilm size {name:24} {mib:7.1f} MiB  min cosine vs exact {cos:.6f}  bake {dt:5.1f} s")
    return []


if __name__ == "__main__":
    print(env_note())
    main()
