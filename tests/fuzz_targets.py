"""Fuzz targets shared by the hypothesis tests (CI, bounded) and scripts/fuzz.py (`make fuzz`, longer).

The invariant for every target: only RlxError subclasses escape, and no call on a small input
takes more than a second.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from rlx_bake import load_safetensors
from rlx_bake.onnx import import_onnx  # imported here so no target call pays for a first import
from rlx_format import OPS, Graph, GraphBuilder, RlxError, RlxFile, read_rlx_bytes, read_rlx_with_password
from rlx_format.dtypes import NUMPY_DTYPES
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
        Graph.from_json(d if isinstance(d, (dict, str)) else _dumps_or_raw(d))
    return _guard(go, doc)


def _dumps_or_raw(d):
    try:
        return json.dumps(d)
    except ValueError:  # an integer over Python's 4300-digit print limit: hand the value over as it is
        return d


RUN_MAX_ELEMENTS = 1 << 16


def target_graph_lifecycle(doc) -> bool:
    """A graph that loads must also write (graph.json and .rlx), re-read to the same types, and run on small
    inputs to arrays of its inferred static shapes (a run-time RlxError is allowed: data-dependent checks
    such as index ranges live there)."""
    def go(d):
        g = Graph.from_json(d)
        again = Graph.from_json(g.to_json())
        assert again.types == g.types, f"graph.json round trip changed types: {g.types} -> {again.types}"
        # in a .rlx the constants live in the weight table: types match once their values are bound again
        assert read_rlx_bytes(RlxFile.from_graph(g).to_bytes()).materialize_graph().validate().types == g.types
        if any(not t.is_static() or math.prod(t.shape) > RUN_MAX_ELEMENTS for t in g.types.values()):
            return
        from rlx_runtime import Device, Session
        feeds = {v.name: np.ones(v.shape, NUMPY_DTYPES[v.dtype]) for v in g.inputs}
        try:
            out = Session(Device.CPU).compile(g).run(feeds)
        except RlxError:
            return
        for name, arr in out.items():
            want = g.types[name].shape
            assert getattr(arr, "shape", None) == want, f"output {name!r}: {arr!r:.80}; expected shape {want}"
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
    doc = copy.deepcopy(doc)  # not a JSON round trip: a mutation may hold what json.dumps cannot write
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
               [[[[]]]], ["b", 4], "f32", "bf16", *EDGE_INTS, *EDGE_FLOATS, *ODD_NAMES]
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


# Values that sit on or beyond the edges of the load-time rules (spec/graph-json.md, spec/ops.md).
EDGE_INTS = [-(2**63) - 1, -(2**63), -5, -1, 0, 2**62, 2**63 - 1, 2**63, 2**64, 10**400]
EDGE_FLOATS = [0.0, -0.0, -1.0, 1e-300, 1e300, -1e308, float("inf"), float("-inf"), float("nan"), 10**400]
ODD_NAMES = ["", "\x00", "a\x00b", "a\nb", "\x7f", "\x85", "\ud800", "b\udfff", "\u00e9\u4e2d", "x" * 70_000]
_SANE = {"int": [-1, 0, 1, 2, 3], "float": [0.5, 1.0, 2.0], "ints": [0, 1, 1, 2, -1], "floats": [0.5, 1.0, 2.0]}


def _pick(rng: np.random.Generator, seq):
    return seq[int(rng.integers(0, len(seq)))]


def _attr_value(kind: str, choices: tuple, rng: np.random.Generator):
    """Mostly a plausible value (so inference gets past the first check), sometimes an edge value."""
    edge = rng.random() < 0.4
    if choices and not edge:
        return _pick(rng, choices)
    if kind in ("int", "float"):
        return _pick(rng, (EDGE_INTS if kind == "int" else EDGE_FLOATS) if edge else _SANE[kind])
    if kind in ("ints", "floats"):
        pool = _SANE[kind] + ((EDGE_INTS if kind == "ints" else EDGE_FLOATS) if edge else [])
        return [_pick(rng, pool) for _ in range(int(rng.integers(0, 5)))]
    if kind == "dtype":
        return _pick(rng, list(NUMPY_DTYPES) + (["f128", 5] if edge else []))
    return _pick(rng, ["", "ij,jk->ik", "...", "a\u00e9", "\ud800", "x"])


def random_op_doc(rng: np.random.Generator) -> dict:
    """One catalogue op on random inputs (rank 0..4; zero, symbolic and out-of-range dims; some inputs small
    constants holding edge values) with random attrs: the type-inference edge cases, huge numbers, negative
    dims and odd names of spec/ops.md's load-time rules."""
    op = _pick(rng, sorted(OPS))
    spec = OPS[op]
    n_in = int(rng.integers(spec.min_inputs, min(spec.max_inputs, spec.min_inputs + 2) + 1))
    common = "f32" if rng.random() < 0.7 else _pick(rng, list(NUMPY_DTYPES))
    inputs, consts, names = [], [], []
    for i in range(n_in):
        dtype = common if rng.random() < 0.8 else _pick(rng, ["i64", "f32", "u8", "bool"])
        name = f"in{i}"
        names.append(name)
        if rng.random() < 0.3:  # a small constant: drives Range/Tile/Expand/Reshape/ConstantOfShape
            pool = EDGE_FLOATS + [1.0, 2.0] * 4 if dtype[0] in "fb" else EDGE_INTS[2:5] + [0, 1, 2, 3] * 3
            n = int(rng.integers(1, 4))
            data = [_pick(rng, pool) for _ in range(n)]
            consts.append({"name": name, "dtype": dtype, "shape": [] if n == 1 and rng.random() < 0.5 else [n],
                           "data": data})
        else:
            dims = [1, 2, 3, 4, "n"] if rng.random() < 0.9 else [0, -1, 2**48 + 1, 10**400, 1.5]
            inputs.append({"name": name, "dtype": dtype,
                           "shape": [_pick(rng, dims) for _ in range(int(rng.integers(0, 5)))]})
    attrs = {k: _attr_value(a.kind, a.choices, rng) for k, a in spec.attrs.items() if rng.random() < 0.6}
    d = {"format": "rlx.graph", "version": 1, "name": "fuzz", "inputs": inputs, "constants": consts,
         "nodes": [{"name": "y", "op": op, "inputs": names, "attrs": attrs}], "outputs": ["y"]}
    if rng.random() < 0.1:  # one odd name: the graph's, the output's (everywhere it is used) or an input's
        odd, where = _pick(rng, ODD_NAMES), int(rng.integers(0, 3))
        if where == 0:
            d["name"] = odd
        elif where == 1:
            d["nodes"][0]["name"], d["outputs"] = odd, [odd]
        elif inputs:
            d["nodes"][0]["inputs"] = [odd if n == inputs[0]["name"] else n for n in names]
            inputs[0]["name"] = odd
    return d
