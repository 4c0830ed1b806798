"""Weight-only work done once instead of per forward, two ways:
- hoisting: a 2048x2048 block whose weight needs dequantize + transpose + LoRA merge before a batch-8
  matmul, with cache_param_invariant vs without (same graph, same weights);
- folding: the LoRA-merged weight `x @ exp(((w + a@b) * s).T)` (1024^2, rank 16) compiled with
  param_bindings (one MatMul left) vs the same graph with set_param.
Goal for both (the fold issue's acceptance): >= 5x faster than doing the work per forward."""

from __future__ import annotations

import numpy as np

from common import Row, best_of, env_note, print_rows
from rlx_format import GraphBuilder
from rlx_format.quants import quantize_q8_0
from rlx_runtime import CompileOptions, Session

N = 2048
RANK = 16


def block():
    g = GraphBuilder("lora_block")
    x = g.input("x", "f32", ["batch", N])
    q = g.param("w_q8", "u8", [N, N // 32 * 34])
    a, b = g.param("lora_a", "f32", [N, RANK]), g.param("lora_b", "f32", [RANK, N])
    w = g.transpose(g.dequantize(q, encoding="gguf_q8_0", shape=[N, N]), perm=[1, 0])
    merged = g.add(w, g.mul(g.matmul(a, b), g.constant(np.array(0.5, np.float32), name="lora_scale")))
    g.output(g.matmul(x, merged, name="y"))
    return g.build()


def main() -> list[Row]:
    r = np.random.default_rng(0)
    params = {"w_q8": quantize_q8_0(r.standard_normal((N, N)).astype(np.float32)),
              "lora_a": r.standard_normal((N, RANK)).astype(np.float32) * 0.01,
              "lora_b": r.standard_normal((RANK, N)).astype(np.float32) * 0.01}
    x = r.standard_normal((8, N)).astype(np.float32)
    compiled = {}
    for hoist in (False, True):
        c = Session().compile_with(block(), CompileOptions(cache_param_invariant=hoist, optimize=False))
        for k, v in params.items():
            c.set_param(k, v)
        compiled[hoist] = c
    np.testing.assert_allclose(compiled[True].run({"x": x})["y"], compiled[False].run({"x": x})["y"], rtol=1e-4,
                               atol=1e-3)
    t_h = best_of(lambda: compiled[True].run({"x": x}), repeat=5, number=5)
    t_p = best_of(lambda: compiled[False].run({"x": x}), repeat=3, number=1)
    # ratio reported as hoisted/plain: goal is plain/hoisted >= 5, i.e. hoisted/plain <= 0.2
    return [Row("hoist", "2048^2 dequant+T+LoRA, batch 8 forward", t_h, t_p, "same graph unhoisted", "<= 0.2x",
                origin="target set with the first benchmarks (ef6ed04): a hoisted forward is >= 5x faster"),
            lora_fold_row(r)]


def lora_fold_row(r: np.random.Generator) -> Row:
    n, rank = 1024, 16
    g = GraphBuilder("lora")
    x = g.input("x", "f32", ["b", n])
    w, a, b, s = (g.param("w", "f32", [n, n]), g.param("a", "f32", [n, rank]), g.param("bb", "f32", [rank, n]),
                  g.param("s", "f32", [1]))
    g.output(g.matmul(x, g.exp(g.transpose(g.mul(g.add(w, g.matmul(a, b)), s), perm=[1, 0])), name="y"))
    graph = g.build()
    vals = {"w": r.standard_normal((n, n)).astype(np.float32) * 0.01,
            "a": r.standard_normal((n, rank)).astype(np.float32) * 0.01,
            "bb": r.standard_normal((rank, n)).astype(np.float32) * 0.01, "s": np.array([0.5], np.float32)}
    bound = Session().compile_with(graph, CompileOptions(param_bindings=vals))
    assert bound.plan_ops() == ["MatMul"], bound.plan_ops()
    plain = Session().compile(graph)
    for k, v in vals.items():
        plain.set_param(k, v)
    xv = r.standard_normal((8, n)).astype(np.float32)
    got, want = bound.run({"x": xv})["y"], plain.run({"x": xv})["y"]
    # the same dot products summed in two orders (the folded weight is contiguous: rlx's few-rows kernel; the
    # unbound one a transposed view: OpenBLAS): each within its rounding bound
    wf = np.exp(((vals["w"] + vals["a"] @ vals["bb"]) * vals["s"]).T).astype(np.float64)
    bound_ = 2 * n * np.finfo(np.float32).eps * (np.abs(xv).astype(np.float64) @ np.abs(wf))
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound_)
    t_b = best_of(lambda: bound.run({"x": xv}), repeat=5, number=5)
    t_p = best_of(lambda: plain.run({"x": xv}), repeat=3, number=1)
    return Row("fold", "LoRA 1024^2 r16 param_bindings, batch 8", t_b, t_p, "same graph unbound", "<= 0.2x",
               origin="target set with this row (9fc1fbd): a bound (folded) forward is >= 5x faster")


if __name__ == "__main__":
    print(env_note())
    rows = main()
    print_rows(rows)
    print(f"hoisted forward is {1 / rows[0].ratio:.1f}x faster; bound (folded) forward {1 / rows[1].ratio:.1f}x")
