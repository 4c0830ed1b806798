"""Lowerings: shapes and data movement (reshape/slice/pad/split/resize/gather/scatter/constants)."""

from __future__ import annotations

import numpy as np

from .context import attr_copy, axes_from, direct, ONNX_DTYPES, LOWER, Unsupported


LOWER["Transpose"] = attr_copy("Transpose", ["perm"])
LOWER["Concat"] = attr_copy("Concat", ["axis"])
LOWER["Gather"] = attr_copy("Gather", ["axis"])
LOWER["Flatten"] = attr_copy("Flatten", ["axis"])
LOWER["DepthToSpace"] = attr_copy("DepthToSpace", ["blocksize", "mode"])
LOWER["Range"] = direct("Range")
LOWER["GatherElements"] = attr_copy("GatherElements", ["axis"])
LOWER["GatherND"] = attr_copy("GatherND", ["batch_dims"])
LOWER["ScatterND"] = attr_copy("ScatterND", ["reduction"])


def _topk_lower(ctx, n, a):
    k = a["k"] if ctx.opset < 10 else ctx.ints(n.input[1], "TopK k")[0]
    if a.get("sorted", 1) == 0:
        pass  # unsorted output order is implementation-defined: sorted satisfies it
    base = {"k": k, "axis": a.get("axis", -1), "largest": a.get("largest", 1)}
    for out, kind in zip(n.output, ("values", "indices")):
        if out:
            ctx.emit("TopK", [n.input[0]], {**base, "output": kind}, out)


LOWER["TopK"] = _topk_lower
LOWER["ScatterElements"] = attr_copy("ScatterElements", ["axis", "reduction"])


def _trilu_lower(ctx, n, a):
    k = ctx.ints(n.input[1], "Trilu k")[0] if len(n.input) > 1 and n.input[1] else 0
    ctx.emit("Trilu", [n.input[0]], {"upper": a.get("upper", 1), "k": k}, n.output[0])


def _size(ctx, n, a):
    ctx.emit("ReduceProd", [ctx.emit("Shape", [n.input[0]])], {"keepdims": 0}, n.output[0])
LOWER["Trilu"] = _trilu_lower
LOWER["Size"] = _size


def _reshape(ctx, n, a):
    if ctx.opset < 5:
        ctx.emit("Reshape", [n.input[0]], {"shape": a["shape"]}, n.output[0])
        return
    v = ctx.value(n.input[1])
    # allowzero=1 (what torch's dynamo exporter writes) only differs where the shape holds a 0
    zero = {"allowzero": 1} if a.get("allowzero", 0) and (v is None or (np.asarray(v) == 0).any()) else {}
    if v is not None:
        ctx.emit("Reshape", [n.input[0]], {"shape": [int(x) for x in v.reshape(-1)], **zero}, n.output[0])
    else:
        ctx.emit("Reshape", [n.input[0], n.input[1]], zero, n.output[0])


LOWER["Reshape"] = _reshape


def _squeeze(op):
    def lower(ctx, n, a):
        axes = axes_from(ctx, n, a, 1)
        ctx.emit(op, [n.input[0]], {"axes": axes}, n.output[0])
    return lower


LOWER["Squeeze"] = _squeeze("Squeeze")
LOWER["Unsqueeze"] = _squeeze("Unsqueeze")


def _slice(ctx, n, a):
    clamp = lambda v: max(min(v, 2**62), -(2**62))  # noqa: E731 - INT64_MAX sentinels
    if ctx.opset < 10:
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        axes = ctx.ints(n.input[3], "Slice axes") if len(n.input) > 3 and n.input[3] else None
        steps = ctx.ints(n.input[4], "Slice steps") if len(n.input) > 4 and n.input[4] else None
        if ctx.value(n.input[1]) is None or ctx.value(n.input[2]) is None:  # computed at run time (from Shape)
            ctx.emit("Slice", [n.input[0], n.input[1], n.input[2]], {"axes": axes, "steps": steps}, n.output[0])
            return
        starts, ends = ctx.ints(n.input[1], "Slice starts"), ctx.ints(n.input[2], "Slice ends")
    ctx.emit("Slice", [n.input[0]], {"starts": [clamp(s) for s in starts], "ends": [clamp(e) for e in ends],
                                     "axes": axes, "steps": steps}, n.output[0])


LOWER["Slice"] = _slice


def _split(ctx, n, a):
    x = n.input[0]
    axis = a.get("axis", 0)
    sizes = a.get("split")
    if sizes is None and len(n.input) > 1 and n.input[1]:
        sizes = ctx.ints(n.input[1], "Split sizes")
    t = ctx.types.get(x)
    if sizes is None:
        if t is None or t[1] is None or not isinstance(t[1][axis], int):
            raise Unsupported("Split into equal parts of a dim unknown at import time")
        dim, k = t[1][axis], len(n.output)
        part = -(-dim // k)
        sizes = [min(part, dim - i * part) for i in range(k)]
    start = 0
    for out, size in zip(n.output, sizes):
        if out:
            ctx.emit("Slice", [x], {"starts": [start], "ends": [start + size], "axes": [axis]}, out)
        start += size


LOWER["Split"] = _split


def _pad(ctx, n, a):
    mode = a.get("mode", "constant")
    if ctx.opset < 11:
        pads = a.get("pads", a.get("paddings"))
        value = a.get("value", 0.0)
        axes = None
    else:
        pads = n.input[1] if ctx.value(n.input[1]) is None else ctx.ints(n.input[1], "Pad pads")
        value = 0.0
        if len(n.input) > 2 and n.input[2]:
            v = ctx.value(n.input[2])
            if v is None:
                raise Unsupported("Pad with a run-time constant_value")
            value = float(np.asarray(v).reshape(()))
        axes = ctx.ints(n.input[3], "Pad axes") if len(n.input) > 3 and n.input[3] else None
    if isinstance(pads, str):  # computed at run time: the input form of Pad
        r = ctx.rank(n.input[0])
        if axes is not None and (r is None or [ax % r for ax in axes] != list(range(r))):
            raise Unsupported("Pad with run-time pads on a subset (or a reordering) of the axes")
        if mode not in ("constant", "reflect", "edge"):
            raise Unsupported(f"Pad mode {mode!r}")
        ctx.emit("Pad", [n.input[0], pads], {"mode": mode, "value": value}, n.output[0])
        return
    if axes is not None:
        r = ctx.rank(n.input[0])
        if r is None:
            raise Unsupported("Pad with axes on an input of unknown rank")
        full = [0] * (2 * r)
        for i, ax in enumerate(axes):
            full[ax % r], full[ax % r + r] = pads[i], pads[i + len(axes)]
        pads = full
    if mode not in ("constant", "reflect", "edge"):
        raise Unsupported(f"Pad mode {mode!r}")
    ctx.emit("Pad", [n.input[0]], {"pads": pads, "mode": mode, "value": value}, n.output[0])


LOWER["Pad"] = _pad


def _shape_op(ctx, n, a):
    if "start" in a or "end" in a:
        s = ctx.emit("Shape", [n.input[0]])
        ctx.emit("Slice", [s], {"starts": [a.get("start", 0)], "ends": [a.get("end", 2**62)]}, n.output[0])
    else:
        ctx.emit("Shape", [n.input[0]], {}, n.output[0])


LOWER["Shape"] = _shape_op


def _shape_arg_op(op, attr):
    def lower(ctx, n, a):
        v = ctx.value(n.input[1])
        if v is not None:
            ctx.emit(op, [n.input[0]], {attr: [int(x) for x in v.reshape(-1)]}, n.output[0])
        else:
            ctx.emit(op, [n.input[0], n.input[1]], {}, n.output[0])
    return lower


LOWER["Expand"] = _shape_arg_op("Expand", "shape")
LOWER["Tile"] = _shape_arg_op("Tile", "repeats")


def _constant_of_shape(ctx, n, a):
    t = a.get("value")
    what = f"ConstantOfShape node {n.name or n.output[0]!r}"
    val = ctx.attr_tensor(t, what) if t is not None else np.zeros(1, np.float32)
    dt = ONNX_DTYPES.get(t.data_type, "f32") if t is not None else "f32"
    v = ctx.value(n.input[0])
    attrs = {"value": float(val.reshape(-1)[0]), "dtype": dt}
    if v is not None:
        ctx.emit("ConstantOfShape", [], {**attrs, "shape": [int(x) for x in v.reshape(-1)]}, n.output[0])
    else:
        ctx.emit("ConstantOfShape", [n.input[0]], attrs, n.output[0])


LOWER["ConstantOfShape"] = _constant_of_shape


def _resize(ctx, n, a):
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise Unsupported(f"Resize mode {mode!r}")
    if ctx.opset < 11:
        ctm, nearest_mode, scales_in, sizes_in = "asymmetric", "floor", 1, None
    else:
        ctm = a.get("coordinate_transformation_mode", "half_pixel")
        nearest_mode = a.get("nearest_mode", "round_prefer_floor")
        scales_in, sizes_in = 2, 3
    if ctm not in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        raise Unsupported(f"Resize coordinate_transformation_mode {ctm!r}")
    if a.get("antialias", 0) or a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise Unsupported("Resize antialias / keep_aspect_ratio_policy")

    def given(pos):
        if pos is None or len(n.input) <= pos or not n.input[pos]:
            return None
        v = ctx.value(n.input[pos])
        if v is None:
            if pos != sizes_in:
                raise Unsupported("Resize with run-time scales")
            return n.input[pos]  # run-time sizes: the input form
        return v.reshape(-1) if v.size else None

    scales, sizes = given(scales_in), given(sizes_in)
    r = ctx.rank(n.input[0])
    axes = a.get("axes")
    if isinstance(sizes, str):
        if axes is not None and (r is None or [ax % r for ax in axes] != list(range(r))):
            raise Unsupported("Resize with run-time sizes on a subset (or a reordering) of the axes")
        ctx.emit("Resize", [n.input[0], sizes], {"mode": mode, "coordinate_transformation_mode": ctm,
                                                 "nearest_mode": nearest_mode}, n.output[0])
        return
    if axes is not None:  # opset 18: values for a subset of axes
        if r is None:
            raise Unsupported("Resize axes on an input of unknown rank")
        t = ctx.types[n.input[0]][1]
        full = [1.0] * r if scales is not None else list(t)
        for i, ax in enumerate(axes):
            full[ax % r] = (scales if scales is not None else sizes)[i]
        scales, sizes = (full, None) if scales is not None else (None, full)
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm, "nearest_mode": nearest_mode}
    if sizes is not None:
        attrs["sizes"] = [int(v) for v in sizes]
    elif scales is not None:
        attrs["scales"] = [float(np.float32(v)) for v in scales]  # the exact float32 values ONNX carries
    else:
        raise Unsupported("Resize without scales or sizes")
    ctx.emit("Resize", [n.input[0]], attrs, n.output[0])


def _upsample(ctx, n, a):
    scales = a.get("scales")
    if scales is None:
        v = ctx.value(n.input[1]) if len(n.input) > 1 else None
        if v is None:
            raise Unsupported("Upsample with run-time scales")
        scales = v.reshape(-1)
    mode = a.get("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise Unsupported(f"Upsample mode {mode!r}")
    ctx.emit("Resize", [n.input[0]], {"scales": [float(np.float32(v)) for v in scales],
                                      "mode": "nearest" if mode == "nearest" else "linear",
                                      "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
             n.output[0])


LOWER["Resize"] = _resize
LOWER["Upsample"] = _upsample


def _constant(ctx, n, a):
    if "value" in a:
        arr = ctx.attr_tensor(a["value"], f"Constant node {n.name or n.output[0]!r}")
    elif "value_float" in a:
        arr = np.array(a["value_float"], np.float32)
    elif "value_floats" in a:
        arr = np.array(a["value_floats"], np.float32)
    elif "value_int" in a:
        arr = np.array(a["value_int"], np.int64)
    elif "value_ints" in a:
        arr = np.array(a["value_ints"], np.int64)
    else:
        raise Unsupported("Constant with a sparse or string value")
    ctx.consts[n.output[0]] = np.array(arr, order="C")
    ctx.names.add(n.output[0])
    dt = ONNX_DTYPES.get(a["value"].data_type) if "value" in a else ("f32" if arr.dtype.kind == "f" else "i64")
    if dt is not None:
        ctx.types[n.output[0]] = (dt, tuple(arr.shape))


LOWER["Constant"] = _constant
