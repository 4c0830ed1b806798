"""Quant codecs and DequantMatMul.

- quantize throughput vs gguf.quants.quantize (the reference), same array: goal rlx >= 3x faster
  (time ratio <= 0.333x); types gguf cannot quantize (Q4_K, Q5_K, Q6_K) print rlx's MB/s only;
- DequantMatMul vs an f32 numpy matmul with the same 4096x4096 weight, for every registered type, at batch 1
  and 32. Goals (issue #22) for Q8_0 and TQ2_0: batch 1 <= 0.5x (they read 3.8x / 15x fewer bytes), batch 32
  <= 1.2x; the other types print their ratio as information.
"""

from __future__ import annotations

import gguf.quants as gq
import numpy as np
from gguf import GGMLQuantizationType as T

from common import Row, best_interleaved, best_of, env_note, print_rows
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
    wt = np.ascontiguousarray(w.T)  # f32 weight as [K, N] for x @ W
    goals = {"gguf_q8_0": ("<= 0.5x", "<= 1.2x"), "gguf_tq2_0": ("<= 0.5x", "<= 1.2x")}
    for codec in CODECS.values():
        packed_c = quantize(w, codec.name)
        for i, batch in enumerate((1, 32)):
            x = r.standard_normal((batch, 4096)).astype(np.float32)
            run = lambda x=x, p=packed_c, c=codec: dequant_matmul(x, p, c.name, 4096, 4096)  # noqa: E731
            if codec.name in goals:  # alternating rounds after an idle pause: OpenBLAS's threads spin on after
                # the f32 GEMV and would take a core from the kernel timed next
                t_rlx, t_ref = best_interleaved(run, lambda x=x: x @ wt, repeat=7, number=5)
            else:  # information only: the quicker plain timing
                t_rlx, t_ref = best_of(run, number=5), best_of(lambda x=x: x @ wt, number=5)
            case = f"{codec.ggml} DequantMatMul 4096x4096 batch {batch}"
            if codec.name in goals:
                rows.append(Row("quants", case, t_rlx, t_ref, "numpy f32 matmul", goals[codec.name][i],
                                origin="issue #22: at most half the f32 GEMV at batch 1, 1.2x at batch 32"))
            else:
                print(f"{case}: {t_rlx * 1e3:.2f} ms vs f32 {t_ref * 1e3:.2f} ms = {t_rlx / t_ref:.2f}x (information)")
    packed = quantize_q8_0(w)
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
