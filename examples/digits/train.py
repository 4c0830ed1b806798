"""Train the demo classifier on scikit-learn's bundled digits (8x8 images, 10 classes).

Writes two bundles (graph.json + weights.safetensors) next to this file:
  float/    an MLP 64-256-256-10 trained in float32
  ternary/  the same MLP whose two 256-input layers are trained ternary ({-a, 0, +a} per output
            channel, `a` fp16-exact) with a straight-through estimator, so `exact` packs them losslessly (TQ1_0).
The graph keeps PyTorch's [out, in] weight layout and an input scaling, so the bake has weight-only
work to fold (transposes) as real exported models do. Deterministic (fixed seeds); numpy only.
Run: python examples/digits/train.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from sklearn.datasets import load_digits

from rlx_format import GraphBuilder

HERE = Path(__file__).parent
SIZES = (64, 256, 256, 10)


def split():
    d = load_digits()
    x, y = d.data.astype(np.float32), d.target.astype(np.int64)
    idx = np.random.default_rng(0).permutation(len(x))
    x, y = x[idx], y[idx]
    n_test = 360
    return (x[n_test:], y[n_test:]), (x[:n_test], y[:n_test])


def ternarize(w: np.ndarray) -> np.ndarray:
    """w [out, in] -> {-a, 0, +a} per output row, a = fp16-exact mean |w| of the kept entries."""
    mag = np.abs(w)
    keep = mag > 0.7 * mag.mean(axis=1, keepdims=True)
    a = (mag * keep).sum(axis=1, keepdims=True) / np.maximum(keep.sum(axis=1, keepdims=True), 1)
    a = a.astype(np.float16).astype(np.float32)
    return (np.sign(w) * keep * a).astype(np.float32)


def forward(params, x, ternary):
    acts = [x / 16.0]
    h = acts[0]
    for i in range(3):
        w = params[f"w{i + 1}"]
        if ternary and i > 0:
            w = ternarize(w)
        h = h @ w.T + params[f"b{i + 1}"]
        if i < 2:
            h = np.maximum(h, 0)
        acts.append(h)
    return acts


def train(ternary: bool, steps: int = 400, lr: float = 3e-3):
    (x, y), _ = split()
    r = np.random.default_rng(1)
    params = {}
    for i in range(3):
        fan_in, fan_out = SIZES[i], SIZES[i + 1]
        params[f"w{i + 1}"] = (r.standard_normal((fan_out, fan_in)) * np.sqrt(2 / fan_in)).astype(np.float32)
        params[f"b{i + 1}"] = np.zeros(fan_out, np.float32)
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v2 = {k: np.zeros_like(v) for k, v in params.items()}
    onehot = np.eye(10, dtype=np.float32)[y]
    for t in range(1, steps + 1):
        acts = forward(params, x, ternary)
        logits = acts[-1]
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) / len(x)
        grads = {}
        for i in (2, 1, 0):
            w = params[f"w{i + 1}"]
            w_used = ternarize(w) if ternary and i > 0 else w
            grads[f"w{i + 1}"] = g.T @ acts[i]  # straight-through: gradient goes to the latent float weight
            grads[f"b{i + 1}"] = g.sum(0)
            if i:
                g = (g @ w_used) * (acts[i] > 0)
        for k in params:
            m[k] = 0.9 * m[k] + 0.1 * grads[k]
            v2[k] = 0.999 * v2[k] + 0.001 * grads[k] ** 2
            params[k] -= lr * (m[k] / (1 - 0.9**t)) / (np.sqrt(v2[k] / (1 - 0.999**t)) + 1e-8)
    if ternary:
        for k in ("w2", "w3"):
            params[k] = ternarize(params[k])
    return params


def build_graph(name: str):
    g = GraphBuilder(name)
    x = g.input("x", "f32", ["batch", 64])
    h = g.mul(x, g.constant(np.array(1 / 16, np.float32), name="input_scale"))
    for i in range(3):
        w = g.param(f"w{i + 1}", "f32", [SIZES[i + 1], SIZES[i]])
        b = g.param(f"b{i + 1}", "f32", [SIZES[i + 1]])
        h = g.add(g.matmul(h, g.transpose(w, perm=[1, 0])), b, name=f"fc{i + 1}")
        if i < 2:
            h = g.relu(h)
    g.output(g.softmax(h, name="probs"))
    return g.build()


def main():
    _, (xt, yt) = split()
    for variant, ternary in (("float", False), ("ternary", True)):
        params = train(ternary)
        acc = (forward(params, xt, False)[-1].argmax(1) == yt).mean()
        out = HERE / variant
        out.mkdir(exist_ok=True)
        build_graph(f"digits_{variant}").to_json(out / "graph.json")
        save_file({k: np.ascontiguousarray(v) for k, v in params.items()}, str(out / "weights.safetensors"))
        print(f"{variant}: test accuracy {acc:.4f} -> {out}")


if __name__ == "__main__":
    main()
