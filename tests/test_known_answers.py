"""Known-answer vectors: exact bytes that an independent implementation of the specs must reproduce.

- RLXENC01 (spec/rlxenc.md, "Known-answer vectors"): a fixed password, salt and nonce prefix; empty,
  multi-chunk and chunk-aligned payloads. Each vector is checked three ways: rlx's writer output has the
  published SHA-256, it equals a from-the-spec construction (raw ChaCha20-Poly1305 calls in this file),
  and rlx's reader opens the spec-built bytes.
- RLXBAKE1 (spec/rlx-format.md, "Known-answer vectors"): two weights whose offsets show the 64-byte alignment.
- Q8_0 / TQ2_0 blocks with exact .5 ties after scaling (half away from zero, as GGML's reference).
- f32 -> bf16 against torch on every float32 class; bf16 -> f32 on all 65536 patterns.
- Slice start/end clamping on every small case against onnxruntime.
"""

import dataclasses
import hashlib
import io
import struct

import gguf.quants as gq
import msgpack
import numpy as np
import onnxruntime as ort
import pytest
from conftest import run_op
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from gguf import GGMLQuantizationType as T
from onnx import TensorProto, helper, numpy_helper

from rlx_format import GraphBuilder, RlxFile, Weight, decrypt_file, encrypt_file, read_rlx_bytes, read_rlx_with_password
from rlx_format import sealed as sealed_mod
from rlx_format.dtypes import bf16_to_f32, f32_to_bf16
from rlx_format.ops import slice_dim
from rlx_format.quants import dequantize_q8_0, dequantize_tq2_0, quantize_q8_0, quantize_tq2_0
from rlx_format.sealed import KDF_PROFILES, SealHeader, derive_key
from rlx_runtime.kernels import KERNELS, prepare_attrs

# ------------------------------------------------------------------------------------------ RLXENC01

PASSWORD = "rlx known answer"
SALT = bytes(range(16))
PREFIX = bytes.fromhex("a0a1a2a3a4a5a6")
KDF = KDF_PROFILES["fast"]  # Argon2id 8192 KiB, t=1, p=1
CHUNK = 4096
KEY_HEX = "ffc7baa552aec891a7131c50cf46be8e2c7058518d8316b71b05b32e18387864"


def _payload(n: int) -> bytes:
    """b'RLXBAKE1' (encrypt_file only seals plaintext rlx files) then bytes (7i + 3) mod 256."""
    return (b"RLXBAKE1" + bytes((7 * i + 3) % 256 for i in range(n - 8)))[:n]


# name -> (plaintext, SHA-256 of the sealed file)
VECTORS = {
    "empty": (b"", "9b5c1209f5740ccef488db3e0efba2a0cd64b8e4c0009845ab3746e9d7bda9f4"),
    "three_chunks": (_payload(2 * CHUNK + 1000), "e643a43a92117152f89b53a30b43070048cc794b85802bf6cae44caa5223702c"),
    "two_full_chunks": (_payload(2 * CHUNK), "ccc34d07d15acb76be324f8f124003dba992bed27997313d348a9816ebdb3f69"),
}
EMPTY_SEALED_HEX = (
    "524c58454e4330310100000001010000002000000100000001000000000102030405060708090a0b0c0d0e0fa0a1a2a3a4a5a600"
    "00100000000000000000000047c2c042948905210c1fa4fb34a44e2a")


def _spec_header(length: int) -> bytes:
    """The 64-byte header, field by field from the table in spec/rlxenc.md."""
    return (b"RLXENC01" + struct.pack("<I", 1) + bytes([1, 1, 0, 0])
            + struct.pack("<III", KDF.memory_kib, KDF.iterations, KDF.lanes) + SALT + PREFIX + b"\0"
            + struct.pack("<IQ", CHUNK, length))


def _spec_seal(key: bytes, plaintext: bytes) -> bytes:
    header = _spec_header(len(plaintext))
    n = max(1, -(-len(plaintext) // CHUNK))
    aead = ChaCha20Poly1305(key)
    out = [header]
    for i in range(n):
        nonce = PREFIX + struct.pack(">I", i) + bytes([1 if i == n - 1 else 0])
        out.append(aead.encrypt(nonce, plaintext[i * CHUNK:(i + 1) * CHUNK], header))
    return b"".join(out)


@pytest.fixture(scope="module")
def key() -> bytes:
    return derive_key(PASSWORD, SALT, KDF)


def test_kat_key(key):
    assert key.hex() == KEY_HEX


@pytest.fixture
def fixed_header(monkeypatch):
    """Writers draw salt and prefix at random; pin them to the vector's."""
    real = sealed_mod.new_header
    monkeypatch.setattr(sealed_mod, "new_header", lambda length, kdf, chunk_size=CHUNK: dataclasses.replace(
        real(length, kdf, chunk_size), salt=SALT, prefix=PREFIX))


def _rlx_seal(tmp_path, key: bytes, plaintext: bytes) -> bytes:
    if not plaintext:  # encrypt_file needs an rlx file: the empty vector goes through the writer itself
        buf = io.BytesIO()
        w = sealed_mod._SealingWriter(buf, SealHeader(KDF, SALT, PREFIX, CHUNK, 0), key)
        w.close()
        return buf.getvalue()
    src, dst = tmp_path / "plain.rlx", tmp_path / "sealed.rlx"
    src.write_bytes(plaintext)
    encrypt_file(src, dst, PASSWORD, KDF, chunk_size=CHUNK)
    return dst.read_bytes()


@pytest.mark.parametrize("name", list(VECTORS))
def test_kat_sealed_bytes(tmp_path, key, fixed_header, name):
    plaintext, digest = VECTORS[name]
    ours = _rlx_seal(tmp_path, key, plaintext)
    assert ours == _spec_seal(key, plaintext)
    assert hashlib.sha256(ours).hexdigest() == digest
    if name == "empty":
        assert ours.hex() == EMPTY_SEALED_HEX


@pytest.mark.parametrize("name", list(VECTORS))
def test_kat_opens(tmp_path, key, name):
    plaintext, _ = VECTORS[name]
    (tmp_path / "s.rlx").write_bytes(_spec_seal(key, plaintext))
    decrypt_file(tmp_path / "s.rlx", tmp_path / "out", PASSWORD)
    assert (tmp_path / "out").read_bytes() == plaintext


def test_kat_sealed_rlx_file_round_trips(tmp_path, key, fixed_header):
    """The public writer on a real RLXBAKE1 file (the golden two-weight file below) gives the spec's bytes."""
    rf = two_weights()
    sealed_mod.write_rlx_encrypted(tmp_path / "s.rlx", rf, PASSWORD, KDF, chunk_size=CHUNK)
    assert (tmp_path / "s.rlx").read_bytes() == _spec_seal(key, GOLDEN_TWO)
    assert read_rlx_with_password(tmp_path / "s.rlx", PASSWORD, verify=True).to_bytes() == GOLDEN_TWO


# ------------------------------------------------------------------------------------------ RLXBAKE1


def two_weights() -> RlxFile:
    g = GraphBuilder("kat")
    x = g.input("x", "f32", [3])
    a = g.param("a", "f32", [3])
    g.output(g.add(x, a, name="y"))
    rf = RlxFile.from_graph(g.build())
    rf.weights["a"] = Weight.plain("a", np.array([1.0, -2.0, 0.5], np.float32), "f32")
    rf.weights["b"] = Weight.plain("b", np.arange(5, dtype=np.int8), "i8")
    return rf


GOLDEN_TWO_SHA256 = "13d78416710d628c2e0801824e7975750d54f8667a0853969eb908433ef71634"
GOLDEN_TWO_OFFSETS = {"a": 448, "b": 512}  # header ends at 394; 64-byte alignment
GOLDEN_TWO = bytes.fromhex(
    "524c5842414b453102000000760100000000000084a5677261706888a6666f726d6174a9726c782e6772617068a776657273696f"
    "6e01a46e616d65a36b6174a6696e707574739183a46e616d65a178a56474797065a3663332a573686170659103a6706172616d73"
    "9183a46e616d65a161a56474797065a3663332a573686170659103a9636f6e7374616e747390a56e6f6465739183a46e616d65a1"
    "79a26f70a3416464a6696e7075747392a178a161a76f75747075747391a179a7776569676874739288a46e616d65a161a8656e63"
    "6f64696e67a3663332a56474797065a3663332a573686170659103a66f6666736574cd01c0a66e62797465730ca6646967657374"
    "b061323632383966366535663730396134a46e6f7465a088a46e616d65a162a8656e636f64696e67a26938a56474797065a26938"
    "a573686170659105a66f6666736574cd0200a66e627974657305a6646967657374b062303735373533613834636130666265a46e"
    "6f7465a0a46d65746180ab6469676573745f616c676fa7787868335f363400000000000000000000000000000000000000000000"
    "00000000000000000000000000000000000000000000000000000000000000000000803f000000c00000003f0000000000000000"
    "00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001020304")


def test_kat_rlxbake_two_weights():
    data = two_weights().to_bytes()
    assert hashlib.sha256(data).hexdigest() == GOLDEN_TWO_SHA256
    assert data == GOLDEN_TWO
    (hlen,) = struct.unpack("<Q", data[12:20])
    table = msgpack.unpackb(data[20:20 + hlen])["weights"]
    assert {e["name"]: e["offset"] for e in table} == GOLDEN_TWO_OFFSETS
    rf = read_rlx_bytes(data, verify=True)
    assert rf.weights["b"].array().tolist() == [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------------- quant ties


def _ties_q8_0() -> np.ndarray:
    """amax 127 * 2^e gives d = 2^e and 1/d exact, so x = (k + 0.5) * 2^e scales to exactly k + 0.5."""
    rows = []
    for e in (0, -3, 4):
        k = np.arange(-127, 127, dtype=np.float32) + np.float32(0.5)  # -126.5 .. 126.5
        for start in range(0, k.size, 31):
            block = np.zeros(32, np.float32)
            part = k[start:start + 31]
            block[:part.size] = part
            block[31] = 127.0 if start % 2 == 0 else -127.0  # the block's amax, both signs
            rows.append(block * np.float32(2.0 ** e))
    return np.stack(rows).astype(np.float32)


def _ties_tq2_0() -> np.ndarray:
    """amax 2^e: x = +-2^(e-1) scales to exactly +-0.5 (rounds to +-1); +-amax and 0 fill the rest."""
    rows = []
    for e in (1, 0, -4, 6):
        a = np.float32(2.0 ** e)
        pattern = np.array([a / 2, -a / 2, a, 0, -a, a / 2, -a / 2, -a / 2], np.float32)
        rows.append(np.tile(pattern, 32))
    return np.stack(rows)


def _half_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)  # float64: exact for these values


def test_q8_0_exact_ties():
    x = _ties_q8_0()
    scaled = x.astype(np.float64) / (np.abs(x).max(axis=1, keepdims=True) / 127)
    assert (np.abs(scaled) % 1 == 0.5).sum() >= 700  # the premise: hundreds of exact ties
    ours = quantize_q8_0(x)
    np.testing.assert_array_equal(ours, gq.quantize(x, T.Q8_0))
    q = ours.reshape(-1, 34)[:, 2:].view(np.int8).reshape(x.shape)
    np.testing.assert_array_equal(q, _half_away(scaled))
    np.testing.assert_array_equal(dequantize_q8_0(ours), gq.dequantize(ours, T.Q8_0))


def test_tq2_0_exact_ties():
    x = _ties_tq2_0()
    ours = quantize_tq2_0(x)
    np.testing.assert_array_equal(ours, gq.quantize(x, T.TQ2_0))
    amax = np.abs(x).max(axis=1, keepdims=True)
    assert (np.abs(x) * 2 == amax).sum() == 4 * 5 * 32  # five ties in each 8-value pattern
    expect = _half_away(x.astype(np.float64) / amax) * amax
    np.testing.assert_array_equal(dequantize_tq2_0(ours), expect.astype(np.float32))


# ------------------------------------------------------------------------------------------ bf16


def _every_f32_class() -> np.ndarray:
    """Every upper half (sign, exponent, top 7 mantissa bits: zeros, subnormals, normals, +-Inf, NaNs)
    with low halves that probe rounding: exact, just above zero, just below/at/above the tie, all ones."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lo = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    return (hi[:, None] | lo[None, :]).reshape(-1).view(np.float32)


def test_bf16_rounding_matches_torch_on_every_class():
    import torch  # the independent bf16 implementation (a test dependency)
    x = _every_f32_class()
    ours = f32_to_bf16(x)
    ref = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x)
    np.testing.assert_array_equal(ours[~nan], ref[~nan])
    # NaN: torch gives one canonical pattern; rlx keeps the sign and top payload bits and sets the quiet bit
    u = x.view(np.uint32)
    np.testing.assert_array_equal(ours[nan], ((u[nan] >> 16) | 0x40).astype(np.uint16))
    # the runtime's Cast(to=bf16) rounds the same way (its output is f32 holding bf16 values)
    sample = x[::7]
    cast = run_op("Cast", [sample], {"to": "bf16"})
    np.testing.assert_array_equal(cast.view(np.uint32) >> 16, f32_to_bf16(sample))


def test_bf16_widening_matches_torch():
    import torch
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ref = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(bf16_to_f32(bits).view(np.uint32), ref.view(np.uint32))


# ------------------------------------------------------------------------------------------ Slice


def _ort_slices(x: np.ndarray, cases: list[tuple[int, int, int]]) -> list[np.ndarray]:
    """onnxruntime's answer for each (start, end, step) on x: one model, one Slice node per case."""
    nodes, outs, inits = [], [], []
    for i, (s, e, st) in enumerate(cases):
        names = [f"s{i}", f"e{i}", f"a{i}", f"t{i}"]
        inits += [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in zip(names, (s, e, 0, st))]
        nodes.append(helper.make_node("Slice", ["x", *names], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "slices", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          outs, initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize("step", [1, 2, 3, -1, -2, -3])
def test_slice_clamping_matches_onnxruntime(step):
    """Every start/end in -7..7 (out of range both ways) on dims 1..4 against onnxruntime (ONNX clamps
    differently from Python for negative steps): the kernel's values and the inferred length."""
    kernel = KERNELS["Slice"]
    for d in range(1, 5):
        x = np.arange(d, dtype=np.float32)
        cases = [(s, e, step) for s in range(-7, 8) for e in range(-7, 8)]
        for (s, e, st), ref in zip(cases, _ort_slices(x, cases), strict=True):
            where = f"d={d} start={s} end={e} step={st}"
            out = kernel(np, prepare_attrs("Slice", {"starts": [s], "ends": [e], "axes": [0], "steps": [st]}), x)
            np.testing.assert_array_equal(out, ref, err_msg=where)
            assert slice_dim(d, s, e, st) == ref.shape[0], where
    # through load-time inference and a compiled plan too
    x = np.arange(4, dtype=np.float32)
    for s, e in ((-7, -9), (9, -9), (-9, 9)):
        out = run_op("Slice", [x], {"starts": [s], "ends": [e], "axes": [0], "steps": [step]})
        np.testing.assert_array_equal(out, _ort_slices(x, [(s, e, step)])[0])
