"""Sealing throughput (KDF excluded): rlx's chunked STREAM vs one raw ChaCha20Poly1305 call of the
cryptography library on the same bytes, same process. Goal: >= 0.8x raw throughput (time ratio <= 1.25x)."""

from __future__ import annotations

import io
import os

from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from common import Row, best_of, env_note, print_rows
from rlx_format.sealed import KDF_PROFILES, HEADER_BYTES, _decrypt_chunks, _SealingWriter, new_header

SIZE = 256 << 20
ORIGIN = "target set with the first benchmarks (ef6ed04): chunking keeps >= 0.8x the raw AEAD's throughput"


def main() -> list[Row]:
    data = os.urandom(SIZE)
    key = os.urandom(32)
    nonce = os.urandom(12)
    raw = ChaCha20Poly1305(key)
    h = new_header(SIZE, KDF_PROFILES["fast"])

    def seal():
        out = io.BytesIO()
        w = _SealingWriter(out, h, key)
        w.write(data)
        w.close()
        return out

    sealed = seal().getvalue()

    def open_():
        buf = bytearray(SIZE)
        f = io.BytesIO(sealed)
        f.seek(HEADER_BYTES)

        def sink(off, chunk):
            buf[off:off + len(chunk)] = chunk

        _decrypt_chunks(f, h, key, sink)
        return buf

    assert bytes(open_()) == data
    ct = raw.encrypt(nonce, data, b"")
    t_seal = best_of(seal, repeat=3)
    t_raw_enc = best_of(lambda: raw.encrypt(nonce, data, b""), repeat=3)
    t_open = best_of(open_, repeat=3)
    t_raw_dec = best_of(lambda: raw.decrypt(nonce, ct, b""), repeat=3)
    return [Row("crypto", "seal 256 MiB (in memory)", t_seal, t_raw_enc, "raw ChaCha20Poly1305", "<= 1.25x",
                origin=ORIGIN),
            Row("crypto", "open 256 MiB (in memory)", t_open, t_raw_dec, "raw ChaCha20Poly1305", "<= 1.25x",
                origin=ORIGIN)]


if __name__ == "__main__":
    print(env_note())
    rows = main()
    print_rows(rows)
    for r in rows:
        print(f"{r.case}: {SIZE / r.rlx / 1e9:.2f} GB/s vs raw {SIZE / r.peer / 1e9:.2f} GB/s "
              f"({r.peer / r.rlx:.2f}x raw throughput)")
