"""ONNX models through rlx (import -> bake exact -> CPU runtime) vs onnxruntime, same inputs, same process.

A small CNN (3 conv blocks, 1x3x64x64) and a 2-layer transformer encoder (batch 1, seq 128, d 256,
4 heads, FFN 1024, GELU via Erf as exporters emit it), both built with the onnx helper API.
Goals: transformer <= 1.5x onnxruntime, CNN <= 3x."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from common import Row, best_of, env_note, print_rows
from rlx_bake import BakeOptions, bake
from rlx_bake.onnx import import_onnx
from rlx_runtime import Session

R = np.random.default_rng(0)


def _w(*shape, scale=None):
    scale = scale if scale is not None else 1 / np.sqrt(np.prod(shape[1:]) if len(shape) > 1 else shape[0])
    return (R.standard_normal(shape) * scale).astype(np.float32)


def cnn():
    nodes, inits, prev, c_in = [], [], "x", 3
    for i, c in enumerate((32, 64, 128)):
        inits += [numpy_helper.from_array(_w(c, c_in, 3, 3), f"cw{i}"), numpy_helper.from_array(_w(c), f"cb{i}")]
        nodes += [helper.make_node("Conv", [prev, f"cw{i}", f"cb{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        prev = f"r{i}"
        if i < 2:
            nodes.append(helper.make_node("MaxPool", [prev], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2]))
            prev = f"p{i}"
        c_in = c
    inits += [numpy_helper.from_array(_w(10, 128), "fw"), numpy_helper.from_array(_w(10), "fb")]
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    return g, {"x": R.standard_normal((1, 3, 64, 64)).astype(np.float32)}


def encoder(layers=2, seq=128, d=256, heads=4, ffn=1024):
    nodes, inits = [], []
    hd = d // heads

    def init(name, arr):
        inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(op, ins, out, **kw):
        nodes.append(helper.make_node(op, ins, [out], **kw))
        return out

    init("shape_heads", np.array([1, seq, heads, hd], np.int64))
    init("shape_back", np.array([1, seq, d], np.int64))
    init("scale", np.array(1 / np.sqrt(hd), np.float32))
    init("sqrt2", np.array(np.sqrt(2.0), np.float32))
    init("one", np.array(1.0, np.float32))
    init("half", np.array(0.5, np.float32))
    h = "x"
    for i in range(layers):
        def proj(name, src, n_in, n_out, i=i):
            mm = node("MatMul", [src, init(f"{name}_w{i}", _w(n_in, n_out))], f"{name}_mm{i}")
            return node("Add", [mm, init(f"{name}_b{i}", _w(n_out, scale=0.02))], f"{name}{i}")

        def heads_of(t):
            r = node("Reshape", [t, "shape_heads"], f"{t}_r")
            return node("Transpose", [r], f"{t}_t", perm=[0, 2, 1, 3])

        q, k, v = (heads_of(proj(n, h, d, d)) for n in ("q", "k", "v"))
        kt = node("Transpose", [k], f"kt{i}", perm=[0, 1, 3, 2])
        s = node("Mul", [node("MatMul", [q, kt], f"qk{i}"), "scale"], f"s{i}")
        a = node("MatMul", [node("Softmax", [s], f"p{i}", axis=-1), v], f"a{i}")
        a = node("Reshape", [node("Transpose", [a], f"at{i}", perm=[0, 2, 1, 3]), "shape_back"], f"ab{i}")
        h1 = node("Add", [h, proj("o", a, d, d)], f"res1_{i}")
        h1 = node("LayerNormalization", [h1, init(f"g1_{i}", np.ones(d, np.float32)),
                                         init(f"be1_{i}", np.zeros(d, np.float32))], f"ln1_{i}", axis=-1)
        f = proj("f1", h1, d, ffn)
        erf = node("Erf", [node("Div", [f, "sqrt2"], f"gd{i}")], f"ge{i}")
        gelu = node("Mul", [node("Mul", [f, node("Add", [erf, "one"], f"ga{i}")], f"gm{i}"), "half"], f"gelu{i}")
        h2 = node("Add", [h1, proj("f2", gelu, ffn, d)], f"res2_{i}")
        h = node("LayerNormalization", [h2, init(f"g2_{i}", np.ones(d, np.float32)),
                                        init(f"be2_{i}", np.zeros(d, np.float32))], f"ln2_{i}", axis=-1)
    nodes.append(helper.make_node("Identity", [h], ["y"]))
    g = helper.make_graph(nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, d])], inits)
    return g, {"x": R.standard_normal((1, seq, d)).astype(np.float32)}


def main() -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (graph, feeds), goal in (("CNN 3 conv blocks 1x3x64x64", cnn(), "<= 3.0x"),
                                           ("transformer encoder 2x(seq 128, d 256)", encoder(), "<= 1.5x")):
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            model.ir_version = 8
            path = Path(tmp) / f"{graph.name}.onnx"
            onnx.save(model, path)
            g, ws = import_onnx(path)
            rf, _ = bake(g, ws, BakeOptions.from_profile("exact"))
            compiled = Session().compile(rf)
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            ref = sess.run(None, feeds)[0]
            np.testing.assert_allclose(compiled.run(feeds)[g.outputs[0]], ref, rtol=1e-3, atol=1e-4)
            t_rlx = best_of(lambda c=compiled, f=feeds: c.run(f), number=5)
            t_ort = best_of(lambda s=sess, f=feeds: s.run(None, f), number=5)
            rows.append(Row("onnx", name, t_rlx, t_ort, "onnxruntime", goal,
                            origin="target set with this benchmark (044eeb3)"))
    return rows


if __name__ == "__main__":
    print(env_note())
    print_rows(main())
