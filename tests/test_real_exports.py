"""Real exports (issue #21): the import forms real exporters write, checked against onnxruntime.

Part 1 builds small ONNX models by hand for each form (op names, Dropout masks, Constant-fed and
Shape-computed operands, auto_pad on symbolic dims, anonymous input dims, every opset 7-23 of the
accepted ops, verify --input/--shape). Part 2 is the corpus: models exported with torch (and Hugging
Face transformers models with random weights) into a per-machine cache, each imported, baked and run
at two dynamic shapes against onnxruntime; a fast subset runs in CI, the rest is `slow`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from rlx_bake import BakeOptions, bake
from rlx_bake.cli import main
from rlx_bake.onnx import import_onnx
from rlx_format import RlxError
from rlx_runtime import Session

R = np.random.default_rng(21)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name + "_v"))


def _close(ours, ref, what):
    """Oracle agreement: cosine >= 0.99999 and max abs diff within 1e-4 of the output's scale."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape}, onnxruntime {ref.shape}"
    if ref.dtype == bool or ref.dtype.kind in "iu":
        np.testing.assert_array_equal(ours, ref, err_msg=what)
        return
    x, y = ours.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    scale = max(float(np.abs(y).max()) if y.size else 0.0, 1e-6)
    diff = float(np.abs(x - y).max()) if y.size else 0.0
    assert diff <= 1e-4 * scale, f"{what}: max abs diff {diff:.3g} > 1e-4 x output scale {scale:.3g}"
    den = np.linalg.norm(x) * np.linalg.norm(y)
    if den > 0:
        assert x @ y / den >= 0.99999, f"{what}: cosine {x @ y / den:.8f}"


def _check(path, feeds_list, profiles=("exact",)):
    """Import, bake each profile, run every feed dict and compare every output with onnxruntime."""
    graph, weights = import_onnx(path)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for profile in profiles:
        rf, _ = bake(graph, weights, BakeOptions.from_profile(profile))
        compiled = Session().compile(rf)
        for feeds in feeds_list:
            ours = compiled.run(feeds)
            for out, ref in zip(sess.get_outputs(), sess.run(None, feeds), strict=True):
                what = f"{Path(path).name} [{profile}] {out.name} at {[f.shape for f in feeds.values()]}"
                if profile == "exact":
                    _close(ours[out.name], ref, what)
                else:  # Q8_0 weights: lossy by design (spec), so only the direction is held
                    x, y = np.asarray(ours[out.name], np.float64).ravel(), ref.astype(np.float64).ravel()
                    assert x @ y / (np.linalg.norm(x) * np.linalg.norm(y)) >= 0.999, what
    return graph


def _save(tmp_path, model, name="m.onnx"):
    p = tmp_path / name
    onnx.save(model, p)
    return p


# ------------------------------------------------------------------------------------------- op names


@pytest.mark.parametrize("op", ["GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("opset", [12, 16, 23])
def test_or_equal_ops(tmp_path, op, opset):
    a = R.integers(0, 3, (3, 4)).astype(np.float32)
    b = R.integers(0, 3, (4,)).astype(np.float32)
    m = _model([helper.make_node(op, ["a", "b"], ["y"])], [_vi("a", [3, 4]), _vi("b", [4])],
               [_vi("y", None, TensorProto.BOOL)], opset=opset)
    _check(_save(tmp_path, m), [{"a": a, "b": b}])


# ------------------------------------------------------------------------------------------- Dropout


@pytest.mark.parametrize("opset", [7, 10, 12, 13, 22])
def test_dropout_with_mask(tmp_path, opset):
    ins = ["x"] + (["ratio", "train"] if opset >= 12 else [])
    nodes = [helper.make_node("Dropout", ins, ["y", "mask"], **({"ratio": 0.3} if opset < 12 else {})),
             helper.make_node("Relu", ["y"], ["z"])]
    inits = ([numpy_helper.from_array(np.array(0.3, np.float32), "ratio"),
              numpy_helper.from_array(np.array(False), "train")] if opset >= 12 else [])
    # the mask of an inference Dropout keeps everything (onnx's reference evaluator: all true); onnxruntime
    # leaves it unfilled (zeros) before opset 12, so there the reference evaluator is the oracle
    mask_t = TensorProto.BOOL if opset >= 10 else TensorProto.FLOAT
    m = _model(nodes, [_vi("x", ["b", 5])], [_vi("z", None), _vi("mask", None, mask_t)], inits, opset)
    x = R.standard_normal((3, 5)).astype(np.float32)
    path = _save(tmp_path, m)
    if opset >= 12:
        _check(path, [{"x": x}, {"x": x[:1]}])
        return
    graph, weights = import_onnx(path)
    ours = Session().compile(bake(graph, weights, BakeOptions.from_profile("exact"))[0]).run({"x": x})
    z, mask = ReferenceEvaluator(m).run(None, {"x": x})
    _close(ours["z"], z, "z")
    assert ours["mask"].dtype == (bool if opset >= 10 else np.float32) and np.all(ours["mask"] == mask)


def test_dropout_in_training_mode_is_refused(tmp_path):
    node = helper.make_node("Dropout", ["x", "", "train"], ["y", "mask"], name="drop")
    m = _model([node], [_vi("x", [2, 5]), _vi("train", [], TensorProto.BOOL)],
               [_vi("y", None), _vi("mask", None, TensorProto.BOOL)], opset=13)
    with pytest.raises(RlxError, match=r"Dropout \(Dropout in training mode.*drop"):
        import_onnx(_save(tmp_path, m))


# ------------------------------------------------------------------------------------------- operands


def test_constant_node_operands_fold_at_import(tmp_path):
    """Pad/Slice/Unsqueeze/ReduceSum operands computed from Constant nodes only become attrs."""
    nodes = [
        _const("p4", np.array([1, 2], np.int32)),
        helper.make_node("Cast", ["p4"], ["p4l"], to=TensorProto.INT64),
        _const("zero2", np.array([0, 0], np.int64)),
        helper.make_node("Concat", ["zero2", "p4l"], ["pads"], axis=0),  # [0, 0, 1, 2] ... rank 2: b0 b1 e0 e1
        helper.make_node("Pad", ["x", "pads"], ["p"]),
        _const("one", np.array(1, np.int64)),
        helper.make_node("Mul", ["one", "one"], ["one2"]),
        helper.make_node("Unsqueeze", ["one2", "zero1"], ["start"]),
        _const("zero1", np.array([0], np.int64)),
        helper.make_node("Add", ["start", "start"], ["end"]),
        helper.make_node("Slice", ["p", "start", "end", "one1"], ["s"]),
        _const("one1", np.array([1], np.int64)),
        helper.make_node("ReduceSum", ["s", "one1"], ["y"]),
    ]
    order = [nodes[i] for i in (0, 1, 2, 3, 4, 5, 6, 8, 7, 9, 11, 10, 12)]
    m = _model(order, [_vi("x", [3, 4])], [_vi("y", None)], opset=13)
    graph = _check(_save(tmp_path, m), [{"x": R.standard_normal((3, 4)).astype(np.float32)}])
    by_op = {n.op: n for n in graph.nodes}
    assert set(by_op) == {"Pad", "Slice", "ReduceSum"}, [n.op for n in graph.nodes]
    assert by_op["Pad"].attrs["pads"] == [0, 0, 1, 2] and by_op["Pad"].inputs == ["x"]
    assert by_op["Slice"].attrs["starts"] == [1] and by_op["Slice"].attrs["ends"] == [2]
    assert by_op["ReduceSum"].attrs["axes"] == [1]


def test_slice_and_pad_operands_from_shape_arithmetic(tmp_path):
    """BERT's position slice table[:seq] and a pad-to-a-multiple-of-4, both computed from Shape at run time."""
    table = R.standard_normal((64, 6)).astype(np.float32)
    i64 = lambda name, v: _const(name, np.array(v, np.int64))  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"]),
        i64("one", [1]), i64("zero", [0]), i64("four", 4), i64("z3", [0, 0, 0]), i64("z2", [0, 0]),
        helper.make_node("Gather", ["sx", "one"], ["seq"], axis=0),  # [seq]
        helper.make_node("Slice", ["table", "zero", "seq", "zero"], ["pos"]),  # table[:seq]
        helper.make_node("Add", ["x", "pos"], ["h"]),
        helper.make_node("Shape", ["h"], ["sh"], start=1, end=2),
        helper.make_node("Sub", ["four", "sh"], ["neg"]),
        helper.make_node("Mod", ["neg", "four"], ["extra"]),  # (4 - seq % 4) % 4 as Python-style Mod
        helper.make_node("Concat", ["z3", "extra", "z2"], ["pads"], axis=0),
        helper.make_node("Pad", ["h", "pads"], ["y"], mode="constant"),
    ]
    m = _model(nodes, [_vi("x", ["b", "seq", 6])], [_vi("y", None)], [numpy_helper.from_array(table, "table")], 17)
    graph = _check(_save(tmp_path, m), [{"x": R.standard_normal((2, 5, 6)).astype(np.float32)},
                                        {"x": R.standard_normal((1, 12, 6)).astype(np.float32)}])
    run_time = sorted((n.op, len(n.inputs)) for n in graph.nodes if n.op == "Pad" or n.inputs[0] == "table")
    assert run_time == [("Pad", 2), ("Slice", 3)]  # the input forms, not attrs


def test_run_time_pad_of_the_wrong_length_names_the_node(tmp_path):
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Concat", ["s", "s", "s"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")]
    m = _model(nodes, [_vi("x", ["n", 2])], [_vi("y", None)], opset=17)
    with pytest.raises(RlxError, match=r"m\.onnx: node 'y' \(Pad\): pads has 6 entries; expected 2\*rank = 4"):
        import_onnx(_save(tmp_path, m))


# ------------------------------------------------------------------------------------------- auto_pad


@pytest.mark.parametrize("op", ["Conv", "MaxPool", "AveragePool"])
@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_auto_pad_same_on_symbolic_dims(tmp_path, op, mode, stride):
    inits, ins, attrs = [], ["x"], {"auto_pad": mode, "strides": [stride, stride]}
    if op == "Conv":
        inits = [numpy_helper.from_array(R.standard_normal((4, 3, 3, 2)).astype(np.float32), "w")]
        ins.append("w")
        attrs["dilations"] = [1, 1]  # onnxruntime refuses SAME with dilations
    else:
        attrs["kernel_shape"] = [3, 2]
    if op == "AveragePool":
        attrs["count_include_pad"] = 1
    m = _model([helper.make_node(op, ins, ["y"], **attrs)], [_vi("x", ["b", 3, "h", "w"])], [_vi("y", None)],
               inits, opset=17)
    _check(_save(tmp_path, m), [{"x": R.standard_normal((1, 3, 7, 10)).astype(np.float32)},
                                {"x": R.standard_normal((2, 3, 12, 5)).astype(np.float32)}])


def test_auto_pad_average_pool_without_count_include_pad_is_refused(tmp_path):
    node = helper.make_node("AveragePool", ["x"], ["y"], auto_pad="SAME_UPPER", kernel_shape=[3, 3], strides=[2, 2])
    m = _model([node], [_vi("x", ["b", 3, "h", "w"])], [_vi("y", None)], opset=17)
    with pytest.raises(RlxError, match="AveragePool auto_pad=SAME_UPPER with a stride on symbolic dims"):
        import_onnx(_save(tmp_path, m))


# ------------------------------------------------------------------------------------------- input dims


def test_anonymous_input_dims_are_each_a_fresh_symbol(tmp_path):
    """[-1, 3, '?', '?']: -1 is accepted and the two '?' dims are independent (48x192 runs)."""
    w = R.standard_normal((8, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2]),
             helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER")]
    x_vi = _vi("x", [1, 3, 1, 1])
    dims = x_vi.type.tensor_type.shape.dim
    dims[0].dim_value = -1
    dims[2].Clear()
    dims[2].dim_param = "?"
    dims[3].Clear()
    dims[3].dim_param = "?"
    m = _model(nodes, [x_vi], [_vi("y", None)], [numpy_helper.from_array(w, "w")], opset=13)
    path = _save(tmp_path, m)
    graph = _check(path, [{"x": R.standard_normal((1, 3, 48, 192)).astype(np.float32)},
                          {"x": R.standard_normal((2, 3, 17, 9)).astype(np.float32)}])
    shape = graph.inputs[0].shape
    assert shape[1] == 3 and len({shape[0], shape[2], shape[3]}) == 3 and all(isinstance(shape[i], str)
                                                                             for i in (0, 2, 3))
    r = CliRunner().invoke(main, ["bake", str(path), "-o", str(tmp_path / "m.rlx")])
    assert r.exit_code == 0, r.output


def test_named_dims_shared_between_inputs_stay_bound(tmp_path):
    m = _model([helper.make_node("Add", ["a", "b"], ["y"])], [_vi("a", ["n", 4]), _vi("b", ["n", 4])],
               [_vi("y", None)])
    graph, _ = import_onnx(_save(tmp_path, m))
    assert graph.inputs[0].shape[0] == graph.inputs[1].shape[0] == "n"


# ------------------------------------------------------------------------------------------- errors


def test_unsupported_ops_inside_subgraphs_are_listed(tmp_path):
    then_g = helper.make_graph([helper.make_node("LSTM", ["x", "w", "r"], ["t"], hidden_size=2, name="lstm_in_then")],
                               "then", [], [_vi("t", None)])
    else_g = helper.make_graph([helper.make_node("Loop", ["", ""], ["e"], name="loop_in_else",
                                                 body=helper.make_graph(
                                                     [helper.make_node("Unique", ["x"], ["u"], name="deep")],
                                                     "body", [], [_vi("u", None)]))],
                               "else", [], [_vi("e", None)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")
    m = _model([node], [_vi("c", [], TensorProto.BOOL), _vi("x", [1, 1, 2])], [_vi("y", None)], opset=17)
    with pytest.raises(RlxError) as e:
        import_onnx(_save(tmp_path, m))
    msg = str(e.value)
    assert "If: 1 node(s), e.g. branch" in msg
    assert "LSTM (inside a subgraph): 1 node(s), e.g. lstm_in_then (in branch.then_branch)" in msg
    assert "Loop (inside a subgraph)" in msg
    assert "Unique (inside a subgraph): 1 node(s), e.g. deep (in loop_in_else (in branch.else_branch).body)" in msg
