"""Reader hardening: duplicate names in linear time, bounded "did you mean" hints, bounded header memory,
digest checking (verify=True, `run --verify`, undigested weights, digest_algo, padding) and mmap=False."""

import json
import os
import struct
import subprocess
import sys
import textwrap
import time

import msgpack
import numpy as np
import pytest
from click.testing import CliRunner

from fuzz_targets import amplifying_header, assemble, long_name, raw_file, split
from rlx_bake.cli import main
from rlx_format import FormatError, Graph, GraphBuilder, GraphError, RlxFile, Weight, read_rlx, read_rlx_bytes
from rlx_format.constants import PREAMBLE_BYTES

GENEROUS_S = 5.0  # timing bounds are loose on purpose: the fixed code takes well under a second


def tiny() -> RlxFile:
    g = GraphBuilder("tiny")
    x = g.input("x", "f32", [1, 2])
    c = g.constant(np.array([[1.0, 2.0]], np.float32), name="c")
    d = g.constant(np.array([[10.0, 20.0]], np.float32), name="d")
    g.output(g.add(g.add(x, c), d, name="y"))
    return RlxFile.from_graph(g.build())


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def timed(fn, *args, **kw):
    t = time.perf_counter()
    try:
        fn(*args, **kw)
    except Exception as e:  # noqa: BLE001 - returned for the caller to check
        return e, time.perf_counter() - t
    return None, time.perf_counter() - t


# ------------------------------------------------------------------ item 3: duplicate weight names


def test_duplicate_weight_name_among_40k_entries_is_found_fast():
    g = GraphBuilder("many")
    g.input("x", "f32", [1])
    g.output("x")
    rf = RlxFile.from_graph(g.build())
    for i in range(40_000):
        rf.weights[f"w{i:05d}"] = Weight.plain(f"w{i:05d}", np.zeros(0, np.float32), "f32")
    blob = rf.to_bytes()
    # same-length rename keeps every offset valid: only the duplicate is wrong
    blob = blob.replace(msgpack.packb("w20001"), msgpack.packb("w20000"), 1)
    err, elapsed = timed(read_rlx_bytes, blob)
    assert isinstance(err, FormatError) and "weight name 'w20000' appears twice" in str(err)
    assert elapsed < GENEROUS_S


# ------------------------------------------------------------------ item 4: bounded "did you mean"


def test_undefined_65k_char_input_is_rejected_fast_with_a_short_message(tmp_path):
    rng = np.random.default_rng(0)
    x = long_name(65_536, rng, 200)
    nodes = [{"name": long_name(65_536, rng, 200), "op": "Relu", "inputs": [x]} for _ in range(4)]
    missing = long_name(65_536, rng, 200)
    nodes.append({"name": "out", "op": "Relu", "inputs": [missing]})
    doc = {"format": "rlx.graph", "version": 1, "inputs": [{"name": x, "dtype": "f32", "shape": [2]}],
           "nodes": nodes, "outputs": ["out"]}
    p = tmp_path / "graph.json"
    p.write_text(json.dumps(doc))
    err, elapsed = timed(Graph.from_json, p)
    assert isinstance(err, GraphError) and "node 'out' (Relu): input " in str(err) and "is not defined" in str(err)
    assert missing[:100] in str(err) and len(str(err)) < 1000  # names the value, truncated
    assert elapsed < GENEROUS_S


def test_hint_work_is_bounded_with_many_similar_candidates():
    rng = np.random.default_rng(1)
    g = {"format": "rlx.graph", "version": 1, "inputs": [{"name": "x", "dtype": "f32", "shape": [2]}],
         "nodes": [{"name": long_name(199, rng), "op": "Relu", "inputs": ["x"]} for _ in range(3000)],
         "outputs": ["out"]}
    g["nodes"].append({"name": "out", "op": "Relu", "inputs": [long_name(199, rng)]})
    err, elapsed = timed(Graph.from_dict, g)
    assert isinstance(err, GraphError) and "is not defined" in str(err)
    assert elapsed < GENEROUS_S


def test_hint_still_suggests_close_names():
    g = GraphBuilder("h")
    g.input("hidden_states", "f32", [2])
    g.output(g.relu("hidden_states", name="y"))
    d = g.build().to_dict()
    d["nodes"][0]["inputs"] = ["hiden_states"]
    with pytest.raises(GraphError, match="input 'hiden_states' is not defined \\(did you mean 'hidden_states'\\?\\)"):
        Graph.from_dict(d)


# ------------------------------------------------------------------ item 5: header memory


AMPLIFY = {  # where the empty arrays hide: the issue's unknown key, and inside known keys
    "unknown key": ("junk", "unknown header key 'junk'"),
    "meta": ("meta", "maps and arrays"),
    "graph": ("graph", "maps and arrays"),
    "weights": ("weights", "maps and arrays"),
}


@pytest.mark.parametrize("where", sorted(AMPLIFY))
def test_amplifying_header_is_refused(where):
    key, match = AMPLIFY[where]
    err, elapsed = timed(read_rlx_bytes, raw_file(amplifying_header(1 << 20, key)))
    assert isinstance(err, FormatError) and match in str(err), err
    assert elapsed < GENEROUS_S


_MEASURE = textwrap.dedent("""
    import sys, time
    from rlx_format import RlxError, read_rlx

    def peak():  # VmHWM restarts at exec, unlike ru_maxrss, which Linux carries over from the parent
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

    before = peak()
    t = time.perf_counter()
    try:
        read_rlx(sys.argv[1])
        print("loaded")
    except RlxError as e:
        print("refused:", str(e)[:200])
    print(time.perf_counter() - t, peak() - before)
""")


def _measure(path) -> tuple[str, float, int]:
    """(verdict, seconds, peak memory growth in bytes) of read_rlx(path) in a fresh interpreter."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("needs Linux /proc to measure peak memory")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    verdict, numbers = r.stdout.strip().rsplit("\n", 1)
    seconds, grown = numbers.split()
    return verdict, float(seconds), int(grown)


def test_issue_header_48mib_empty_arrays_under_unknown_key_is_refused_fast_in_little_memory(tmp_path):
    p = tmp_path / "amplify.rlx"
    p.write_bytes(raw_file(amplifying_header(48 << 20, "junk")))
    verdict, seconds, grown = _measure(p)
    assert verdict.startswith("refused: ") and "unknown header key 'junk'" in verdict
    assert seconds < 1.0
    assert grown < (48 << 20) // 4  # the header past the key is never read (was 3.75 GB)


def test_header_memory_is_bounded_inside_known_keys(tmp_path):
    size = 16 << 20
    p = tmp_path / "amplify.rlx"
    p.write_bytes(raw_file(amplifying_header(size, "meta")))
    verdict, seconds, grown = _measure(p)
    assert verdict.startswith("refused: ") and "maps and arrays" in verdict
    assert grown < 16 * size  # unbounded, 16M empty lists are ~75x the header
    assert seconds < 3 * GENEROUS_S


def test_legitimate_header_with_50k_nodes_loads():
    g = GraphBuilder("deep")
    h = g.input("x", "f32", ["b", 8])
    for i in range(50_000):
        h = g.relu(h, name=f"n{i}")
    g.output(h)
    back = read_rlx_bytes(RlxFile.from_graph(g.build()).to_bytes())
    assert len(back.graph.nodes) == 50_000


def test_legitimate_header_with_many_small_weights_loads():
    g = GraphBuilder("wide")
    x = g.input("x", "f32", [1])
    for i in range(5_000):
        x = g.add(x, g.constant(np.full([1], i, np.float32), name=f"c{i}"))
    g.output(x)
    back = read_rlx_bytes(RlxFile.from_graph(g.build()).to_bytes(), verify=True)
    assert back.weights["c4999"].array().tolist() == [4999.0]


@pytest.mark.parametrize("header,match", [
    (msgpack.packb({"graph": {}, "weights": [], "extra": 1}), "unknown header key 'extra'"),
    (b"\x83" + msgpack.packb("graph") + b"\x80" + msgpack.packb("meta") + b"\x80" + msgpack.packb("meta") + b"\x80",
     "header key 'meta' appears twice"),
    (b"\x81\x91\x90\x80", "header key at offset 21 is not a string"),
    (msgpack.packb({"graph": {}}) + b"\x00", "1 bytes follow the header map"),
    (msgpack.packb([1, 2]), "expected a map, got first byte 0x92"),
    (msgpack.packb({"graph": tiny().graph.to_dict(), "digest_algo": 5}), "'digest_algo' is 5"),
    (msgpack.packb({"graph": tiny().graph.to_dict(), "weights": {}}), "'weights' must be a list"),
    (msgpack.packb({"graph": tiny().graph.to_dict(), "meta": []}), "'meta' a map"),
])
def test_header_structure_and_field_types(header, match):
    with pytest.raises(FormatError, match=match):
        read_rlx_bytes(raw_file(header))


# ------------------------------------------------------------------ item 10: digests


def test_default_read_skips_digests_and_verify_true_catches_a_zeroed_weight(tmp_path):
    h, tensors = split(tiny().to_bytes())
    tensors["c"] = b"\0" * len(tensors["c"])
    p = tmp_path / "zeroed.rlx"
    p.write_bytes(assemble(h, tensors))
    assert read_rlx(p).weights["c"].array().tolist() == [[0.0, 0.0]]  # documented: not checked by default
    with pytest.raises(FormatError, match="weight 'c': digest mismatch"):
        read_rlx(p, verify=True)
    with pytest.raises(FormatError, match="weight 'c': digest mismatch"):
        read_rlx(p, verify=True, mmap=False)
    np.save(tmp_path / "x.npy", np.ones((1, 2), np.float32))
    r = invoke("run", p, "--input", f"x={tmp_path / 'x.npy'}")
    assert r.exit_code == 0, r.output  # runs silently on the zeroed weight...
    r = invoke("run", p, "--input", f"x={tmp_path / 'x.npy'}", "--verify")
    assert r.exit_code == 1 and "digest mismatch" in r.output and "y:" not in r.output  # ...unless --verify


def test_verify_counts_good_digests(tmp_path):
    p = tmp_path / "ok.rlx"
    p.write_bytes(tiny().to_bytes())
    assert read_rlx(p).verify() == 2
    r = invoke("verify", p)
    assert r.exit_code == 0 and f"{p}: 2 weight digests OK" in r.output


def test_undigested_weight_loads_but_fails_verify(tmp_path):
    h, tensors = split(tiny().to_bytes())
    del h["weights"][1]["digest"]  # 'd'
    p = tmp_path / "undigested.rlx"
    p.write_bytes(assemble(h, tensors))
    assert read_rlx(p).weights["d"].digest is None  # readers accept files without digests
    with pytest.raises(FormatError, match="1 of 2 weights have no digest and cannot be verified \\('d'\\); "
                                          "the other 1 digests match"):
        read_rlx(p, verify=True)
    r = invoke("verify", p)
    assert r.exit_code == 1 and "1 of 2 weights have no digest" in r.output and "digests OK" not in r.output


def test_unknown_digest_algorithm_is_rejected_at_load():
    h, tensors = split(tiny().to_bytes())
    h["digest_algo"] = "sha256"
    with pytest.raises(FormatError, match="'digest_algo' is 'sha256'; this reader supports only 'xxh3_64'"):
        read_rlx_bytes(assemble(h, tensors))


def test_malformed_digest_is_rejected_at_load():
    h, tensors = split(tiny().to_bytes())
    h["weights"][0]["digest"] = "not-hex"
    with pytest.raises(FormatError, match="weight 'c' \\(weights\\[0\\]\\): digest 'not-hex' is not an xxh3_64"):
        read_rlx_bytes(assemble(h, tensors))


@pytest.mark.parametrize("where", ["after header", "between tensors", "after last tensor"])
def test_nonzero_padding_fails_verify(where):
    blob = bytearray(tiny().to_bytes())
    h, _ = split(bytes(blob))
    hlen = struct.unpack("<Q", blob[12:20])[0]
    c, d = h["weights"]
    at = {"after header": PREAMBLE_BYTES + hlen, "between tensors": c["offset"] + c["nbytes"],
          "after last tensor": len(blob)}[where]
    if at == len(blob):
        blob += b"\0\0\7"
        at += 2
    blob[at] = 7
    rf = read_rlx_bytes(bytes(blob))  # loads: padding is checked by verify only (it is not cheap for big files)
    with pytest.raises(FormatError, match=f"padding byte at offset {at} is 0x07"):
        rf.verify()


# ------------------------------------------------------------------ item 16: mmap=False


def test_mmap_false_equals_mmap(tmp_path):
    p = tmp_path / "m.rlx"
    p.write_bytes(tiny().to_bytes())
    a, b = read_rlx(p), read_rlx(p, mmap=False)
    assert isinstance(b._buffer, bytes)
    assert a.graph.to_dict() == b.graph.to_dict() and a.meta == b.meta and set(a.weights) == set(b.weights)
    for name, w in a.weights.items():
        v = b.weights[name]
        assert (v.encoding, v.shape, v.dtype, v.digest) == (w.encoding, w.shape, w.dtype, w.digest)
        np.testing.assert_array_equal(v.array(), w.array())
        assert not v.array().flags.writeable
    assert b.verify() == 2


def test_mmap_false_survives_truncation_of_the_file(tmp_path):
    """A mapped file truncated under a reader kills it with SIGBUS; mmap=False copies, so the weights stay."""
    p = tmp_path / "m.rlx"
    p.write_bytes(tiny().to_bytes())
    child = textwrap.dedent("""
        import os, sys
        from rlx_format import read_rlx
        rf = read_rlx(sys.argv[1], mmap=False)
        os.truncate(sys.argv[1], 0)
        print(rf.weights["c"].array().tolist(), rf.weights["d"].array().tolist())
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    r = subprocess.run([sys.executable, "-c", child, str(p)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert r.stdout.strip() == "[[1.0, 2.0]] [[10.0, 20.0]]"
    assert p.stat().st_size == 0
