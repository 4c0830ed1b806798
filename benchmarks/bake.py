"""Bake a ~1 GiB safetensors model (an 8-layer MLP of 4096x8192 f32 weights) with `merge` and `exact`,
vs copying the weights file with shutil.copyfile, same machine, page cache warm for both.
Goals: bake time <= 2x the copy; peak RSS <= 1.5x the largest tensor + 150 MB. The bake fsyncs its
output (atomic, durable write) and copyfile does not, so the copy + sync time is printed too; every
timed step starts after os.sync() so no step pays for an earlier one's dirty pages.
Each bake runs in a fresh subprocess; peak RSS is its VmHWM (ru_maxrss would include the parent's
high-water mark, which Linux carries across fork+exec)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from common import Row, env_note, print_rows
from rlx_format import GraphBuilder

LAYERS, D, H = 4, 4096, 8192  # 4 x (4096x8192 + 8192x4096) f32 = 1 GiB

CHILD = r"""
import json, sys, time
from rlx_bake import BakeOptions, bake, load_graph
from rlx_format import write_rlx
t = time.perf_counter()
graph, ws = load_graph(sys.argv[1])
rf, rep = bake(graph, ws, BakeOptions.from_profile(sys.argv[3]))
write_rlx(sys.argv[2], rf)
status = dict(l.split(':', 1) for l in open('/proc/self/status'))
print(json.dumps({'seconds': time.perf_counter() - t,
                  'peak_rss_mb': int(status['VmHWM'].split()[0]) / 1024,
                  'anon_mb': int(status['RssAnon'].split()[0]) / 1024,
                  'file_mb': int(status['RssFile'].split()[0]) / 1024}))
"""


def make_bundle(d: Path) -> int:
    g = GraphBuilder("big_mlp")
    h = g.input("x", "f32", ["batch", D])
    weights = {}
    r = np.random.default_rng(0)
    for i in range(LAYERS):
        for name, shape in ((f"up{i}", (D, H)), (f"down{i}", (H, D))):
            weights[name] = (r.standard_normal(shape, dtype=np.float32) * 0.01)
        h = g.matmul(g.relu(g.matmul(h, g.param(f"up{i}", "f32", [D, H]))), g.param(f"down{i}", "f32", [H, D]))
    g.output(g.identity(h, name="y"))
    g.build().to_json(d / "graph.json")
    save_file(weights, str(d / "weights.safetensors"))
    return max(w.nbytes for w in weights.values())


def main() -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(dir=Path(__file__).parent) as tmp:
        d = Path(tmp) / "bundle"
        d.mkdir()
        largest = make_bundle(d)
        src = d / "weights.safetensors"
        shutil.copyfile(src, Path(tmp) / "warm.copy")  # warm the page cache once
        os.sync()  # start every timed step with no dirty pages from an earlier one
        t = time.perf_counter()
        shutil.copyfile(src, Path(tmp) / "copy.safetensors")
        t_copy = time.perf_counter() - t
        t = time.perf_counter()
        os.sync()
        t_copy_sync = t_copy + time.perf_counter() - t
        budget_mb = 1.5 * largest / 2**20 + 150
        # the bake fsyncs its output and copyfile does not: the copy with its flush, for reading the rows below
        print(f"bake peer: shutil.copyfile {t_copy * 1e3:.0f} ms, with os.sync {t_copy_sync * 1e3:.0f} ms")
        origin = "target set with the first benchmarks (ef6ed04)"
        for profile in ("merge", "exact"):
            os.sync()
            out = Path(tmp) / f"{profile}.rlx"
            res = subprocess.run([sys.executable, "-c", CHILD, str(d), str(out), profile], capture_output=True,
                                 text=True, check=True)
            m = json.loads(res.stdout)
            rows.append(Row("bake", f"{profile}: 1 GiB bundle -> .rlx", m["seconds"], t_copy, "shutil.copyfile",
                            "<= 2.0x", origin=origin))
            rows.append(Row("bake", f"{profile}: peak RSS (MB)", m["peak_rss_mb"], budget_mb,
                            "1.5x largest + 150 MB", "<= 1.0x", unit="MB", origin=origin + ": memory near one tensor"))
            rows.append(Row("bake", f"{profile}: anonymous RSS at end (MB)", m["anon_mb"], budget_mb,
                            "1.5x largest + 150 MB", "<= 1.0x", unit="MB", origin=origin + ": memory near one tensor"))
            out.unlink()
    return rows


if __name__ == "__main__":
    print(env_note())
    print_rows(main())
