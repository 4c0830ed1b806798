"""Quant codecs and DequantMatMul.

- quantize throughput vs gguf.quants.quantize (the reference), same array: goal rlx >= 3x faster
  (time ratio <= 0.333x); types gguf cannot quantize (Q4_K, Q5_K, Q6_K) print rlx's MB/s only;
- Q8_0 DequantMatMul vs an f32 numpy matmul with the same 4096x4096 weight: batch 1 goal <= 1.0x,
  batch 32 goal <= 2.0x.
"""

from __future__ import annotations

import gguf.quants as gq
import numpy as np
from gguf import GGMLQuantizationType as T

from common import Row, best_of, env_note, print_rows
from rlx_format.codecs import CODECS
from rlx_format.quants import quantize, quantize_q8_0
from rlx_format import GraphBuilder
from rlx_runtime import CompileOptions, Session
from rlx_runtime.quant_kernels import dequant_matmul


def main() -> list[Row]:
    r = np.random.default_rng(0)
    rows = []
    w = r.standard_normal((4096, 4096)).astype(np.float32)
    for codec in CODECS.values():  # every registered type
        qt = T[codec.ggml]
        try:
            ref = gq.quantize(w[:64], qt)
        except NotImplementedError:  # gguf-py has no quantizer (the K-quants): our speed, as information
            t_rlx = best_of(lambda codec=codec: quantize(w, codec.name), repeat=3)
            print(f"quantize {codec.ggml} 4096x4096: {w.nbytes / t_rlx / 1e6:.1f} MB/s of f32 input (no reference)")
            continue
        assert np.array_equal(quantize(w[:64], codec.name), ref)
        t_rlx = best_of(lambda codec=codec: quantize(w, codec.name), repeat=3)
        t_ref = best_of(lambda qt=qt: gq.quantize(w, qt), repeat=3)
        rows.append(Row("quants", f"quantize {codec.ggml} 4096x4096 (64 MiB f32)", t_rlx, t_ref, "gguf.quants",
                        "<= 0.333x",
                        origin="target set with the first benchmarks (ef6ed04): >= 3x the reference's speed"))
    packed = quantize_q8_0(w)
    wt = np.ascontiguousarray(w.T)  # f32 weight as [K, N] for x @ W
    for batch, goal in ((1, "<= 1.0x"), (32, "<= 2.0x")):
        x = r.standard_normal((batch, 4096)).astype(np.float32)
        t_rlx = best_of(lambda x=x: dequant_matmul(x, packed, "gguf_q8_0", 4096, 4096), number=5)
        t_ref = best_of(lambda x=x: x @ wt, number=5)
        rows.append(Row("quants", f"Q8_0 DequantMatMul 4096x4096 batch {batch}", t_rlx, t_ref, "numpy f32 matmul",
                        goal, origin="target set with the first benchmarks (ef6ed04)"))
    # the same packed weight run with CompileOptions(unpack_quantized=True): dequantized once at compile
    g = GraphBuilder("unpack")
    xin = g.input("x", "f32", ["b", 4096])
    g.output(g.dequant_mat_mul(xin, g.constant(packed, name="w"), encoding="gguf_q8_0", N=4096, K=4096, name="y"))
    compiled = Session().compile_with(g.build(), CompileOptions(unpack_quantized=True))
    x = r.standard_normal((32, 4096)).astype(np.float32)
    t_rlx = best_of(lambda: compiled.run({"x": x}), number=5)
    t_ref = best_of(lambda: x @ wt, number=5)
    rows.append(Row("quants", "Q8_0 weight, unpack_quantized, batch 32", t_rlx, t_ref, "numpy f32 matmul", "<= 1.2x",
                    origin="target set with this row (84971f6): f32 matmul speed, 20% for noise"))
    return rows


if __name__ == "__main__":
    print(env_note())
    print_rows(main())
