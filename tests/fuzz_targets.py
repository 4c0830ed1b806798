"""Fuzz targets shared by the hypothesis tests (CI, bounded) and scripts/fuzz.py (`make fuzz`, longer).

The invariant for every target: only RlxError subclasses escape, and no call on a small input
takes more than a second.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from rlx_bake import load_safetensors
from rlx_bake.onnx import import_onnx  # imported here so no target call pays for a first import
from rlx_format import Graph, GraphBuilder, RlxError, RlxFile, read_rlx_bytes, read_rlx_with_password
from rlx_format.sealed import KDF_PROFILES, write_rlx_encrypted

TIME_LIMIT_S = 1.0
PASSWORD = "fuzz"
_TMP = Path(tempfile.mkdtemp(prefix="rlx-fuzz-"))


def seed_graph() -> Graph:
    g = GraphBuilder("seed")
    x = g.input("x", "f32", ["b", 4])
    w = g.param("w", "f32", [4, 3])
    c = g.constant(np.arange(3, dtype=np.float32), name="c")
    h = g.add(g.matmul(x, w), c)
    g.output(g.softmax(g.reshape(h, shape=[0, -1]), name="y"))
    return g.build()


def seed_rlx() -> bytes:
    from rlx_bake import bake
    rf, _ = bake(seed_graph(), {"w": np.ones((4, 3), np.float32)})
    return rf.to_bytes()


def seed_sealed() -> bytes:
    p = _TMP / "seed_sealed.rlx"
    g = GraphBuilder("s")
    g.input("x", "f32", [2])
    g.output(g.relu("x", name="y"))
    write_rlx_encrypted(p, RlxFile.from_graph(g.build()), PASSWORD, KDF_PROFILES["fast"], chunk_size=4096)
    return p.read_bytes()


def seed_safetensors() -> bytes:
    return save({"w": np.ones((4, 3), np.float32), "b": np.arange(5, dtype=np.int64)})


def seed_onnx() -> bytes:
    """A small conv model from the ONNX backend test data the onnx package ships."""
    import onnx
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "pytorch-operator" / "test_operator_conv"
    return (path / "model.onnx").read_bytes()


def _guard(fn, *args, limit: float = TIME_LIMIT_S) -> bool:
    """Run fn; True if it succeeded, False on RlxError; anything else propagates. Enforces the time limit."""
    t = time.perf_counter()
    try:
        fn(*args)
        ok = True
    except RlxError:
        ok = False
    elapsed = time.perf_counter() - t
    if elapsed > limit:
        raise AssertionError(f"{fn.__name__} took {elapsed:.2f}s on a small input")
    return ok


def target_read_rlx(data: bytes) -> bool:
    def go(d):
        rf = read_rlx_bytes(d)
        rf.verify()
        rf.materialize_graph()
    return _guard(go, data)


def target_graph_json(doc) -> bool:
    def go(d):
        Graph.from_json(d if isinstance(d, (dict, str)) else json.dumps(d))
    return _guard(go, doc)


def target_sealed(data: bytes) -> bool:
    """A mutated header may ask for more Argon2 work than the seed (memory/iterations/lanes up to the
    reader's documented caps): the key must be derived before the tampering can be detected, so such
    cases get the time the caps allow instead of one second."""
    from rlx_format.sealed import KDF_PROFILES, parse_header
    p = _TMP / "sealed.rlx"
    p.write_bytes(data)
    limit = TIME_LIMIT_S
    try:
        kdf = parse_header(data).kdf
        if kdf.memory_kib * kdf.iterations > KDF_PROFILES["fast"].memory_kib * KDF_PROFILES["fast"].iterations:
            limit = 120.0
    except RlxError:
        pass
    return _guard(read_rlx_with_password, p, PASSWORD, limit=limit)


def target_safetensors(data: bytes) -> bool:
    p = _TMP / "w.safetensors"
    p.write_bytes(data)
    return _guard(load_safetensors, p)


def target_onnx(data: bytes) -> bool:
    p = _TMP / "m.onnx"
    p.write_bytes(data)
    return _guard(import_onnx, p)


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """A few random edits: bit flips, byte overwrites, inserts, deletes, truncation."""
    b = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        kind = int(rng.integers(0, 5))
        pos = int(rng.integers(0, max(len(b), 1)))
        if kind == 0 and b:
            b[pos % len(b)] ^= 1 << int(rng.integers(0, 8))
        elif kind == 1 and b:
            b[pos % len(b)] = int(rng.integers(0, 256))
        elif kind == 2:
            b[pos:pos] = bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
        elif kind == 3 and b:
            del b[pos:pos + int(rng.integers(1, 9))]
        else:
            b = b[:pos]
    return bytes(b)


def mutate_json(doc, rng: np.random.Generator):
    """Replace one random leaf or container of a graph dict with a random value of another type."""
    doc = json.loads(json.dumps(doc))
    paths = []
    stack = [((), doc)]
    while stack:
        path, node = stack.pop()
        paths.append(path)
        if isinstance(node, dict):
            stack.extend(((*path, k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in enumerate(node))
    path = paths[int(rng.integers(0, len(paths)))]
    choices = [None, True, -1, 0, 2**63, 1.5, float("1e308"), "", "x", "MatMul", [], [1, 2], {}, {"a": 1},
               [[[[]]]], ["b", 4], "f32", "bf16"]
    value = choices[int(rng.integers(0, len(choices)))]
    if not path:
        return value
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if isinstance(parent, list) and rng.random() < 0.2:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return doc
