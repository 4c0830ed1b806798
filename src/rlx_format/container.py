"""RLXBAKE1 v2: one file holding a graph, its weight table and tensor bytes (spec/rlx-format.md).

The reader memory-maps the file and returns zero-copy, read-only numpy views; it validates,
in a fixed order, everything the header claims before trusting it. The writer streams through
files.atomic_write, so `path` is never half-written.
"""

from __future__ import annotations

import io
import math
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import numpy as np
import xxhash

from .constants import (ALIGNMENT, HEADER_BYTES_PER_CONTAINER, HEADER_CONTAINER_ALLOWANCE, HEADER_KEYS, MAX_DIM,
                        MAX_HEADER_BYTES, MAX_NODES, MAX_RANK, MAX_STR, MAX_WEIGHTS, PLAIN_ENCODINGS, PREAMBLE_BYTES,
                        QUANT_ENCODINGS, READABLE_VERSIONS, RLXBAKE_MAGIC, RLXENC_MAGIC, SCHEMA_VERSION)
from .dtypes import NUMPY_DTYPES, bf16_to_f32
from .errors import EncryptedFileError, FormatError, GraphError
from .files import atomic_write, open_for_reading
from .graph import Graph

TOOL_VERSION = "rlx 0.1.0"
DIGEST_ALGO = "xxh3_64"


def byte_view(arr: np.ndarray):
    """The bytes of a C-contiguous array without copying (memoryview cannot cast 0-sized shapes)."""
    return memoryview(arr.reshape(-1)).cast("B") if arr.size else b""


def digest_bytes(buf) -> str:
    return xxhash.xxh3_64_hexdigest(buf)


def storage_shape(encoding: str, shape: tuple) -> tuple:
    """Shape of the stored array: the logical shape, or (..., K/block*bytes) for quant encodings."""
    if encoding in QUANT_ENCODINGS:
        qk, bs = QUANT_ENCODINGS[encoding]
        return (*shape[:-1], shape[-1] // qk * bs)
    return tuple(shape)


def storage_dtype(encoding: str) -> np.dtype:
    return np.dtype(np.uint8) if encoding in QUANT_ENCODINGS else NUMPY_DTYPES[encoding]


@dataclass
class Weight:
    """One tensor of the weight table.

    `shape`/`dtype` are logical (what the tensor means); `data` is the stored array: a typed view
    for plain encodings, packed GGML blocks (uint8, (..., row_bytes)) for quant encodings.
    """

    name: str
    encoding: str
    shape: tuple
    data: np.ndarray
    dtype: str = "f32"
    digest: str | None = None
    note: str = ""

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def array(self) -> np.ndarray:
        """The stored array (zero-copy when read from a file)."""
        return self.data

    def dense(self) -> np.ndarray:
        """The logical tensor as a float/int numpy array (dequantized / widened from bf16)."""
        if self.encoding in QUANT_ENCODINGS:
            from .quants import dequantize
            return dequantize(self.data, self.encoding).reshape(self.shape)
        if self.encoding == "bf16":
            return bf16_to_f32(self.data)
        return self.data

    @classmethod
    def plain(cls, name: str, array: np.ndarray, dtype: str, note: str = "") -> Weight:
        return cls(name, dtype, tuple(array.shape), array, dtype, None, note)


@dataclass
class RlxFile:
    graph: Graph
    weights: dict[str, Weight] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    version: int = SCHEMA_VERSION
    _buffer: Any = field(default=None, repr=False)  # keeps the mmap alive
    _padding: list[tuple[int, int]] = field(default_factory=list, repr=False)  # [start, end) of non-tensor bytes

    @classmethod
    def from_graph(cls, graph: Graph, meta: dict | None = None) -> RlxFile:
        """Move every constant's value into the weight table (plain encodings)."""
        weights = {name: Weight.plain(name, c.value, c.dtype) for name, c in graph.constants.items()
                   if c.value is not None}
        return cls(graph, weights, dict(meta or {}))

    def materialize_graph(self) -> Graph:
        """The graph with every table-backed constant bound to its (zero-copy) array."""
        g = self.graph.copy()
        for name, c in g.constants.items():
            if c.value is None:
                w = self.weights.get(name)
                if w is None:
                    raise FormatError(f"constant {name!r} has no data and no weight-table entry")
                c.value = w.array()
        return g.validate()  # the load-time rules that read constant values (Range, Tile, Reshape...) see them now

    def verify(self) -> int:
        """Check the file's integrity and return how many weight digests match.

        Recomputes every weight digest (about one read of the file) and checks that the bytes between
        and after the tensors are zero. Raises FormatError on the first mismatch or non-zero padding,
        and when any weight has no digest (it cannot be verified).
        """
        undigested = []
        for w in self.weights.values():
            if w.digest is None:
                undigested.append(w.name)
                continue
            got = digest_bytes(byte_view(np.ascontiguousarray(w.data)))
            release_pages(w.data)
            if got != w.digest:
                raise FormatError(f"weight {w.name!r}: digest mismatch ({DIGEST_ALGO} {got} != stored {w.digest}); "
                                  "the file is corrupted — re-bake or re-copy it")
        for start, end in self._padding:
            _check_zero(self._buffer, start, end)
        if undigested:
            shown = ", ".join(f"{n!r:.80}" for n in undigested[:5]) + (", ..." if len(undigested) > 5 else "")
            raise FormatError(f"{len(undigested)} of {len(self.weights)} weights have no digest and cannot be "
                              f"verified ({shown}); the other {len(self.weights) - len(undigested)} digests match. "
                              "Re-write the file with write_rlx (or re-bake it) to store digests")
        return len(self.weights)

    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        write_stream(buf, self)
        return buf.getvalue()

    def close(self) -> None:
        buf, self._buffer = self._buffer, None
        if isinstance(buf, mmap.mmap):
            try:
                buf.close()
            except BufferError:  # views still alive; the OS unmaps when they go
                pass


# ------------------------------------------------------------------------------------------- writer


def release_pages(arr: np.ndarray) -> None:
    """Best effort: drop the pages of a file-mapped array from this process (they stay in the page cache).

    Hashing or copying a memory-mapped weight faults its pages into our RSS; releasing them after
    use keeps a bake's or verify's resident memory near one tensor instead of the whole model.
    """
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    mm = base.obj if isinstance(base, memoryview) else base
    if not isinstance(mm, mmap.mmap) or arr.nbytes == 0 or not hasattr(mm, "madvise"):
        return
    try:
        start = arr.__array_interface__["data"][0] - np.frombuffer(mm, np.uint8, count=1).__array_interface__["data"][0]
        page = mmap.PAGESIZE
        lo = (start + page - 1) // page * page  # whole pages inside the array only
        hi = (start + arr.nbytes) // page * page
        if hi > lo:
            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except (ValueError, OSError):
        pass


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _graph_dict_for_file(rf: RlxFile) -> dict:
    return rf.graph.to_dict(external=set(rf.weights))


_DIGEST_PLACEHOLDER = "0" * 16  # xxh3-64 hex digests always have 16 characters


def file_layout(rf: RlxFile, placeholder: bool = False) -> tuple[bytes, list[tuple[int, np.ndarray]]]:
    """Header bytes and (offset, array) per tensor. Missing digests are computed here, or (placeholder)
    written as a same-length placeholder that the seekable writer patches after hashing while writing."""
    entries = []
    for name in sorted(rf.weights):
        w = rf.weights[name]
        _check_weight_in_memory(w)
        data = np.ascontiguousarray(w.data)
        if w.digest is None and not placeholder:
            w.digest = digest_bytes(byte_view(data))
            release_pages(data)
        entries.append((w, data))
    graph = _graph_dict_for_file(rf)
    data_start = PREAMBLE_BYTES
    while True:  # offsets depend on the header length and vice versa: iterate to a fixed point
        offsets, pos = [], _align(data_start)
        for _, data in entries:
            offsets.append(pos)
            pos = _align(pos + data.nbytes)
        table = [{"name": w.name, "encoding": w.encoding, "dtype": w.dtype, "shape": list(w.shape),
                  "offset": off, "nbytes": data.nbytes, "digest": w.digest or _DIGEST_PLACEHOLDER, "note": w.note}
                 for (w, data), off in zip(entries, offsets)]
        header = msgpack.packb({"graph": graph, "weights": table, "meta": rf.meta, "digest_algo": DIGEST_ALGO},
                               use_bin_type=True)
        new_start = PREAMBLE_BYTES + len(header)
        if _align(new_start) == _align(data_start):
            return header, list(zip(offsets, (d for _, d in entries)))
        data_start = new_start


def write_stream(f: BinaryIO, rf: RlxFile, seekable: bool = False) -> None:
    """Write the file. With a seekable `f`, missing digests are computed while the tensors are written
    (one read of each weight instead of two) and the header is patched in place afterwards."""
    missing = {name for name, w in rf.weights.items() if w.digest is None} if seekable else set()
    header, tensors = file_layout(rf, placeholder=bool(missing))
    f.write(RLXBAKE_MAGIC + struct.pack("<IQ", SCHEMA_VERSION, len(header)) + header)
    pos = PREAMBLE_BYTES + len(header)
    for name, (off, data) in zip(sorted(rf.weights), tensors):  # _layout lists tensors by sorted name
        f.write(b"\0" * (off - pos))
        mv = byte_view(data)
        hasher = xxhash.xxh3_64() if name in missing else None
        for i in range(0, len(mv), 64 << 20):  # chunked: no giant temporary copies
            f.write(mv[i:i + (64 << 20)])
            if hasher is not None:
                hasher.update(mv[i:i + (64 << 20)])
        if hasher is not None:
            rf.weights[name].digest = hasher.hexdigest()
        release_pages(data)
        pos = off + data.nbytes
    if missing:
        final, _ = file_layout(rf)
        if len(final) != len(header):  # cannot happen: digests are fixed-length strings
            raise FormatError("internal error: header length changed while patching digests")
        end = f.tell()
        f.seek(PREAMBLE_BYTES)
        f.write(final)
        f.seek(end)


def write_rlx(path: str | os.PathLike, rf: RlxFile) -> None:
    """Write `rf` as a plaintext RLXBAKE1 v2 file, atomically. Same input -> same bytes."""
    atomic_write(path, lambda f: write_stream(f, rf, seekable=True))


# ------------------------------------------------------------------------------------------- reader


def read_plain(path: str | os.PathLike, *, verify: bool = False, mmap: bool = True) -> RlxFile:
    """Open a plain RLXBAKE1 file (rlx_format.read_rlx is the public entry point: it also opens sealed ones)."""
    path = Path(path)
    with open_for_reading(path) as f:
        head = f.read(8)
        if head == RLXENC_MAGIC:
            raise EncryptedFileError(
                f"{path}: file is encrypted (RLXENC01); pass password=... to read_rlx, or --password-env VAR / "
                "--password-stdin on the CLI")
        size = os.fstat(f.fileno()).st_size
        _check_preamble(head + f.read(PREAMBLE_BYTES - 8), size, str(path))
        buf = _map_file(f) if mmap else _read_whole(f, size, path)
    rf = _parse(buf, size, str(path))
    if verify:
        rf.verify()
    return rf


def _map_file(f: BinaryIO) -> mmap.mmap:
    return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _read_whole(f: BinaryIO, size: int, path: Path) -> bytes:
    f.seek(0)
    data = f.read(size)
    if len(data) != size or f.read(1):
        raise FormatError(f"{path}: the file changed size while it was read ({size} bytes expected); "
                          "replace .rlx files by rename, never in place")
    return data


def read_rlx_bytes(buf: bytes | bytearray | memoryview, *, verify: bool = False, where: str = "<bytes>") -> RlxFile:
    """Parse an in-memory RLXBAKE1 file; tensors are views into `buf` (no copy)."""
    mv = memoryview(buf)
    if bytes(mv[:8]) == RLXENC_MAGIC:
        raise EncryptedFileError(f"{where}: data is encrypted (RLXENC01); use read_rlx_with_password")
    _check_preamble(bytes(mv[:PREAMBLE_BYTES]), len(mv), where)
    rf = _parse(mv, len(mv), where)
    if verify:
        rf.verify()
    return rf


def _check_preamble(pre: bytes, size: int, where: str) -> None:
    if len(pre) < 8 or pre[:8] != RLXBAKE_MAGIC:
        raise FormatError(f"{where}: not an rlx file (magic {pre[:8]!r}; expected {RLXBAKE_MAGIC!r})")
    if len(pre) < PREAMBLE_BYTES:
        raise FormatError(f"{where}: truncated preamble ({size} bytes; expected at least {PREAMBLE_BYTES})")
    version, hlen = struct.unpack("<IQ", pre[8:PREAMBLE_BYTES])
    if version not in READABLE_VERSIONS:
        raise FormatError(f"{where}: schema version {version} at offset 8; this reader supports "
                          f"{list(READABLE_VERSIONS)} — upgrade rlx")
    if hlen > MAX_HEADER_BYTES:
        raise FormatError(f"{where}: header length {hlen} at offset 12 exceeds the cap of {MAX_HEADER_BYTES} bytes")
    if PREAMBLE_BYTES + hlen > size:
        raise FormatError(f"{where}: header length {hlen} at offset 12 runs past the end of the file "
                          f"({size} bytes); the file is truncated")


class _ViewReader:
    """read(n) over a memoryview: msgpack.Unpacker pulls the header only as far as it decodes it."""

    def __init__(self, view: memoryview):
        self.view, self.pos = view, 0

    def read(self, n: int) -> bytes:
        chunk = bytes(self.view[self.pos:self.pos + n])
        self.pos += len(chunk)
        return chunk


class _OverBudget(Exception):
    """Raised from inside msgpack's hooks once a header has decoded more containers than allowed."""


_MAP_FIRST_BYTES = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])  # fixmap, map16, map32
_STR_FIRST_BYTES = frozenset([*range(0xA0, 0xC0), 0xD9, 0xDA, 0xDB])  # fixstr, str8, str16, str32


def _decode_header(view: memoryview, where: str) -> dict:
    """Decode the header map with bounded memory (spec/rlx-format.md, "Header decoding").

    An empty msgpack array is one byte but ~70 bytes as a Python list, so the byte cap alone does not
    bound memory: top-level keys are checked as they are read, before their values are decoded, and
    every decoded map and array is counted against a budget proportional to the header length.
    """
    budget = HEADER_CONTAINER_ALLOWANCE + len(view) // HEADER_BYTES_PER_CONTAINER
    left = budget

    def count(obj):
        nonlocal left
        left -= 1
        if left < 0:
            raise _OverBudget
        return obj

    at = f"{where}: header at offset {PREAMBLE_BYTES}"
    if not len(view) or view[0] not in _MAP_FIRST_BYTES:
        first = f"0x{view[0]:02x}" if len(view) else "none (empty header)"
        raise FormatError(f"{at} is not valid msgpack for a header: expected a map, got first byte {first}")
    up = msgpack.Unpacker(_ViewReader(view), read_size=min(len(view), 1 << 20), raw=False, strict_map_key=True,
                          max_buffer_size=len(view),
                          max_str_len=MAX_HEADER_BYTES, max_bin_len=MAX_HEADER_BYTES,
                          max_array_len=max(MAX_WEIGHTS, MAX_NODES), max_map_len=MAX_NODES, max_ext_len=0,
                          list_hook=count, object_hook=count)
    header: dict = {}
    try:
        for _ in range(up.read_map_header()):
            at_key = up.tell()
            if at_key >= len(view) or view[at_key] not in _STR_FIRST_BYTES:
                raise FormatError(f"{where}: header key at offset {PREAMBLE_BYTES + at_key} is not a string")
            key = up.unpack()
            if key not in HEADER_KEYS:
                raise FormatError(f"{where}: unknown header key {key!r:.80} at offset {PREAMBLE_BYTES + at_key}; "
                                  f"expected only {list(HEADER_KEYS)}")
            if key in header:
                raise FormatError(f"{where}: header key {key!r} appears twice")
            header[key] = up.unpack()
        if up.tell() != len(view):
            raise FormatError(f"{at}: {len(view) - up.tell()} bytes follow the header map; expected none")
    except FormatError:
        raise
    except _OverBudget:
        raise FormatError(f"{at}: {len(view)} bytes decode to more than {budget} maps and arrays (the cap is "
                          f"{HEADER_CONTAINER_ALLOWANCE} + one per {HEADER_BYTES_PER_CONTAINER} header bytes); "
                          "the file is corrupted or was not written by rlx") from None
    except Exception as e:  # noqa: BLE001 - msgpack raises many types for bad bytes
        raise FormatError(f"{at} is not valid msgpack ({type(e).__name__}: {e})") from None
    return header


def _parse(buf, size: int, where: str) -> RlxFile:
    version, hlen = struct.unpack("<IQ", bytes(buf[8:PREAMBLE_BYTES]))
    with memoryview(buf)[PREAMBLE_BYTES:PREAMBLE_BYTES + hlen] as view:
        header = _decode_header(view, where)
    if not isinstance(header.get("graph"), dict):
        raise FormatError(f"{where}: header must be a map with a 'graph' map")
    algo = header.get("digest_algo", DIGEST_ALGO)
    if algo != DIGEST_ALGO:
        raise FormatError(f"{where}: header 'digest_algo' is {algo!r:.80}; this reader supports only "
                          f"{DIGEST_ALGO!r}, so it cannot check the weight digests — upgrade rlx or re-bake the file")
    table = header.get("weights", []) if version >= 2 else []
    meta = header.get("meta", {}) if version >= 2 else header.get("meta", {})
    if not isinstance(table, list) or not isinstance(meta, dict):
        raise FormatError(f"{where}: header 'weights' must be a list and 'meta' a map")
    if len(table) > MAX_WEIGHTS:
        raise FormatError(f"{where}: {len(table)} weights exceed the cap of {MAX_WEIGHTS}")
    nodes = header["graph"].get("nodes")
    if isinstance(nodes, list) and len(nodes) > MAX_NODES:  # other types: Graph.from_dict names the problem
        raise FormatError(f"{where}: node count exceeds the cap of {MAX_NODES}")
    data_start = PREAMBLE_BYTES + hlen
    entries = [_check_entry(e, i, data_start, size, where) for i, e in enumerate(table)]
    names: set[str] = set()
    for e in entries:
        if e["name"] in names:
            raise FormatError(f"{where}: weight name {e['name']!r:.200} appears twice in the weight table")
        names.add(e["name"])
    spans = sorted((e["offset"], e["offset"] + e["nbytes"], e["name"]) for e in entries if e["nbytes"])
    for (a0, a1, an), (b0, _, bn) in zip(spans, spans[1:]):
        if b0 < a1:
            raise FormatError(f"{where}: weights {an!r:.200} [{a0}, {a1}) and {bn!r:.200} (offset {b0}) overlap")
    padding, pos = [], data_start
    for a0, a1, _ in spans:
        if a0 > pos:
            padding.append((pos, a0))
        pos = a1
    if size > pos:
        padding.append((pos, size))
    weights = {}
    for e in entries:
        sdt = storage_dtype(e["encoding"])
        sshape = storage_shape(e["encoding"], e["shape"])
        count = math.prod(sshape)
        arr = np.frombuffer(buf, dtype=sdt, count=count, offset=e["offset"]).reshape(sshape)
        weights[e["name"]] = Weight(e["name"], e["encoding"], e["shape"], arr, e["dtype"], e["digest"], e["note"])
    try:
        graph = Graph.from_dict(header["graph"])
    except GraphError as err:
        raise FormatError(f"{where}: embedded graph is invalid: {err}") from None
    for name, c in graph.constants.items():
        if c.value is None:
            w = weights.get(name)
            if w is None:
                raise FormatError(f"{where}: graph constant {name!r} has no data and no weight-table entry")
            if w.data.dtype != NUMPY_DTYPES[c.dtype] or tuple(w.data.shape) != tuple(c.shape):
                raise FormatError(f"{where}: weight {name!r} is stored as {w.data.dtype}{list(w.data.shape)} but the "
                                  f"graph declares {c.dtype}{list(c.shape)}")
    return RlxFile(graph, weights, meta, version, buf, padding)


def _check_zero(buf, start: int, end: int) -> None:
    """Raise FormatError unless buf[start:end] is all zero bytes (checked in slices, pages released)."""
    for lo in range(start, end, 64 << 20):
        chunk = np.frombuffer(buf, np.uint8, count=min(end, lo + (64 << 20)) - lo, offset=lo)
        if chunk.any():
            at = lo + int(np.argmax(chunk != 0))
            raise FormatError(f"padding byte at offset {at} is 0x{chunk[at - lo]:02x}; padding between and after "
                              "tensors must be zero — the file is corrupted or was not written by rlx")
        release_pages(chunk)


_DIGEST_RE = re.compile(r"[0-9a-f]{16}")
_ENTRY_TYPES = {"name": str, "encoding": str, "dtype": str, "shape": list, "offset": int, "nbytes": int}


def _check_entry(e: Any, i: int, data_start: int, size: int, where: str) -> dict:
    if not isinstance(e, dict):
        raise FormatError(f"{where}: weights[{i}] must be a map")
    for k, t in _ENTRY_TYPES.items():
        v = e.get(k)
        if type(v) is not t:  # exact types: msgpack never produces subclasses, and bool is not an int here
            raise FormatError(f"{where}: weights[{i}] field {k!r} is {v!r}; expected {t.__name__}")
    name = e["name"]
    ctx = f"{where}: weight {name!r:.200} (weights[{i}])"
    if not name or len(name) > MAX_STR:
        raise FormatError(f"{ctx}: name must be 1..{MAX_STR} characters")
    enc = e["encoding"]
    if enc not in PLAIN_ENCODINGS and enc not in QUANT_ENCODINGS:
        raise FormatError(f"{ctx}: unknown encoding {enc!r}; expected one of "
                          f"{list(PLAIN_ENCODINGS) + list(QUANT_ENCODINGS)}")
    if e["dtype"] not in NUMPY_DTYPES:
        raise FormatError(f"{ctx}: unknown dtype {e['dtype']!r}")
    shape = e["shape"]
    if len(shape) > MAX_RANK or any(type(d) is not int or not 0 <= d <= MAX_DIM for d in shape):
        raise FormatError(f"{ctx}: shape {shape} must have rank <= {MAX_RANK} and dims in [0, {MAX_DIM}]")
    if enc in QUANT_ENCODINGS and (not shape or shape[-1] % QUANT_ENCODINGS[enc][0]):
        raise FormatError(f"{ctx}: {enc} needs a last dim that is a multiple of {QUANT_ENCODINGS[enc][0]}; "
                          f"got shape {shape}")
    want = math.prod(storage_shape(enc, tuple(shape))) * storage_dtype(enc).itemsize
    off, n = e["offset"], e["nbytes"]
    if n != want:
        raise FormatError(f"{ctx}: nbytes {n}; expected {want} for {enc} {shape}")
    if off % ALIGNMENT:
        raise FormatError(f"{ctx}: offset {off} is not {ALIGNMENT}-byte aligned")
    if off < data_start or off + n > size:
        raise FormatError(f"{ctx}: bytes [{off}, {off + n}) are outside the data section [{data_start}, {size}); "
                          "the file is truncated or corrupted")
    digest = e.get("digest")
    if digest is not None and (type(digest) is not str or not _DIGEST_RE.fullmatch(digest)):
        raise FormatError(f"{ctx}: digest {digest!r:.80} is not an {DIGEST_ALGO} digest (16 lowercase hex digits)")
    note = e.get("note", "")
    return {"name": name, "encoding": enc, "dtype": e["dtype"], "shape": tuple(shape), "offset": off, "nbytes": n,
            "digest": digest, "note": note if isinstance(note, str) else str(note)}


def _check_weight_in_memory(w: Weight) -> None:
    enc = w.encoding
    if enc not in PLAIN_ENCODINGS and enc not in QUANT_ENCODINGS:
        raise FormatError(f"weight {w.name!r}: unknown encoding {enc!r}")
    want_shape = storage_shape(enc, tuple(w.shape))
    if w.data.dtype != storage_dtype(enc) or tuple(w.data.shape) != want_shape:
        raise FormatError(f"weight {w.name!r}: data is {w.data.dtype}{list(w.data.shape)}; encoding {enc} with "
                          f"shape {list(w.shape)} needs {storage_dtype(enc)}{list(want_shape)}")
