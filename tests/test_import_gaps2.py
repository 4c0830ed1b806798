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


# ------------------------------------------------------------------------------------------- Attention (opset 23)
# the standard-ONNX form of a LLaMA/Qwen decoding step: grouped-query heads and the KV cache inside the op


def _attention_model(shapes: dict, outputs=("y",), **attrs):
    names = ["q", "k", "v", "mask", "past_key", "past_value"]
    ins = [n if n in shapes else "" for n in names]
    while not ins[-1]:
        ins.pop()
    mask_t = TensorProto.BOOL if attrs.pop("bool_mask", False) else TensorProto.FLOAT
    inputs = [_vi(n, s, mask_t if n == "mask" else TensorProto.FLOAT) for n, s in shapes.items()]
    node = helper.make_node("Attention", ins, list(outputs), **attrs)
    return _model([node], inputs, [_vi(o, None) for o in outputs if o], opset=23)


def _attention_feeds(m, dims: list[dict]) -> list[dict]:
    """Feeds for each dims binding (symbolic name -> size); bool masks keep every row's first key."""
    feeds = []
    for d in dims:
        f = {}
        for vi in m.graph.input:
            shape = [x.dim_value or d[x.dim_param] for x in vi.type.tensor_type.shape.dim]
            if vi.type.tensor_type.elem_type == TensorProto.BOOL:
                f[vi.name] = R.random(shape) < 0.7
                f[vi.name][..., 0] = True
            else:
                f[vi.name] = _f32(*shape)
        feeds.append(f)
    return feeds


_STEP = [{"b": 1, "s": 1, "p": 3}, {"b": 2, "s": 3, "p": 0}, {"b": 2, "s": 1, "p": 9}]


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_attention_grouped_query_heads(tmp_path, causal, kv_heads):
    """4 query heads over 2 key/value heads (query heads 0-1 read key/value head 0, 2-3 head 1), or over one."""
    m = _attention_model({"q": ["b", 4, "s", 8], "k": ["b", kv_heads, "s", 8], "v": ["b", kv_heads, "s", 6]},
                         is_causal=causal)
    _check(_save(tmp_path, m), _attention_feeds(m, _STEP))


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mask", [None, "float", "bool"])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_attention_kv_cache(tmp_path, causal, mask, kv_heads):
    """past_key/past_value in, present_key/present_value out; causal counts the past (query i attends up to
    past + i); the mask covers past + new keys. Past lengths 3, 0 and 9 in one session."""
    shapes = {"q": ["b", 4, "s", 8], "k": ["b", kv_heads, "s", 8], "v": ["b", kv_heads, "s", 8]}
    if mask:
        shapes["mask"] = ["b", 1, "s", "t"]
    shapes |= {"past_key": ["b", kv_heads, "p", 8], "past_value": ["b", kv_heads, "p", 8]}
    m = _attention_model(shapes, ("y", "present_key", "present_value"), is_causal=causal, scale=0.3,
                         bool_mask=mask == "bool")
    _check(_save(tmp_path, m), _attention_feeds(m, [d | {"t": d["s"] + d["p"]} for d in _STEP]))


def test_attention_3d_packed_heads(tmp_path):
    """[batch, seq, heads * dim] with q_num_heads/kv_num_heads, grouped, with a cache: out as [batch, seq, 32]."""
    shapes = {"q": ["b", "s", 32], "k": ["b", "s", 16], "v": ["b", "s", 16], "past_key": ["b", 2, "p", 8],
              "past_value": ["b", 2, "p", 8]}
    m = _attention_model(shapes, ("y", "present_key", "present_value"), q_num_heads=4, kv_num_heads=2, is_causal=1)
    _check(_save(tmp_path, m), _attention_feeds(m, _STEP))


def test_attention_presents_without_a_past(tmp_path):
    """A prefill: no past in, the new keys/values out as the presents."""
    m = _attention_model({"q": ["b", 4, "s", 8], "k": ["b", 2, "s", 8], "v": ["b", 2, "s", 8]},
                         ("y", "present_key", "present_value"), is_causal=1)
    _check(_save(tmp_path, m), _attention_feeds(m, _STEP))


@pytest.mark.parametrize("shapes,attrs,expected", [
    ({"q": ["b", 4, "s", 8], "k": ["b", 3, "s", 8], "v": ["b", 3, "s", 8]}, {}, "4 query heads and 3 key/value"),
    ({"q": ["b", "s", 32], "k": ["b", "s", 16], "v": ["b", "s", 16]}, {"q_num_heads": 4}, "without q_num_heads"),
    ({"q": ["b", 4, "s", 8], "k": ["b", 4, "s", 8], "v": ["b", 4, "s", 8]}, {"softcap": 2.0}, "softcap"),
])
def test_attention_refuses_forms_it_cannot_lower(tmp_path, shapes, attrs, expected):
    with pytest.raises(RlxError, match=rf"Attention.*{expected}"):
        import_onnx(_save(tmp_path, _attention_model(shapes, **attrs)))
