import struct

import numpy as np
import pytest

from rlx_format import (DecryptError, GraphBuilder, RlxError, RlxFile, Weight, decrypt_file, encrypt_file,
                        is_encrypted, read_rlx, read_rlx_with_password, write_rlx, write_rlx_encrypted)
from rlx_format.sealed import (HEADER_BYTES, HEADER_FMT, KDF_MAX_MEMORY_KIB, KDF_PROFILES, TAG_BYTES, KdfLimitError,
                               KdfParams, read_seal_header)

FAST = KDF_PROFILES["fast"]
CHUNK = 4096


def artifact(n_floats: int) -> RlxFile:
    g = GraphBuilder("s")
    g.input("x", "f32", [1])
    g.output("x")
    rf = RlxFile.from_graph(g.build())
    if n_floats:
        rf.weights["w"] = Weight.plain("w", np.arange(n_floats, dtype=np.float32), "f32")
    return rf


def seal(tmp_path, rf, name="s.rlx"):
    p = tmp_path / name
    write_rlx_encrypted(p, rf, "correct horse", FAST, chunk_size=CHUNK)
    return p


@pytest.mark.parametrize("n", [0, 16, 5000])
def test_round_trip(tmp_path, n):
    rf = artifact(n)
    p = seal(tmp_path, rf)
    assert is_encrypted(p)
    back = read_rlx_with_password(p, "correct horse", verify=True)
    assert back.to_bytes() == rf.to_bytes()
    assert read_rlx(p, password=b"correct horse").to_bytes() == rf.to_bytes()


def test_chunk_boundaries(tmp_path):
    base = len(artifact(0).to_bytes())
    for target in (CHUNK, CHUNK + 1, 3 * CHUNK):
        # reach a plaintext length equal to target by sizing a u8 weight
        pad = target - base
        for _ in range(5):
            rf = artifact(0)
            rf.weights["pad"] = Weight.plain("pad", np.zeros(pad, np.uint8), "u8")
            pad += target - len(rf.to_bytes())
        assert len(rf.to_bytes()) == target
        p = seal(tmp_path, rf, f"b{target}.rlx")
        h = read_seal_header(p)
        assert h.length == target and h.n_chunks == -(-target // CHUNK)
        assert p.stat().st_size == HEADER_BYTES + target + h.n_chunks * TAG_BYTES
        assert read_rlx_with_password(p, "correct horse").to_bytes() == rf.to_bytes()
    assert base < CHUNK


def test_file_to_file(tmp_path):
    rf = artifact(10_000)
    plain = tmp_path / "p.rlx"
    write_rlx(plain, rf)
    enc, dec = tmp_path / "e.rlx", tmp_path / "d.rlx"
    encrypt_file(plain, enc, "pw", FAST, chunk_size=CHUNK)
    decrypt_file(enc, dec, "pw")
    assert dec.read_bytes() == plain.read_bytes()
    with pytest.raises(DecryptError):
        decrypt_file(enc, tmp_path / "x.rlx", "wrong")
    assert not (tmp_path / "x.rlx").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.rlx", "e.rlx", "p.rlx"]


def _fields():
    """(name, byte offset, size) of every header field."""
    names = ["magic", "version", "kdf_id", "aead_id", "reserved1", "memory", "iterations", "lanes", "salt", "prefix",
             "reserved2", "chunk_size", "length"]
    out, off = [], 0
    for name, code in zip(names, ["8s", "I", "B", "B", "H", "I", "I", "I", "16s", "7s", "B", "I", "Q"]):
        size = struct.calcsize("<" + code)
        out.append((name, off, size))
        off += size
    assert off == HEADER_BYTES == struct.calcsize(HEADER_FMT)
    return out


@pytest.fixture(scope="module")
def sealed_bytes(tmp_path_factory):
    return seal(tmp_path_factory.mktemp("t"), artifact(3000)).read_bytes()  # 3 chunks


def _flip(data, pos, bit=0):
    b = bytearray(data)
    b[pos] ^= 1 << bit
    return bytes(b)


def _chunks(data):
    h = read_seal_header_bytes(data)
    out, pos = [], HEADER_BYTES
    rem = h.length
    for _ in range(h.n_chunks):
        size = min(CHUNK, rem) + TAG_BYTES
        out.append(data[pos:pos + size])
        pos += size
        rem -= size - TAG_BYTES
    return out


def read_seal_header_bytes(data):
    from rlx_format.sealed import parse_header
    return parse_header(data[:HEADER_BYTES])


def _tampered(data):
    for name, off, size in _fields():
        for bit in (0, 7):
            yield f"header:{name}:byte{off + size - 1}:bit{bit}", _flip(data, off + size - 1, bit)
    yield "chunk body", _flip(data, HEADER_BYTES + 100)
    yield "tag of chunk 0", _flip(data, HEADER_BYTES + CHUNK + 3)
    yield "last tag", _flip(data, len(data) - 1)
    ch = _chunks(data)
    head = data[:HEADER_BYTES]
    yield "truncate at chunk boundary", head + ch[0] + ch[1]
    yield "truncate mid-chunk", data[: HEADER_BYTES + CHUNK // 2]
    yield "drop middle chunk", head + ch[0] + ch[2]
    yield "swap chunks", head + ch[1] + ch[0] + ch[2]
    yield "duplicate chunk", head + ch[0] + ch[0] + ch[1] + ch[2]
    yield "append bytes", data + b"\0"
    yield "empty", b""


def test_tamper_matrix(tmp_path, sealed_bytes):
    cases = list(_tampered(sealed_bytes))
    assert len(cases) > 30
    for label, data in cases:
        p = tmp_path / "t.rlx"
        p.write_bytes(data)
        with pytest.raises(DecryptError):
            read_rlx_with_password(p, "correct horse")
            pytest.fail(f"{label}: tampered file decrypted")
        with pytest.raises(DecryptError):
            decrypt_file(p, tmp_path / "out.rlx", "correct horse")
        assert not (tmp_path / "out.rlx").exists(), label


def test_wrong_password_is_opaque(tmp_path, sealed_bytes):
    p = tmp_path / "s.rlx"
    p.write_bytes(sealed_bytes)
    with pytest.raises(DecryptError, match="^decryption failed: wrong password, or the file was modified"):
        read_rlx_with_password(p, "Correct horse")


def test_kdf_caps_refused_before_hashing(tmp_path, sealed_bytes, monkeypatch):
    import rlx_format.sealed as sealed
    called = []
    monkeypatch.setattr(sealed, "hash_secret_raw", lambda *a, **k: called.append(1))
    b = bytearray(sealed_bytes)
    struct.pack_into("<I", b, 16, KDF_MAX_MEMORY_KIB * 4)
    p = tmp_path / "dos.rlx"
    p.write_bytes(bytes(b))
    with pytest.raises(KdfLimitError, match="outside the accepted range"):
        read_rlx_with_password(p, "x")
    struct.pack_into("<II", b, 16, 64, 1)  # below the floor
    p.write_bytes(bytes(b))
    with pytest.raises(KdfLimitError, match="memory=64 KiB"):
        read_rlx_with_password(p, "x")
    assert called == []
    with pytest.raises(KdfLimitError):
        write_rlx_encrypted(tmp_path / "w.rlx", artifact(1), "pw", KdfParams(1 << 30, 1, 1))


@pytest.mark.parametrize("m,t,p", [(KDF_MAX_MEMORY_KIB + 1, 1, 1), (8 << 10, 17, 1), (8 << 10, 1, 65),
                                   (8 << 10, 0, 1), (8 << 10, 1, 0), ((8 << 10) - 1, 1, 1)])
def test_each_kdf_limit_is_refused_before_hashing(tmp_path, sealed_bytes, monkeypatch, m, t, p):
    """One past each documented cap and floor (memory, iterations, lanes)."""
    import rlx_format.sealed as sealed
    monkeypatch.setattr(sealed, "hash_secret_raw", lambda *a, **k: pytest.fail("Argon2 ran on a refused header"))
    b = bytearray(sealed_bytes)
    struct.pack_into("<III", b, 16, m, t, p)
    (tmp_path / "dos.rlx").write_bytes(bytes(b))
    with pytest.raises(KdfLimitError, match=f"memory={m} KiB, iterations={t}, lanes={p} are outside"):
        read_rlx_with_password(tmp_path / "dos.rlx", "x")


def test_default_kdf_is_rfc9106_second_profile():
    assert KdfParams() == KdfParams(64 * 1024, 3, 4)


def test_empty_password_refused(tmp_path):
    with pytest.raises(RlxError, match="non-empty"):
        write_rlx_encrypted(tmp_path / "e.rlx", artifact(1), "", FAST)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_large_file_to_file_constant_memory(big_scratch):
    """> 2 GiB payload through encrypt_file/decrypt_file; peak RSS stays far below the size."""
    import hashlib
    import subprocess
    import sys
    n = (2200 << 20) // 4
    # two files of the size at a time: the plaintext is hashed and removed once sealed
    tmp = big_scratch(2 * 4 * n + (64 << 20))
    plain, sealed, back = tmp / "big.rlx", tmp / "e.rlx", tmp / "d.rlx"
    make = f"""
import numpy as np
from rlx_format import GraphBuilder, RlxFile, Weight, write_rlx
g = GraphBuilder('b'); g.input('x', 'f32', [1]); g.output('x')
rf = RlxFile.from_graph(g.build())
w = np.ones({n}, np.float32); w[::4097] = np.arange(w[::4097].size)  # not constant: a misplaced chunk shows
rf.weights['w'] = Weight.plain('w', w, 'f32')
write_rlx({str(plain)!r}, rf)
"""
    subprocess.run([sys.executable, "-c", make], check=True)
    size = plain.stat().st_size
    assert size > 2 << 30

    def digest(path):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(16 << 20):
                h.update(chunk)
        return h.hexdigest()

    want = digest(plain)
    seal = f"""
import os
from rlx_format import encrypt_file, decrypt_file
from rlx_format.sealed import KDF_PROFILES
encrypt_file({str(plain)!r}, {str(sealed)!r}, 'pw', KDF_PROFILES['fast'])
os.remove({str(plain)!r})
decrypt_file({str(sealed)!r}, {str(back)!r}, 'pw')
print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])  # this process only, KiB
"""
    out = subprocess.run([sys.executable, "-c", seal], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-4000:]
    peak_mib = int(out.stdout.strip()) / 1024
    assert peak_mib < 400, f"peak RSS {peak_mib:.0f} MiB for a {size >> 20} MiB file"
    assert back.stat().st_size == size
    assert digest(back) == want
