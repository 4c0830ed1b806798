"""LSTM / GRU / RNN against onnxruntime: directions, layouts, every optional input and output,
sequence lengths, activations with alpha/beta, clip, input_forget, linear_before_reset; and models
exported by torch.onnx from nn.LSTM / nn.GRU / nn.RNN."""

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_bake import BakeOptions, bake
from rlx_bake.onnx import import_onnx
from rlx_runtime import Session

R = np.random.default_rng(11)
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
SEQ, BATCH, INP, HID = 5, 3, 4, 6


def _model(op, direction="forward", layout=0, optional=(), outputs=("Y", "Y_h", "Y_c"), opset=14, **attrs):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    inits = [numpy_helper.from_array(R.standard_normal((dirs, g * HID, INP)).astype(np.float32) * 0.5, "W"),
             numpy_helper.from_array(R.standard_normal((dirs, g * HID, HID)).astype(np.float32) * 0.5, "R")]
    x_shape = [BATCH, SEQ, INP] if layout else [SEQ, BATCH, INP]
    state_shape = [BATCH, dirs, HID] if layout else [dirs, BATCH, HID]
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    names = ["X", "W", "R", "", "", "", "", ""]
    feeds = {"X": R.standard_normal(x_shape).astype(np.float32)}
    if "B" in optional:
        inits.append(numpy_helper.from_array(R.standard_normal((dirs, 2 * g * HID)).astype(np.float32) * 0.3, "B"))
        names[3] = "B"
    if "sequence_lens" in optional:
        graph_inputs.append(helper.make_tensor_value_info("L", TensorProto.INT32, [BATCH]))
        feeds["L"] = np.array([SEQ, 2, 4][:BATCH], np.int32)
        names[4] = "L"
    for pos, name in ((5, "initial_h"), (6, "initial_c")):
        if name in optional:
            graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state_shape))
            feeds[name] = R.standard_normal(state_shape).astype(np.float32)
            names[pos] = name
    if "P" in optional:
        inits.append(numpy_helper.from_array(R.standard_normal((dirs, 3 * HID)).astype(np.float32) * 0.3, "P"))
        names[7] = "P"
    while names and not names[-1]:
        names.pop()
    k = 3 if op == "LSTM" else 2
    outs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")[:k]]
    while outs and not outs[-1]:
        outs.pop()
    if layout:
        attrs["layout"] = 1
    node = helper.make_node(op, names, outs, hidden_size=HID, direction=direction, **attrs)
    graph_outputs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs if o]
    m = helper.make_model(helper.make_graph([node], "rnn", graph_inputs, graph_outputs, inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    return m, feeds


def _oracle(m, feeds) -> dict:
    """onnxruntime's outputs. It has no layout=1 kernels: those run as the layout-0 twin (same weights) on
    transposed inputs, outputs transposed back."""
    node = m.graph.node[0]
    layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
    if layout:
        m = onnx.ModelProto.FromString(m.SerializeToString())
        n = m.graph.node[0]
        kept = [a for a in n.attribute if a.name != "layout"]
        del n.attribute[:]
        n.attribute.extend(kept)
        for v in m.graph.input:
            dims = v.type.tensor_type.shape.dim
            if len(dims) == 3:
                a0, a1 = dims[0].dim_value, dims[1].dim_value
                dims[0].dim_value, dims[1].dim_value = a1, a0
        feeds = {k: (v.transpose(1, 0, 2) if v.ndim == 3 else v) for k, v in feeds.items()}
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    if layout:
        out = {k: v.transpose(2, 0, 1, 3) if v.ndim == 4 else v.transpose(1, 0, 2) for k, v in out.items()}
    return out


def _check(tmp_path, m, feeds, rtol=1e-5, atol=1e-5):
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    ref = _oracle(m, feeds)
    graph, weights = import_onnx(path)
    rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
    out = Session().compile(rf).run(feeds)
    assert set(out) == set(ref)
    for name, v in ref.items():
        assert out[name].shape == v.shape, name
        np.testing.assert_allclose(out[name], v, rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_and_layouts(tmp_path, op, direction, layout):
    _check(tmp_path, *_model(op, direction, layout, optional=("B",)))


OPTIONALS = {"LSTM": ("B", "sequence_lens", "initial_h", "initial_c", "P"), "GRU": ("B", "sequence_lens", "initial_h"),
             "RNN": ("B", "sequence_lens", "initial_h")}


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_every_optional_input_subset(tmp_path, op, direction):
    names = OPTIONALS[op]
    for r in range(len(names) + 1):
        for subset in itertools.combinations(names, r):
            _check(tmp_path, *_model(op, direction, optional=subset))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["reverse", "bidirectional"])
def test_sequence_lengths_with_reverse_passes_and_layout_1(tmp_path, op, direction):
    _check(tmp_path, *_model(op, direction, layout=1, optional=("B", "sequence_lens", "initial_h")))


@pytest.mark.parametrize("outputs", [("Y",), ("Y_h",), ("Y_c",), ("Y", "Y_c"), ("Y_h", "Y_c")])
def test_any_subset_of_outputs(tmp_path, outputs):
    _check(tmp_path, *_model("LSTM", "bidirectional", optional=("B",), outputs=outputs))


@pytest.mark.parametrize("op,acts,alpha,beta", [
    ("RNN", ["Relu"], None, None),
    ("RNN", ["LeakyRelu"], [0.3], None),
    ("RNN", ["ScaledTanh"], [1.5], [0.7]),
    ("RNN", ["HardSigmoid"], [0.3], [0.4]),
    ("GRU", ["HardSigmoid", "Softsign"], [0.25], [0.45]),
    ("GRU", ["Sigmoid", "Elu"], [0.8], None),
    ("LSTM", ["HardSigmoid", "Tanh", "Softplus"], [0.15], [0.55]),
    ("LSTM", ["Sigmoid", "ThresholdedRelu", "Affine"], [0.1, 0.9], [0.2]),
])
def test_activations_with_alpha_and_beta(tmp_path, op, acts, alpha, beta):
    attrs = {"activations": acts}
    if alpha is not None:
        attrs["activation_alpha"] = alpha
    if beta is not None:
        attrs["activation_beta"] = beta
    _check(tmp_path, *_model(op, optional=("B",), **attrs))


def test_clip_input_forget_and_linear_before_reset(tmp_path):
    _check(tmp_path, *_model("LSTM", "bidirectional", optional=("B", "P"), clip=0.4))
    _check(tmp_path, *_model("LSTM", optional=("B", "initial_c"), input_forget=1))
    _check(tmp_path, *_model("GRU", "bidirectional", optional=("B", "initial_h"), linear_before_reset=1))
    _check(tmp_path, *_model("GRU", optional=("B",), clip=0.3))


def test_opset_7_forms(tmp_path):
    for op in ("LSTM", "GRU", "RNN"):
        _check(tmp_path, *_model(op, optional=("B",), opset=7))


def test_sequence_length_out_of_range_is_a_clear_run_time_error(tmp_path):
    m, feeds = _model("GRU", optional=("sequence_lens",))
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    graph, weights = import_onnx(path)
    rf, _ = bake(graph, weights)
    feeds["L"] = np.array([SEQ + 1, 1, 1], np.int32)
    from rlx_format import RlxError

    with pytest.raises(RlxError, match=r"\(GRU\).*sequence_lens \[6, 1, 1\] outside \[0, 5\]"):
        Session().compile(rf).run(feeds)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_torch_exported_recurrent_models_match_torch_and_onnxruntime(tmp_path, lstm_kernel_calls, kind):
    """2-layer bidirectional nets exported by torch.onnx: the LSTM's and GRU's steps (PyTorch exports GRUs with
    linear_before_reset) run the numba kernels, one call per layer and direction."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    cls = getattr(torch.nn, kind)
    net = cls(input_size=INP, hidden_size=HID, num_layers=2, batch_first=True, bidirectional=True).eval()

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.fc = net, torch.nn.Linear(2 * HID, 3)

        def forward(self, x):
            y = self.rnn(x)[0]
            return self.fc(y[:, -1])

    model = Head().eval()
    x = torch.randn(BATCH, SEQ, INP)
    path = tmp_path / "t.onnx"
    torch.onnx.export(model, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=False, opset_version=14)
    with torch.no_grad():
        want = model(x).numpy()
    graph, weights = import_onnx(path)
    rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
    got = Session().compile(rf).run({"x": x.numpy()})["y"]
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, {"x": x.numpy()})[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert len(lstm_kernel_calls) == (0 if kind == "RNN" else 4)


# ---------------------------------------------------------------- the numba LSTM steps (recurrent_kernels.py)
def _rlx(tmp_path, m, feeds) -> dict:
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    rf, _ = bake(*import_onnx(path), BakeOptions.from_profile("exact"))
    return Session().compile(rf).run(feeds)


@pytest.fixture
def lstm_kernel_calls(monkeypatch):
    """The shapes of xw each direction run by the numba steps (recurrent_kernels.lstm_steps or gru_steps) got (their
    caller is counted: on two threads the kernel itself runs on the pool's threads)."""
    from rlx_runtime.kernels import recurrent
    calls = []
    real = recurrent._direction
    monkeypatch.setattr(recurrent, "_direction", lambda *a: calls.append(a[1].shape) or real(*a))
    return calls


# the ops the numba steps take: (op, attrs, every optional input but sequence_lens); a GRU with linear_before_reset
# (PyTorch's) and without (ONNX's default: the candidate multiplies r·h by Rhᵀ, a second GEMM per step)
_KERNEL_OPS = {"LSTM": ("LSTM", {}, ("B", "initial_h", "initial_c")),
               "GRU": ("GRU", {"linear_before_reset": 1}, ("B", "initial_h")),
               "GRU-reset-first": ("GRU", {"linear_before_reset": 0}, ("B", "initial_h"))}


@pytest.mark.parametrize("case", _KERNEL_OPS)
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("with_optional", [False, True])
def test_numba_steps_equal_the_generic_steps_bit_for_bit(tmp_path, monkeypatch, lstm_kernel_calls, case, direction,
                                                         with_optional):
    """The kernels do the generic steps' float32 operations in the same order (the GRU's: (x + h·Rᵀ) + Rb through
    the sigmoid for z and r, x + r·(h·Rhᵀ + Rbh) through tanh, (1 - z)·h~ + z·h); with the generic path's tanh
    swapped for the kernels', every output is the same to the bit (batch 3: both take the few-rows GEMM)."""
    from rlx_runtime import ufuncs
    from rlx_runtime.kernels import recurrent
    op, attrs, optional = _KERNEL_OPS[case]
    m, feeds = _model(op, direction, optional=optional if with_optional else (), **attrs)
    fast = _rlx(tmp_path, m, feeds)
    assert len(lstm_kernel_calls) == (2 if direction == "bidirectional" else 1)
    monkeypatch.setattr(recurrent, "_numba_steps", lambda *a: False)
    real = recurrent._activation
    monkeypatch.setattr(recurrent, "_activation",
                        lambda xp, name, al, be: ufuncs.tanh_f32 if name == "Tanh" else real(xp, name, al, be))
    generic = _rlx(tmp_path, m, feeds)
    assert len(lstm_kernel_calls) == (2 if direction == "bidirectional" else 1)
    for k in fast:
        np.testing.assert_array_equal(fast[k], generic[k], err_msg=k)


@pytest.mark.parametrize("attrs,optional,taken", [
    ({}, (), True),
    ({"activations": ["Sigmoid", "Tanh", "Tanh"]}, (), True),
    ({"clip": 2.0}, (), False),
    ({"input_forget": 1}, (), False),
    ({"activations": ["Sigmoid", "Tanh", "Relu"]}, (), False),
    ({}, ("P",), False),
    ({}, ("sequence_lens",), False),
], ids=str)
def test_which_lstms_take_the_numba_steps(tmp_path, lstm_kernel_calls, attrs, optional, taken):
    m, feeds = _model("LSTM", optional=optional, **attrs)
    out = _rlx(tmp_path, m, feeds)
    assert bool(lstm_kernel_calls) == taken
    ref = _oracle(m, feeds)
    for k, v in ref.items():
        np.testing.assert_allclose(out[k], v, rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("batch", [1, 8, 19])
def test_numba_lstm_at_real_sizes_matches_onnxruntime(tmp_path, lstm_kernel_calls, batch):
    """Hidden 256 (every column loop of the few-rows kernel), batch 1, 8 and 19 (more than its 8 rows at once),
    40 steps with biases and initial states."""
    hid, seq, inp = 256, 40, 48
    w = (R.standard_normal((1, 4 * hid, inp)) * 0.2).astype(np.float32)
    r = (R.standard_normal((1, 4 * hid, hid)) * 0.1).astype(np.float32)
    b = (R.standard_normal((1, 8 * hid)) * 0.2).astype(np.float32)
    node = helper.make_node("LSTM", ["X", "W", "R", "B", "", "H0", "C0"], ["Y", "Y_h", "Y_c"], hidden_size=hid)
    ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, inp]),
           helper.make_tensor_value_info("H0", TensorProto.FLOAT, [1, batch, hid]),
           helper.make_tensor_value_info("C0", TensorProto.FLOAT, [1, batch, hid])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h", "Y_c")]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))]
    m = helper.make_model(helper.make_graph([node], "l", ins, outs, inits), opset_imports=[helper.make_opsetid("", 14)])
    feeds = {"X": R.standard_normal((seq, batch, inp)).astype(np.float32),
             "H0": R.standard_normal((1, batch, hid)).astype(np.float32) * 0.5,
             "C0": R.standard_normal((1, batch, hid)).astype(np.float32)}
    out = _rlx(tmp_path, m, feeds)
    assert lstm_kernel_calls == [(seq, batch, 4 * hid)]
    for k, v in _oracle(m, feeds).items():
        np.testing.assert_allclose(out[k], v, rtol=1e-4, atol=2e-5, err_msg=k)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("hid,batch", [(40, 3), (96, 19)])
def test_numba_lstm_steps_split_over_threads_give_the_same_bits(tmp_path, monkeypatch, lstm_kernel_calls, direction,
                                                                hid, batch):
    """Each step's hidden units split into blocks (32-column multiples; 40 leaves a block of 8) over two threads,
    taken by whichever thread is free: the same bits as one thread, which match onnxruntime."""
    from threadpoolctl import threadpool_limits

    from rlx_runtime.kernels import recurrent
    monkeypatch.setattr(recurrent, "_MIN_STEP_SPLIT", 0)
    m, feeds = _model_sized("LSTM", direction, hid, batch)
    with threadpool_limits(2, "blas"):
        two = _rlx(tmp_path, m, feeds)
    with threadpool_limits(1, "blas"):
        one = _rlx(tmp_path, m, feeds)
    assert lstm_kernel_calls
    for k in one:
        np.testing.assert_array_equal(two[k], one[k], err_msg=k)
    for k, v in _oracle(m, feeds).items():
        np.testing.assert_allclose(two[k], v, rtol=1e-4, atol=2e-5, err_msg=k)


def _model_sized(op, direction, hid, batch, seq=7, inp=12):
    """An LSTM with biases and initial states at a given hidden size and batch."""
    dirs = 2 if direction == "bidirectional" else 1
    w = (R.standard_normal((dirs, 4 * hid, inp)) * 0.3).astype(np.float32)
    r = (R.standard_normal((dirs, 4 * hid, hid)) * 0.15).astype(np.float32)
    b = (R.standard_normal((dirs, 8 * hid)) * 0.2).astype(np.float32)
    node = helper.make_node(op, ["X", "W", "R", "B", "", "H0", "C0"], ["Y", "Y_h", "Y_c"], hidden_size=hid,
                            direction=direction)
    ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, inp]),
           helper.make_tensor_value_info("H0", TensorProto.FLOAT, [dirs, batch, hid]),
           helper.make_tensor_value_info("C0", TensorProto.FLOAT, [dirs, batch, hid])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h", "Y_c")]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))]
    m = helper.make_model(helper.make_graph([node], "l", ins, outs, inits), opset_imports=[helper.make_opsetid("", 14)])
    feeds = {"X": R.standard_normal((seq, batch, inp)).astype(np.float32),
             "H0": R.standard_normal((dirs, batch, hid)).astype(np.float32) * 0.5,
             "C0": R.standard_normal((dirs, batch, hid)).astype(np.float32)}
    return m, feeds


def test_the_lstm_kernel_follows_a_new_recurrence_weight():
    """Rᵀ is kept per plan step and weight: a different R (a run-time param set anew) must be used, not the
    first one's transpose."""
    from rlx_runtime.kernels import recurrent
    from rlx_runtime.kernels.registry import prepare_attrs
    a = prepare_attrs("LSTM", {"hidden_size": 8, "direction": "forward", "activations": None,
                               "activation_alpha": None, "activation_beta": None, "clip": None, "optional": [],
                               "input_forget": 0})
    x = R.standard_normal((4, 2, 5)).astype(np.float32)
    w = R.standard_normal((1, 32, 5)).astype(np.float32)
    r1, r2 = (R.standard_normal((1, 32, 8)).astype(np.float32) for _ in range(2))
    first = recurrent._lstm(np, a, x, w, r1)
    second = recurrent._lstm(np, a, x, w, r2)
    np.testing.assert_array_equal(second, recurrent._lstm(np, dict(a), x, w, r2))
    assert not np.array_equal(first, second)
    np.testing.assert_array_equal(recurrent._lstm(np, a, x, w, r1), first)


@pytest.mark.parametrize("case", _KERNEL_OPS)
@pytest.mark.parametrize("threads,batch,hid,chunks,groups", [(2, 9, 96, 2, 2), (4, 9, 96, 4, 2), (4, 3, 40, 2, 1),
                                                             (3, 13, 288, 3, 3)], ids=str)
def test_row_groups_and_hidden_blocks_give_the_same_bits(monkeypatch, case, threads, batch, hid, chunks, groups):
    """The batch's rows split into groups (at least 4 rows each) that run with no wait on one another, and
    threads left over split each group's steps into hidden blocks (32-column multiples): 2 threads on 9 rows are
    2 groups, 4 threads 2 groups of 2 blocks of 48 -> 64 units, 4 threads on 3 rows one group of 40 units in
    blocks of 32 + 8, 3 threads on 13 rows 3 groups of 4-5 rows with 288 units (two panels of Rᵀ). Whatever
    the split, and run by however many threads turn up (here more than the CPUs), every output is the
    one-thread kernel's to the bit. A GRU without linear_before_reset splits into the groups only."""
    from rlx_runtime import threads as T
    from rlx_runtime.kernels import recurrent
    from rlx_runtime.kernels.registry import prepare_attrs
    op, extra, optional = _KERNEL_OPS[case]
    a = prepare_attrs(op, {"hidden_size": hid, "direction": "bidirectional", "activations": None,
                           "activation_alpha": None, "activation_beta": None, "clip": None,
                           "optional": list(optional), "input_forget": 0, **extra})
    g, seq, inp = GATES[op], 6, 10
    x = R.standard_normal((seq, batch, inp)).astype(np.float32)
    w = (R.standard_normal((2, g * hid, inp)) * 0.3).astype(np.float32)
    r = (R.standard_normal((2, g * hid, hid)) * 0.15).astype(np.float32)
    b = (R.standard_normal((2, 2 * g * hid)) * 0.2).astype(np.float32)
    states = [R.standard_normal((2, batch, hid)).astype(np.float32) for _ in optional[1:]]
    run = recurrent._lstm if op == "LSTM" else recurrent._gru
    monkeypatch.setattr(T, "threads_in_use", lambda: threads)
    # the reference's steps on one thread, its input projection split as the split run's is: a BLAS GEMM's chunk
    # edges may round differently (OpenBLAS's Haswell kernels do; its SkylakeX ones do not)
    monkeypatch.setattr(recurrent, "_MIN_STEP_SPLIT", 1 << 62)
    with T.forward_threads():
        one = run(np, a, x, w, r, b, *states)
    monkeypatch.setattr(recurrent, "_MIN_STEP_SPLIT", 0)
    runs = []
    real = T.run_chunks
    monkeypatch.setattr(T, "run_chunks", lambda count, fn: runs.append(count) or real(count, fn))
    with T.forward_threads():
        split = run(np, a, x, w, r, b, *states)
    assert runs == [groups if case == "GRU-reset-first" else chunks] * 2  # one job per direction
    np.testing.assert_array_equal(split, one)


# ---------------------------------------------------------------- the numba GRU steps (recurrent_kernels.gru_steps)
@pytest.mark.parametrize("attrs,optional,taken", [
    ({"linear_before_reset": 1}, (), True),
    ({"linear_before_reset": 1, "activations": ["Sigmoid", "Tanh"]}, ("B",), True),
    ({}, ("B",), True),  # linear_before_reset 0 (ONNX's default)
    ({"linear_before_reset": 1, "clip": 2.0}, (), False),
    ({"linear_before_reset": 1, "activations": ["Sigmoid", "Relu"]}, (), False),
    ({"linear_before_reset": 1}, ("sequence_lens",), False),
], ids=str)
def test_which_grus_take_the_numba_steps(tmp_path, lstm_kernel_calls, attrs, optional, taken):
    m, feeds = _model("GRU", optional=optional, **attrs)
    out = _rlx(tmp_path, m, feeds)
    assert bool(lstm_kernel_calls) == taken
    for k, v in _oracle(m, feeds).items():
        np.testing.assert_allclose(out[k], v, rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("before_reset", [1, 0])
@pytest.mark.parametrize("batch", [1, 8, 19])
def test_numba_gru_at_real_sizes_matches_onnxruntime(tmp_path, lstm_kernel_calls, batch, before_reset):
    """Hidden 256 (panels of Rᵀ of 768 columns), batch 1, 8 and 19, 40 steps with biases and an initial state, with
    and without linear_before_reset."""
    hid, seq, inp = 256, 40, 48
    w = (R.standard_normal((1, 3 * hid, inp)) * 0.2).astype(np.float32)
    r = (R.standard_normal((1, 3 * hid, hid)) * 0.1).astype(np.float32)
    b = (R.standard_normal((1, 6 * hid)) * 0.2).astype(np.float32)
    node = helper.make_node("GRU", ["X", "W", "R", "B", "", "H0"], ["Y", "Y_h"], hidden_size=hid,
                            linear_before_reset=before_reset)
    ins = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [seq, batch, inp]),
           helper.make_tensor_value_info("H0", TensorProto.FLOAT, [1, batch, hid])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h")]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))]
    m = helper.make_model(helper.make_graph([node], "g", ins, outs, inits), opset_imports=[helper.make_opsetid("", 14)])
    feeds = {"X": R.standard_normal((seq, batch, inp)).astype(np.float32),
             "H0": R.standard_normal((1, batch, hid)).astype(np.float32) * 0.5}
    out = _rlx(tmp_path, m, feeds)
    assert lstm_kernel_calls == [(seq, batch, 3 * hid)]
    for k, v in _oracle(m, feeds).items():
        np.testing.assert_allclose(out[k], v, rtol=1e-4, atol=2e-5, err_msg=k)


@pytest.mark.parametrize("case", _KERNEL_OPS)
@pytest.mark.parametrize("seq,batch", [(0, 2), (3, 0)])
def test_empty_sequences_and_batches_run_the_kernels(lstm_kernel_calls, case, seq, batch):
    """No steps (Y empty, the final states the initial ones) or no batch rows (every output empty): the
    projection's reshape took the inner size from -1, which an empty array cannot give (a ValueError)."""
    from rlx_runtime.kernels import recurrent
    from rlx_runtime.kernels.registry import prepare_attrs
    from rlx_runtime.threads import forward_threads
    op, extra, optional = _KERNEL_OPS[case]
    hid, g = 5, GATES[op]
    a = prepare_attrs(op, {"hidden_size": hid, "direction": "forward", "activations": None,
                           "activation_alpha": None, "activation_beta": None, "clip": None,
                           "optional": list(optional), "input_forget": 0, **extra})
    x = R.standard_normal((seq, batch, 6)).astype(np.float32)
    w = R.standard_normal((1, g * hid, 6)).astype(np.float32)
    r = R.standard_normal((1, g * hid, hid)).astype(np.float32)
    b = R.standard_normal((1, 2 * g * hid)).astype(np.float32)
    states = [R.standard_normal((1, batch, hid)).astype(np.float32) for _ in optional[1:]]
    with forward_threads():
        out = (recurrent._lstm if op == "LSTM" else recurrent._gru)(np, a, x, w, r, b, *states)
    assert lstm_kernel_calls == [(seq, batch, g * hid)]
    assert out.shape == (seq + len(states), 1, batch, hid)
    for i, s in enumerate(states):
        np.testing.assert_array_equal(out[seq + i], s)
