"""Dynamically quantized models: DynamicQuantizeLinear, MatMulInteger and ConvInteger against onnxruntime,
by hand (every zero-point form) and on models that onnxruntime.quantization.quantize_dynamic produced."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_bake import BakeOptions, bake
from rlx_bake.onnx import import_onnx
from rlx_runtime import Session

from ort_integer import u8s8_saturates

R = np.random.default_rng(5)


def _run_both(tmp_path, m, feeds):
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    graph, weights = import_onnx(path)
    rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
    return Session().compile(rf).run(feeds), ref, rf


def _model(nodes, inputs, outputs, inits=(), opset=13):
    return helper.make_model(helper.make_graph(nodes, "q", inputs, outputs, list(inits)),
                             opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("a_t,b_t", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("zps", ["none", "scalar", "vector", "b_only"])
def test_matmul_integer_every_zero_point_form(tmp_path, a_t, b_t, zps):
    info = {np.uint8: (TensorProto.UINT8, 0, 256), np.int8: (TensorProto.INT8, -128, 128)}
    a = R.integers(info[a_t][1], info[a_t][2], (4, 300)).astype(a_t)  # K = 300: sums past float32's 2^24
    b = R.integers(info[b_t][1], info[b_t][2], (300, 5)).astype(b_t)
    inits = [numpy_helper.from_array(b, "B")]
    names = ["A", "B"]
    if zps in ("scalar", "vector"):
        azp = R.integers(info[a_t][1], info[a_t][2], () if zps == "scalar" else (4,)).astype(a_t)
        inits.append(numpy_helper.from_array(azp, "azp"))
        names.append("azp")
    if zps in ("scalar", "vector", "b_only"):
        bzp = R.integers(info[b_t][1], info[b_t][2], () if zps == "scalar" else (5,)).astype(b_t)
        inits.append(numpy_helper.from_array(bzp, "bzp"))
        names += ([""] if zps == "b_only" else []) + ["bzp"]
    m = _model([helper.make_node("MatMulInteger", names, ["Y"])],
               [helper.make_tensor_value_info("A", info[a_t][0], [4, 300])],
               [helper.make_tensor_value_info("Y", TensorProto.INT32, None)], inits, opset=10)
    za = 0 if zps in ("none", "b_only") else azp.astype(np.int64)[:, None] if zps == "vector" else int(azp)
    zb = 0 if zps == "none" else bzp.astype(np.int64)
    exact = ((a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)).astype(np.int32)  # the spec's int32 sums
    if zps == "vector":  # onnxruntime has no per-row / per-column zero points: integer numpy is the oracle
        path = tmp_path / "m.onnx"
        onnx.save(m, str(path))
        graph, weights = import_onnx(path)
        rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
        out = Session().compile(rf).run({"A": a})
    else:
        out, ref, rf = _run_both(tmp_path, m, {"A": a})
        if not (a_t == np.uint8 and b_t == np.int8 and u8s8_saturates()):  # see ort_integer.py
            np.testing.assert_array_equal(ref["Y"], exact)
    assert out["Y"].dtype == np.int32
    np.testing.assert_array_equal(out["Y"], exact)  # exact integer sums
    assert rf.weights["B"].dtype in ("u8", "i8")  # the weight stays 8-bit in the file


@pytest.mark.parametrize("wzp", ["none", "scalar", "per_channel"])
def test_conv_integer(tmp_path, wzp):
    x = R.integers(0, 256, (2, 3, 9, 9)).astype(np.uint8)
    w = R.integers(0, 256, (4, 3, 3, 3)).astype(np.uint8)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.uint8(7), "xzp")]
    names = ["X", "W", "xzp"]
    if wzp != "none":
        z = R.integers(0, 256, () if wzp == "scalar" else (4,)).astype(np.uint8)
        inits.append(numpy_helper.from_array(z, "wzp"))
        names.append("wzp")
    m = _model([helper.make_node("ConvInteger", names, ["Y"], pads=[1, 0, 1, 2], strides=[2, 1])],
               [helper.make_tensor_value_info("X", TensorProto.UINT8, [2, 3, 9, 9])],
               [helper.make_tensor_value_info("Y", TensorProto.INT32, None)], inits, opset=10)
    if wzp == "per_channel":  # not in onnxruntime: its float Conv on the shifted operands (sums < 2^24: exact)
        path = tmp_path / "m.onnx"
        onnx.save(m, str(path))
        graph, weights = import_onnx(path)
        rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
        out = Session().compile(rf).run({"X": x})
        xf, wf = x.astype(np.float32) - 7, w.astype(np.float32) - z.astype(np.float32)[:, None, None, None]
        fm = _model([helper.make_node("Conv", ["X", "W"], ["Y"], pads=[1, 0, 1, 2], strides=[2, 1])],
                    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 9, 9])],
                    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], [numpy_helper.from_array(wf, "W")])
        sess = ort.InferenceSession(fm.SerializeToString(), providers=["CPUExecutionProvider"])
        ref = {"Y": sess.run(None, {"X": xf})[0].astype(np.int32)}
    else:
        out, ref, _ = _run_both(tmp_path, m, {"X": x})
    np.testing.assert_array_equal(out["Y"], ref["Y"])


@pytest.mark.parametrize("case", ["normal", "all_positive", "all_negative", "all_zero", "one_value"])
def test_dynamic_quantize_linear(tmp_path, case):
    x = {"normal": R.standard_normal((3, 50)), "all_positive": R.random((3, 50)) + 0.5,
         "all_negative": -R.random((3, 50)) - 0.1, "all_zero": np.zeros((3, 50)),
         "one_value": np.full((3, 50), 2.5)}[case].astype(np.float32)
    m = _model([helper.make_node("DynamicQuantizeLinear", ["X"], ["Y", "S", "Z"])],
               [helper.make_tensor_value_info("X", TensorProto.FLOAT, [3, 50])],
               [helper.make_tensor_value_info(n, t, None) for n, t in
                (("Y", TensorProto.UINT8), ("S", TensorProto.FLOAT), ("Z", TensorProto.UINT8))], opset=11)
    out, ref, _ = _run_both(tmp_path, m, {"X": x})
    for k in ("Y", "S", "Z"):
        np.testing.assert_array_equal(out[k], ref[k], err_msg=k)


def _torch_model(kind: str):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    if kind == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        return net.eval(), torch.randn(5, 64)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, stride=2),
                              torch.nn.Flatten(), torch.nn.Linear(4 * 7 * 7, 6))
    return net.eval(), torch.randn(2, 3, 16, 16)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("wtype", ["QInt8", "QUInt8"])
def test_quantize_dynamic_models_match_onnxruntime(tmp_path, kind, wtype):
    torch = pytest.importorskip("torch")
    from onnxruntime.quantization import QuantType, quantize_dynamic

    net, x = _torch_model(kind)
    fp = tmp_path / "fp.onnx"
    torch.onnx.export(net, (x,), str(fp), input_names=["x"], output_names=["y"], dynamo=False, opset_version=13,
                      dynamic_axes={"x": {0: "batch"}})
    qp = tmp_path / "q.onnx"
    # 7-bit weights where onnxruntime's uint8 x int8 kernels saturate (ort_integer.py): it is then exact too
    quantize_dynamic(str(fp), str(qp), weight_type=getattr(QuantType, wtype),
                     op_types_to_quantize=["MatMul", "Conv", "Gemm"],
                     reduce_range=wtype == "QInt8" and u8s8_saturates())
    ops = {n.op_type for n in onnx.load(str(qp)).graph.node}
    assert "DynamicQuantizeLinear" in ops and ("ConvInteger" in ops) == (kind == "cnn"), ops
    graph, weights = import_onnx(qp)
    rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
    sess = ort.InferenceSession(str(qp), providers=["CPUExecutionProvider"])
    for batch in (x.shape[0], 1):
        xv = np.random.default_rng(batch).standard_normal((batch, *x.shape[1:])).astype(np.float32)
        ref = sess.run(None, {"x": xv})[0]
        got = Session().compile(rf).run({"x": xv})["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    with torch.no_grad():  # and near the float model: the quantization error, not a lowering error
        fl = net(torch.from_numpy(xv)).numpy()
    assert np.abs(got - fl).max() < 0.1 * np.abs(fl).max()
