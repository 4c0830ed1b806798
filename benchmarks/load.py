"""Open a ~1 GiB artifact: rlx read_rlx vs safetensors (load_file and safe_open) on the same weights.
Two ways: reading the first value of each weight (what a lazy open costs; goals: >= 10x faster than
load_file, not slower than safe_open; RSS after open < 50 MB above the process baseline), and reading every
byte of every weight (a checksum of all of it; goal: not slower than either peer).

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
kind, path, every = sys.argv[1], sys.argv[2], sys.argv[3] == 'every'
def touch(a):  # every byte (a wrapping u64 sum of the whole buffer), or the first value only
    return int(np.ascontiguousarray(a).reshape(-1).view(np.uint64).sum()) if every else float(a.ravel()[0])
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
    s = sum(touch(w.array()) for w in rf.weights.values())
elif kind == 'load_file':
    from safetensors.numpy import load_file
    base = rss()
    t = time.perf_counter()
    d = load_file(path)
    s = sum(touch(a) for a in d.values())
else:
    from safetensors import safe_open
    base = rss()
    t = time.perf_counter()
    with safe_open(path, framework='numpy') as f:
        s = sum(touch(f.get_tensor(k)) if every else float(f.get_slice(k)[0:1][0]) for k in f.keys())
print(json.dumps({'seconds': time.perf_counter() - t, 'rss_delta_mb': rss() - base, 'sum': s}))
"""


def _child(kind: str, path: Path, every: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, str(path), "every" if every else "first"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def best(kind, path, every=False, n=3):
    runs = [_child(kind, path, every) for _ in range(n)]
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
        full = {kind: best(kind, d / name, every=True) for kind, name in
                (("rlx", "m.rlx"), ("load_file", "m.safetensors"), ("safe_open", "m.safetensors"))}
        assert full["rlx"]["sum"] == full["load_file"]["sum"] == full["safe_open"]["sum"]
    origin = "target set with the first benchmarks (ef6ed04): a memory-mapped open"
    every = "derived (issue #25): mapping the file must not cost more than reading it"
    return [
        Row("load", "open 1 GiB + first value of each weight", rlx["seconds"], lf["seconds"], "safetensors load_file",
            "<= 0.1x", origin=origin),
        Row("load", "open 1 GiB + first value of each weight", rlx["seconds"], so["seconds"], "safetensors safe_open",
            "<= 1.0x", origin=origin),
        Row("load", "RSS growth after open (MB)", rlx["rss_delta_mb"], 50.0, "budget 50 MB", "<= 1.0x", unit="MB",
            origin=origin),
        Row("load", "open 1 GiB + read every byte", full["rlx"]["seconds"], full["load_file"]["seconds"],
            "safetensors load_file", "<= 1.0x", origin=every),
        Row("load", "open 1 GiB + read every byte", full["rlx"]["seconds"], full["safe_open"]["seconds"],
            "safetensors safe_open", "<= 1.0x", origin=every),
    ]


if __name__ == "__main__":
    print(env_note())
    print_rows(main())
