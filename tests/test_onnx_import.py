"""ONNX import: the backend test data the onnx package ships, lowering forms vs onnxruntime, errors, CLI."""

import glob
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail as OrtFail
from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as OrtNotImplemented

from rlx_bake import BakeOptions, bake
from rlx_bake.cli import main
from rlx_bake.onnx import import_onnx
from rlx_format import RlxError, read_rlx
from rlx_runtime import Session

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
CASES = sorted(glob.glob(str(DATA / "pytorch-converted" / "*")) + glob.glob(str(DATA / "pytorch-operator" / "*")))


def _load_pb(pattern):
    return [numpy_helper.to_array(onnx.load_tensor(f)) for f in sorted(glob.glob(pattern))]


def test_case_count():
    assert len(CASES) == 117


# opset-6 PRelu with a per-channel slope of shape [C]: the version converter keeps that shape, which opset 7+
# broadcasting aligns with the last axis, so onnxruntime refuses the upgraded model (rlx still matches the
# case's own test data)
ORT_CANNOT_RUN = {"test_PReLU_1d_multiparam", "test_PReLU_2d_multiparam", "test_PReLU_3d_multiparam"}


def _ort_session(path: str):
    try:
        return ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except OrtNotImplemented:  # onnxruntime dropped kernels for opsets < 7: upgrade the model for it
        from onnx import version_converter
        model = onnx.load(path)
        assert min(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) < 7
        upgraded = version_converter.convert_version(model, 13)
        return ort.InferenceSession(upgraded.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("case", CASES, ids=[os.path.basename(c) for c in CASES])
def test_backend_case(case):
    graph, weights = import_onnx(os.path.join(case, "model.onnx"))
    rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
    compiled = Session().compile(rf)
    # tolerances: the largest differences over all 117 cases are 4.8e-7 against the test data and 1.4e-6
    # against onnxruntime (Conv, LogSoftmax)
    for ds in sorted(glob.glob(os.path.join(case, "test_data_set_*"))):
        feeds = dict(zip(graph.input_names, _load_pb(os.path.join(ds, "input_*.pb")), strict=True))
        out = compiled.run(feeds)
        for name, ref in zip(graph.outputs, _load_pb(os.path.join(ds, "output_*.pb")), strict=True):
            np.testing.assert_allclose(out[name], ref, rtol=1e-6, atol=1e-6)
    # parity with onnxruntime on seeded random inputs of the same shapes
    sess = _ort_session(os.path.join(case, "model.onnx"))
    r = np.random.default_rng(0)
    feeds = {}
    for name, ref in zip(graph.input_names, _load_pb(os.path.join(case, "test_data_set_0", "input_*.pb"))):
        feeds[name] = (r.standard_normal(ref.shape).astype(ref.dtype) if ref.dtype.kind == "f"
                       else r.integers(0, max(int(ref.max()), 1), ref.shape).astype(ref.dtype))
    ours = compiled.run(feeds)
    if os.path.basename(case) in ORT_CANNOT_RUN:
        with pytest.raises(OrtFail, match="PRelu"):  # still true? else drop the case from ORT_CANNOT_RUN
            sess.run(None, feeds)
        return
    for name, ref in zip(graph.outputs, sess.run(None, feeds), strict=True):
        np.testing.assert_allclose(ours[name], ref, rtol=1e-6, atol=3e-6)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _compare(tmp_path, model, feeds, profile="exact", rtol=1e-6, atol=2e-6):  # measured max: 9.5e-7
    p = tmp_path / "m.onnx"
    onnx.save(model, p)
    graph, weights = import_onnx(p)
    rf, _ = bake(graph, weights, BakeOptions.from_profile(profile))
    ours = Session().compile(rf).run(feeds)
    ref = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, r in zip(graph.outputs, ref, strict=True):
        np.testing.assert_allclose(ours[name], r, rtol=rtol, atol=atol)
    return graph


R = np.random.default_rng(1)
X = R.standard_normal((2, 6, 5, 4)).astype(np.float32)


@pytest.mark.parametrize("ta,tb,alpha,beta,bias", [(0, 0, 1.0, 1.0, True), (1, 0, 0.5, 2.0, True),
                                                   (0, 1, 1.0, 1.0, False), (1, 1, 2.0, 0.25, True)])
def test_gemm(tmp_path, ta, tb, alpha, beta, bias):
    a = R.standard_normal((3, 4) if not ta else (4, 3)).astype(np.float32)
    w = R.standard_normal((4, 5) if not tb else (5, 4)).astype(np.float32)
    c = R.standard_normal((5,)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(c, "c")] if bias else [])
    node = helper.make_node("Gemm", ["a", "w"] + (["c"] if bias else []), ["y"], transA=ta, transB=tb, alpha=alpha,
                            beta=beta)
    _compare(tmp_path, _model([node], [_vi("a", list(a.shape))], [_vi("y", None)], inits), {"a": a})


@pytest.mark.parametrize("opset,form", [(11, "attr"), (13, "input"), (18, "equal")])
def test_split(tmp_path, opset, form):
    x = X.reshape(2, 6, 20)
    if form == "attr":
        node, inits = helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[2, 4]), []
    elif form == "input":
        node = helper.make_node("Split", ["x", "s"], ["a", "b"], axis=1)
        inits = [numpy_helper.from_array(np.array([2, 4], np.int64), "s")]
    else:
        node, inits = helper.make_node("Split", ["x"], ["a", "b"], axis=2, num_outputs=2), []
    _compare(tmp_path, _model([node], [_vi("x", [2, 6, 20])], [_vi("a", None), _vi("b", None)], inits, opset),
             {"x": x})


def test_composites(tmp_path):
    slope = np.abs(R.standard_normal((6, 1, 1))).astype(np.float32)
    nodes = [
        helper.make_node("PRelu", ["x", "slope"], ["p"]),
        helper.make_node("LRN", ["x"], ["l"], size=3, alpha=1e-3, beta=0.75, bias=2.0),
        helper.make_node("Sum", ["x", "p", "l"], ["s"]),
        helper.make_node("Mean", ["x", "p"], ["m"]),
        helper.make_node("Dropout", ["m"], ["d"]),
        helper.make_node("HardSigmoid", ["d"], ["h"], alpha=0.3, beta=0.4),
        helper.make_node("Softmax", ["h"], ["sm"], axis=1),
        helper.make_node("LpNormalization", ["s"], ["lp"], axis=1, p=2),
        helper.make_node("LpNormalization", ["s"], ["lp1"], axis=-1, p=1),
    ]
    outs = [_vi(n, None) for n in ("sm", "lp", "lp1")]
    _compare(tmp_path, _model(nodes, [_vi("x", list(X.shape))], outs, [numpy_helper.from_array(slope, "slope")], 13),
             {"x": X})


@pytest.mark.parametrize("opset", [10, 13, 18])
def test_opset_forms(tmp_path, opset):
    """Reshape/Slice/Pad/Squeeze/Unsqueeze/ReduceSum/ReduceMean/Clip in their per-opset attr or input forms."""
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [ints("shape", [0, -1]), ints("st", [1]), ints("en", [100]), ints("ax", [1]), ints("pads", [0, 1, 0, 2]),
             ints("sq", [0]), ints("rax", [1]), numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
             numpy_helper.from_array(np.array(0.5, np.float32), "hi")]
    new = opset >= 13
    red18 = opset >= 18
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Slice", ["r", "st", "en", "ax"], ["s"]) if opset >= 10 else None,
        helper.make_node("Pad", ["s", "pads"], ["p"], mode="reflect") if opset >= 11 else
        helper.make_node("Pad", ["s"], ["p"], mode="reflect", pads=[0, 1, 0, 2]),
        helper.make_node("Unsqueeze", ["p", "sq"], ["u"]) if new else helper.make_node("Unsqueeze", ["p"], ["u"],
                                                                                       axes=[0]),
        helper.make_node("Squeeze", ["u", "sq"], ["q"]) if new else helper.make_node("Squeeze", ["u"], ["q"], axes=[0]),
        helper.make_node("ReduceSum", ["q", "rax"], ["rs"], keepdims=1) if new else
        helper.make_node("ReduceSum", ["q"], ["rs"], axes=[1], keepdims=1),
        helper.make_node("ReduceMean", ["q", "rax"], ["rm"], keepdims=0) if red18 else
        helper.make_node("ReduceMean", ["q"], ["rm"], axes=[1], keepdims=0),
        helper.make_node("Clip", ["rs", "lo", "hi"], ["c"]) if opset >= 11 else
        helper.make_node("Clip", ["rs"], ["c"], min=-0.5, max=0.5),
    ]
    nodes = [n for n in nodes if n is not None]
    _compare(tmp_path, _model(nodes, [_vi("x", [2, 6, 5, 4])], [_vi("c", None), _vi("rm", None)], inits, opset),
             {"x": X})


def test_softmin_lowering(tmp_path):
    # Softmin is PyTorch's name (exported as Neg + Softmax); rlx also accepts it as a node
    m = _model([helper.make_node("Softmin", ["x"], ["y"], axis=1)], [_vi("x", list(X.shape))], [_vi("y", None)])
    p = tmp_path / "sm.onnx"
    onnx.save(m, p)
    graph, ws = import_onnx(p)
    out = Session().compile(graph).run({"x": X})["y"]
    e = np.exp(-X - (-X).max(1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(1, keepdims=True), rtol=1e-6)


def test_dim_param_and_constant_nodes(tmp_path):
    w = R.standard_normal((4, 3)).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
             helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Mul", ["m", "k"], ["y"])]
    m = _model(nodes, [_vi("x", ["batch", 4])], [_vi("y", ["batch", 3])], [numpy_helper.from_array(w, "w")])
    g = _compare(tmp_path, m, {"x": R.standard_normal((5, 4)).astype(np.float32)})
    assert g.inputs[0].shape == ("batch", 4) and g.param_names == ["w"] and len(g.constants) == 1


def test_unsupported_ops_listed_together(tmp_path):
    nodes = [helper.make_node("Det", ["x"], ["a"]), helper.make_node("Det", ["x"], ["b"]),
             helper.make_node("Hardmax", ["x"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    m = _model(nodes, [_vi("x", [2, 2])], [_vi("y", None)], [numpy_helper.from_array(np.ones(2, np.float32), "sc")])
    p = tmp_path / "u.onnx"
    onnx.save(m, p)
    with pytest.raises(RlxError) as e:
        import_onnx(p)
    msg = str(e.value)
    assert "3 node(s) use ops rlx does not support" in msg
    assert "Det: 2 node(s), e.g. a, b" in msg and "Hardmax: 1 node(s), e.g. c" in msg


def test_external_data_is_memory_mapped(tmp_path):
    w = R.standard_normal((64, 32)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [1, 64])], [_vi("y", None)],
               [numpy_helper.from_array(w, "w")])
    p = tmp_path / "ext.onnx"
    onnx.save(m, p, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.data",
              size_threshold=0)
    graph, ws = import_onnx(p)
    assert not ws["w"].flags.owndata and not ws["w"].flags.writeable  # a view of the mapped file
    np.testing.assert_array_equal(ws["w"], w)
    x = R.standard_normal((1, 64)).astype(np.float32)
    rf, _ = bake(graph, ws)
    np.testing.assert_allclose(Session().compile(rf).run({"x": x})["y"], x @ w, rtol=1e-6, atol=1e-6)


def test_bad_onnx_files(tmp_path):
    with pytest.raises(RlxError, match="no such ONNX file"):
        import_onnx(tmp_path / "none.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x99garbage")
    with pytest.raises(RlxError, match="not a valid ONNX model"):
        import_onnx(tmp_path / "bad.onnx")


def test_cli_bakes_onnx_directly_and_imports_to_bundle(tmp_path):
    model = os.path.join(DATA, "pytorch-converted", "test_Conv2d", "model.onnx")
    runner = CliRunner()
    for flags in ([], ["--opt", "size"], ["--password-env", "PW", "--kdf", "fast"]):
        out = tmp_path / f"m{len(flags)}.rlx"
        r = runner.invoke(main, [model, "-o", str(out), *flags], env={"PW": "pw"})
        assert r.exit_code == 0, r.output
        assert read_rlx(out, password="pw" if flags and flags[0] == "--password-env" else None).graph.nodes
    bundle = tmp_path / "bundle"
    r = runner.invoke(main, ["import-onnx", model, "-o", str(bundle)])
    assert r.exit_code == 0, r.output
    assert (bundle / "graph.json").is_file() and (bundle / "weights.safetensors").is_file()
    r = runner.invoke(main, [str(bundle), "-o", str(tmp_path / "b.rlx")])
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["import-onnx", str(tmp_path / "none.onnx"), "-o", str(bundle)])
    assert r.exit_code == 1 and "no such ONNX file" in r.output


@pytest.mark.parametrize("opset,node_kw", [
    (13, {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}),
    (13, {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    (18, {"mode": "linear", "coordinate_transformation_mode": "align_corners", "axes": [2, 3]}),
    (10, {"mode": "nearest"}),
])
def test_resize_import(tmp_path, opset, node_kw):
    x = R.standard_normal((1, 2, 5, 4)).astype(np.float32)
    if opset == 10:
        inits = [numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "sc")]
        node = helper.make_node("Resize", ["x", "sc"], ["y"], **node_kw)
    elif "axes" in node_kw:
        inits = [numpy_helper.from_array(np.array([2, 1.5], np.float32), "sc")]
        node = helper.make_node("Resize", ["x", "", "sc"], ["y"], **node_kw)
    else:
        inits = [numpy_helper.from_array(np.array([1, 2, 9, 6], np.int64), "sz")]
        node = helper.make_node("Resize", ["x", "", "", "sz"], ["y"], **node_kw)
    _compare(tmp_path, _model([node], [_vi("x", list(x.shape))], [_vi("y", None)], inits, opset), {"x": x})


def test_upsample_import(tmp_path):
    x = R.standard_normal((1, 2, 3, 4)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array([1, 1, 2, 3], np.float32), "sc")]
    node = helper.make_node("Upsample", ["x", "sc"], ["y"], mode="nearest")
    m = _model([node], [_vi("x", list(x.shape))], [_vi("y", None)], inits, 9)
    p = tmp_path / "u.onnx"
    onnx.save(m, p)
    graph, ws = import_onnx(p)
    out = Session().compile(bake(graph, ws)[0]).run({"x": x})["y"]
    np.testing.assert_array_equal(out, x.repeat(2, axis=2).repeat(3, axis=3))


def test_einsum_import(tmp_path):
    a = R.standard_normal((2, 3, 4)).astype(np.float32)
    w = R.standard_normal((4, 5)).astype(np.float32)
    node = helper.make_node("Einsum", ["a", "w"], ["y"], equation="bij,jk->bik")
    _compare(tmp_path, _model([node], [_vi("a", [2, 3, 4])], [_vi("y", None)], [numpy_helper.from_array(w, "w")], 12),
             {"a": a})


def test_more_lowerings(tmp_path):
    x = R.standard_normal((2, 3, 4)).astype(np.float32)
    x[0, 0, 0], x[1, 1, 1] = np.nan, -np.inf
    ints = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("IsNaN", ["x"], ["nan"]), helper.make_node("IsInf", ["x"], ["inf"]),
             helper.make_node("IsInf", ["x"], ["ninf"], detect_positive=0),
             helper.make_node("Size", ["x"], ["size"]),
             helper.make_node("Where", ["nan", "zero", "x"], ["x0"]),
             helper.make_node("Where", ["inf", "zero", "x0"], ["xc"]),
             helper.make_node("ReduceL1", ["xc"], ["l1"], keepdims=1, axes=[1]),
             helper.make_node("ReduceL2", ["xc"], ["l2"], keepdims=0, axes=[2]),
             helper.make_node("ReduceLogSumExp", ["xc"], ["lse"], keepdims=0, axes=[1]),
             helper.make_node("Trilu", ["xc", "k"], ["tri"], upper=0)]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero"), ints("k", 1)]
    outs = [onnx.ValueInfoProto(name=n) for n in ("nan", "inf", "ninf", "size", "l1", "l2", "lse", "tri")]
    _compare(tmp_path, _model(nodes, [_vi("x", [2, 3, 4])], outs, inits, 14), {"x": x})


@pytest.mark.parametrize("opset", [13, 19])
def test_qdq_model_imports_and_weight_dequantization_folds(tmp_path, opset):
    """A QDQ model: the input goes through Quantize/DequantizeLinear, the int8 per-channel weight through
    DequantizeLinear. After `exact`, the weight's dequantization is a folded constant."""
    w = R.integers(-127, 127, (8, 6)).astype(np.int8)
    w_scale = (np.abs(R.standard_normal(6)) * 0.02 + 0.01).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(w_scale, "w_s"),
             numpy_helper.from_array(np.array(0.05, np.float32), "x_s"),
             numpy_helper.from_array(np.array(128, np.uint8), "x_zp")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_s", "x_zp"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s"], ["wd"], axis=1),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    x = R.standard_normal((3, 8)).astype(np.float32)
    graph = _compare(tmp_path, _model(nodes, [_vi("x", [3, 8])], [_vi("y", None)], inits, opset), {"x": x})
    rf, _ = bake(graph, import_onnx(tmp_path / "m.onnx")[1], BakeOptions.from_profile("exact"))
    ops = [n.op for n in rf.graph.nodes]
    assert ops.count("MatMul") == 1 and "Reshape" not in ops  # the per-channel weight path folded away


@pytest.mark.parametrize("largest,axis", [(1, -1), (0, 0), (1, 1)])
def test_topk_import(tmp_path, largest, axis):
    x = np.round(R.standard_normal((4, 6)) * 2).astype(np.float32)  # ties
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    m = _model([node], [_vi("x", [4, 6])], [_vi("v", None), onnx.ValueInfoProto(name="i")],
               [numpy_helper.from_array(np.array([3], np.int64), "k")], 11)
    _compare(tmp_path, m, {"x": x}, rtol=0, atol=0)


def test_activation_lowerings(tmp_path):
    x = (R.standard_normal((3, 5)) * 3).astype(np.float32)
    nodes = [helper.make_node("HardSwish", ["x"], ["a"]), helper.make_node("Mish", ["x"], ["b"]),
             helper.make_node("Celu", ["x"], ["c"], alpha=0.7),
             helper.make_node("ThresholdedRelu", ["x"], ["d"], alpha=0.4),
             helper.make_node("Shrink", ["x"], ["e"], lambd=0.8, bias=0.3)]
    outs = [_vi(n, None) for n in "abcde"]
    _compare(tmp_path, _model(nodes, [_vi("x", [3, 5])], outs, [], 18), {"x": x})


@pytest.mark.parametrize("causal,mask", [(0, None), (1, None), (0, "bool"), (0, "float")])
def test_attention_import(tmp_path, causal, mask):
    q = R.standard_normal((2, 3, 5, 8)).astype(np.float32)
    k = R.standard_normal((2, 3, 6, 8)).astype(np.float32)
    v = R.standard_normal((2, 3, 6, 4)).astype(np.float32)
    inputs = [_vi("q", list(q.shape)), _vi("k", list(k.shape)), _vi("v", list(v.shape))]
    feeds = {"q": q, "k": k, "v": v}
    names = ["q", "k", "v"]
    if mask == "bool":
        m = R.random((2, 1, 5, 6)) < 0.7
        m[..., 0] = True
        inputs.append(_vi("m", list(m.shape), TensorProto.BOOL))
        feeds["m"], names = m, names + ["m"]
    elif mask == "float":
        m = (R.standard_normal((1, 1, 5, 6)) * 0.5).astype(np.float32)
        inputs.append(_vi("m", list(m.shape)))
        feeds["m"], names = m, names + ["m"]
    node = helper.make_node("Attention", names, ["y"], is_causal=causal)
    _compare(tmp_path, _model([node], inputs, [_vi("y", None)], [], 23), feeds)
