"""Per-op overhead and an MLP forward: rlx CPU runtime vs onnxruntime, same graphs, same process.

(a) a chain of 1,000 tiny elementwise ops on a [1, 16] tensor (pure dispatch overhead), goal <= 3x;
(b) an MLP 784-1024-1024-10 at batch 64 (BLAS-bound), goal <= 1.2x.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from common import Row, best_of, env_note, print_rows
from rlx_format import GraphBuilder
from rlx_runtime import Session

_UNARY = ["Relu", "Neg", "Abs", "Sigmoid", "Tanh"]


def chain(n: int = 1000):
    g = GraphBuilder("chain")
    h = g.input("x", "f32", [1, 16])
    nodes = []
    prev = "x"
    for i in range(n):
        op = _UNARY[i % len(_UNARY)]
        h = g.op(op, h, name=f"n{i}")
        nodes.append(helper.make_node(op, [prev], [f"n{i}"]))
        prev = f"n{i}"
    g.output(h)
    og = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                           [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, 16])])
    return g.build(), og, {"x": np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)}


def mlp(batch: int = 64):
    r = np.random.default_rng(0)
    sizes = [784, 1024, 1024, 10]
    g = GraphBuilder("mlp")
    h = g.input("x", "f32", ["batch", 784])
    nodes, inits, prev = [], [], "x"
    for i in range(3):
        w = (r.standard_normal((sizes[i], sizes[i + 1])) / np.sqrt(sizes[i])).astype(np.float32)
        b = r.standard_normal(sizes[i + 1]).astype(np.float32)
        h = g.add(g.matmul(h, g.constant(w, name=f"w{i}")), g.constant(b, name=f"b{i}"))
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        prev = f"a{i}"
        if i < 2:
            h = g.relu(h)
            nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
            prev = f"r{i}"
    g.output(h)
    og = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 784])],
                           [helper.make_tensor_value_info(prev, TensorProto.FLOAT, ["batch", 10])], initializer=inits)
    return g.build(), og, {"x": r.standard_normal((batch, 784)).astype(np.float32)}


def ort_session(og):
    model = helper.make_model(og, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main() -> list[Row]:
    rows = []
    for case, (graph, og, feeds), goal, number in (("a: 1000-op elementwise chain", chain(), "<= 3.0x", 20),
                                                   ("b: MLP 784-1024-1024-10 b64", mlp(), "<= 1.2x", 20)):
        c = Session().compile(graph)
        s = ort_session(og)
        out_name = s.get_outputs()[0].name
        np.testing.assert_allclose(c.run(feeds)[graph.outputs[0]], s.run([out_name], feeds)[0], rtol=1e-4, atol=1e-4)
        t_rlx = best_of(lambda c=c, feeds=feeds: c.run(feeds), number=number)
        t_ort = best_of(lambda s=s, feeds=feeds, o=out_name: s.run([o], feeds), number=number)
        rows.append(Row("runtime", case, t_rlx, t_ort, "onnxruntime", goal,
                        origin="target set with the first benchmarks (ef6ed04): dispatch cost (a), BLAS parity (b)"))
    return rows


if __name__ == "__main__":
    print(env_note())
    print_rows(main())
