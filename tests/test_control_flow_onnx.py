"""ONNX If (run-time condition), Loop and Scan: imported with their bodies, baked, run, and compared with
onnxruntime; also the onnx package's own node cases, torch exports, .rlx and CLI round trips."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_bake import BakeOptions, bake
from rlx_bake.onnx import import_onnx
from rlx_format import read_rlx, write_rlx
from rlx_runtime import Session

R = np.random.default_rng(5)
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, t, shape):
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _check(tmp_path, model, feeds_list, profile="exact"):
    """Import, bake, write + read the .rlx, run every feed set; compare each with onnxruntime."""
    p = tmp_path / "m.onnx"
    onnx.save(model, p)
    graph, weights = import_onnx(p)
    rf, _ = bake(graph, weights, BakeOptions.from_profile(profile))
    write_rlx(tmp_path / "m.rlx", rf)
    compiled = Session().compile(read_rlx(tmp_path / "m.rlx"))
    sess = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        ours = compiled.run(feeds)
        for name, ref in zip(graph.outputs, sess.run(None, feeds), strict=True):
            assert ours[name].shape == ref.shape, name
            assert ours[name].dtype == ref.dtype, name
            np.testing.assert_allclose(ours[name], ref, rtol=1e-6, atol=1e-6)
    return graph, rf


def _loop_body(scan=True):
    """carried acc += x * w (w: an initializer of the main graph, read by name); cond = sum(acc) < limit;
    scan output: acc at each iteration; the iteration number is added to a second carried counter."""
    nodes = [helper.make_node("Mul", ["x", "w"], ["xw"]),
             helper.make_node("Add", ["acc_in", "xw"], ["acc_out"]),
             helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
             helper.make_node("Less", ["total", "limit"], ["cond_out"]),
             helper.make_node("Cast", ["i"], ["i_f"], to=F),
             helper.make_node("Add", ["cnt_in", "i_f"], ["cnt_out"])]
    outs = [_vi("cond_out", B, []), _vi("acc_out", F, [4]), _vi("cnt_out", F, [])]
    if scan:
        nodes.append(helper.make_node("Identity", ["acc_out"], ["acc_scan"]))
        outs.append(_vi("acc_scan", F, [4]))
    return helper.make_graph(nodes, "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("acc_in", F, [4]),
                                             _vi("cnt_in", F, [])], outs)


def _loop_model(m_given, cond_given, scan=True):
    inputs = [_vi("x", F, [4]), _vi("limit", F, [])]
    ins = ["", "", "acc0", "cnt0"]
    if m_given:
        inputs.append(_vi("M", I64, []))
        ins[0] = "M"
    if cond_given:
        inputs.append(_vi("c", B, []))
        ins[1] = "c"
    outs = ["acc", "cnt"] + (["accs"] if scan else [])
    nodes = [helper.make_node("Loop", ins, outs, body=_loop_body(scan))]
    inits = [numpy_helper.from_array(R.standard_normal(4).astype(np.float32) ** 2, "w"),
             numpy_helper.from_array(np.zeros(4, np.float32), "acc0"),
             numpy_helper.from_array(np.zeros((), np.float32), "cnt0")]
    shapes = {"acc": [4], "cnt": [], "accs": ["trips", 4]}
    return _model(nodes, inputs, [_vi(o, F, shapes[o]) for o in outs], inits)


def _feeds(m=None, c=None, limit=5.0):
    f = {"x": R.random(4).astype(np.float32) + 0.5, "limit": np.array(limit, np.float32)}
    if m is not None:
        f["M"] = np.array(m, np.int64)
    if c is not None:
        f["c"] = np.array(c)
    return f


@pytest.mark.parametrize("m_given,cond_given", [(True, False), (False, True), (True, True)])
def test_loop_trip_count_condition_and_scan_outputs(tmp_path, m_given, cond_given):
    model = _loop_model(m_given, cond_given)
    feeds = []
    for m in ([0, 1, 3, 40] if m_given else [None]):
        for c in ([True, False] if cond_given else [None]):
            for limit in ([1.0, 5.0, 1e9] if cond_given else [5.0]):
                if not m_given and limit > 1e6:
                    continue  # cond alone with no limit would never stop
                feeds.append(_feeds(m, c, limit))
    graph, rf = _check(tmp_path, model, feeds)
    assert any(n.op == "Loop" for n in rf.graph.nodes)


def _if_model(nest_loop=False):
    """then: x @ W (an initializer, read by name) -> [b, 3]; else: Concat(x, x) along 0 -> [2b, 4]... both
    rank 2, different shapes; with nest_loop, the else branch runs a Loop of 2 iterations doubling x."""
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t_out"])], "then", [],
                               [_vi("t_out", F, ["b", 3])])
    if nest_loop:
        body = helper.make_graph([helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
                                  helper.make_node("Identity", ["c_in"], ["c_out"])], "inner",
                                 [_vi("j", I64, []), _vi("c_in", B, []), _vi("v_in", F, ["b", 4])],
                                 [_vi("c_out", B, []), _vi("v_out", F, ["b", 4])])
        else_nodes = [helper.make_node("Loop", ["two", "", "x"], ["e_out"], body=body)]
        else_out = _vi("e_out", F, ["b", 4])
    else:
        else_nodes = [helper.make_node("Concat", ["x", "x"], ["e_out"], axis=0)]
        else_out = _vi("e_out", F, ["b2", 4])
    else_g = helper.make_graph(else_nodes, "else", [], [else_out])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    inits = [numpy_helper.from_array(R.standard_normal((4, 3)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(2, np.int64), "two")]
    return _model(nodes, [_vi("x", F, ["b", 4])], [_vi("y", F, ["r", "c"])], inits)


def test_if_with_a_run_time_condition_takes_either_branch(tmp_path):
    x = R.standard_normal((3, 4)).astype(np.float32)
    pos, neg = np.abs(x), -np.abs(x)
    graph, rf = _check(tmp_path, _if_model(), [{"x": pos}, {"x": neg}, {"x": pos[:1]}])
    assert [n.op for n in rf.graph.nodes].count("If") == 1
    ours = Session().compile(rf)
    assert ours.run({"x": pos})["y"].shape == (3, 3) and ours.run({"x": neg})["y"].shape == (6, 4)


def test_loop_nested_in_an_if_branch(tmp_path):
    x = R.standard_normal((2, 4)).astype(np.float32)
    graph, _ = _check(tmp_path, _if_model(nest_loop=True), [{"x": -np.abs(x)}, {"x": np.abs(x)[:, :4]}])
    body = next(n for n in graph.nodes if n.op == "If").attrs["else_branch"]
    assert [n.op for n in body.nodes if n.op == "Loop"] == ["Loop"]


def _scan_model(in_axis, in_dir, out_axis, out_dir):
    """state s += x_t (a row of x along in_axis); scan out y_t = s * x_t."""
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])], "body",
                             [_vi("s_in", F, [3]), _vi("x_t", F, [3])], [_vi("s_out", F, [3]), _vi("y_t", F, [3])])
    attrs = {"num_scan_inputs": 1, "scan_input_axes": [in_axis], "scan_input_directions": [in_dir],
             "scan_output_axes": [out_axis], "scan_output_directions": [out_dir]}
    x_shape = [5, 3] if in_axis == 0 else [3, 5]
    y_shape = [5, 3] if out_axis in (0, -2) else [3, 5]
    node = helper.make_node("Scan", ["s0", "x"], ["s", "y"], body=body, **attrs)
    return _model([node], [_vi("s0", F, [3]), _vi("x", F, x_shape)], [_vi("s", F, [3]), _vi("y", F, y_shape)])


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir", [(0, 0, 0, 0), (0, 1, 0, 0), (1, 0, 1, 1), (1, 1, -2, 1)])
def test_scan_axes_and_directions(tmp_path, in_axis, in_dir, out_axis, out_dir):
    model = _scan_model(in_axis, in_dir, out_axis, out_dir)
    x = R.standard_normal((5, 3) if in_axis == 0 else (3, 5)).astype(np.float32)
    _check(tmp_path, model, [{"s0": R.standard_normal(3).astype(np.float32), "x": x}])


def test_unsupported_ops_inside_bodies_are_listed_with_where_they_are(tmp_path):
    from rlx_format import RlxError

    body = helper.make_graph([helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
                              helper.make_node("Identity", ["c_in"], ["c_out"]),
                              helper.make_node("Det", ["sq"], ["d"], name="det_in_body")], "body",
                             [_vi("i", I64, []), _vi("c_in", B, []), _vi("v_in", F, [2])],
                             [_vi("c_out", B, []), _vi("v_out", F, [2]), _vi("d", F, [])])
    m = _model([helper.make_node("Loop", ["M", "", "x"], ["v", "ds"], body=body, name="lp")],
               [_vi("M", I64, []), _vi("x", F, [2]), _vi("sq", F, [2, 2])], [_vi("v", F, [2]), _vi("ds", F, [None])])
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    with pytest.raises(RlxError) as e:
        import_onnx(p)
    msg = str(e.value)
    assert "Det (inside a subgraph): 1 node(s), e.g. det_in_body (in lp.body)" in msg
    assert "Add" not in msg.split("supported ONNX ops")[0]  # the ops that lower are not reported


def _onnx_node_cases():
    import warnings

    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators compute their expected outputs with numpy
        return {c.name: c for c in collect_testcases(None)}


# the onnx package's node cases for If/Loop/Scan on tensors (its test data ships only as these generators):
# test_if_seq / test_if_opt / test_loop13_seq / test_loop16_seq_none use sequence and optional types,
# test_scan_sum is opset 8's batched Scan; those are refused (rlx has tensors only)
NODE_CASES = ["test_if", "test_loop11", "test_scan9_sum"]
REFUSED_CASES = ["test_if_seq", "test_if_opt", "test_loop13_seq", "test_loop16_seq_none", "test_scan_sum"]


@pytest.mark.parametrize("name", NODE_CASES)
def test_onnx_backend_node_case(tmp_path, name):
    case = _onnx_node_cases()[name]
    p = tmp_path / "m.onnx"
    onnx.save(case.model, p)
    graph, weights = import_onnx(p)
    rf, _ = bake(graph, weights)
    compiled = Session().compile(rf)
    for inputs, outputs in case.data_sets:
        ours = compiled.run(dict(zip(graph.input_names, inputs, strict=True)))
        for o, ref in zip(graph.outputs, outputs, strict=True):
            np.testing.assert_allclose(ours[o], ref, rtol=1e-6, atol=1e-6)
        ref_ort = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(
            None, dict(zip(graph.input_names, inputs, strict=True)))
        for o, ref in zip(graph.outputs, ref_ort, strict=True):
            np.testing.assert_allclose(ours[o], ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", REFUSED_CASES)
def test_onnx_backend_node_cases_with_sequences_are_refused_clearly(tmp_path, name):
    from rlx_format import RlxError

    p = tmp_path / "m.onnx"
    onnx.save(_onnx_node_cases()[name].model, p)
    with pytest.raises(RlxError, match="does not support|unsupported type"):
        import_onnx(p)


def _torch_modules():
    torch = pytest.importorskip("torch")

    class RNNLoop(torch.nn.Module):  # a for-loop over a tensor dim: Loop with a trip count from Shape
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = torch.zeros_like(x[0])
            for i in range(x.shape[0]):
                h = torch.tanh(self.lin(x[i]) + h)
            return h

    class Branch(torch.nn.Module):  # a data-dependent branch: If on a run-time condition
        def forward(self, x):
            if x.sum() > 0:
                y = x * 2
            else:
                y = x - 1
            return y

    return torch, {"loop": RNNLoop, "if": Branch}


@pytest.mark.parametrize("kind", ["loop", "if"])
def test_torch_script_exports(tmp_path, kind):
    import warnings

    torch, modules = _torch_modules()
    torch.manual_seed(0)
    p = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(torch.jit.script(modules[kind]()), (torch.randn(3, 4),), str(p), dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "t"}}, opset_version=17)
    op = {"loop": "Loop", "if": "If"}[kind]
    assert op in [n.op_type for n in onnx.load(str(p)).graph.node]  # torch really exported control flow
    model = onnx.load(str(p))
    x = R.standard_normal((5, 4)).astype(np.float32)
    graph, rf = _check(tmp_path, model, [{"x": x}, {"x": -np.abs(x[:2])}, {"x": np.abs(x)}, {"x": x[:0]}]
                       if kind == "loop" else [{"x": np.abs(x)}, {"x": -np.abs(x)}])
    assert op in [n.op for n in rf.graph.nodes]


def test_weight_work_inside_a_loop_body_folds_out_of_it(tmp_path):
    """Body: h = tanh(x_t @ Transpose(W) + h); W only read inside the body. The bake moves Transpose(W) out of
    the body and folds it: the file stores W transposed once, and the body no longer transposes per iteration."""
    body = helper.make_graph([helper.make_node("Transpose", ["W"], ["Wt"], perm=[1, 0]),
                              helper.make_node("MatMul", ["x_t", "Wt"], ["xw"]),
                              helper.make_node("Add", ["xw", "h_in"], ["pre"]),
                              helper.make_node("Tanh", ["pre"], ["h_out"])], "body",
                             [_vi("h_in", F, [1, 6]), _vi("x_t", F, [1, 4])], [_vi("h_out", F, [1, 6])])
    node = helper.make_node("Scan", ["h0", "x"], ["h"], body=body, num_scan_inputs=1)
    w = R.standard_normal((6, 4)).astype(np.float32)
    model = _model([node], [_vi("h0", F, [1, 6]), _vi("x", F, ["t", 1, 4])], [_vi("h", F, [1, 6])],
                   [numpy_helper.from_array(w, "W")])
    feeds = [{"h0": np.zeros((1, 6), np.float32), "x": R.standard_normal((t, 1, 4)).astype(np.float32)}
             for t in (3, 1)]  # onnxruntime refuses a Scan of length 0
    graph, rf = _check(tmp_path, model, feeds)
    (scan,) = [n for n in rf.graph.nodes if n.op == "Scan"]
    assert [n.op for n in scan.attrs["body"].nodes] == ["MatMul", "Add", "Tanh"]
    (stored,) = rf.weights.values()
    np.testing.assert_array_equal(stored.array(), w.T)


def test_cli_bakes_runs_and_inspects_a_model_with_a_loop(tmp_path):
    from click.testing import CliRunner

    from rlx_bake.cli import main

    model = _loop_model(True, True)
    onnx.save(model, tmp_path / "m.onnx")
    r = CliRunner().invoke(main, ["-q", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "m.rlx")])
    assert r.exit_code == 0, r.output
    feeds = _feeds(7, True, 5.0)
    for k, v in feeds.items():
        np.save(tmp_path / f"{k}.npy", v)
    args = [a for k in feeds for a in ("--input", f"{k}={tmp_path / f'{k}.npy'}")]
    r = CliRunner().invoke(main, ["-q", "run", str(tmp_path / "m.rlx"), *args, "-o", str(tmp_path / "out.npz")])
    assert r.exit_code == 0, r.output
    got = np.load(tmp_path / "out.npz")
    ref = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, want in zip(["acc", "cnt", "accs"], ref, strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=1e-6)
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "m.rlx"), "--json"])
    assert r.exit_code == 0, r.output
    assert "Loop" in r.output


def test_body_names_that_repeat_other_names_are_renamed(tmp_path):
    """Both branches define 't'; the then branch's Constant 'k' folds at import into a value of the main graph,
    which itself defines 'k' after the If (ONNX scoping allows all of it)."""
    then_g = helper.make_graph([helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
                                    np.array([2.0, 4.0], np.float32))),
                                helper.make_node("Add", ["x", "k"], ["t"]),
                                helper.make_node("Mul", ["t", "x"], ["o1"])],
                               "then", [], [_vi("o1", F, [2])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "w"], ["t"]),
                                helper.make_node("Mul", ["t", "t"], ["o2"])], "else", [], [_vi("o2", F, [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Relu", ["y"], ["t"]), helper.make_node("Neg", ["t"], ["k"])]
    m = _model(nodes, [_vi("x", F, [2]), _vi("c", B, [])], [_vi("k", F, [2])],
               [numpy_helper.from_array(np.array([0.5, -3.0], np.float32), "w")])
    x = np.array([1.5, -2.0], np.float32)
    _check(tmp_path, m, [{"x": x, "c": np.array(True)}, {"x": x, "c": np.array(False)}])

