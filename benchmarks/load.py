"""Open a ~1 GiB artifact and touch one byte of every weight: rlx read_rlx vs safetensors
(load_file and safe_open) on the same weights, one process. Goals: >= 10x faster than load_file,
faster than safe_open; RSS after open < 50 MB above the process baseline.

Each loader runs in a fresh subprocess so page-cache-warm files and RSS are measured alike.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from common import Row, env_note, print_rows
from rlx_format import GraphBuilder, RlxFile, Weight, write_rlx

N_TENSORS = 64
ELEMS = (1 << 30) // 4 // N_TENSORS  # 1 GiB of f32 in total

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
kind, path = sys.argv[1], sys.argv[2]
def rss():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
base = rss()
import numpy as np
if kind == 'rlx':
    from rlx_format import read_rlx
    base = rss()
    t = time.perf_counter()
    rf = read_rlx(path)
    s = sum(float(w.array().ravel()[0]) for w in rf.weights.values())
elif kind == 'load_file':
    from safetensors.numpy import load_file
    base = rss()
    t = time.perf_counter()
    d = load_file(path)
    s = sum(float(a.ravel()[0]) for a in d.values())
else:
    from safetensors import safe_open
    base = rss()
    t = time.perf_counter()
    with safe_open(path, framework='numpy') as f:
        s = sum(float(f.get_slice(k)[0:1][0]) for k in f.keys())
print(json.dumps({'seconds': time.perf_counter() - t, 'rss_delta_mb': rss() - base, 'sum': s}))
"""


def _child(kind: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(path)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def best(kind, path, n=3):
    runs = [_child(kind, path) for _ in range(n)]
    return min(runs, key=lambda r: r["seconds"])


def main() -> list[Row]:
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as d:
        d = Path(d)
        r = np.random.default_rng(0)
        tensors = {f"w{i:02d}": r.standard_normal(ELEMS, dtype=np.float32) for i in range(N_TENSORS)}
        save_file(tensors, str(d / "m.safetensors"))
        g = GraphBuilder("load")
        g.input("x", "f32", [1])
        g.output("x")
        rf = RlxFile.from_graph(g.build())
        rf.weights = {k: Weight.plain(k, v, "f32") for k, v in tensors.items()}
        write_rlx(d / "m.rlx", rf)
        del tensors, rf
        rlx = best("rlx", d / "m.rlx")
        lf = best("load_file", d / "m.safetensors")
        so = best("safe_open", d / "m.safetensors")
        assert abs(rlx["sum"] - lf["sum"]) < 1e-3 and abs(rlx["sum"] - so["sum"]) < 1e-3
    return [
        Row("load", "open 1 GiB + touch every weight", rlx["seconds"], lf["seconds"], "safetensors load_file",
            "<= 0.1x"),
        Row("load", "open 1 GiB + touch every weight", rlx["seconds"], so["seconds"], "safetensors safe_open",
            "<= 1.0x"),
        Row("load", "RSS growth after open (MB)", rlx["rss_delta_mb"], 50.0, "budget 50 MB", "<= 1.0x", unit="MB"),
    ]


if __name__ == "__main__":
    print(env_note())
    print_rows(main())
