"""SIGKILL a bake at random moments: the destination is always absent or a complete file that verifies."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from rlx_format import GraphBuilder, read_rlx

TRIALS = 20
MB = 1 << 20


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("crash") / "bundle"
    d.mkdir()
    g = GraphBuilder("crash")
    h = g.input("x", "f32", ["b", 1024])
    weights = {}
    for i in range(4):  # 4 x 64 MiB = 256 MiB of weights
        name = f"w{i}"
        weights[name] = np.full((1024, 16384), i + 1, np.float32)
        h = g.reduce_sum(g.matmul(h, g.param(name, "f32", [1024, 16384])), axes=[1], keepdims=1)
        h = g.expand(h, shape=[1, 1024])
    g.output(g.identity(h, name="y"))
    g.build().to_json(d / "graph.json")
    save_file(weights, str(d / "weights.safetensors"))
    return d


def bake_cmd(bundle: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "rlx_bake", "-q", str(bundle), "-o", str(out), "--opt", "merge"]


def test_sigkill_during_bake_never_leaves_a_partial_file(bundle, tmp_path):
    out = tmp_path / "model.rlx"
    full = float("inf")
    for _ in range(2):  # the warm time: a first, cold run (imports, page cache) would stretch the kill window
        t = time.perf_counter()
        subprocess.run(bake_cmd(bundle, out), check=True, capture_output=True)
        full = min(full, time.perf_counter() - t)
    previous = out.read_bytes()
    read_rlx(out, verify=True)
    rng = np.random.default_rng(2024)
    outcomes = {"killed": 0, "finished": 0}
    for trial in range(TRIALS):
        proc = subprocess.Popen(bake_cmd(bundle, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(float(rng.uniform(0.05, full * 1.1)))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            outcomes["killed"] += 1
        else:
            outcomes["finished"] += 1
        proc.wait()
        assert out.exists(), f"trial {trial}: destination vanished"
        rf = read_rlx(out, verify=True)  # the previous complete file, or the new complete one
        assert rf.meta["bake"]["profile"] == "merge"
        assert out.read_bytes() == previous  # bakes are reproducible: old and new are the same bytes
        strays = [p for p in tmp_path.iterdir() if p.name != "model.rlx"]
        assert all(p.name.startswith(".model.rlx.") and p.name.endswith(".tmp") for p in strays), strays
        for p in strays:  # hidden temp names never collide with outputs; drop them to save disk
            p.unlink()
    assert outcomes["killed"] >= TRIALS // 2, outcomes


def test_sigkill_first_bake_leaves_nothing_or_a_complete_file(bundle, tmp_path):
    rng = np.random.default_rng(7)
    for trial in range(5):
        out = tmp_path / f"fresh{trial}.rlx"
        proc = subprocess.Popen(bake_cmd(bundle, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(float(rng.uniform(0.5, 2.0)))
        proc.kill()
        proc.wait()
        if out.exists():
            read_rlx(out, verify=True)
        for p in tmp_path.glob(f".{out.name}.*.tmp"):
            p.unlink()
