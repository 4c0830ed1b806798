"""Import gaps found by the vision exports of the corpus (issue #21, tests/export_corpus.py: torchvision's
architectures), each checked on a minimal onnx.helper model against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_real_exports import _check, _model, _save, _vi

from rlx_bake.onnx import import_onnx
from rlx_format import RlxError

R = np.random.default_rng(3)


def _f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------------------------------- GroupNormalization
# torch's dynamo exporter writes nn.GroupNorm as GroupNormalization at opset 21 (the FCOS-like detector's towers)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("x_shape,groups", [(["b", 6, "h", "w"], 3), (["b", 8, "t"], 2), (["b", 4, 3, 2, "w"], 4),
                                            (["b", 6, 5], 1)])
def test_group_normalization(tmp_path, opset, x_shape, groups):
    """Opset 21: scale and bias per channel; opsets 18-20: per group (the spec changed between them)."""
    c = x_shape[1]
    n_affine = c if opset >= 21 else groups
    inits = [numpy_helper.from_array(_f32(n_affine) + 1.0, "scale"), numpy_helper.from_array(_f32(n_affine), "bias")]
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=groups, epsilon=1e-3)
    m = _model([node], [_vi("x", x_shape)], [_vi("y", None)], inits, opset=opset)
    feeds = []
    for b, other in ((1, 3), (2, 7)):
        shape = [b if d == "b" else other if isinstance(d, str) else d for d in x_shape]
        feeds.append({"x": (_f32(*shape) * 3 + 1).astype(np.float32)})  # a mean and spread to remove
    _check(_save(tmp_path, m), feeds)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization_with_run_time_scale_and_bias(tmp_path, opset):
    c, groups = 6, 2
    n_affine = c if opset >= 21 else groups
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=groups)
    m = _model([node], [_vi("x", ["b", c, "h", 4]), _vi("scale", [n_affine]), _vi("bias", [n_affine])],
               [_vi("y", None)], opset=opset)
    _check(_save(tmp_path, m), [{"x": _f32(b, c, h, 4), "scale": _f32(n_affine), "bias": _f32(n_affine)}
                                for b, h in ((1, 3), (3, 5))])


# ------------------------------------------------------------------------------------------- Clip, run-time bounds
# torchvision's clip_boxes_to_image: boxes.clamp(min=0, max=width), the width read from the image at run time


@pytest.mark.parametrize("bounds", [("lo", "hi"), ("lo", ""), ("", "hi"), ("zero", "hi"), ("lo", "ten")])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT64])
def test_clip_with_run_time_bounds(tmp_path, bounds, dtype):
    """Each bound a graph input (run time) or a constant; lo > hi in one feed (ONNX: every value becomes hi)."""
    npt = np.float32 if dtype == TensorProto.FLOAT else np.int64
    inits = [numpy_helper.from_array(np.array(0, npt), "zero"), numpy_helper.from_array(np.array(10, npt), "ten")]
    inputs = [_vi("x", ["b", 5], dtype)] + [_vi(b, [], dtype) for b in bounds if b in ("lo", "hi")]
    m = _model([helper.make_node("Clip", ["x", *bounds], ["y"])], inputs, [_vi("y", None, dtype)], inits, opset=13)
    feeds = []
    for b, lo, hi in ((2, -0.5, 0.7), (3, 1.5, 4.0), (1, 2.0, -1.0)):
        x = (R.standard_normal((b, 5)) * 6).astype(npt)
        f = {"x": x, "lo": np.array(lo, npt), "hi": np.array(hi, npt)}
        feeds.append({k: v for k, v in f.items() if k == "x" or k in bounds})
    _check(_save(tmp_path, m), feeds)


def test_clip_to_a_bound_computed_from_shape(tmp_path):
    """The detector's form: the bound is Cast(Gather(Shape(image), -1)), a 0-d value known only at run time."""
    nodes = [helper.make_node("Shape", ["img"], ["s"]),
             helper.make_node("Gather", ["s", "last"], ["w"], axis=0),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Clip", ["x", "zero", "wf"], ["y"])]
    inits = [numpy_helper.from_array(np.array(-1, np.int64), "last"), numpy_helper.from_array(np.float32(0), "zero")]
    m = _model(nodes, [_vi("x", ["b", "n", 4]), _vi("img", ["b", 3, "h", "w"])], [_vi("y", None)], inits, opset=17)
    _check(_save(tmp_path, m), [{"x": _f32(b, n, 4) * 20, "img": _f32(b, 3, 4, w)} for b, n, w in ((1, 6, 9),
                                                                                                     (2, 3, 13))])


@pytest.mark.parametrize("opset,expected", [
    (18, r"node 'y' \(GroupNormalization\) is malformed \(ValueError: 6 channels are not divisible by num_groups 4"),
    (21, r"node 'y' \(GroupNorm\): channels 6 not divisible by num_groups 4")])
def test_group_normalization_with_groups_that_do_not_divide_the_channels_is_refused(tmp_path, opset, expected):
    n_affine = 4 if opset < 21 else 6
    inits = [numpy_helper.from_array(np.ones(n_affine, np.float32), k) for k in ("scale", "bias")]
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=4)
    m = _model([node], [_vi("x", ["b", 6, 5])], [_vi("y", None)], inits, opset=opset)
    with pytest.raises(RlxError, match=expected):
        import_onnx(_save(tmp_path, m))
