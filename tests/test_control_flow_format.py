"""Control flow in the format and runtime: bodies in graph.json and .rlx files, load-time validation and caps,
Loop/Scan edge cases (huge trip counts, zero iterations), passes (fold out of bodies, hoisting)."""

import json
import struct

import msgpack
import numpy as np
import pytest

from rlx_format import FormatError, RlxFile, read_rlx, read_rlx_bytes, write_rlx
from rlx_format.constants import MAX_BODY_DEPTH, RLXBAKE_MAGIC
from rlx_format.errors import GraphError
from rlx_format.graph import Graph, Node, Value
from rlx_runtime import CompileOptions, Session

R = np.random.default_rng(3)


def _loop_graph(cond_limit=None, scan=True, body_const=True):
    """acc <- acc + w (w captured), M times; scan output acc * 2 (2: a body constant); with cond_limit the body's
    condition is i + 1 < cond_limit."""
    consts = [Value("two", "f32", (), np.array(2, np.float32))] if body_const else []
    nodes = [Node("acc2", "Add", ["acc", "w"])]
    if cond_limit is None:
        nodes.append(Node("c2", "Identity", ["c"]))
    else:
        consts.append(Value("lim", "i64", (), np.array(cond_limit, np.int64)))
        consts.append(Value("one", "i64", (), np.array(1, np.int64)))
        nodes += [Node("i1", "Add", ["i", "one"]), Node("c2", "Less", ["i1", "lim"])]
    outs = ["c2", "acc2"]
    if scan:
        nodes.append(Node("sc", "Mul", ["acc2", "two"] if body_const else ["acc2", "acc2"]))
        outs.append("sc")
    body = Graph("L.body", [Value("i", "i64", ()), Value("c", "bool", ()), Value("acc", "f32", ("n",)),
                            Value("w", "f32", ("n",))], [], consts, nodes, outs)
    top = [Node("L", "Loop", ["M", "x", "wp"], {"body": body, "optional": ["M"], "num_captures": 1}),
           Node("y", "Item", ["L"], {"index": 0})]
    outputs = ["y"]
    if scan:
        top.append(Node("s", "Item", ["L"], {"index": 1}))
        outputs.append("s")
    return Graph("g", [Value("x", "f32", ("n",)), Value("M", "i64", ())], [Value("wp", "f32", ("n",))], [], top,
                 outputs)


def _ref(x, w, m, limit=None):
    acc, scans = x.copy(), []
    for i in range(m):
        acc = acc + w
        scans.append(acc * 2)
        if limit is not None and not i + 1 < limit:
            break
    return acc, (np.stack(scans) if scans else np.zeros((0, x.size), np.float32))


def test_json_and_rlx_round_trips_keep_bodies(tmp_path):
    g = _loop_graph()
    text = g.to_json()
    assert Graph.from_json(text).to_json() == text
    body = json.loads(text)["nodes"][0]["attrs"]["body"]
    assert sorted(body) == ["constants", "inputs", "name", "nodes", "outputs"]
    assert body["constants"] == [{"name": "two", "dtype": "f32", "shape": [], "data": [2.0]}]  # inline data
    w = R.standard_normal(5).astype(np.float32)
    g2 = Graph.from_json(text)
    g2.params = []
    g2.constants["wp"] = Value("wp", "f32", (5,), w)
    g2.inputs[0] = Value("x", "f32", (5,))
    rf = RlxFile.from_graph(g2.validate())
    write_rlx(tmp_path / "m.rlx", rf)
    back = read_rlx(tmp_path / "m.rlx")
    assert back.materialize_graph().to_json() == rf.graph.to_json()
    x = R.standard_normal(5).astype(np.float32)
    for m in (0, 1, 4):
        out = Session().compile(back).run({"x": x, "M": np.array(m)})
        acc, scans = _ref(x, w, m)
        np.testing.assert_array_equal(out["y"], acc)
        np.testing.assert_array_equal(out["s"], scans)


def test_a_huge_trip_count_allocates_nothing_up_front():
    """M = 2^62 (and 2^63 - 1), body condition false after 3 iterations: 3 iterations run, 3 scan rows."""
    g = _loop_graph(cond_limit=3)
    c = Session().compile(g)
    x, w = R.standard_normal(4).astype(np.float32), R.standard_normal(4).astype(np.float32)
    c.set_param("wp", w)
    for m in (1 << 62, (1 << 63) - 1):
        out = c.run({"x": x, "M": np.array(m)})
        acc, scans = _ref(x, w, 3)
        assert out["s"].shape == (3, 4)
        np.testing.assert_array_equal(out["y"], acc)


def test_scan_of_length_zero_gives_the_initial_states_and_empty_outputs():
    body = Graph("b", [Value("s", "f32", (3,)), Value("x", "f32", (3,))], [], [],
                 [Node("s2", "Add", ["s", "x"]), Node("y", "Mul", ["s2", "x"])], ["s2", "y"])
    g = Graph("g", [Value("s0", "f32", (3,)), Value("xs", "f32", ("t", 3))], [], [],
              [Node("S", "Scan", ["s0", "xs"], {"body": body, "num_scan_inputs": 1}),
               Node("s", "Item", ["S"], {"index": 0}), Node("ys", "Item", ["S"], {"index": 1})], ["s", "ys"])
    s0 = R.standard_normal(3).astype(np.float32)
    out = Session().compile(g).run({"s0": s0, "xs": np.zeros((0, 3), np.float32)})
    np.testing.assert_array_equal(out["s"], s0)
    assert out["ys"].shape == (0, 3)


def _doc(g: Graph) -> dict:
    return json.loads(g.to_json())


def _body_of(d: dict) -> dict:
    return d["nodes"][0]["attrs"]["body"]


@pytest.mark.parametrize("edit,message", [
    (lambda d: _body_of(d).update(params=[]), "unknown body field(s) ['params']"),
    (lambda d: d["inputs"][0].update(dtype="f16"), "is declared f32['n']; the operand is f16['n']"),
    (lambda d: _body_of(d)["inputs"][3].update(shape=[5]), "a static body dim must equal the operand's"),
    (lambda d: d["nodes"][0]["inputs"].pop(), "body declares 4 inputs; expected 3"),
    (lambda d: _body_of(d)["constants"][0].pop("data"), "constants inside a body carry their data inline"),
    (lambda d: d["nodes"].__setitem__(1, {"name": "y", "op": "Relu", "inputs": ["L"]}),
     "read one result with an Item node"),
    (lambda d: d["nodes"][1].update(attrs={"index": 2}), "index 2 out of range; the node it reads has 2 results"),
    (lambda d: d.update(outputs=["L"]), "output 'L' is the tuple of results of a control-flow node"),
    (lambda d: _body_of(d)["nodes"][0].update(op="Concat", attrs={"axis": 0}),
     "dim 0 is 'n' going in and 'acc2:d"),
])
def test_bad_bodies_are_refused_at_load(edit, message):
    d = _doc(_loop_graph())
    edit(d)
    with pytest.raises(GraphError) as e:
        Graph.from_dict(d)
    assert message in str(e.value)


def test_a_symbol_may_not_stand_for_two_operand_dims():
    d = _doc(_loop_graph())
    d["inputs"].append({"name": "x2", "dtype": "f32", "shape": ["m"]})
    d["nodes"][0]["inputs"][2] = "x2"  # w now has dim 'm' while the body calls both 'n'
    with pytest.raises(GraphError, match="body dim 'n' stands for both 'n' and 'm'"):
        Graph.from_dict(d)


def test_a_carried_dim_may_change_when_its_symbol_is_free():
    d = _doc(_loop_graph(scan=False, body_const=False))
    body = _body_of(d)
    body["inputs"][2]["shape"] = ["k"]  # acc's dim is free in the body: Concat may grow it
    body["inputs"][3]["shape"] = ["q"]
    body["nodes"][0].update(op="Concat", attrs={"axis": 0})
    g = Graph.from_dict(d)
    assert g.types["y"].shape != ("n",)  # a fresh symbol: the final length depends on M
    c = Session().compile(g)
    c.set_param("wp", np.ones(2, np.float32))
    y = c.run({"x": np.zeros(3, np.float32), "M": np.array(2)})["y"]
    np.testing.assert_array_equal(y, [0, 0, 0, 1, 1, 1, 1])


def _nested_doc(depth: int) -> dict:
    """An If nested `depth` bodies deep (each then branch holds the next If), built iteratively."""
    leaf = {"name": "leaf", "inputs": [], "constants": [{"name": "k", "dtype": "f32", "shape": [], "data": [1.0]}],
            "nodes": [], "outputs": ["k"]}
    inner = leaf
    for _ in range(depth):
        node = {"name": "iff", "op": "If", "inputs": ["cc"], "attrs": {"then_branch": inner, "else_branch": dict(leaf)}}
        inner = {"name": "b", "inputs": [],
                 "constants": [{"name": "cc", "dtype": "bool", "shape": [], "data": [True]}],
                 "nodes": [node, {"name": "r", "op": "Item", "inputs": ["iff"], "attrs": {"index": 0}}],
                 "outputs": ["r"]}
    return {"format": "rlx.graph", "version": 1, "name": "deep", "inputs": [], "params": [],
            "constants": inner["constants"], "nodes": inner["nodes"], "outputs": ["r"]}


def test_nesting_cap():
    g = Graph.from_dict(_nested_doc(MAX_BODY_DEPTH))
    assert Session().compile(g).run({})["r"] == 1.0
    for depth in (MAX_BODY_DEPTH + 1, 300):  # refused before any body is built: no RecursionError
        with pytest.raises(GraphError, match=f"bodies nested more than {MAX_BODY_DEPTH} deep"):
            Graph.from_dict(_nested_doc(depth))


def test_rlx_reader_refuses_too_deep_bodies_as_a_format_error():
    header = msgpack.packb({"graph": _nested_doc(MAX_BODY_DEPTH + 1), "weights": [], "meta": {}},
                           use_bin_type=True)
    data = RLXBAKE_MAGIC + struct.pack("<IQ", 2, len(header)) + header
    with pytest.raises(FormatError, match="embedded graph is invalid: .*nested more than"):
        read_rlx_bytes(data)


def test_param_bindings_fold_weight_work_out_of_a_body_and_hoisting_keeps_the_loop():
    """A body transposing a captured weight: param_bindings folds the Transpose out of the body; with
    cache_param_invariant the Transpose is prepared once and the Loop stays in the per-forward half."""
    body = Graph("b", [Value("i", "i64", ()), Value("c", "bool", ()), Value("h", "f32", (1, 3)),
                       Value("W", "f32", (3, 3))], [], [],
                 [Node("Wt", "Transpose", ["W"], {"perm": [1, 0]}), Node("h2", "MatMul", ["h", "Wt"]),
                  Node("c2", "Identity", ["c"])], ["c2", "h2"])
    g = Graph("g", [Value("h0", "f32", (1, 3)), Value("M", "i64", ())], [Value("W", "f32", (3, 3))], [],
              [Node("L", "Loop", ["M", "h0", "W"], {"body": body, "optional": ["M"], "num_captures": 1}),
               Node("y", "Item", ["L"], {"index": 0})], ["y"])
    w = R.standard_normal((3, 3)).astype(np.float32)
    h0 = R.standard_normal((1, 3)).astype(np.float32)
    ref = h0
    for _ in range(3):
        ref = ref @ w.T
    folded = Session().compile_with(g, CompileOptions(param_bindings={"W": w}))
    (loop,) = [n for n in folded.graph.nodes if n.op == "Loop"]
    assert [n.op for n in loop.attrs["body"].nodes] == ["MatMul", "Identity"]
    np.testing.assert_allclose(folded.run({"h0": h0, "M": np.array(3)})["y"], ref, rtol=1e-6)
    hoisted = Session().compile_with(g, CompileOptions(cache_param_invariant=True))
    hoisted.set_param("W", w)
    np.testing.assert_allclose(hoisted.run({"h0": h0, "M": np.array(3)})["y"], ref, rtol=1e-6)


def test_a_loop_of_constants_is_not_folded_across_iterations():
    g = _loop_graph(scan=False, body_const=False)
    x, w = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    g.inputs = []
    g.params = []
    g.constants = {"x": Value("x", "f32", (3,), x), "M": Value("M", "i64", (), np.array(4, np.int64)),
                   "wp": Value("wp", "f32", (3,), w)}
    g.validate()
    c = Session().compile_with(g, CompileOptions(optimize=True))
    assert "Loop" in c.plan_ops()
    np.testing.assert_array_equal(c.run({})["y"], x + 4)


def test_inference_of_each_control_op():
    """If: branch dims that differ become fresh symbols, equal ones stay; Loop: carried type kept, scan outputs
    [fresh trip count, *per-iteration]; Scan: the iteration axis inserted at scan_output_axes."""
    then_b = Graph("t", [Value("a", "f32", ("b", 4))], [], [], [Node("o", "Concat", ["a", "a"], {"axis": 0})], ["o"])
    else_b = Graph("e", [Value("a", "f32", ("b", 4))], [], [], [Node("o", "Relu", ["a"])], ["o"])
    g = Graph("g", [Value("c", "bool", ()), Value("x", "f32", ("batch", 4))], [], [],
              [Node("I", "If", ["c", "x"], {"then_branch": then_b, "else_branch": else_b}),
               Node("y", "Item", ["I"], {"index": 0})], ["y"])
    (d0, d1) = g.types["y"].shape
    assert isinstance(d0, str) and d0 not in ("b", "batch") and d1 == 4
    loop = _loop_graph()
    assert loop.types["y"].shape == ("n",)
    trips, n = loop.types["s"].shape
    assert isinstance(trips, str) and n == "n"  # the body's 'n' maps back to the operand's 'n'
    body = Graph("b", [Value("s", "f32", (3,)), Value("x", "f32", (3,))], [], [],
                 [Node("s2", "Add", ["s", "x"]), Node("y", "Mul", ["s2", "x"])], ["s2", "y"])
    sc = Graph("g", [Value("s0", "f32", (3,)), Value("xs", "f32", (3, "t"))], [], [],
               [Node("S", "Scan", ["s0", "xs"], {"body": body, "num_scan_inputs": 1, "scan_input_axes": [1],
                                                 "scan_output_axes": [-1]}),
                Node("ys", "Item", ["S"], {"index": 1})], ["ys"])
    assert sc.types["ys"].shape == (3, "t")


def test_fold_drops_dead_body_nodes_and_unused_captures():
    body = Graph("b", [Value("i", "i64", ()), Value("c", "bool", ()), Value("h", "f32", (2,)), Value("u", "f32", (2,)),
                       Value("v", "f32", (2,))], [], [],
                 [Node("dead", "Mul", ["h", "u"]), Node("h2", "Add", ["h", "v"]), Node("c2", "Identity", ["c"])],
                 ["c2", "h2"])
    g = Graph("g", [Value("h0", "f32", (2,)), Value("M", "i64", ()), Value("u0", "f32", (2,)),
                    Value("v0", "f32", (2,))], [], [],
              [Node("L", "Loop", ["M", "h0", "u0", "v0"], {"body": body, "optional": ["M"], "num_captures": 2}),
               Node("y", "Item", ["L"], {"index": 0})], ["y"])
    c = Session().compile_with(g, CompileOptions(optimize=True))
    (loop,) = [n for n in c.graph.nodes if n.op == "Loop"]
    assert [n.name for n in loop.attrs["body"].nodes] == ["h2", "c2"]
    assert loop.inputs == ["M", "h0", "v0"] and loop.attrs["num_captures"] == 1
    h0, v0 = R.standard_normal(2).astype(np.float32), R.standard_normal(2).astype(np.float32)
    out = c.run({"h0": h0, "M": np.array(2), "u0": h0, "v0": v0})["y"]
    np.testing.assert_allclose(out, h0 + 2 * v0, rtol=1e-6)


def test_a_failing_body_names_the_iteration_and_the_body_node():
    from rlx_format import RlxError

    body = Graph("b", [Value("i", "i64", ()), Value("c", "bool", ()), Value("acc", "f32", ()),
                       Value("x", "f32", (2,))], [], [],
                 [Node("g", "Gather", ["x", "i"]), Node("acc2", "Add", ["acc", "g"]), Node("c2", "Identity", ["c"])],
                 ["c2", "acc2"])
    g = Graph("g", [Value("x", "f32", (2,)), Value("M", "i64", ()), Value("a0", "f32", ())], [], [],
              [Node("L", "Loop", ["M", "a0", "x"], {"body": body, "optional": ["M"], "num_captures": 1}),
               Node("y", "Item", ["L"], {"index": 0})], ["y"])
    c = Session().compile(g)
    feeds = {"x": np.array([1, 2], np.float32), "a0": np.array(0, np.float32)}
    assert c.run({**feeds, "M": np.array(2)})["y"] == 3
    with pytest.raises(RlxError, match=r"Loop body, iteration 2: node 'g' \(Gather\) failed at run time"):
        c.run({**feeds, "M": np.array(5)})
