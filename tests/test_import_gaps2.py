"""Import gaps found by the decoder/encoder exports of the corpus (issue #21, tests/export_corpus.py), each
checked on a minimal onnx.helper model against onnxruntime; and the KV-cache decoding step's shape arithmetic
(past_sequence_length + 1) at several past lengths in one compiled session."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_real_exports import _check, _close, _model, _save, _vi

from rlx_bake import BakeOptions, bake
from rlx_bake.onnx import import_onnx
from rlx_format import RlxError
from rlx_runtime import CompileOptions, Session

R = np.random.default_rng(2)


def _f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------------------- RotaryEmbedding
# torch's dynamo exporter at opset 23 fuses LLaMA's rotate_half into RotaryEmbedding (onnxscript's rewriter)


def _rope_model(x_shape, cache_shape, pos_shape=None, **attrs):
    inputs = [_vi("x", x_shape), _vi("cos", cache_shape), _vi("sin", cache_shape)]
    if pos_shape is not None:
        inputs.append(_vi("pos", pos_shape, TensorProto.INT64))
    node = helper.make_node("RotaryEmbedding", [i.name for i in inputs], ["y"], **attrs)
    return _model([node], inputs, [_vi("y", None)], opset=23)


@pytest.mark.parametrize("attrs", [{}, {"interleaved": 1}, {"rotary_embedding_dim": 4},
                                   {"rotary_embedding_dim": 4, "interleaved": 1}])
def test_rotary_embedding_4d(tmp_path, attrs):
    """[batch, heads, seq, head]: halves (or even/odd pairs) of the first rot features rotate, the rest pass."""
    half = attrs.get("rotary_embedding_dim", 8) // 2
    m = _rope_model(["b", 3, "s", 8], ["b", "s", half], **attrs)
    _check(_save(tmp_path, m), [{"x": _f32(b, 3, s, 8), "cos": _f32(b, s, half), "sin": _f32(b, s, half)}
                                for b, s in ((1, 1), (2, 5))])


@pytest.mark.parametrize("attrs", [{"num_heads": 2}, {"num_heads": 4, "interleaved": 1},
                                   {"num_heads": 2, "rotary_embedding_dim": 6}])
def test_rotary_embedding_3d_packed_heads(tmp_path, attrs):
    """[batch, seq, heads * head] with num_heads: each head's features rotate on their own."""
    head = 16 // attrs["num_heads"]
    half = attrs.get("rotary_embedding_dim", head) // 2
    m = _rope_model(["b", "s", 16], ["b", "s", half], **attrs)
    _check(_save(tmp_path, m), [{"x": _f32(b, s, 16), "cos": _f32(b, s, half), "sin": _f32(b, s, half)}
                                for b, s in ((1, 3), (2, 4))])


@pytest.mark.parametrize("x_shape", [["b", 2, "s", 8], ["b", "s", 16]])
def test_rotary_embedding_position_ids(tmp_path, x_shape):
    """position_ids index a [positions, rot/2] table (a decoding step's positions start at the past length)."""
    attrs = {"num_heads": 2} if len(x_shape) == 3 else {}
    m = _rope_model(x_shape, [12, 4], ["b", "s"], **attrs)
    feeds = []
    for b, s in ((1, 1), (3, 4)):
        shape = [b, 2, s, 8] if len(x_shape) == 4 else [b, s, 16]
        feeds.append({"x": _f32(*shape), "cos": _f32(12, 4), "sin": _f32(12, 4),
                      "pos": R.integers(0, 12, (b, s)).astype(np.int64)})
    _check(_save(tmp_path, m), feeds)


@pytest.mark.parametrize("x_shape,attrs,expected", [
    (["b", "s", 16], {}, "num_heads dividing its last dim 16"),
    (["b", "s", 16], {"num_heads": 3}, "num_heads dividing its last dim 16"),
    (["b", 2, "s", 8], {"rotary_embedding_dim": 5}, "rotary_embedding_dim 5"),
    (["b", 2, "s", 8], {"rotary_embedding_dim": 10}, "rotary_embedding_dim 10"),
])
def test_rotary_embedding_refuses_forms_it_cannot_lower(tmp_path, x_shape, attrs, expected):
    m = _rope_model(x_shape, ["b", "s", 4], **attrs)
    with pytest.raises(RlxError, match=rf"RotaryEmbedding.*{expected}"):
        import_onnx(_save(tmp_path, m))


# ------------------------------------------------------------------------------------------- past_length + 1


def _step_model():
    """A decoding step's shape arithmetic: the mask's length is Shape(past)[2] + 1, positions are
    Range(past, past + 1), and the present is Concat(past, new) — every dim follows the past length."""
    nodes = [helper.make_node("Shape", ["past"], ["ps"]),
             helper.make_node("Gather", ["ps", "two"], ["plen"], axis=0),
             helper.make_node("Add", ["plen", "one"], ["total"]),
             helper.make_node("Range", ["plen", "total", "one"], ["positions"]),
             helper.make_node("Unsqueeze", ["total", "zero"], ["total1"]),
             helper.make_node("ConstantOfShape", ["total1"], ["mask"],
                              value=numpy_helper.from_array(np.array([1.0], np.float32))),
             helper.make_node("Concat", ["past", "new"], ["present"], axis=2),
             helper.make_node("Cast", ["positions"], ["posf"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["present", "axes"], ["summed"], keepdims=0),
             helper.make_node("Mul", ["summed", "mask"], ["masked"]),
             helper.make_node("Add", ["masked", "posf"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
             {"two": 2, "one": 1, "zero": [0], "axes": [0, 1, 3]}.items()]
    return _model(nodes, [_vi("past", [1, 2, "p", 4]), _vi("new", [1, 2, 1, 4])],
                  [_vi("y", None), _vi("present", None)], inits)


@pytest.mark.parametrize("cache", [False, True])
def test_past_length_plus_one_at_several_past_lengths_in_one_session(tmp_path, cache):
    """One compiled session, past lengths 3, 9, 0 and 3 again (with the shape cache on: a revisited length
    must not reuse another length's shapes)."""
    path = _save(tmp_path, _step_model())
    graph, weights = import_onnx(path)
    rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
    compiled = Session().compile_with(rf, CompileOptions(cache_shape_invariant=cache, cache_param_invariant=cache))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for p in (3, 9, 0, 3):
        feeds = {"past": _f32(1, 2, p, 4), "new": _f32(1, 2, 1, 4)}
        ours = compiled.run(feeds)
        for out, ref in zip(sess.get_outputs(), sess.run(None, feeds), strict=True):
            assert ref.shape[-1] == (p + 1 if out.name == "y" else 4)
            _close(ours[out.name], ref, f"{out.name} at past length {p}")
