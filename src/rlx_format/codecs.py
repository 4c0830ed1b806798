"""The quant codec registry: one object per GGML block type, the single source of its facts.

A codec knows its encoding string (as stored in .rlx files), its block size in elements and bytes,
where its fp16 scales sit in a block, how to split packed rows into fields and how to decode those
fields on any array module (`xp` = numpy or cupy). Quantizers are numba kernels in quants.py (looked
up by name, so importing this module stays cheap); optional fused kernels are named here and looked
up by the runtime (rlx_runtime.quant_kernels for the CPU, rlx_runtime/cuda/kernels.cu for CUDA).
Layouts: spec/ops.md, "Quantized".
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

from .errors import QuantError


@dataclass(frozen=True)
class Codec:
    name: str                    # encoding string in files and attrs, e.g. "gguf_q8_0"
    ggml: str                    # GGML type name, e.g. "Q8_0" (gguf.GGMLQuantizationType member)
    block: int                   # elements per block
    nbytes: int                  # bytes per block
    scale_offsets: tuple         # byte offsets of the block's fp16 scales (d first, then m where there is one;
                                 # none where the kernel writes the scale bytes: MXFP4's E8M0 byte, and the
                                 # K-quants, whose codes come from the fp16-rounded scales)
    kernel: str                  # quants.py numba kernel: (blocks f32 [nb, block], scales f32 [nb, S], out u8)
    fields: Callable             # (xp, b u8 [R, nb, nbytes]) -> tuple of per-row arrays [R, nb, ...]
    decode: Callable             # (xp, fields, out f32 [R, nb, block]) -> None
    ternary: bool = False        # codes are {-1, 0, 1} * d: lossless for {-a, 0, a} blocks with fp16-exact a
    # rlx_runtime.quant_kernels names: a fused dot kernel, a row-tile decoder, a block decoder (the fused and
    # row kernels are built on it where the first two are not given; with none, the array-op decoder runs)
    cpu_fused: str | None = None
    cpu_rows: str | None = None
    cpu_block: str | None = None
    cuda_gemv: str | None = None  # entry point in rlx_runtime/cuda/kernels.cu

    @property
    def bits_per_weight(self) -> float:
        return self.nbytes * 8 / self.block

    @property
    def short(self) -> str:
        """The CLI name: "q8_0" for "gguf_q8_0"."""
        return self.ggml.lower()


# ----------------------------------------------------------------------- array-module field decoders
# Every decoder computes what GGML's reference dequantizer computes, in the same float32 operations
# (one multiply, then one add for the types with a min), so the values are bit-identical everywhere.


def _scale(xp, b, off: int):
    """fp16 at byte `off` of every block -> f32 [R, nb, 1] (a small contiguous copy)."""
    return xp.ascontiguousarray(b[:, :, off:off + 2]).view(xp.float16).astype(xp.float32)


def _nibbles(xp, qs):
    """u8 [R, nb, 16] -> codes u8 [R, nb, 2, 16]: element j < 16 in the low nibble of byte j, j + 16 in its high."""
    shifts = xp.arange(0, 8, 4, dtype=xp.uint8).reshape(1, 1, 2, 1)  # built on the device: no upload per call
    return (qs.reshape(qs.shape[0], qs.shape[1], 1, 16) >> shifts) & 15


def _high_bits(xp, qh):
    """u8 [R, nb, 4] (a little-endian u32) -> bit j of it for j < 32, as u8 [R, nb, 2, 16]."""
    shifts = xp.arange(8, dtype=xp.uint8).reshape(1, 1, 1, 8)
    return ((qh.reshape(qh.shape[0], qh.shape[1], 4, 1) >> shifts) & 1).reshape(qh.shape[0], qh.shape[1], 2, 16)


def _q8_0_fields(xp, b):
    return b[:, :, 2:34].view(xp.int8), _scale(xp, b, 0)


def _q8_0_decode(xp, f, out):
    xp.multiply(f[0], f[1], out=out)


def _q4_0_fields(xp, b):
    return b[:, :, 2:18], _scale(xp, b, 0)


def _q4_0_decode(xp, f, out):
    q = _nibbles(xp, f[0])
    xp.multiply(xp.subtract(q, 8, dtype=xp.float32), f[1].reshape(*f[1].shape, 1), out=out.reshape(q.shape))


def _q4_1_fields(xp, b):
    return b[:, :, 4:20], _scale(xp, b, 0), _scale(xp, b, 2)


def _q4_1_decode(xp, f, out):
    q = _nibbles(xp, f[0])
    o = out.reshape(q.shape)
    xp.multiply(q.astype(xp.float32), f[1].reshape(*f[1].shape, 1), out=o)
    xp.add(o, f[2].reshape(*f[2].shape, 1), out=o)


def _q5_0_fields(xp, b):
    return b[:, :, 6:22], xp.ascontiguousarray(b[:, :, 2:6]), _scale(xp, b, 0)


def _q5_0_decode(xp, f, out):
    q = _nibbles(xp, f[0]) | (_high_bits(xp, f[1]) << 4)
    xp.multiply(xp.subtract(q, 16, dtype=xp.float32), f[2].reshape(*f[2].shape, 1), out=out.reshape(q.shape))


def _q5_1_fields(xp, b):
    return b[:, :, 8:24], xp.ascontiguousarray(b[:, :, 4:8]), _scale(xp, b, 0), _scale(xp, b, 2)


def _q5_1_decode(xp, f, out):
    q = _nibbles(xp, f[0]) | (_high_bits(xp, f[1]) << 4)
    o = out.reshape(q.shape)
    xp.multiply(q.astype(xp.float32), f[2].reshape(*f[2].shape, 1), out=o)
    xp.add(o, f[3].reshape(*f[3].shape, 1), out=o)


def _tq2_0_fields(xp, b):
    return b[:, :, :64], _scale(xp, b, 64)


def _tq2_0_decode(xp, f, out):
    # value j*128 + l*32 + m is bits 2l..2l+1 of byte j*32 + m, stored as q + 1
    codes, d = f
    rows, nb = codes.shape[:2]
    shifts = xp.arange(0, 8, 2, dtype=xp.uint8).reshape(1, 1, 1, 4, 1)
    q = (codes.reshape(rows, nb, 2, 1, 32) >> shifts) & 3
    xp.multiply(xp.subtract(q, 1, dtype=xp.float32), d.reshape(rows, nb, 1, 1, 1), out=out.reshape(rows, nb, 2, 4, 32))


def _tq1_0_fields(xp, b):
    return b[:, :, :48], b[:, :, 48:52], _scale(xp, b, 52)


def _trits(xp, packed, n: int, width: int, d, out):
    """Base-3 digits: byte m of `packed` [R, nb, width] holds elements i*width + m (i < n) as the top
    digit of (byte * 3^i mod 256) * 3 / 256, stored as q + 1."""
    rows, nb = packed.shape[:2]
    pow3 = xp.power(xp.full((1, 1, n, 1), 3, dtype=xp.uint8), xp.arange(n, dtype=xp.uint8).reshape(1, 1, n, 1))
    t = packed.reshape(rows, nb, 1, width) * pow3  # uint8: wraps mod 256 by design
    q = (t.astype(xp.uint16) * 3) >> 8
    xp.multiply(xp.subtract(q, 1, dtype=xp.float32), d.reshape(rows, nb, 1, 1), out=out.reshape(rows, nb, n, width))


def _tq1_0_decode(xp, f, out):
    qs, qh, d = f
    _trits(xp, qs[:, :, :32], 5, 32, d, out[:, :, :160])
    _trits(xp, qs[:, :, 32:48], 5, 16, d, out[:, :, 160:240])
    _trits(xp, qh, 4, 4, d, out[:, :, 240:256])


def _mxfp4_fields(xp, b):
    e = b[:, :, :1].astype(xp.uint32)  # E8M0 byte -> 2^(e - 128) as f32 (subnormal for e < 2)
    bits = xp.where(e < 2, xp.left_shift(xp.ones_like(e), e + 21), xp.left_shift(e - 1, 23))
    return b[:, :, 1:17], xp.ascontiguousarray(bits).view(xp.float32)


def _mxfp4_decode(xp, f, out):
    # code i: e2m1 (sign i >> 3, exponent (i >> 1) & 3, mantissa i & 1) doubled, as an integer (so code 8 is +0)
    i = _nibbles(xp, f[0]).astype(xp.int32)
    ex, man = (i >> 1) & 3, i & 1
    mag = xp.where(ex == 0, man, (man + 2) << xp.maximum(ex - 1, 0))
    v = xp.where(i >= 8, -mag, mag).astype(xp.float32)
    xp.multiply(v, f[1].reshape(*f[1].shape, 1), out=out.reshape(v.shape))


# K-quants: super-blocks of 256 values in sub-blocks, each with its own scale (and min) relative to fp16 d (dmin)


def _k_fields(xp, b):
    """Q4_K / Q5_K: d, dmin, the 12 bytes of 6-bit sub-block scales and mins, and the rest (qh, qs)."""
    return _scale(xp, b, 0), _scale(xp, b, 2), b[:, :, 4:16], b[:, :, 16:]


def _k_scales(xp, d, dmin, s):
    """d * scale and dmin * min of the 8 sub-blocks, f32 [R, nb, 8, 1]. Sub-block j < 4: scale = low 6 bits of
    byte j, min = of byte j + 4; j >= 4: the low / high nibble of byte j + 4, the top 2 bits from bits 6..7 of
    byte j - 4 (scale) and byte j (min)."""
    lo, mid, hi = s[:, :, 0:4], s[:, :, 4:8], s[:, :, 8:12]
    sc = xp.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=2)
    mn = xp.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=2)
    return (xp.multiply(d, sc, dtype=xp.float32)[..., None], xp.multiply(dmin, mn, dtype=xp.float32)[..., None])


def _k_nibbles(xp, qs):
    """u8 [R, nb, 128] -> codes u8 [R, nb, 8, 32]: chunk c of 32 bytes holds sub-block 2c in its low nibbles and
    2c + 1 in its high ones."""
    shifts = xp.arange(0, 8, 4, dtype=xp.uint8).reshape(1, 1, 1, 2, 1)
    return ((qs.reshape(qs.shape[0], qs.shape[1], 4, 1, 32) >> shifts) & 15).reshape(qs.shape[0], qs.shape[1], 8, 32)


def _q4_k_decode(xp, f, out):
    d1, m1 = _k_scales(xp, f[0], f[1], f[2])
    q = _k_nibbles(xp, f[3])
    o = out.reshape(q.shape)
    xp.multiply(q.astype(xp.float32), d1, out=o)
    xp.subtract(o, m1, out=o)


def _q5_k_decode(xp, f, out):
    d1, m1 = _k_scales(xp, f[0], f[1], f[2])
    rest = f[3]
    rows, nb = rest.shape[:2]
    shifts = xp.arange(8, dtype=xp.uint8).reshape(1, 1, 8, 1)
    high = (rest[:, :, :32].reshape(rows, nb, 1, 32) >> shifts) & 1  # bit j of qh[i]: element i of sub-block j
    q = _k_nibbles(xp, rest[:, :, 32:]) | (high << 4)
    o = out.reshape(q.shape)
    xp.multiply(q.astype(xp.float32), d1, out=o)
    xp.subtract(o, m1, out=o)


def _q6_k_fields(xp, b):
    return b[:, :, :128], b[:, :, 128:192], b[:, :, 192:208].view(xp.int8), _scale(xp, b, 208)


def _q6_k_decode(xp, f, out):
    # element 128h + 32k + i (h < 2, k < 4, i < 32): low 4 bits from nibble k >> 1 of ql[64h + 32(k & 1) + i],
    # high 2 bits from bits 2k..2k+1 of qh[32h + i]; code - 32, times d * scale[element // 16]
    ql, qh, sc, d = f
    rows, nb = ql.shape[:2]
    nib = xp.arange(0, 8, 4, dtype=xp.uint8).reshape(1, 1, 1, 2, 1, 1)
    low = ((ql.reshape(rows, nb, 2, 1, 2, 32) >> nib) & 15).reshape(rows, nb, 2, 4, 32)
    pairs = xp.arange(0, 8, 2, dtype=xp.uint8).reshape(1, 1, 1, 4, 1)
    high = (qh.reshape(rows, nb, 2, 1, 32) >> pairs) & 3
    q = xp.subtract(low | (high << 4), 32, dtype=xp.float32).reshape(rows, nb, 16, 16)
    xp.multiply(xp.multiply(d, sc, dtype=xp.float32)[..., None], q, out=out.reshape(q.shape))


CODECS: dict[str, Codec] = {c.name: c for c in (
    Codec("gguf_q8_0", "Q8_0", 32, 34, (0,), "_q8_0_blocks", _q8_0_fields, _q8_0_decode,
          cpu_fused="q8_0_fused", cpu_rows="q8_0_rows", cuda_gemv="rlx_q8_0_gemv"),
    Codec("gguf_q4_0", "Q4_0", 32, 18, (0,), "_q4_0_blocks", _q4_0_fields, _q4_0_decode,
          cpu_fused="q4_0_fused", cpu_rows="q4_0_rows"),
    Codec("gguf_q4_1", "Q4_1", 32, 20, (0, 2), "_q4_1_blocks", _q4_1_fields, _q4_1_decode,
          cpu_fused="q4_1_fused", cpu_rows="q4_1_rows"),
    Codec("gguf_q5_0", "Q5_0", 32, 22, (0,), "_q5_0_blocks", _q5_0_fields, _q5_0_decode,
          cpu_fused="q5_0_fused", cpu_rows="q5_0_rows"),
    Codec("gguf_q5_1", "Q5_1", 32, 24, (0, 2), "_q5_1_blocks", _q5_1_fields, _q5_1_decode,
          cpu_fused="q5_1_fused", cpu_rows="q5_1_rows"),
    Codec("gguf_mxfp4", "MXFP4", 32, 17, (), "_mxfp4_blocks", _mxfp4_fields, _mxfp4_decode,
          cpu_block="_dec_mxfp4"),
    Codec("gguf_tq1_0", "TQ1_0", 256, 54, (52,), "_tq1_0_blocks", _tq1_0_fields, _tq1_0_decode, ternary=True,
          cpu_fused="tq1_0_fused", cpu_block="_dec_tq1_0"),
    Codec("gguf_tq2_0", "TQ2_0", 256, 66, (64,), "_tq2_0_blocks", _tq2_0_fields, _tq2_0_decode, ternary=True,
          cpu_fused="tq2_0_fused", cpu_rows="tq2_0_rows", cuda_gemv="rlx_tq2_0_gemv"),
    Codec("gguf_q4_k", "Q4_K", 256, 144, (), "_q4_k_blocks", _k_fields, _q4_k_decode, cpu_block="_dec_q4_k"),
    Codec("gguf_q5_k", "Q5_K", 256, 176, (), "_q5_k_blocks", _k_fields, _q5_k_decode, cpu_block="_dec_q5_k"),
    Codec("gguf_q6_k", "Q6_K", 256, 210, (), "_q6_k_blocks", _q6_k_fields, _q6_k_decode, cpu_block="_dec_q6_k"),
)}
BY_SHORT: dict[str, Codec] = {c.short: c for c in CODECS.values()}


def get_codec(encoding: str, where: str = "") -> Codec:
    """The codec of `encoding`, or a QuantError naming the known ones."""
    c = CODECS.get(encoding) if isinstance(encoding, str) else None
    if c is None:
        raise QuantError(f"{where + ': ' if where else ''}unknown quant encoding {encoding!r}; expected one of "
                         f"{', '.join(CODECS)}")
    return c


def ternary_codecs() -> list[Codec]:
    """Lossless ternary packings, smallest first."""
    return sorted((c for c in CODECS.values() if c.ternary), key=lambda c: c.bits_per_weight)
