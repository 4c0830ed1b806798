"""Every op that exists in ONNX, compared with onnxruntime on the same inputs.

Tolerances: exact (0) for data movement, comparisons and integer ops; rtol/atol 1e-5 (f32) for
transcendental and reduction ops whose summation order or libm can differ.
"""

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import run_op
from onnx import TensorProto, helper, numpy_helper

F32_TOL = dict(rtol=1e-5, atol=1e-5)


def ort_run(op, inputs, attrs=None, opset=18, const_inputs=None, n_out_dtype=None):
    """Run one ONNX node; const_inputs: {position: array} given as initializers."""
    const_inputs = const_inputs or {}
    names, vis, inits = [], [], []
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        n = f"in{i}"
        names.append(n)
        if i in const_inputs:
            inits.append(numpy_helper.from_array(a, n))
        else:
            vis.append(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))
    node = helper.make_node(op, names, ["out"], **(attrs or {}))
    out = onnx.ValueInfoProto(name="out")
    graph = helper.make_graph([node], "g", vis, [out], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {f"in{i}": a for i, a in enumerate(inputs) if a is not None and i not in const_inputs}
    return sess.run(None, feeds)[0]


R = np.random.default_rng(7)
X = R.standard_normal((3, 4, 5)).astype(np.float32)
POS = (np.abs(X) + 0.1).astype(np.float32)
Y = R.standard_normal((4, 5)).astype(np.float32)
I = R.integers(-20, 20, (3, 4)).astype(np.int64)
J = R.integers(1, 7, (3, 4)).astype(np.int64) * np.where(R.random((3, 4)) < 0.5, -1, 1)

UNARY = [("Identity", X), ("Neg", X), ("Abs", X), ("Exp", X), ("Log", POS), ("Sqrt", POS),
         ("Reciprocal", POS), ("Sin", X), ("Cos", X), ("Tan", X), ("Tanh", X), ("Sigmoid", X), ("Relu", X),
         ("Softplus", X), ("Softsign", X), ("Erf", X), ("Floor", X * 3), ("Ceil", X * 3), ("Sign", X),
         ("Round", np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -0.51], np.float32)),
         ("Asin", np.tanh(X)), ("Acos", np.tanh(X)), ("Atan", X), ("Sinh", X), ("Cosh", X), ("Asinh", X),
         ("Acosh", POS + 1), ("Atanh", np.tanh(X) * 0.9)]


@pytest.mark.parametrize("op,x", UNARY, ids=[u[0] for u in UNARY])
def test_unary(op, x):
    np.testing.assert_allclose(run_op(op, [x]), ort_run(op, [x]), **F32_TOL)


@pytest.mark.parametrize("op,attrs", [("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.7}), ("Selu", {}),
                                      ("HardSigmoid", None)][:3])
def test_unary_attrs(op, attrs):
    np.testing.assert_allclose(run_op(op, [X], attrs), ort_run(op, [X], attrs), **F32_TOL)


@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu(approx):
    np.testing.assert_allclose(run_op("Gelu", [X], {"approximate": approx}),
                               ort_run("Gelu", [X], {"approximate": approx}, opset=20), **F32_TOL)


def test_rsqrt_silu_hand():
    np.testing.assert_allclose(run_op("Rsqrt", [POS]), 1 / np.sqrt(POS), rtol=1e-6)
    np.testing.assert_allclose(run_op("Silu", [X]), X / (1 + np.exp(-X)), rtol=1e-6, atol=1e-7)


def test_clip_and_cast_and_not():
    np.testing.assert_allclose(run_op("Clip", [X], {"min": -0.5, "max": 0.25}),
                               ort_run("Clip", [X, np.float32(-0.5), np.float32(0.25)], const_inputs={1: 0, 2: 0}))
    for to, onnx_to in [("i32", TensorProto.INT32), ("f16", TensorProto.FLOAT16), ("bool", TensorProto.BOOL)]:
        np.testing.assert_array_equal(run_op("Cast", [X * 10], {"to": to}), ort_run("Cast", [X * 10], {"to": onnx_to}))
    b = X > 0
    np.testing.assert_array_equal(run_op("Not", [b]), ort_run("Not", [b]))


BIN_F = ["Add", "Sub", "Mul", "Div", "Max", "Min", "Equal", "Less", "Greater"]


def test_less_equal_greater_equal():
    # onnxruntime registers these as functions that fail to load in a one-node model; numpy is the oracle
    xy = np.round(X * 2) / 2, np.round(Y * 2) / 2  # ties
    np.testing.assert_array_equal(run_op("LessEqual", list(xy)), xy[0] <= xy[1])
    np.testing.assert_array_equal(run_op("GreaterEqual", list(xy)), xy[0] >= xy[1])


@pytest.mark.parametrize("op", BIN_F)
def test_binary_broadcast_f32(op):
    np.testing.assert_allclose(run_op(op, [X, Y]), ort_run(op, [X, Y], opset=16), **F32_TOL)


def test_pow_and_mod():
    np.testing.assert_allclose(run_op("Pow", [POS, Y]), ort_run("Pow", [POS, Y]), **F32_TOL)
    np.testing.assert_array_equal(run_op("Mod", [I, J]), ort_run("Mod", [I, J]))
    np.testing.assert_allclose(run_op("Mod", [X, POS[0]], {"fmod": 1}), ort_run("Mod", [X, POS[0]], {"fmod": 1}))


def test_integer_division_truncates():
    np.testing.assert_array_equal(run_op("Div", [I, J]), ort_run("Div", [I, J]))


def test_logic_and_where():
    a, b = X > 0, Y < 0.3
    for op in ("And", "Or", "Xor"):
        np.testing.assert_array_equal(run_op(op, [a, b]), ort_run(op, [a, b]))
    np.testing.assert_array_equal(run_op("Where", [a, X, Y]), ort_run("Where", [a, X, Y]))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("axes,keep", [([1], 1), ([0, 2], 0), (None, 1), ([-1], 0)])
def test_reductions(op, axes, keep):
    ours = run_op(op, [X], {"axes": axes, "keepdims": keep})
    if op == "ReduceSum":  # axes is an input since opset 13
        ref = ort_run(op, [X] + ([np.array(axes, np.int64)] if axes else []), {"keepdims": keep},
                      const_inputs={1: 0} if axes else None)
    else:
        ref = ort_run(op, [X], {"keepdims": keep, **({"axes": axes} if axes else {})}, opset=17)
    np.testing.assert_allclose(ours, ref, **F32_TOL)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keep,last", [(0, 1, 0), (2, 0, 0), (-1, 1, 1)])
def test_arg_reductions(op, axis, keep, last):
    x = np.round(X * 2) / 2  # ties, so select_last_index matters
    attrs = {"axis": axis, "keepdims": keep, "select_last_index": last}
    np.testing.assert_array_equal(run_op(op, [x], attrs), ort_run(op, [x], attrs))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [-1, 1])
def test_softmax(op, axis):
    np.testing.assert_allclose(run_op(op, [X], {"axis": axis}), ort_run(op, [X], {"axis": axis}), **F32_TOL)


@pytest.mark.parametrize("excl,rev", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(excl, rev):
    ours = run_op("CumSum", [X], {"axis": 1, "exclusive": excl, "reverse": rev})
    ref = ort_run("CumSum", [X, np.array(1, np.int64)], {"exclusive": excl, "reverse": rev}, const_inputs={1: 0})
    np.testing.assert_allclose(ours, ref, **F32_TOL)


def test_data_movement():
    np.testing.assert_array_equal(run_op("Reshape", [X], {"shape": [0, -1]}),
                                  ort_run("Reshape", [X, np.array([0, -1], np.int64)], const_inputs={1: 0}))
    np.testing.assert_array_equal(run_op("Transpose", [X], {"perm": [2, 0, 1]}),
                                  ort_run("Transpose", [X], {"perm": [2, 0, 1]}))
    np.testing.assert_array_equal(run_op("Concat", [X, X[:, :2]], {"axis": 1}),
                                  ort_run("Concat", [X, X[:, :2]], {"axis": 1}))
    sl = {"starts": [1, -1], "ends": [3, -6], "axes": [1, 2], "steps": [1, -2]}
    ref = ort_run("Slice", [X] + [np.array(sl[k], np.int64) for k in ("starts", "ends", "axes", "steps")],
                  const_inputs={1: 0, 2: 0, 3: 0, 4: 0})
    np.testing.assert_array_equal(run_op("Slice", [X], sl), ref)
    idx = np.array([[0, -1], [2, 1]], np.int64)
    np.testing.assert_array_equal(run_op("Gather", [X, idx], {"axis": 1}), ort_run("Gather", [X, idx], {"axis": 1}))
    np.testing.assert_array_equal(run_op("Expand", [Y[:1]], {"shape": [2, 3, 1, 5]}),
                                  ort_run("Expand", [Y[:1], np.array([2, 3, 1, 5], np.int64)], const_inputs={1: 0}))
    np.testing.assert_array_equal(run_op("Tile", [Y], {"repeats": [2, 3]}),
                                  ort_run("Tile", [Y, np.array([2, 3], np.int64)], const_inputs={1: 0}))
    x1 = X[:, :1]
    np.testing.assert_array_equal(run_op("Squeeze", [x1], {"axes": [1]}),
                                  ort_run("Squeeze", [x1, np.array([1], np.int64)], const_inputs={1: 0}))
    np.testing.assert_array_equal(run_op("Unsqueeze", [X], {"axes": [0, -1]}),
                                  ort_run("Unsqueeze", [X, np.array([0, -1], np.int64)], const_inputs={1: 0}))
    np.testing.assert_array_equal(run_op("Flatten", [X], {"axis": 2}), ort_run("Flatten", [X], {"axis": 2}))
    np.testing.assert_array_equal(run_op("Shape", [X]), ort_run("Shape", [X]))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(mode):
    pads = [0, 1, 2, 0, 2, 1]
    ours = run_op("Pad", [X], {"pads": pads, "mode": mode, "value": 1.5})
    extra = [np.array(pads, np.int64)] + ([np.float32(1.5)] if mode == "constant" else [])
    ref = ort_run("Pad", [X] + extra, {"mode": mode}, const_inputs={1: 0, 2: 0})
    np.testing.assert_array_equal(ours, ref)


def test_run_time_operand_forms():
    """Slice starts/ends, Pad pads and Resize sizes fed at run time (the forms Shape arithmetic produces)."""
    starts, ends = np.array([1, -1], np.int64), np.array([3, -2**62], np.int64)
    ref = ort_run("Slice", [X, starts, ends, np.array([1, 2], np.int64), np.array([1, -2], np.int64)],
                  const_inputs={3: 0, 4: 0})
    np.testing.assert_array_equal(run_op("Slice", [X, starts, ends], {"axes": [1, 2], "steps": [1, -2]}), ref)
    pads = np.array([0, 1, 2, 0, 2, 1], np.int64)
    for mode in ("constant", "reflect", "edge"):
        ref = ort_run("Pad", [X, pads] + ([np.float32(1.5)] if mode == "constant" else []), {"mode": mode},
                      const_inputs={2: 0})
        np.testing.assert_array_equal(run_op("Pad", [X, pads], {"mode": mode, "value": 1.5}), ref)
    x = R.standard_normal((1, 2, 3, 5)).astype(np.float32)
    sizes = np.array([1, 2, 7, 4], np.int64)
    for mode in ("nearest", "linear"):
        ref = ort_run("Resize", [x, None, None, sizes], {"mode": mode}, opset=13)
        np.testing.assert_allclose(run_op("Resize", [x, sizes], {"mode": mode}), ref, rtol=1e-5, atol=1e-5)


def test_range_constant_of_shape_depth_to_space():
    s, l, d = (np.array(v, np.float32) for v in (1.0, 7.5, 0.5))
    np.testing.assert_allclose(run_op("Range", [s, l, d]), ort_run("Range", [s, l, d]))
    si, li, di = (np.array(v, np.int64) for v in (10, -3, -4))
    np.testing.assert_array_equal(run_op("Range", [si, li, di]), ort_run("Range", [si, li, di]))
    shp = np.array([2, 3], np.int64)
    np.testing.assert_array_equal(
        run_op("ConstantOfShape", [shp], {"value": 2.0}, consts=(0,)),
        ort_run("ConstantOfShape", [shp], {"value": numpy_helper.from_array(np.array([2.0], np.float32))},
                const_inputs={0: 0}))
    x = R.standard_normal((2, 8, 3, 2)).astype(np.float32)
    for mode in ("DCR", "CRD"):
        np.testing.assert_array_equal(run_op("DepthToSpace", [x], {"blocksize": 2, "mode": mode}),
                                      ort_run("DepthToSpace", [x], {"blocksize": 2, "mode": mode}))


@pytest.mark.parametrize("a_shape,b_shape", [((4,), (4, 3)), ((2, 4), (4,)), ((5, 2, 4), (4, 3)),
                                             ((2, 1, 3, 4), (5, 4, 2)), ((7, 4), (4, 6))])
def test_matmul(a_shape, b_shape):
    a = R.standard_normal(a_shape).astype(np.float32)
    b = R.standard_normal(b_shape).astype(np.float32)
    np.testing.assert_allclose(run_op("MatMul", [a, b]), ort_run("MatMul", [a, b]), **F32_TOL)


CONV_CASES = [
    ((1, 2, 9), (4, 2, 3), {}),
    ((2, 4, 7, 8), (6, 2, 3, 3), {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2], "group": 2}),
    ((1, 3, 5, 6, 4), (2, 3, 2, 3, 2), {"strides": [1, 2, 1], "pads": [0, 1, 1, 1, 0, 0]}),
    ((1, 4, 6, 6), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv(xs, ws, attrs, bias):
    x = R.standard_normal(xs).astype(np.float32)
    w = R.standard_normal(ws).astype(np.float32)
    ins = [x, w] + ([R.standard_normal(ws[0]).astype(np.float32)] if bias else [])
    np.testing.assert_allclose(run_op("Conv", ins, attrs), ort_run("Conv", ins, attrs), rtol=1e-4, atol=1e-4)


CONVT_CASES = [
    ((1, 2, 5), (2, 3, 3), {}),
    ((2, 4, 3, 4), (4, 2, 3, 2), {"strides": [2, 3], "pads": [1, 0, 0, 1], "group": 2, "output_padding": [1, 0]}),
    ((1, 2, 3, 3), (2, 2, 2, 2), {"dilations": [2, 1], "strides": [1, 2]}),
    ((1, 2, 2, 3, 2), (2, 1, 2, 2, 2), {"strides": [2, 1, 2]}),
]


@pytest.mark.parametrize("xs,ws,attrs", CONVT_CASES)
def test_conv_transpose(xs, ws, attrs):
    x = R.standard_normal(xs).astype(np.float32)
    w = R.standard_normal(ws).astype(np.float32)
    b = R.standard_normal(ws[1] * attrs.get("group", 1)).astype(np.float32)
    np.testing.assert_allclose(run_op("ConvTranspose", [x, w, b], attrs), ort_run("ConvTranspose", [x, w, b], attrs),
                               rtol=1e-4, atol=1e-4)


POOL_CASES = [
    ((1, 2, 7, 8), {"kernel_shape": [3, 3]}),
    ((2, 3, 7, 8), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]}),
    ((1, 2, 7, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    ((1, 2, 9), {"kernel_shape": [4], "strides": [3], "pads": [1, 2], "ceil_mode": 1}),
    ((1, 1, 5, 4, 6), {"kernel_shape": [2, 2, 3], "strides": [1, 2, 2]}),
]


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
def test_maxpool(xs, attrs):
    x = R.standard_normal(xs).astype(np.float32)
    np.testing.assert_array_equal(run_op("MaxPool", [x], attrs), ort_run("MaxPool", [x], attrs))


def test_maxpool_dilation():
    x = R.standard_normal((1, 2, 9, 9)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "dilations": [2, 2], "strides": [1, 2]}
    np.testing.assert_array_equal(run_op("MaxPool", [x], attrs), ort_run("MaxPool", [x], attrs))


@pytest.mark.parametrize("xs,attrs", POOL_CASES)
@pytest.mark.parametrize("cip", [0, 1])
def test_avgpool(xs, attrs, cip):
    x = R.standard_normal(xs).astype(np.float32)
    a = {**attrs, "count_include_pad": cip}
    np.testing.assert_allclose(run_op("AveragePool", [x], a), ort_run("AveragePool", [x], a), **F32_TOL)


def test_norms():
    x = R.standard_normal((2, 6, 4, 3)).astype(np.float32)
    c = [R.standard_normal(6).astype(np.float32) for _ in range(3)] + [np.abs(R.standard_normal(6)).astype(np.float32)]
    np.testing.assert_allclose(run_op("GlobalAveragePool", [x]), ort_run("GlobalAveragePool", [x]), **F32_TOL)
    np.testing.assert_allclose(run_op("BatchNormalization", [x, *c], {"epsilon": 1e-3}),
                               ort_run("BatchNormalization", [x, *c], {"epsilon": 1e-3}), **F32_TOL)
    s, b = R.standard_normal((4, 3)).astype(np.float32), R.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(run_op("LayerNorm", [x, s, b], {"axis": 2}),
                               ort_run("LayerNormalization", [x, s, b], {"axis": 2, "epsilon": 1e-5}, opset=17),
                               **F32_TOL)
    np.testing.assert_allclose(run_op("RMSNorm", [x, s], {"axis": 2}),
                               ort_run("RMSNormalization", [x, s], {"axis": 2, "epsilon": 1e-6}, opset=23),
                               **F32_TOL)
    gs, gb = c[0], c[1]
    ours = run_op("GroupNorm", [x, gs, gb], {"num_groups": 3})
    ref = ort_run("GroupNormalization", [x, gs, gb], {"num_groups": 3, "epsilon": 1e-5}, opset=21)
    np.testing.assert_allclose(ours, ref, **F32_TOL)


def _sdpa_ref(q, k, v, mask=None, causal=False):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def test_sdpa():
    q = R.standard_normal((2, 3, 5, 8)).astype(np.float32)
    k = R.standard_normal((2, 3, 6, 8)).astype(np.float32)
    v = R.standard_normal((2, 3, 6, 4)).astype(np.float32)
    np.testing.assert_allclose(run_op("ScaledDotProductAttention", [q, k, v]), _sdpa_ref(q, k, v), **F32_TOL)
    np.testing.assert_allclose(run_op("ScaledDotProductAttention", [q, k, v], {"causal": 1}),
                               _sdpa_ref(q, k, v, causal=True), **F32_TOL)
    mask = R.random((2, 1, 1, 6)) < 0.7
    mask[..., 0] = True
    np.testing.assert_allclose(run_op("ScaledDotProductAttention", [q, k, v, mask]), _sdpa_ref(q, k, v, mask),
                               **F32_TOL)
    ref = ort_run("Attention", [q, k, v], {"is_causal": 1}, opset=23)
    np.testing.assert_allclose(run_op("ScaledDotProductAttention", [q, k, v], {"causal": 1}), ref, **F32_TOL)


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31))
def test_random_conv_and_pool_configs_match_onnxruntime(seed):
    """Random rank, groups, kernel, stride, dilation, pads and ceil_mode (kernels that fit the input)."""
    rng = np.random.default_rng(seed)
    nsp = int(rng.integers(1, 4))
    g = int(rng.choice([1, 2]))
    cin, cout = g * int(rng.integers(1, 3)), g * int(rng.integers(1, 3))
    k = [int(rng.integers(1, 4)) for _ in range(nsp)]
    s = [int(rng.integers(1, 3)) for _ in range(nsp)]
    dil = [int(rng.integers(1, 3)) for _ in range(nsp)]
    sp = [int(rng.integers(k[i] * dil[i], 8)) for i in range(nsp)]
    pads = [int(rng.integers(0, k[i % nsp])) for i in range(2 * nsp)]
    x = rng.standard_normal([2, cin] + sp).astype(np.float32)
    w = rng.standard_normal([cout, cin // g] + k).astype(np.float32)
    conv = {"strides": s, "dilations": dil, "pads": pads, "group": g}
    np.testing.assert_allclose(run_op("Conv", [x, w], conv), ort_run("Conv", [x, w], conv), rtol=1e-4, atol=1e-4)
    wt = rng.standard_normal([cin, cout // g] + k).astype(np.float32)
    np.testing.assert_allclose(run_op("ConvTranspose", [x, wt], conv), ort_run("ConvTranspose", [x, wt], conv),
                               rtol=1e-4, atol=1e-4)
    pool = {"kernel_shape": k, "strides": s, "pads": pads, "ceil_mode": int(rng.integers(0, 2))}
    np.testing.assert_array_equal(run_op("MaxPool", [x], {**pool, "dilations": dil}),
                                  ort_run("MaxPool", [x], {**pool, "dilations": dil}))
    avg = {**pool, "count_include_pad": int(rng.integers(0, 2))}
    np.testing.assert_allclose(run_op("AveragePool", [x], avg), ort_run("AveragePool", [x], avg), rtol=1e-5,
                               atol=1e-6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31))
def test_random_slices_match_onnxruntime(seed):
    """Random starts/ends/steps, negative steps and INT64-style sentinels: values and inferred shape."""
    from rlx_format import GraphBuilder
    rng = np.random.default_rng(seed)
    shape = [int(rng.integers(1, 6)) for _ in range(int(rng.integers(1, 4)))]
    x = rng.standard_normal(shape).astype(np.float32)
    n = int(rng.integers(1, len(shape) + 1))
    attrs = {"starts": [int(rng.integers(-8, 8)) for _ in range(n)],
             "ends": [int(rng.choice([rng.integers(-8, 8), 2**62, -(2**62)])) for _ in range(n)],
             "axes": [int(a) for a in rng.permutation(len(shape))[:n]],
             "steps": [int(rng.choice([1, 2, 3, -1, -2])) for _ in range(n)]}
    ref = ort_run("Slice", [x] + [np.array(attrs[k], np.int64) for k in ("starts", "ends", "axes", "steps")],
                  const_inputs={1: 0, 2: 0, 3: 0, 4: 0})
    np.testing.assert_array_equal(run_op("Slice", [x], attrs), ref)
    g = GraphBuilder()
    g.output(g.slice(g.input("x", "f32", shape), name="o", **attrs))
    assert g.build().types["o"].shape == ref.shape


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31))
def test_random_resize_matches_onnxruntime(seed):
    rng = np.random.default_rng(seed)
    shape = [1, int(rng.integers(1, 3))] + [int(rng.integers(1, 7)) for _ in range(int(rng.integers(1, 3)))]
    x = rng.standard_normal(shape).astype(np.float32)
    a = {"mode": str(rng.choice(["nearest", "linear"])),
         "coordinate_transformation_mode": str(rng.choice(["half_pixel", "pytorch_half_pixel", "align_corners",
                                                           "asymmetric"])),
         "nearest_mode": str(rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))}
    if rng.random() < 0.5:
        sizes = shape[:2] + [int(rng.integers(1, 13)) for _ in shape[2:]]
        ours = run_op("Resize", [x], {"sizes": sizes, **a})
        ref = ort_run("Resize", [x, None, None, np.array(sizes, np.int64)], a, opset=13, const_inputs={3: 0})
    else:
        scales = np.array([1.0, 1.0] + [rng.choice([0.5, 0.75, 1.5, 2.0, 3.0, 1.3]) for _ in shape[2:]], np.float32)
        ours = run_op("Resize", [x], {"scales": [float(v) for v in scales], **a})
        ref = ort_run("Resize", [x, None, scales], a, opset=13, const_inputs={2: 0})
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eq,shapes", [
    ("ij,jk->ik", [(3, 4), (4, 5)]), ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]), ("i,i", [(5,), (5,)]), ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)]), ("ijk", [(2, 3, 4)]), ("ij->", [(3, 4)]),
])
def test_einsum(eq, shapes):
    ins = [R.standard_normal(s).astype(np.float32) for s in shapes]
    ours = run_op("Einsum", ins, {"equation": eq})
    np.testing.assert_allclose(ours, ort_run("Einsum", ins, {"equation": eq}, opset=12), rtol=1e-5, atol=1e-5)
    from rlx_format import GraphBuilder
    g = GraphBuilder()
    g.output(g.einsum(*[g.input(f"i{k}", "f32", list(s)) for k, s in enumerate(shapes)], equation=eq, name="o"))
    assert g.build().types["o"].shape == ours.shape


def test_einsum_broadcast_ellipsis_against_numpy():
    # onnxruntime refuses ellipses of different lengths; numpy is the oracle here
    a, b = R.standard_normal((2, 3, 4)).astype(np.float32), R.standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(run_op("Einsum", [a, b], {"equation": "...ij,...jk"}), np.einsum("...ij,...jk", a, b),
                               rtol=1e-5, atol=1e-6)  # BLAS-backed einsum sums in another order


@pytest.mark.parametrize("upper,k", [(1, 0), (0, 0), (1, 2), (0, -1)])
def test_trilu(upper, k):
    x = R.standard_normal((2, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(run_op("Trilu", [x], {"upper": upper, "k": k}),
                                  ort_run("Trilu", [x, np.array(k, np.int64)], {"upper": upper}, opset=14,
                                          const_inputs={1: 0}))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    x = R.standard_normal((3, 4)).astype(np.float32)
    idx = R.integers(-3, 3, (3, 4)).astype(np.int64)
    np.testing.assert_array_equal(run_op("GatherElements", [x, idx], {"axis": axis}),
                                  ort_run("GatherElements", [x, idx], {"axis": axis}))


@pytest.mark.parametrize("axis,idx_shape", [(0, (4, 1)), (1, (2, 6)), (0, (2, 3))])
def test_gather_elements_with_indices_shorter_than_the_data_off_the_axis(axis, idx_shape):
    x = R.standard_normal((4, 4)).astype(np.float32)
    idx = R.integers(-4, 4, idx_shape).astype(np.int64)
    out = run_op("GatherElements", [x, idx], {"axis": axis})
    assert out.shape == idx_shape
    np.testing.assert_array_equal(out, ort_run("GatherElements", [x, idx], {"axis": axis}))


@pytest.mark.parametrize("data_shape,idx_shape,batch_dims", [
    ((4, 5), (3, 2), 0), ((4, 5, 6), (2, 3, 1), 0), ((4, 5, 6), (2, 2), 0), ((3, 4, 5), (3, 2, 1), 1),
    ((2, 3, 4, 5), (2, 3, 2), 2), ((2, 3, 4), (2, 1), 1)])
def test_gather_nd(data_shape, idx_shape, batch_dims):
    x = R.standard_normal(data_shape).astype(np.float32)
    k = idx_shape[-1]
    hi = np.array(data_shape[batch_dims:batch_dims + k])
    idx = (R.integers(0, 1 << 20, idx_shape) % hi - R.integers(0, 2, idx_shape) * hi).astype(np.int64)  # negatives too
    np.testing.assert_array_equal(run_op("GatherND", [x, idx], {"batch_dims": batch_dims}),
                                  ort_run("GatherND", [x, idx], {"batch_dims": batch_dims}))


def test_reshape_allowzero():
    x = R.standard_normal((0, 3)).astype(np.float32)
    shape = np.array([3, 0], np.int64)
    np.testing.assert_array_equal(run_op("Reshape", [x], {"shape": [3, 0], "allowzero": 1}),
                                  ort_run("Reshape", [x, shape], {"allowzero": 1}, opset=14, const_inputs={1: 0}))
    y = R.standard_normal((2, 3)).astype(np.float32)  # without a 0 in the shape, allowzero changes nothing
    np.testing.assert_array_equal(run_op("Reshape", [y], {"shape": [3, -1], "allowzero": 1}), y.reshape(3, 2))
    assert run_op("Reshape", [y], {"shape": [0, 3]}).shape == (2, 3)  # the default: 0 copies the dim


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    x = R.standard_normal((4, 5, 3)).astype(np.float32)
    idx = np.array([[0, 1], [3, -1], [2, 2]], np.int64) if reduction == "none" else np.array([[0, 1], [0, 1], [2, 2]],
                                                                                             np.int64)
    upd = R.standard_normal((3, 3)).astype(np.float32)
    a = {"reduction": reduction}
    np.testing.assert_allclose(run_op("ScatterND", [x, idx, upd], a), ort_run("ScatterND", [x, idx, upd], a),
                               rtol=1e-6)


@pytest.mark.parametrize("axis,reduction", [(0, "none"), (1, "none"), (-1, "add"), (0, "max")])
def test_scatter_elements(axis, reduction):
    x = R.standard_normal((3, 4)).astype(np.float32)
    idx = np.array([[1, 0, 2, -1], [0, 2, 1, 0]], np.int64) if axis != 1 and axis != -1 else \
        np.array([[1, 3], [0, -2], [2, 1]], np.int64)
    upd = R.standard_normal(idx.shape).astype(np.float32)
    a = {"axis": axis, "reduction": reduction}
    np.testing.assert_allclose(run_op("ScatterElements", [x, idx, upd], a),
                               ort_run("ScatterElements", [x, idx, upd], a), rtol=1e-6)


@pytest.mark.parametrize("attrs", [{"kernel_shape": [7, 7]}, {"kernel_shape": [7, 7], "strides": [2, 2]},
                                   {"kernel_shape": [7, 7], "ceil_mode": 1, "strides": [3, 3]},
                                   {"kernel_shape": [5, 7], "pads": [1, 0, 1, 0], "count_include_pad": 1}])
def test_avgpool_whose_window_is_the_whole_input(attrs, monkeypatch):
    """A window as large as the input is GlobalAveragePool on the CPU (unpadded; a padded one keeps the pooling
    path): onnxruntime's values, and the taken path checked."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the GAP's vector sums
    from rlx_runtime.kernels import nn
    calls = []
    real = nn._gap_cpu
    monkeypatch.setattr(nn, "_gap_cpu", lambda *a: calls.append(1) or real(*a))
    x = R.standard_normal((2, 64, 7, 7)).astype(np.float32)
    np.testing.assert_allclose(run_op("AveragePool", [x], attrs), ort_run("AveragePool", [x], attrs), **F32_TOL)
    assert bool(calls) == ("pads" not in attrs)
