import json
import time

import numpy as np
import pytest

from rlx_format import OPS, Graph, GraphBuilder, GraphError, RlxError

GOLDEN = """{
 "format": "rlx.graph",
 "version": 1,
 "name": "mlp",
 "inputs": [
  {"name": "x", "dtype": "f32", "shape": ["batch", 784]}
 ],
 "params": [
  {"name": "w1", "dtype": "f32", "shape": [784, 128]}
 ],
 "constants": [
  {"name": "b1", "dtype": "f32", "shape": [2], "data": [0.5, -1.25]},
  {"name": "idx", "dtype": "i64", "shape": [1], "data": [3]}
 ],
 "nodes": [
  {"name": "h", "op": "MatMul", "inputs": ["x", "w1"]},
  {"name": "y", "op": "Softmax", "inputs": ["h"], "attrs": {"axis": 0}}
 ],
 "outputs": ["y"]
}
"""


def test_golden_round_trip_is_byte_exact():
    g = Graph.from_json(GOLDEN)
    assert g.to_json() == GOLDEN
    assert Graph.from_json(g.to_json()).to_json() == GOLDEN
    assert g.types["h"].shape == ("batch", 128)
    np.testing.assert_array_equal(g.constants["b1"].value, np.array([0.5, -1.25], np.float32))


def test_round_trip_from_path(tmp_path):
    p = tmp_path / "graph.json"
    p.write_text(GOLDEN)
    assert Graph.from_json(p).to_json() == GOLDEN
    assert Graph.from_json(str(p)).to_json() == GOLDEN


def test_nodes_out_of_order_are_sorted():
    d = json.loads(GOLDEN)
    d["nodes"].reverse()
    g = Graph.from_json(d)
    assert [n.name for n in g.nodes] == ["h", "y"]


def _err(d_or_text, match):
    with pytest.raises(GraphError, match=match) as ei:
        Graph.from_json(d_or_text)
    assert isinstance(ei.value, RlxError)
    return ei.value


def _mut(fn):
    d = json.loads(GOLDEN)
    fn(d)
    return d


def test_error_catalogue(tmp_path):
    _err("{not json", "invalid JSON at line 1")
    _err(tmp_path / "missing.json", "no such file")
    _err(_mut(lambda d: d.update(format="onnx")), "'format' is 'onnx'; expected 'rlx.graph'")
    _err(_mut(lambda d: d.update(version=2)), "version 2 is not supported.*upgrade rlx")
    _err(_mut(lambda d: d.update(version="x")), "'version' is 'x'")
    _err(_mut(lambda d: d["nodes"][0].update(op="MatMull")), "unknown op 'MatMull'; did you mean MatMul")
    _err(_mut(lambda d: d["nodes"][0].update(inputs=["x", "w2"])), "node 'h' \\(MatMul\\): input 'w2' is not defined")
    _err(_mut(lambda d: d["nodes"][1].update(name="h")), "duplicate name 'h'")
    _err(_mut(lambda d: d["nodes"][0].update(inputs=["y", "w1"])), "cycle through node")
    _err(_mut(lambda d: d["nodes"][1].update(inputs=["h", "h"])), "node 'y' \\(Softmax\\): 2 inputs; expected 1")
    _err(_mut(lambda d: d["nodes"][1].update(attrs={"axis": "0"})), "attr 'axis' has value '0'; expected int")
    _err(_mut(lambda d: d["nodes"][1].update(attrs={"axes": [0]})), "unknown attr\\(s\\) \\['axes'\\] for Softmax")
    _err(_mut(lambda d: d["params"][0].update(shape=[783, 128])), "inner dims differ.*783")
    _err(_mut(lambda d: d.update(outputs=["z"])), "output 'z' names nothing")
    _err(_mut(lambda d: d["inputs"][0].update(dtype="float")), "unknown dtype 'float'")
    _err(_mut(lambda d: d["constants"][0].update(data=[1.0])), "data has 1 values; expected 2")
    _err(_mut(lambda d: d.update(extra=1)), "unknown top-level field")
    _err(_mut(lambda d: d["nodes"].append({"name": "r", "op": "Reshape", "inputs": ["h"]})),
         "needs attr 'shape' or input 1")
    _err(_mut(lambda d: d["nodes"].append({"name": "t", "op": "Transpose", "inputs": ["h"], "attrs": {"perm": [0]}})),
         "perm \\[0\\] is not a permutation")
    _err(_mut(lambda d: d["nodes"].append({"name": "u", "op": "Input", "inputs": []})), "declared in the inputs list")
    _err([1, 2], "graph must be a JSON object")


def test_missing_required_attr():
    g = GraphBuilder()
    x = g.input("x", "f32", [2, 3])
    g.output(g.op("Concat", x, x))
    with pytest.raises(GraphError, match="missing required attr 'axis'"):
        g.build()


def test_newer_minor_version_warns_and_ignores_fields():
    d = _mut(lambda d: d.update(version="1.3", future_field={"a": 1}))
    with pytest.warns(UserWarning, match="future_field"):
        g = Graph.from_json(d)
    assert g.outputs == ["y"]


def test_100k_node_chain_loads_fast():
    n = 100_000
    nodes = [{"name": f"n{i}", "op": "Relu", "inputs": [f"n{i - 1}" if i else "x"]} for i in range(n)]
    nodes.reverse()  # worst case for sorting
    d = {"format": "rlx.graph", "version": 1, "name": "chain",
         "inputs": [{"name": "x", "dtype": "f32", "shape": ["b", 4]}], "nodes": nodes, "outputs": [f"n{n - 1}"]}
    t = time.perf_counter()
    g = Graph.from_json(json.dumps(d))
    assert time.perf_counter() - t < 10
    assert g.nodes[0].name == "n0" and g.nodes[-1].name == f"n{n - 1}"
    assert g.types[f"n{n - 1}"].shape == ("b", 4)


def test_spec_lists_every_op():
    from pathlib import Path
    text = (Path(__file__).parent.parent / "spec" / "ops.md").read_text()
    missing = [op for op in OPS if op not in text]
    assert missing == []


def test_container_spec_lists_every_registered_encoding():
    from pathlib import Path

    from rlx_format.codecs import CODECS
    text = (Path(__file__).parent.parent / "spec" / "rlx-format.md").read_text()
    missing = [f"`{name}`" for name in CODECS if f"`{name}`" not in text]
    assert missing == []
