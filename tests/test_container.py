import struct

import msgpack
import numpy as np
import pytest

from rlx_format import FormatError, GraphBuilder, RlxError, RlxFile, Weight, read_rlx, read_rlx_bytes, write_rlx
from rlx_format.constants import ALIGNMENT, PREAMBLE_BYTES
from rlx_format.dtypes import f32_to_bf16
from rlx_format.quants import quantize_q8_0, quantize_tq2_0
from rlx_runtime import Session


def tiny() -> RlxFile:
    g = GraphBuilder("tiny")
    x = g.input("x", "f32", [1, 2])
    c = g.constant(np.array([[1.0, 2.0]], np.float32), name="c")
    g.output(g.add(x, c, name="y"))
    return RlxFile.from_graph(g.build())


# Golden bytes: the complete tiny file. Any change to the layout, the header encoding or the padding
# breaks this on purpose: bump the schema version (and keep reading the old one) instead.
GOLDEN_TINY = bytes.fromhex(
    "524c5842414b453102000000250100000000000084a5677261706888a6666f726d6174a9726c782e6772617068a77665727369"
    "6f6e01a46e616d65a474696e79a6696e707574739183a46e616d65a178a56474797065a3663332a57368617065920102a67061"
    "72616d7390a9636f6e7374616e74739183a46e616d65a163a56474797065a3663332a57368617065920102a56e6f6465739183"
    "a46e616d65a179a26f70a3416464a6696e7075747392a178a163a76f75747075747391a179a7776569676874739188a46e616d"
    "65a163a8656e636f64696e67a3663332a56474797065a3663332a57368617065920102a66f6666736574cd0140a66e62797465"
    "7308a6646967657374b034646538643738663731333466346237a46e6f7465a0a46d65746180ab6469676573745f616c676fa7"
    "787868335f3634000000000000000000803f00000040")


def test_golden_bytes():
    data = tiny().to_bytes()
    assert data == GOLDEN_TINY
    assert data[:8] == b"RLXBAKE1"
    version, hlen = struct.unpack("<IQ", data[8:20])
    assert version == 2
    header = msgpack.unpackb(data[20:20 + hlen])
    (entry,) = header["weights"]
    assert entry["offset"] == 320 and entry["offset"] % ALIGNMENT == 0 and entry["offset"] >= 20 + hlen
    assert data[320:328] == struct.pack("<2f", 1.0, 2.0) and len(data) == 328
    assert set(data[20 + hlen:320]) <= {0}  # zero padding
    assert header["graph"]["constants"] == [{"name": "c", "dtype": "f32", "shape": [1, 2]}]
    assert read_rlx_bytes(GOLDEN_TINY).weights["c"].array().tolist() == [[1.0, 2.0]]


def test_golden_digest_is_xxh3_of_tensor_bytes():
    import xxhash
    data = tiny().to_bytes()
    hlen = struct.unpack("<Q", data[12:20])[0]
    entry = msgpack.unpackb(data[20:20 + hlen])["weights"][0]
    assert entry["digest"] == xxhash.xxh3_64_hexdigest(struct.pack("<2f", 1.0, 2.0))


ENC_CASES = {
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "f16": np.arange(6, dtype=np.float16).reshape(3, 2),
    "f64": np.linspace(0, 1, 5),
    "i64": np.arange(-3, 3, dtype=np.int64),
    "i32": np.arange(4, dtype=np.int32),
    "i16": np.arange(4, dtype=np.int16),
    "i8": np.arange(-4, 4, dtype=np.int8),
    "u8": np.arange(7, dtype=np.uint8),
    "bool": np.array([True, False, True]),
}


def test_round_trip_every_encoding(tmp_path, rng):
    g = GraphBuilder("all")
    g.input("x", "f32", [1])
    for name, arr in ENC_CASES.items():
        g.constant(arr, name=name, dtype=name)
    g.output("x")
    rf = RlxFile.from_graph(g.build())
    bf = f32_to_bf16(rng.standard_normal((2, 4)).astype(np.float32))
    rf.weights["bf"] = Weight("bf", "bf16", (2, 4), bf, "bf16")
    w = rng.standard_normal((4, 256)).astype(np.float32)
    rf.weights["q8"] = Weight("q8", "gguf_q8_0", (4, 256), quantize_q8_0(w), "f32")
    rf.weights["tq"] = Weight("tq", "gguf_tq2_0", (4, 256), quantize_tq2_0(np.sign(w)), "f32")
    p = tmp_path / "all.rlx"
    write_rlx(p, rf)
    back = read_rlx(p, verify=True)
    for name, arr in ENC_CASES.items():
        got = back.weights[name].array()
        np.testing.assert_array_equal(got, arr)
        assert got.dtype == arr.dtype and not got.flags.writeable and not got.flags.owndata
    np.testing.assert_array_equal(back.weights["bf"].array(), bf)
    np.testing.assert_array_equal(back.weights["q8"].array(), rf.weights["q8"].data)
    np.testing.assert_array_equal(back.weights["tq"].dense(), np.sign(w))
    assert back.weights["q8"].shape == (4, 256)
    for wt in back.weights.values():
        off = wt.data.__array_interface__["data"][0] - back.weights["bool"].data.__array_interface__["data"][0]
        assert off % ALIGNMENT == 0


def test_reproducible_and_atomic(tmp_path):
    a, b = tmp_path / "a.rlx", tmp_path / "b.rlx"
    write_rlx(a, tiny())
    write_rlx(b, tiny())
    assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.rlx", "b.rlx"]  # no temp files left


def test_stale_temp_files_of_killed_writes_are_cleaned(tmp_path):
    import os
    import time
    old = tmp_path / ".m.rlx.abc12345.tmp"  # temp names carry 8 characters, like tempfile.mkstemp's
    fresh = tmp_path / ".m.rlx.def45678.tmp"
    other = tmp_path / ".other.rlx.xyz12345.tmp"
    for f in (old, fresh, other):
        f.write_bytes(b"partial")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))
    os.utime(other, (two_days_ago, two_days_ago))
    write_rlx(tmp_path / "m.rlx", tiny())
    assert not old.exists() and fresh.exists() and other.exists()  # only old temps of this target go


def test_failed_write_leaves_previous_file(tmp_path):
    p = tmp_path / "m.rlx"
    write_rlx(p, tiny())
    before = p.read_bytes()
    bad = tiny()
    bad.weights["c"] = Weight("c", "gguf_q8_0", (1, 2), np.zeros(3, np.uint8))
    with pytest.raises(FormatError):
        write_rlx(p, bad)
    assert p.read_bytes() == before
    assert [q.name for q in tmp_path.iterdir()] == ["m.rlx"]


def test_v1_graph_only_file_loads(tmp_path):
    g = GraphBuilder("v1")
    x = g.input("x", "f32", [2])
    g.output(g.relu(x, name="y"))
    header = msgpack.packb({"graph": g.build().to_dict()})
    p = tmp_path / "v1.rlx"
    p.write_bytes(b"RLXBAKE1" + struct.pack("<IQ", 1, len(header)) + header)
    rf = read_rlx(p)
    assert rf.version == 1 and rf.weights == {}
    out = Session().compile(rf).run({"x": np.array([-1.0, 2.0], np.float32)})["y"]
    np.testing.assert_array_equal(out, [0.0, 2.0])


def test_verify_detects_corruption(tmp_path):
    p = tmp_path / "t.rlx"
    write_rlx(p, tiny())
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x40
    p.write_bytes(data)
    rf = read_rlx(p)  # opening does not hash
    with pytest.raises(FormatError, match="weight 'c': digest mismatch"):
        rf.verify()
    with pytest.raises(FormatError, match="digest mismatch"):
        read_rlx(p, verify=True)


def _align(n):
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _header_edit(fn) -> bytes:
    """Edit the header, then move the data section so the (edited) offsets still point at it."""
    data = tiny().to_bytes()
    hlen = struct.unpack("<Q", data[12:20])[0]
    old_start = _align(PREAMBLE_BYTES + hlen)
    h = msgpack.unpackb(data[20:20 + hlen])
    fn(h)
    shift = 0
    while True:
        moved = msgpack.unpackb(msgpack.packb(h))
        for e in moved.get("weights", []) if isinstance(moved, dict) else []:
            if isinstance(e.get("offset"), int) and e["offset"] >= old_start:
                e["offset"] += shift
        nh = msgpack.packb(moved)
        new_shift = _align(PREAMBLE_BYTES + len(nh)) - old_start
        if new_shift == shift:
            break
        shift = new_shift
    body = data[:8] + struct.pack("<IQ", 2, len(nh)) + nh
    return body + b"\0" * (old_start + shift - len(body)) + data[old_start:]


def _second_weight(h):
    e = dict(h["weights"][0])
    e["name"] = "d"
    h["weights"].append(e)


BAD = [
    (lambda d: b"GGUF" + d[4:], "not an rlx file"),
    (lambda d: d[:8] + struct.pack("<I", 9) + d[12:], "schema version 9 at offset 8"),
    (lambda d: d[:12] + struct.pack("<Q", 1 << 40) + d[20:], "exceeds the cap"),
    (lambda d: d[:12] + struct.pack("<Q", len(d)) + d[20:], "runs past the end of the file"),
    (lambda d: d[:10], "truncated preamble"),
    (lambda d: d[:20] + b"\xc1" * 8 + d[28:], "not valid msgpack"),
    (lambda d: d[:-4], "outside the data section"),
    (lambda d: _header_edit(lambda h: h.update(graph=1)), "must be a map with a 'graph' map"),
    (lambda d: _header_edit(lambda h: h["weights"][0].update(offset=h["weights"][0]["offset"] + 4)),
     "not 64-byte aligned"),
    (lambda d: _header_edit(lambda h: h["weights"][0].update(nbytes=4)), "nbytes 4; expected 8"),
    (lambda d: _header_edit(lambda h: h["weights"][0].update(encoding="q4_k")), "unknown encoding 'q4_k'"),
    (lambda d: _header_edit(lambda h: h["weights"][0].update(shape=[1, -2])), "must have rank"),
    (lambda d: _header_edit(lambda h: h["weights"][0].update(offset=0)), "outside the data section"),
    (lambda d: _header_edit(_second_weight), "overlap"),
    (lambda d: _header_edit(lambda h: h["weights"].append(h["weights"][0])), "appears twice"),
    (lambda d: _header_edit(lambda h: h["weights"].clear()), "no data and no weight-table entry"),
    (lambda d: _header_edit(lambda h: h["graph"]["nodes"][0].update(op="Nope")), "embedded graph is invalid"),
    (lambda d: _header_edit(lambda h: h["weights"][0].update(name=7)), "field 'name' is 7"),
]


@pytest.mark.parametrize("mutate,match", BAD)
def test_reader_rejects(tmp_path, mutate, match):
    data = mutate(tiny().to_bytes())
    p = tmp_path / "bad.rlx"
    p.write_bytes(data)
    with pytest.raises(FormatError, match=match):
        read_rlx(p)
    with pytest.raises(FormatError, match=match):
        read_rlx_bytes(data)


def test_reader_path_errors(tmp_path):
    with pytest.raises(FormatError, match="no such file"):
        read_rlx(tmp_path / "nope.rlx")
    with pytest.raises(FormatError, match="is a directory"):
        read_rlx(tmp_path)
    (tmp_path / "empty.rlx").write_bytes(b"")
    with pytest.raises(RlxError, match="not an rlx file"):
        read_rlx(tmp_path / "empty.rlx")


def test_encrypted_file_to_plaintext_reader(tmp_path):
    from rlx_format import write_rlx_encrypted
    from rlx_format.sealed import KDF_PROFILES
    p = tmp_path / "s.rlx"
    write_rlx_encrypted(p, tiny(), "pw", KDF_PROFILES["fast"])
    with pytest.raises(RlxError, match="encrypted.*password"):
        read_rlx(p)
    with pytest.raises(RlxError, match="encrypted"):
        read_rlx_bytes(p.read_bytes())


def test_big_scratch_skips_with_the_figures_when_the_disk_is_short(big_scratch):
    with pytest.raises(pytest.skip.Exception, match=r"writes 931322\.6 GiB, but only [0-9.]+ GiB is free"):
        big_scratch(10**15)
    folder = big_scratch(1 << 20)
    assert folder.is_dir() and not any(folder.iterdir())


@pytest.mark.slow
def test_offsets_past_4_gib(big_scratch):
    """2.5+ GiB artifact: offsets beyond 2^31 and 2^32 are 64-bit and read back correctly."""
    n = (900 << 20) // 4
    tmp = big_scratch(5 * 4 * n + (64 << 20))
    g = GraphBuilder("big")
    g.input("x", "f32", [1])
    g.output("x")
    rf = RlxFile.from_graph(g.build())
    for i in range(5):
        a = np.zeros(n, np.float32)
        a[0], a[-1] = i + 1, -(i + 1)
        rf.weights[f"w{i}"] = Weight.plain(f"w{i}", a, "f32")
    p = tmp / "big.rlx"
    write_rlx(p, rf)
    back = read_rlx(p)
    offs = []
    for i in range(5):
        w = back.weights[f"w{i}"].array()
        assert w[0] == i + 1 and w[-1] == -(i + 1)
        offs.append(w.__array_interface__["data"][0])
    assert p.stat().st_size > (4 << 30)
    back.close()


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

_DT = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i64": np.int64, "i32": np.int32, "i16": np.int16,
       "i8": np.int8, "u8": np.uint8, "bool": np.bool_}


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=12), st.tuples(st.sampled_from(sorted(_DT)),
                                                                     hnp.array_shapes(min_dims=0, max_dims=3,
                                                                                      min_side=0, max_side=5)),
                       max_size=6), st.data())
def test_property_round_trip_random_weight_sets(entries, data):
    g = GraphBuilder("p")
    g.input("x", "f32", [1])
    g.output("x")
    rf = RlxFile.from_graph(g.build())
    arrays = {}
    for name, (dt, shape) in entries.items():
        arrays[name] = data.draw(hnp.arrays(_DT[dt], shape))
        rf.weights[name] = Weight.plain(name, arrays[name], dt)
    blob = rf.to_bytes()
    assert blob == rf.to_bytes()  # deterministic
    back = read_rlx_bytes(blob, verify=True)
    assert set(back.weights) == set(arrays)
    for name, a in arrays.items():
        got = back.weights[name].array()
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)
