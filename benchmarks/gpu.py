"""GPU benchmarks (run by scripts/gpu-check; needs cupy and a CUDA GPU; not part of run_all.py).

1. DequantMatMul on a 4096x4096 weight, Q8_0 and TQ2_0, batch 1/32/512, against cuBLAS GEMM on the
   same weight in f32 and in f16 (x @ W.T with cupy.matmul). Two rlx rows per case: `run` is the
   whole CompiledGraph.run (input checks, Python dispatch) with a device-resident input; `kernel` is
   the DequantMatMul kernel call alone. Times are medians of CUDA-event times (cupyx.profiler.benchmark).
2. Hoisting on the GPU: benchmarks/hoist.py's block (dequantize + transpose + LoRA merge of a
   2048x2048 weight, batch 8), forward with cache_param_invariant vs without.
Prints one table; with RLX_BENCH_JSON=path also writes the rows as JSON.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from rlx_format import GraphBuilder
from rlx_format.quants import dequantize, quantize
from rlx_runtime import CompileOptions, Device, Session

N = K = 4096
BATCHES = (1, 32, 512)


def gpu_ms(cupy, fn, n_repeat=30) -> float:
    from cupyx.profiler import benchmark

    r = benchmark(fn, (), n_repeat=n_repeat, n_warmup=5)
    return float(np.median(r.gpu_times[0])) * 1e3


def dequant_rows(cupy) -> list[dict]:
    rng = np.random.default_rng(0)
    return [row for enc in ("gguf_q8_0", "gguf_tq2_0") for row in _dequant_case(cupy, enc, rng)]


def _dequant_case(cupy, enc: str, rng) -> list[dict]:
    from rlx_runtime.kernels import KERNELS

    w = rng.standard_normal((N, K)).astype(np.float32)
    if enc == "gguf_tq2_0":
        w = rng.integers(-1, 2, (N, K)).astype(np.float32)
    packed = quantize(w, enc)
    w32 = cupy.asarray(dequantize(packed, enc))
    w16 = w32.astype(cupy.float16)
    g = GraphBuilder("dq")
    x_name = g.input("x", "f32", ["M", K])
    g.output(g.op("DequantMatMul", x_name, g.constant(packed, name="w"), name="y", encoding=enc, N=N, K=K))
    compiled = Session(Device.CUDA).compile(g.build())
    dev_packed = cupy.asarray(packed)
    attrs = {"encoding": enc, "N": N, "K": K}
    kern = KERNELS["DequantMatMul"]
    rows = []
    for m in BATCHES:
        x = cupy.asarray(rng.standard_normal((m, K)).astype(np.float32))
        x16 = x.astype(cupy.float16)
        ref = x @ w32.T
        err = float(cupy.abs(compiled.run({"x": x})["y"] - ref).max() / (cupy.abs(ref).max() + 1e-30))
        t_run = gpu_ms(cupy, lambda x=x: compiled.run({"x": x}))
        t_kernel = gpu_ms(cupy, lambda x=x: kern(cupy, attrs, x, dev_packed))
        t32 = gpu_ms(cupy, lambda x=x: x @ w32.T)
        t16 = gpu_ms(cupy, lambda x16=x16: x16 @ w16.T)
        rows.append({"bench": "dequant_matmul", "case": f"{enc} {N}x{K} batch {m}", "rlx_run_ms": t_run,
                     "rlx_kernel_ms": t_kernel, "cublas_f32_ms": t32, "cublas_f16_ms": t16,
                     "kernel_vs_f32": t_kernel / t32, "kernel_vs_f16": t_kernel / t16, "max_rel_err": err})
    return rows


def hoist_rows(cupy) -> list[dict]:
    sys.path.insert(0, os.path.dirname(__file__))
    from hoist import N as HN
    from hoist import RANK, block

    rng = np.random.default_rng(0)
    params = {"w_q8": quantize(rng.standard_normal((HN, HN)).astype(np.float32), "gguf_q8_0"),
              "lora_a": rng.standard_normal((HN, RANK)).astype(np.float32) * 0.01,
              "lora_b": rng.standard_normal((RANK, HN)).astype(np.float32) * 0.01}
    x = cupy.asarray(rng.standard_normal((8, HN)).astype(np.float32))
    times = {}
    for hoist in (False, True):
        c = Session(Device.CUDA).compile_with(block(), CompileOptions(cache_param_invariant=hoist, optimize=False))
        for k, v in params.items():
            c.set_param(k, v)
        c.run({"x": x})
        times[hoist] = gpu_ms(cupy, lambda c=c: c.run({"x": x}))
    return [{"bench": "hoist", "case": f"{HN}^2 dequant+T+LoRA, batch 8 forward", "hoisted_ms": times[True],
             "unhoisted_ms": times[False], "speedup": times[False] / times[True]}]


def main() -> int:
    try:
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception as e:  # noqa: BLE001 - no cupy, no driver, no GPU
        print(f"benchmarks/gpu.py: no usable CUDA GPU ({type(e).__name__}: {e}); nothing measured")
        return 1
    print(f"GPU: {name}; cupy {cupy.__version__}; times are medians of CUDA-event times")
    rows = dequant_rows(cupy) + hoist_rows(cupy)
    print(f"{'case':34} {'rlx run':>9} {'rlx kern':>9} {'cuBLAS32':>9} {'cuBLAS16':>9} {'k/f32':>6} {'k/f16':>6}"
          f" {'rel err':>8}")
    for r in rows:
        if r["bench"] == "dequant_matmul":
            print(f"{r['case']:34} {r['rlx_run_ms']:8.3f}m {r['rlx_kernel_ms']:8.3f}m {r['cublas_f32_ms']:8.3f}m "
                  f"{r['cublas_f16_ms']:8.3f}m {r['kernel_vs_f32']:5.2f}x {r['kernel_vs_f16']:5.2f}x "
                  f"{r['max_rel_err']:8.1e}")
        else:
            print(f"{r['case']:34} hoisted {r['hoisted_ms']:.3f} ms, unhoisted {r['unhoisted_ms']:.3f} ms: "
                  f"{r['speedup']:.1f}x faster")
    if os.environ.get("RLX_BENCH_JSON"):
        with open(os.environ["RLX_BENCH_JSON"], "w") as f:
            json.dump({"gpu": name, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
