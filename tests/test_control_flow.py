"""ONNX If: a condition known at import inlines the taken branch (against onnxruntime); a run-time one becomes
an If node with both branches (tests/test_control_flow_onnx.py)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlx_bake import BakeOptions, bake
from rlx_bake.onnx import import_onnx
from rlx_runtime import Session

R = np.random.default_rng(2)


def _branch(name, op, const):
    w = numpy_helper.from_array(const, f"{name}_w")
    return helper.make_graph([helper.make_node(op, ["x", f"{name}_w"], [f"{name}_y"])], name, [],
                             [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)], [w])


def _model(cond_nodes, cond_inputs=()):
    then_g = _branch("then", "Add", np.full((1, 4), 10, np.float32))
    else_g = _branch("else", "Mul", R.standard_normal((1, 4)).astype(np.float32))
    nodes = cond_nodes + [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4]), *cond_inputs]
    return helper.make_model(helper.make_graph(nodes, "if", inputs,
                                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
                             opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("value", [True, False])
def test_if_on_a_constant_condition_inlines_the_taken_branch(tmp_path, value):
    m = _model([helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(np.array(value)))])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    graph, weights = import_onnx(path)
    rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
    assert [n.op for n in rf.graph.nodes] == ["Add" if value else "Mul"]
    x = R.standard_normal((3, 4)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(Session().compile(rf).run({"x": x})["y"], ref)


def test_if_on_a_condition_from_static_shapes_folds_at_import(tmp_path):
    """torch-style guards: Equal(Shape(w)[0], 1) is known once shapes are."""
    w = numpy_helper.from_array(np.zeros((1, 4), np.float32), "w0")
    nodes = [helper.make_node("Shape", ["w0"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["s0"], axis=0),
             helper.make_node("Equal", ["s0", "one"], ["cond"])]
    m = _model(nodes)
    m.graph.initializer.extend([w, numpy_helper.from_array(np.array(0, np.int64), "zero"),
                                numpy_helper.from_array(np.array(1, np.int64), "one")])
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    graph, weights = import_onnx(path)
    rf, _ = bake(graph, weights)
    assert [n.op for n in rf.graph.nodes] == ["Add"]
    x = R.standard_normal((2, 4)).astype(np.float32)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(Session().compile(rf).run({"x": x})["y"], ref)


def test_if_on_a_run_time_condition_keeps_both_branches(tmp_path):
    m = _model([], [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])])
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    graph, weights = import_onnx(path)
    rf, _ = bake(graph, weights)
    (node,) = [n for n in rf.graph.nodes if n.op == "If"]
    assert [n.op for n in node.attrs["then_branch"].nodes] == ["Add"]
    assert [n.op for n in node.attrs["else_branch"].nodes] == ["Mul"]
    x = R.standard_normal((3, 4)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for c in (True, False):
        feeds = {"x": x, "cond": np.array(c)}
        np.testing.assert_array_equal(Session().compile(rf).run(feeds)["y"], sess.run(None, feeds)[0])
