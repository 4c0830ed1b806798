"""RLXENC01: a whole RLXBAKE1 file sealed with ChaCha20-Poly1305 in a chunked STREAM (spec/rlxenc.md).

Header (64 bytes, little-endian) = associated data of every chunk:
  magic(8) version u32 | kdf_id u8 aead_id u8 reserved u16 | m_cost_kib u32 t_cost u32 lanes u32 |
  salt(16) | nonce_prefix(7) reserved u8 | chunk_size u32 | plaintext_length u64
Chunk i (i = 0..n-1) = AEAD(key, nonce = prefix || u32be(i) || u8(last), chunk, aad = header).
Key = Argon2id(password, salt, t_cost, m_cost, lanes) -> 32 bytes.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from argon2.low_level import Type, hash_secret_raw
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from .constants import KDF_PROFILE_NAMES, PREAMBLE_BYTES, RLXBAKE_MAGIC, RLXENC_MAGIC
from .container import RlxFile, file_layout, read_rlx_bytes, write_stream
from .errors import DecryptError, FormatError, RlxError
from .files import atomic_write, check_output_path, open_for_reading

ENC_VERSION = 1
KDF_ARGON2ID = 1
AEAD_CHACHA20POLY1305 = 1
HEADER_FMT = "<8sIBBHIII16s7sBIQ"
HEADER_BYTES = struct.calcsize(HEADER_FMT)  # 64
TAG_BYTES = 16
DEFAULT_CHUNK = 1 << 20
MIN_CHUNK, MAX_CHUNK = 4 << 10, 64 << 20
# Reader limits on attacker-controlled KDF parameters (checked before any Argon2 work).
KDF_MAX_MEMORY_KIB = 1 << 20     # 1 GiB
KDF_MAX_TIME = 16
KDF_MAX_LANES = 64
KDF_MIN_MEMORY_KIB = 8 << 10     # 8 MiB
KDF_MIN_TIME = 1
OPAQUE = "decryption failed: wrong password, or the file was modified or truncated"


class KdfLimitError(DecryptError):
    """Header KDF parameters outside the reader's accepted range (refused before hashing)."""


@dataclass(frozen=True)
class KdfParams:
    """Argon2id cost. Default: RFC 9106's second recommended option (64 MiB, t=3, p=4)."""

    memory_kib: int = 64 << 10
    iterations: int = 3
    lanes: int = 4

    def check(self, where: str = "KDF parameters") -> None:
        m, t, p = self.memory_kib, self.iterations, self.lanes
        if not (KDF_MIN_MEMORY_KIB <= m <= KDF_MAX_MEMORY_KIB and KDF_MIN_TIME <= t <= KDF_MAX_TIME
                and 1 <= p <= KDF_MAX_LANES and m >= 8 * p):
            raise KdfLimitError(
                f"{where}: Argon2id memory={m} KiB, iterations={t}, lanes={p} are outside the accepted range "
                f"(memory {KDF_MIN_MEMORY_KIB}..{KDF_MAX_MEMORY_KIB} KiB, iterations {KDF_MIN_TIME}..{KDF_MAX_TIME}, "
                f"lanes 1..{KDF_MAX_LANES}); re-seal the file with parameters in range")


KDF_PROFILES = {"default": KdfParams(), "fast": KdfParams(8 << 10, 1, 1), "strong": KdfParams(256 << 10, 4, 4)}
assert tuple(KDF_PROFILES) == KDF_PROFILE_NAMES


@dataclass(frozen=True)
class SealHeader:
    kdf: KdfParams
    salt: bytes
    prefix: bytes
    chunk_size: int
    length: int
    raw: bytes = b""  # the exact header bytes read from a file (the AEAD associated data)

    def pack(self) -> bytes:
        if self.raw:
            return self.raw
        return struct.pack(HEADER_FMT, RLXENC_MAGIC, ENC_VERSION, KDF_ARGON2ID, AEAD_CHACHA20POLY1305, 0,
                           self.kdf.memory_kib, self.kdf.iterations, self.kdf.lanes, self.salt, self.prefix, 0,
                           self.chunk_size, self.length)

    @property
    def n_chunks(self) -> int:
        return max(1, -(-self.length // self.chunk_size))

    @property
    def sealed_size(self) -> int:
        return HEADER_BYTES + self.length + self.n_chunks * TAG_BYTES

    def nonce(self, i: int) -> bytes:
        return self.prefix + struct.pack(">IB", i, 1 if i == self.n_chunks - 1 else 0)


def _password_bytes(password: str | bytes) -> bytes:
    if isinstance(password, str):
        try:
            password = password.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates (undecodable bytes from environ/argv); never echo them
            raise RlxError("password is not valid UTF-8 text (it contains unpaired surrogates); pass valid "
                           "text or the password's bytes") from None
    if not isinstance(password, (bytes, bytearray)) or not password:
        raise RlxError("password must be a non-empty str or bytes")
    return bytes(password)


def derive_key(password: str | bytes, salt: bytes, kdf: KdfParams) -> bytes:
    return hash_secret_raw(_password_bytes(password), salt, time_cost=kdf.iterations, memory_cost=kdf.memory_kib,
                           parallelism=kdf.lanes, hash_len=32, type=Type.ID)


def parse_header(raw: bytes, file_size: int | None = None, where: str = "sealed file") -> SealHeader:
    """Validate a sealed header (structure and limits only; authenticity comes from the AEAD)."""
    if len(raw) < HEADER_BYTES:
        raise DecryptError(f"{where}: {OPAQUE} (shorter than the {HEADER_BYTES}-byte header)")
    (magic, version, kdf_id, aead_id, _r1, m, t, p, salt, prefix, _r2, chunk, length) = struct.unpack(
        HEADER_FMT, raw[:HEADER_BYTES])
    if magic != RLXENC_MAGIC:
        raise DecryptError(f"{where}: not a sealed rlx file (magic {magic!r}; expected {RLXENC_MAGIC!r})")
    if _r1 or _r2:
        raise DecryptError(f"{where}: {OPAQUE} (reserved header bytes are not zero)")
    if version != ENC_VERSION or kdf_id != KDF_ARGON2ID or aead_id != AEAD_CHACHA20POLY1305:
        raise DecryptError(f"{where}: unsupported sealed format (version {version}, kdf {kdf_id}, aead {aead_id}; "
                           f"this reader supports {ENC_VERSION}/{KDF_ARGON2ID}/{AEAD_CHACHA20POLY1305}) or {OPAQUE}")
    kdf = KdfParams(m, t, p)
    kdf.check(where)
    if not MIN_CHUNK <= chunk <= MAX_CHUNK:
        raise DecryptError(f"{where}: {OPAQUE} (chunk size {chunk} outside {MIN_CHUNK}..{MAX_CHUNK})")
    h = SealHeader(kdf, salt, prefix, chunk, length, bytes(raw[:HEADER_BYTES]))
    if file_size is not None and file_size != h.sealed_size:
        raise DecryptError(f"{where}: {OPAQUE}")
    return h


def new_header(length: int, kdf: KdfParams, chunk_size: int = DEFAULT_CHUNK) -> SealHeader:
    kdf.check("write: KDF parameters")
    if not MIN_CHUNK <= chunk_size <= MAX_CHUNK:
        raise RlxError(f"chunk size {chunk_size}; expected {MIN_CHUNK}..{MAX_CHUNK} bytes")
    return SealHeader(kdf, os.urandom(16), os.urandom(7), chunk_size, length)


class _SealingWriter:
    """File-like sink: buffers plaintext and writes sealed chunks to `out` as they fill."""

    def __init__(self, out: BinaryIO, header: SealHeader, key: bytes):
        self.out, self.h, self.aad = out, header, header.pack()
        self.aead = ChaCha20Poly1305(key)
        self.buf = bytearray(header.chunk_size)
        self.ct = bytearray(header.chunk_size + TAG_BYTES)
        self.fill = 0
        self.index = 0
        self.total = 0
        out.write(self.aad)

    def write(self, data) -> int:
        mv = memoryview(data).cast("B")
        n, pos = len(mv), 0
        while pos < n:
            take = min(n - pos, self.h.chunk_size - self.fill)
            self.buf[self.fill:self.fill + take] = mv[pos:pos + take]
            self.fill += take
            pos += take
            if self.fill == self.h.chunk_size and self.total + self.fill < self.h.length:
                self._emit()
        return n

    def _emit(self) -> None:
        size = self.fill
        if self.index >= self.h.n_chunks:
            raise RlxError("sealing: more plaintext than the header announced")
        out = memoryview(self.ct)[:size + TAG_BYTES]
        self.aead.encrypt_into(self.h.nonce(self.index), memoryview(self.buf)[:size], self.aad, out)
        self.out.write(out)
        self.total += size
        self.index += 1
        self.fill = 0

    def close(self) -> None:
        self._emit()  # the last chunk (possibly empty)
        if self.total != self.h.length or self.index != self.h.n_chunks:
            raise RlxError(f"sealing: wrote {self.total} plaintext bytes; header announced {self.h.length}")


def _plaintext_size(rf: RlxFile) -> int:
    header, tensors = file_layout(rf)
    end = PREAMBLE_BYTES + len(header)
    return max([end] + [off + data.nbytes for off, data in tensors])


def write_rlx_encrypted(path: str | os.PathLike, rf: RlxFile, password: str | bytes,
                        kdf: KdfParams | None = None, chunk_size: int = DEFAULT_CHUNK) -> None:
    """Seal `rf` to `path` (atomic, mode 0600). Plaintext is streamed through the cipher, never written to disk."""
    check_output_path(path)  # before the Argon2 work
    h = new_header(_plaintext_size(rf), kdf or KdfParams(), chunk_size)
    key = derive_key(password, h.salt, h.kdf)

    def write(f):
        w = _SealingWriter(f, h, key)
        write_stream(w, rf)
        w.close()

    atomic_write(path, write, private=True)


def encrypt_file(src: str | os.PathLike, dst: str | os.PathLike, password: str | bytes,
                 kdf: KdfParams | None = None, chunk_size: int = DEFAULT_CHUNK) -> None:
    """Seal an existing plaintext .rlx file to `dst` (atomic, mode 0600), streaming in constant memory."""
    src = Path(src)
    check_output_path(dst)
    with open_for_reading(src) as f:
        if f.read(8) != RLXBAKE_MAGIC:
            raise FormatError(f"{src}: not a plaintext rlx file (expected magic {RLXBAKE_MAGIC!r})")
        f.seek(0)
        h = new_header(os.fstat(f.fileno()).st_size, kdf or KdfParams(), chunk_size)
        key = derive_key(password, h.salt, h.kdf)

        def write(out):
            w = _SealingWriter(out, h, key)
            while chunk := f.read(h.chunk_size):
                w.write(chunk)
            w.close()

        atomic_write(dst, write, private=True)


def _decrypt_chunks(f: BinaryIO, h: SealHeader, key: bytes, sink) -> None:
    aead = ChaCha20Poly1305(key)
    aad = h.pack()
    ct = bytearray(h.chunk_size + TAG_BYTES)
    pt = bytearray(h.chunk_size)
    remaining = h.length
    for i in range(h.n_chunks):
        size = min(h.chunk_size, remaining)
        view = memoryview(ct)[:size + TAG_BYTES]
        if f.readinto(view) != size + TAG_BYTES:
            raise DecryptError(OPAQUE)
        try:
            aead.decrypt_into(h.nonce(i), view, aad, memoryview(pt)[:size])
        except InvalidTag:
            raise DecryptError(OPAQUE) from None
        sink(i * h.chunk_size, memoryview(pt)[:size])
        remaining -= size
    if f.read(1):
        raise DecryptError(OPAQUE)


def _open_sealed(path: str | os.PathLike, password) -> tuple:
    path = Path(path)
    f = open_for_reading(path)
    try:
        h = parse_header(f.read(HEADER_BYTES), os.fstat(f.fileno()).st_size, str(path))
        key = derive_key(password, h.salt, h.kdf)
    except BaseException:
        f.close()
        raise
    return f, h, key


def read_sealed(path: str | os.PathLike, password: str | bytes, *, verify: bool = False) -> RlxFile:
    """Decrypt a sealed .rlx into memory (one plaintext allocation) and parse it (read_rlx calls this)."""
    f, h, key = _open_sealed(path, password)
    with f:
        plain = bytearray(h.length)

        def sink(off, data):
            plain[off:off + len(data)] = data

        _decrypt_chunks(f, h, key, sink)
    return read_rlx_bytes(plain, verify=verify, where=str(path))


def read_rlx_with_password(path: str | os.PathLike, password: str | bytes, *, verify: bool = False) -> RlxFile:
    """Kept for compatibility; `read_rlx(path, password=...)` is the one documented way."""
    return read_sealed(path, password, verify=verify)


def decrypt_file(src: str | os.PathLike, dst: str | os.PathLike, password: str | bytes) -> None:
    """Unseal to a plaintext .rlx file (mode 0600), streaming; nothing is left at `dst` if authentication
    fails, and on Linux nothing named holds plaintext until it is complete (files.atomic_write)."""
    check_output_path(dst)
    f, h, key = _open_sealed(src, password)
    with f:
        atomic_write(dst, lambda out: _decrypt_chunks(f, h, key, lambda _off, data: out.write(data)), private=True)


def is_encrypted(path: str | os.PathLike) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == RLXENC_MAGIC
    except OSError:
        return False


def read_seal_header(path: str | os.PathLike) -> SealHeader:
    """The sealed header (KDF params, chunking, length) without the password."""
    with open_for_reading(Path(path)) as f:
        return parse_header(f.read(HEADER_BYTES), None, str(path))
