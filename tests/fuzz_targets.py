"""Fuzz targets shared by the hypothesis tests (CI, bounded) and scripts/fuzz.py (`make fuzz`, longer).

The invariant for every target: only RlxError subclasses escape, and no call on a small input
takes more than a second.
"""

from __future__ import annotations

import copy
import json
import math
import struct
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
from safetensors.numpy import save

from rlx_bake import load_safetensors
from rlx_bake.onnx import import_onnx  # imported here so no target call pays for a first import
from rlx_format import OPS, Graph, GraphBuilder, RlxError, RlxFile, Weight, read_rlx_bytes, read_rlx_with_password
from rlx_format.constants import ALIGNMENT, PREAMBLE_BYTES, RLXBAKE_MAGIC
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


# ---------------------------------------------------------------- crafted files (hostile seeds and tests)


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def raw_file(header: bytes) -> bytes:
    """An .rlx preamble followed by raw header bytes (for headers no writer would produce)."""
    return RLXBAKE_MAGIC + struct.pack("<IQ", 2, len(header)) + header


def split(data: bytes) -> tuple[dict, dict[str, bytes]]:
    """The header map of a valid .rlx file and each weight's stored bytes."""
    hlen = struct.unpack("<Q", data[12:20])[0]
    h = msgpack.unpackb(data[20:20 + hlen])
    return h, {e["name"]: data[e["offset"]:e["offset"] + e["nbytes"]] for e in h["weights"]}


def assemble(h, tensors: dict[str, bytes]) -> bytes:
    """An .rlx file from a header (any msgpack value): entries naming one of `tensors` get that tensor,
    laid out as the writer does (offsets recomputed); other entries are left as they are."""
    table = h.get("weights") if isinstance(h, dict) else None
    entries = [e for e in table if isinstance(e, dict) and isinstance(e.get("name"), str) and e["name"] in tensors
               ] if isinstance(table, list) else []
    hlen = len(msgpack.packb(h))
    while True:
        pos = _align(PREAMBLE_BYTES + hlen)
        for e in entries:
            e["offset"] = pos
            pos = _align(pos + len(tensors[e["name"]]))
        hb = msgpack.packb(h)
        if _align(PREAMBLE_BYTES + len(hb)) == _align(PREAMBLE_BYTES + hlen):
            break
        hlen = len(hb)
    out = bytearray(raw_file(hb))
    for e in entries:
        out += b"\0" * (e["offset"] - len(out)) + tensors[e["name"]]
    return bytes(out)


def amplifying_header(n: int, key: str) -> bytes:
    """A header whose `key` ("graph", "weights", "meta" or an unknown one) holds n empty arrays, in arrays of
    at most 1M: one byte each in the file, ~70 bytes each as Python lists."""
    parts = [min(1 << 20, n - i) for i in range(0, n, 1 << 20)]
    arrays = b"\xdd" + struct.pack(">I", len(parts)) + b"".join(
        b"\xdd" + struct.pack(">I", k) + b"\x90" * k for k in parts)
    if key == "graph":
        return b"\x81" + msgpack.packb("graph") + b"\x81" + msgpack.packb("nodes") + arrays  # {"nodes": [[]...]}
    value = b"\x81" + msgpack.packb("x") + arrays if key == "meta" else arrays
    return b"\x82" + msgpack.packb("graph") + msgpack.packb(seed_graph().to_dict()) + msgpack.packb(key) + value


def long_name(n: int, rng: np.random.Generator, letters: int = 2) -> str:
    """A random name that keeps difflib's ratio() quadratic: its autojunk (names of 200+ characters) only drops
    characters seen in over 1% of positions, so long names need 100+ distinct letters, short ones few."""
    return "".join(rng.choice([chr(0x100 + i) for i in range(letters)], n))


def _edit(fn) -> bytes:
    h, tensors = split(seed_rlx())
    fn(h)
    return assemble(h, tensors)


def _many_weights(n: int, name_len: int = 6) -> bytes:
    g = GraphBuilder("many")
    g.input("x", "f32", [1])
    g.output("x")
    rf = RlxFile.from_graph(g.build())
    for i in range(n):
        name = f"w{i:0{name_len - 1}d}"
        rf.weights[name] = Weight.plain(name, np.zeros(0, np.float32), "f32")
    return rf.to_bytes()


def hostile_rlx() -> dict[str, bytes]:
    """Crafted .rlx files that each once got through the reader or took too long: all must be refused."""
    rng = np.random.default_rng(0)
    first_name = "w" + "0" * 65_535
    cases = {
        "duplicate weight name": _many_weights(2000).replace(msgpack.packb("w01001"), msgpack.packb("w01000"), 1),
        "duplicate 64k-char weight name": _many_weights(2, 65_536).replace(
            msgpack.packb(first_name[:-1] + "1"), msgpack.packb(first_name), 1),
        "undefined 64k-char graph input": _edit(lambda h: h["graph"]["nodes"][0].update(
            inputs=[long_name(65_536, rng, 200), "w"])),
        "digest_algo sha256": _edit(lambda h: h.update(digest_algo="sha256")),
        "digest_algo not a string": _edit(lambda h: h.update(digest_algo=1)),
        "digest not hex": _edit(lambda h: h["weights"][0].update(digest="zz" * 8)),
        "digest not a string": _edit(lambda h: h["weights"][0].update(digest=7)),
        "graph nodes not a list": _edit(lambda h: h["graph"].update(nodes=True)),
        "weights a map": _edit(lambda h: h.update(weights={})),
        "meta a list": _edit(lambda h: h.update(meta=[])),
        "shape a string": _edit(lambda h: h["weights"][0].update(shape="4,3")),
        "nbytes a float": _edit(lambda h: h["weights"][0].update(nbytes=8.0)),
        "unknown header key": _edit(lambda h: h.update(extra=[])),
        "header key not a string": raw_file(b"\x81\x91\x90\x80"),
        "header key twice": raw_file(b"\x82" + msgpack.packb("meta") + b"\x80" + msgpack.packb("meta") + b"\x80"),
    }
    for key in ("junk", "meta", "graph", "weights"):
        cases[f"empty arrays under {key}"] = raw_file(amplifying_header(1 << 16, key))
    return cases


def hostile_graphs() -> dict[str, dict]:
    """Crafted graph documents with long or many similar names: all must be refused within the time limit."""
    rng = np.random.default_rng(0)
    x = long_name(65_536, rng, 200)
    long_nodes = [{"name": long_name(65_536, rng, 200), "op": "Relu", "inputs": [x]} for _ in range(4)]
    similar = [{"name": long_name(199, rng), "op": "Relu", "inputs": ["x"]} for _ in range(1000)]

    def doc(inputs, nodes, missing):
        return {"format": "rlx.graph", "version": 1,
                "inputs": [{"name": n, "dtype": "f32", "shape": [2]} for n in inputs],
                "nodes": [*nodes, {"name": "out", "op": "Relu", "inputs": [missing]}], "outputs": ["out"]}

    return {
        "undefined 64k-char input among 64k-char names": doc([x], long_nodes, long_name(65_536, rng, 200)),
        "undefined name among 1000 similar ones": doc(["x"], similar, long_name(199, rng)),
        "duplicate 64k-char name": doc([x, x], [], x),
        "unknown 64k-char op": {**doc(["x"], [], "x"), "nodes": [{"name": "n", "op": x, "inputs": ["x"]}]},
    }


def mutate_header(data: bytes, rng: np.random.Generator) -> bytes:
    """Replace a random field of a valid file's header with a value of another type, keeping the tensors."""
    h, tensors = split(data)
    while True:  # mutate_json also draws values msgpack cannot store (lone surrogates, ints past 64 bits)
        try:
            return assemble(mutate_json(h, rng), tensors)
        except (UnicodeEncodeError, OverflowError):
            continue


def _timed(fn, *args) -> tuple[bool, float]:
    """(True if fn succeeded, False on RlxError; its wall time); anything else propagates."""
    t = time.perf_counter()
    try:
        fn(*args)
        ok = True
    except RlxError:
        ok = False
    return ok, time.perf_counter() - t


def _guard(fn, *args, limit: float = TIME_LIMIT_S) -> bool:
    """Run fn; True if it succeeded, False on RlxError; anything else propagates. Enforces the time limit: an input
    fails when a second run takes as long too (a slow path repeats; a scheduler stall on a shared 2-core machine
    did not: one read took 1.15 s in a CI run, 0.002-0.08 s on every rerun)."""
    ok, elapsed = _timed(fn, *args)
    if elapsed > limit:
        ok, elapsed = _timed(fn, *args)
        if elapsed > limit:
            raise AssertionError(f"{fn.__name__} took {elapsed:.2f}s on a small input, twice")
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
