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
