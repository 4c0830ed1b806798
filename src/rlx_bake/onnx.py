"""ONNX import: `import_onnx(path) -> (Graph, weights)`, lowering ONNX ops to the rlx catalogue.

Initializers become params with their weights (so the bake specializes, folds and packs them);
Constant nodes become constants; `dim_param` becomes a symbolic dim. Shape-like operands given
as inputs in newer opsets (Reshape/Slice/Pad/Squeeze/Unsqueeze/ReduceX/Clip/Split/...) are read at
import time when they are constants and become attrs. External-data tensors are memory-mapped
from their files (never copied twice). Every unsupported op is reported in one error.
Needs the `onnx` extra.
"""

from __future__ import annotations

import math
import mmap
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlx_format.dtypes import f32_to_bf16
from rlx_format.errors import RlxError
from rlx_format.graph import Graph, Node, Value

from .loader import WeightSet

try:
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import ExternalDataInfo
except ImportError:  # pragma: no cover - exercised only without the extra
    onnx = None

_DTYPES = {1: "f32", 10: "f16", 16: "bf16", 11: "f64", 7: "i64", 6: "i32", 5: "i16", 3: "i8", 2: "u8", 9: "bool"}


class Unsupported(Exception):
    """Raised by a lowering for a form rlx cannot express (collected, then reported together)."""


class _Ctx:
    def __init__(self, model, base_dir: Path):
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.base_dir = base_dir
        self.nodes: list[Node] = []
        self.consts: dict[str, np.ndarray] = {}   # Constant nodes and folded helper constants
        self.inits: dict[str, np.ndarray] = {}    # initializers (become params)
        self.init_dtype: dict[str, str] = {}
        self.types: dict[str, tuple[str, tuple]] = {}
        self.names: set[str] = set()
        self._mmaps: dict[str, mmap.mmap] = {}
        self._n = 0

    # -- values
    def fresh(self, base: str) -> str:
        while True:
            self._n += 1
            name = f"{base}/{self._n}"
            if name not in self.names:
                self.names.add(name)
                return name

    def emit(self, op: str, inputs: list[str], attrs: dict | None = None, name: str | None = None) -> str:
        name = name or self.fresh(op.lower())
        self.names.add(name)
        self.nodes.append(Node(name, op, list(inputs), dict(attrs or {})))
        return name

    def const(self, value, dtype=None, base: str = "const") -> str:
        arr = np.asarray(value, dtype=dtype)
        name = self.fresh(base)
        self.consts[name] = np.array(arr, copy=True, order="C")
        return name

    def value(self, name: str) -> np.ndarray | None:
        """The value of a constant operand (initializer or Constant node), else None."""
        if name in self.consts:
            return self.consts[name]
        return self.inits.get(name)

    def ints(self, name: str, what: str) -> list[int]:
        v = self.value(name)
        if v is None:
            raise Unsupported(f"{what} must be a constant (computed at run time here)")
        return [int(x) for x in np.asarray(v).reshape(-1)]

    def rank(self, name: str) -> int | None:
        t = self.types.get(name)
        return None if t is None or t[1] is None else len(t[1])

    def dtype(self, name: str) -> str | None:
        t = self.types.get(name)
        return None if t is None else t[0]

    # -- tensors
    def tensor(self, t) -> np.ndarray:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = ExternalDataInfo(t)
            path = (self.base_dir / info.location).resolve()
            if not path.is_file():
                raise RlxError(f"initializer {t.name!r}: external data file {info.location} not found next to "
                               "the model")
            mm = self._mmaps.get(str(path))
            if mm is None:
                with open(path, "rb") as f:
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                self._mmaps[str(path)] = mm
            dt = _DTYPES.get(t.data_type)
            if dt is None:
                raise RlxError(f"initializer {t.name!r}: unsupported ONNX data type {t.data_type}")
            np_dt = np.dtype(np.uint16 if dt == "bf16" else helper_np(t.data_type)).newbyteorder("<")
            count = math.prod(t.dims)
            off = info.offset or 0
            if info.length is not None and info.length != count * np_dt.itemsize:
                raise RlxError(f"initializer {t.name!r}: external length {info.length} != {count * np_dt.itemsize}")
            return np.frombuffer(mm, np_dt, count=count, offset=off).reshape(tuple(t.dims))  # zero-copy
        arr = numpy_helper.to_array(t)
        if t.data_type == 16:  # bf16 arrives widened to float32 by some onnx versions
            arr = f32_to_bf16(arr) if arr.dtype == np.float32 else arr.view(np.uint16)
        return arr


def helper_np(elem_type: int):
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


def _attrs(node) -> dict:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode("utf-8") for x in v]
        out[a.name] = v
    return out


# ----------------------------------------------------------------------------------------- lowerings

Lowering = Callable[[_Ctx, object, dict], None]
LOWER: dict[str, Lowering] = {}

_SAME = ["Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tan", "Tanh", "Sigmoid", "Relu", "Erf",
         "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
         "Floor", "Ceil", "Round", "Sign", "Not", "Softplus", "Softsign", "Identity", "Add", "Sub", "Mul", "Div",
         "Pow", "Equal", "Less", "LessEqual", "Greater", "GreaterEqual", "And", "Or", "Where", "MatMul",
         "GlobalAveragePool"]


def _direct(op):
    def lower(ctx, n, a):
        ctx.emit(op, [i for i in n.input if i], {}, n.output[0])
    return lower


for _op in _SAME:
    LOWER[_op] = _direct(_op)


def _attr_copy(op, keys):
    def lower(ctx, n, a):
        ctx.emit(op, [i for i in n.input if i], {k: a[k] for k in keys if k in a}, n.output[0])
    return lower


LOWER["LeakyRelu"] = _attr_copy("LeakyRelu", ["alpha"])
LOWER["Elu"] = _attr_copy("Elu", ["alpha"])
LOWER["Selu"] = _attr_copy("Selu", ["alpha", "gamma"])
LOWER["Gelu"] = _attr_copy("Gelu", ["approximate"])
LOWER["Transpose"] = _attr_copy("Transpose", ["perm"])
LOWER["Concat"] = _attr_copy("Concat", ["axis"])
LOWER["Gather"] = _attr_copy("Gather", ["axis"])
LOWER["Flatten"] = _attr_copy("Flatten", ["axis"])
LOWER["DepthToSpace"] = _attr_copy("DepthToSpace", ["blocksize", "mode"])
LOWER["ArgMax"] = _attr_copy("ArgMax", ["axis", "keepdims", "select_last_index"])
LOWER["ArgMin"] = _attr_copy("ArgMin", ["axis", "keepdims", "select_last_index"])
LOWER["Range"] = _direct("Range")
LOWER["Einsum"] = _attr_copy("Einsum", ["equation"])
LOWER["GatherElements"] = _attr_copy("GatherElements", ["axis"])
LOWER["ScatterND"] = _attr_copy("ScatterND", ["reduction"])


def _topk_lower(ctx, n, a):
    k = a["k"] if ctx.opset < 10 else ctx.ints(n.input[1], "TopK k")[0]
    if a.get("sorted", 1) == 0:
        pass  # unsorted output order is implementation-defined: sorted satisfies it
    base = {"k": k, "axis": a.get("axis", -1), "largest": a.get("largest", 1)}
    for out, kind in zip(n.output, ("values", "indices")):
        if out:
            ctx.emit("TopK", [n.input[0]], {**base, "output": kind}, out)


LOWER["TopK"] = _topk_lower
LOWER["ScatterElements"] = _attr_copy("ScatterElements", ["axis", "reduction"])


def _trilu_lower(ctx, n, a):
    k = ctx.ints(n.input[1], "Trilu k")[0] if len(n.input) > 1 and n.input[1] else 0
    ctx.emit("Trilu", [n.input[0]], {"upper": a.get("upper", 1), "k": k}, n.output[0])


def _isnan(ctx, n, a):
    x = n.input[0]
    ctx.emit("Not", [ctx.emit("Equal", [x, x])], {}, n.output[0])  # NaN is the only value != itself


def _isinf(ctx, n, a):
    x = n.input[0]
    pos, neg = a.get("detect_positive", 1), a.get("detect_negative", 1)
    inf = ctx.const(np.array(np.inf, _np(ctx, x)))
    if pos and neg:
        ctx.emit("Equal", [ctx.emit("Abs", [x]), inf], {}, n.output[0])
    elif pos:
        ctx.emit("Equal", [x, inf], {}, n.output[0])
    else:
        ctx.emit("Equal", [x, ctx.emit("Neg", [inf])], {}, n.output[0])


def _size(ctx, n, a):
    ctx.emit("ReduceProd", [ctx.emit("Shape", [n.input[0]])], {"keepdims": 0}, n.output[0])


def _reduce_composite(kind):
    def lower(ctx, n, a):
        x = n.input[0]
        axes = _axes_from(ctx, n, a, 1)
        keep = a.get("keepdims", 1)
        if kind == "L1":
            ctx.emit("ReduceSum", [ctx.emit("Abs", [x])], {"axes": axes, "keepdims": keep}, n.output[0])
        elif kind == "L2":
            s = ctx.emit("ReduceSum", [ctx.emit("Mul", [x, x])], {"axes": axes, "keepdims": keep})
            ctx.emit("Sqrt", [s], {}, n.output[0])
        elif kind == "LogSum":
            ctx.emit("Log", [ctx.emit("ReduceSum", [x], {"axes": axes, "keepdims": keep})], {}, n.output[0])
        else:  # LogSumExp, max-shifted so large inputs do not overflow
            m = ctx.emit("ReduceMax", [x], {"axes": axes, "keepdims": 1})
            s = ctx.emit("ReduceSum", [ctx.emit("Exp", [ctx.emit("Sub", [x, m])])], {"axes": axes, "keepdims": 1})
            out = ctx.emit("Add", [ctx.emit("Log", [s]), m])
            if keep:
                ctx.emit("Identity", [out], {}, n.output[0])
            else:
                r = ctx.rank(x)
                if r is None and axes is None:
                    raise Unsupported("ReduceLogSumExp keepdims=0 on an input of unknown rank")
                ctx.emit("Squeeze", [out], {"axes": axes if axes is not None else list(range(r))}, n.output[0])
    return lower


def _per_axis(ctx, n, a, name: str, x: str) -> str:
    """A scale/zero-point operand shaped to broadcast along `axis` of x (per-axis quantization)."""
    v = ctx.value(name)
    t = ctx.types.get(name)
    rank1 = (v is not None and v.ndim == 1 and v.size > 1) or (t is not None and t[1] is not None and len(t[1]) == 1
                                                               and t[1][0] != 1)
    if not rank1:
        return name
    r = ctx.rank(x)
    if r is None:
        raise Unsupported("per-axis (de)quantization on an input of unknown rank")
    axis = a.get("axis", 1) % r
    return ctx.emit("Reshape", [name], {"shape": [-1 if i == axis else 1 for i in range(r)]})


def _dequantize_linear(ctx, n, a):
    if a.get("block_size", 0):
        raise Unsupported("DequantizeLinear block_size")
    x, scale = n.input[0], n.input[1]
    s = _per_axis(ctx, n, a, scale, x)
    xf = ctx.emit("Cast", [x], {"to": ctx.dtype(scale) or "f32"})
    if len(n.input) > 2 and n.input[2]:
        zp = ctx.emit("Cast", [_per_axis(ctx, n, a, n.input[2], x)], {"to": ctx.dtype(scale) or "f32"})
        xf = ctx.emit("Sub", [xf, zp])
    ctx.emit("Mul", [xf, s], {}, n.output[0])


_QRANGE = {"u8": (0, 255), "i8": (-128, 127), "i16": (-32768, 32767), "i32": (-(2**31), 2**31 - 1)}


def _quantize_linear(ctx, n, a):
    if a.get("block_size", 0):
        raise Unsupported("QuantizeLinear block_size")
    x, scale = n.input[0], n.input[1]
    has_zp = len(n.input) > 2 and n.input[2]
    out_t = ctx.dtype(n.input[2]) if has_zp else _DTYPES.get(a.get("output_dtype", 2), "u8")
    if out_t not in _QRANGE:
        raise Unsupported(f"QuantizeLinear to {out_t}")
    q = ctx.emit("Round", [ctx.emit("Div", [x, _per_axis(ctx, n, a, scale, x)])])  # half to even, as ONNX
    if has_zp:
        q = ctx.emit("Add", [q, ctx.emit("Cast", [_per_axis(ctx, n, a, n.input[2], x)], {"to": ctx.dtype(x) or "f32"})])
    lo, hi = _QRANGE[out_t]
    ctx.emit("Cast", [ctx.emit("Clip", [q], {"min": float(lo), "max": float(hi)})], {"to": out_t}, n.output[0])


LOWER["DequantizeLinear"] = _dequantize_linear
LOWER["QuantizeLinear"] = _quantize_linear
LOWER["Trilu"] = _trilu_lower
LOWER["IsNaN"] = _isnan
LOWER["IsInf"] = _isinf
LOWER["Size"] = _size
LOWER["ReduceL1"] = _reduce_composite("L1")
LOWER["ReduceL2"] = _reduce_composite("L2")
LOWER["ReduceLogSum"] = _reduce_composite("LogSum")
LOWER["ReduceLogSumExp"] = _reduce_composite("LogSumExp")


def _dropout(ctx, n, a):
    if len(n.output) > 1 and n.output[1]:
        raise Unsupported("Dropout mask output")
    ctx.emit("Identity", [n.input[0]], {}, n.output[0])


LOWER["Dropout"] = _dropout


def _cast(ctx, n, a):
    to = _DTYPES.get(a["to"])
    if to is None:
        raise Unsupported(f"Cast to ONNX type {a['to']}")
    ctx.emit("Cast", [n.input[0]], {"to": to}, n.output[0])


LOWER["Cast"] = _cast


def _softmax(op):
    def lower(ctx, n, a):
        axis = a.get("axis", -1 if ctx.opset >= 13 else 1)
        r = ctx.rank(n.input[0])
        if ctx.opset >= 13 or (r is not None and axis % r == r - 1):
            ctx.emit(op, [n.input[0]], {"axis": axis}, n.output[0])
            return
        # opset < 13: softmax over the input flattened to 2-D at `axis`
        flat = ctx.emit("Flatten", [n.input[0]], {"axis": axis})
        sm = ctx.emit(op, [flat], {"axis": 1})
        ctx.emit("Reshape", [sm, ctx.emit("Shape", [n.input[0]])], {}, n.output[0])
    return lower


LOWER["Softmax"] = _softmax("Softmax")
LOWER["LogSoftmax"] = _softmax("LogSoftmax")


def _softmin(ctx, n, a):
    neg = ctx.emit("Neg", [n.input[0]])
    LOWER["Softmax"](ctx, _Fake([neg], n.output), a)


class _Fake:
    def __init__(self, inputs, outputs):
        self.input, self.output = list(inputs), list(outputs)


LOWER["Softmin"] = _softmin


def _variadic(op):
    def lower(ctx, n, a):
        ins = [i for i in n.input if i]
        if len(ins) == 1:
            ctx.emit("Identity", ins, {}, n.output[0])
            return
        acc = ins[0]
        for k, i in enumerate(ins[1:]):
            acc = ctx.emit(op, [acc, i], {}, n.output[0] if k == len(ins) - 2 else None)
    return lower


LOWER["Sum"] = _variadic("Add")
LOWER["Max"] = _variadic("Max")
LOWER["Min"] = _variadic("Min")


def _mean(ctx, n, a):
    ins = [i for i in n.input if i]
    total = ins[0]
    for i in ins[1:]:
        total = ctx.emit("Add", [total, i])
    ctx.emit("Div", [total, ctx.const(np.array(len(ins), _np(ctx, ins[0])))], {}, n.output[0])


LOWER["Mean"] = _mean


def _np(ctx, name):
    from rlx_format.dtypes import compute_dtype
    return compute_dtype(ctx.dtype(name) or "f32")


def _clip(ctx, n, a):
    attrs = {}
    ins = [n.input[0]]
    if ctx.opset < 11:
        attrs = {k: a[k] for k in ("min", "max") if k in a}
    else:
        for pos, key in ((1, "min"), (2, "max")):
            if len(n.input) > pos and n.input[pos]:
                v = ctx.value(n.input[pos])
                if v is None:
                    raise Unsupported("Clip with run-time bounds")
                attrs[key] = float(np.asarray(v).reshape(()))
    ctx.emit("Clip", ins, attrs, n.output[0])


LOWER["Clip"] = _clip


def _emit_hard_sigmoid(ctx, x: str, alpha: float, beta: float, name: str | None = None) -> str:
    dt = _np(ctx, x)
    lin = ctx.emit("Add", [ctx.emit("Mul", [x, ctx.const(np.array(alpha, dt))]), ctx.const(np.array(beta, dt))])
    return ctx.emit("Clip", [lin], {"min": 0.0, "max": 1.0}, name)


def _hard_sigmoid(ctx, n, a):
    _emit_hard_sigmoid(ctx, n.input[0], a.get("alpha", 0.2), a.get("beta", 0.5), n.output[0])


LOWER["HardSigmoid"] = _hard_sigmoid


def _hard_swish(ctx, n, a):
    x = n.input[0]
    ctx.emit("Mul", [x, _emit_hard_sigmoid(ctx, x, 1 / 6, 0.5)], {}, n.output[0])


def _mish(ctx, n, a):
    x = n.input[0]
    ctx.emit("Mul", [x, ctx.emit("Tanh", [ctx.emit("Softplus", [x])])], {}, n.output[0])


def _celu(ctx, n, a):
    x = n.input[0]
    dt = _np(ctx, x)
    alpha = ctx.const(np.array(a.get("alpha", 1.0), dt))
    zero = ctx.const(np.array(0, dt))
    neg = ctx.emit("Mul", [alpha, ctx.emit("Sub", [ctx.emit("Exp", [ctx.emit("Div", [x, alpha])]),
                                                   ctx.const(np.array(1, dt))])])
    ctx.emit("Add", [ctx.emit("Max", [x, zero]), ctx.emit("Min", [neg, zero])], {}, n.output[0])


def _thresholded_relu(ctx, n, a):
    x = n.input[0]
    dt = _np(ctx, x)
    ctx.emit("Where", [ctx.emit("Greater", [x, ctx.const(np.array(a.get("alpha", 1.0), dt))]), x,
                       ctx.const(np.array(0, dt))], {}, n.output[0])


def _shrink(ctx, n, a):
    x = n.input[0]
    dt = _np(ctx, x)
    lambd, bias = ctx.const(np.array(a.get("lambd", 0.5), dt)), ctx.const(np.array(a.get("bias", 0.0), dt))
    zero = ctx.const(np.array(0, dt))
    low = ctx.emit("Where", [ctx.emit("Less", [x, ctx.emit("Neg", [lambd])]), ctx.emit("Add", [x, bias]), zero])
    ctx.emit("Where", [ctx.emit("Greater", [x, lambd]), ctx.emit("Sub", [x, bias]), low], {}, n.output[0])


LOWER["HardSwish"] = _hard_swish
LOWER["Mish"] = _mish
LOWER["Celu"] = _celu
LOWER["ThresholdedRelu"] = _thresholded_relu
LOWER["Shrink"] = _shrink


def _prelu(ctx, n, a):
    x, slope = n.input[0], n.input[1]
    xr = ctx.rank(x)
    sv = ctx.value(slope)
    if sv is not None and xr is not None and sv.ndim == 1 and sv.size > 1 and xr > 2:
        slope = ctx.emit("Reshape", [slope], {"shape": [sv.size] + [1] * (xr - 2)})  # per-channel slope
    zero = ctx.const(np.array(0, _np(ctx, x)))
    ctx.emit("Where", [ctx.emit("Less", [x, zero]), ctx.emit("Mul", [x, slope]), x], {}, n.output[0])


LOWER["PRelu"] = _prelu


def _gemm(ctx, n, a):
    A, B = n.input[0], n.input[1]
    if a.get("transA", 0):
        A = ctx.emit("Transpose", [A], {"perm": [1, 0]})
    if a.get("transB", 0):
        B = ctx.emit("Transpose", [B], {"perm": [1, 0]})
    dt = _np(ctx, n.input[0])
    y = ctx.emit("MatMul", [A, B])
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    has_c = len(n.input) > 2 and n.input[2]
    if alpha != 1.0:
        y = ctx.emit("Mul", [y, ctx.const(np.array(alpha, dt))], {}, None if has_c else n.output[0])
    if has_c:
        c = n.input[2]
        if beta != 1.0:
            c = ctx.emit("Mul", [c, ctx.const(np.array(beta, dt))])
        ctx.emit("Add", [y, c], {}, n.output[0])
    elif alpha == 1.0:
        ctx.emit("Identity", [y], {}, n.output[0])


LOWER["Gemm"] = _gemm


def _reshape(ctx, n, a):
    if ctx.opset < 5:
        ctx.emit("Reshape", [n.input[0]], {"shape": a["shape"]}, n.output[0])
        return
    if a.get("allowzero", 0):
        raise Unsupported("Reshape allowzero=1")
    v = ctx.value(n.input[1])
    if v is not None:
        ctx.emit("Reshape", [n.input[0]], {"shape": [int(x) for x in v.reshape(-1)]}, n.output[0])
    else:
        ctx.emit("Reshape", [n.input[0], n.input[1]], {}, n.output[0])


LOWER["Reshape"] = _reshape


def _axes_from(ctx, n, a, pos: int, attr: str = "axes"):
    if attr in a:
        return list(a[attr])
    if len(n.input) > pos and n.input[pos]:
        return ctx.ints(n.input[pos], attr)
    return None


def _squeeze(op):
    def lower(ctx, n, a):
        axes = _axes_from(ctx, n, a, 1)
        ctx.emit(op, [n.input[0]], {"axes": axes}, n.output[0])
    return lower


LOWER["Squeeze"] = _squeeze("Squeeze")
LOWER["Unsqueeze"] = _squeeze("Unsqueeze")


def _reduce(op):
    def lower(ctx, n, a):
        axes = _axes_from(ctx, n, a, 1)
        if axes == [] or (axes is None and a.get("noop_with_empty_axes", 0)):
            if a.get("noop_with_empty_axes", 0):
                ctx.emit("Identity", [n.input[0]], {}, n.output[0])
                return
            axes = None
        ctx.emit(op, [n.input[0]], {"axes": axes, "keepdims": a.get("keepdims", 1)}, n.output[0])
    return lower


for _op in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"]:
    LOWER[_op] = _reduce(_op)


def _reduce_sum_square(ctx, n, a):
    sq = ctx.emit("Mul", [n.input[0], n.input[0]])
    LOWER["ReduceSum"](ctx, _Fake([sq] + list(n.input[1:]), n.output), a)


LOWER["ReduceSumSquare"] = _reduce_sum_square


def _slice(ctx, n, a):
    if ctx.opset < 10:
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts = ctx.ints(n.input[1], "Slice starts")
        ends = ctx.ints(n.input[2], "Slice ends")
        axes = ctx.ints(n.input[3], "Slice axes") if len(n.input) > 3 and n.input[3] else None
        steps = ctx.ints(n.input[4], "Slice steps") if len(n.input) > 4 and n.input[4] else None
    clamp = lambda v: max(min(v, 2**62), -(2**62))  # noqa: E731 - INT64_MAX sentinels
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
        pads = ctx.ints(n.input[1], "Pad pads")
        value = 0.0
        if len(n.input) > 2 and n.input[2]:
            v = ctx.value(n.input[2])
            if v is None:
                raise Unsupported("Pad with a run-time constant_value")
            value = float(np.asarray(v).reshape(()))
        axes = ctx.ints(n.input[3], "Pad axes") if len(n.input) > 3 and n.input[3] else None
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
    val = numpy_helper.to_array(t) if t is not None else np.zeros(1, np.float32)
    dt = _DTYPES.get(t.data_type, "f32") if t is not None else "f32"
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
            raise Unsupported("Resize with run-time scales/sizes")
        return v.reshape(-1) if v.size else None

    scales, sizes = given(scales_in), given(sizes_in)
    r = ctx.rank(n.input[0])
    axes = a.get("axes")
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


def _cumsum(ctx, n, a):
    axis = ctx.ints(n.input[1], "CumSum axis")[0]
    ctx.emit("CumSum", [n.input[0]], {"axis": axis, "exclusive": a.get("exclusive", 0), "reverse": a.get("reverse", 0)},
             n.output[0])


LOWER["CumSum"] = _cumsum


def _auto_pad(ctx, n, a, kernel):
    mode = a.get("auto_pad", "NOTSET")
    if mode in ("NOTSET", "VALID"):
        return a.get("pads") if mode == "NOTSET" else [0] * (2 * len(kernel))
    t = ctx.types.get(n.input[0])
    if t is None or not all(isinstance(d, int) for d in t[1][2:]):
        raise Unsupported(f"auto_pad={mode} on an input whose spatial dims are unknown at import time")
    strides = a.get("strides") or [1] * len(kernel)
    dil = a.get("dilations") or [1] * len(kernel)
    begin, end = [], []
    for d, k, s, dl in zip(t[1][2:], kernel, strides, dil):
        out = -(-d // s)
        total = max(0, (out - 1) * s + (k - 1) * dl + 1 - d)
        small, big = total // 2, total - total // 2
        begin.append(big if mode == "SAME_LOWER" else small)
        end.append(small if mode == "SAME_LOWER" else big)
    return begin + end


def _conv(op):
    def lower(ctx, n, a):
        w = ctx.value(n.input[1])
        kernel = a.get("kernel_shape") or (list(w.shape[2:]) if w is not None else None)
        if kernel is None:
            raise Unsupported(f"{op} with a run-time weight and no kernel_shape")
        if a.get("output_shape"):
            raise Unsupported("ConvTranspose output_shape")
        attrs = {k: a[k] for k in ("strides", "dilations", "group", "output_padding") if k in a}
        if op == "Conv":
            attrs.pop("output_padding", None)
        pads = _auto_pad(ctx, n, a, kernel)
        if pads is not None:
            attrs["pads"] = list(pads)
        ctx.emit(op, [i for i in n.input if i], attrs, n.output[0])
    return lower


LOWER["Conv"] = _conv("Conv")
LOWER["ConvTranspose"] = _conv("ConvTranspose")


def _pool(op):
    def lower(ctx, n, a):
        if len(n.output) > 1 and n.output[1]:
            raise Unsupported(f"{op} indices output")
        if a.get("storage_order", 0):
            raise Unsupported(f"{op} storage_order=1")
        kernel = a["kernel_shape"]
        attrs = {"kernel_shape": kernel, "ceil_mode": a.get("ceil_mode", 0)}
        if a.get("strides"):
            attrs["strides"] = a["strides"]
        pads = _auto_pad(ctx, n, a, kernel)
        if pads is not None:
            attrs["pads"] = list(pads)
        if op == "MaxPool" and a.get("dilations"):
            attrs["dilations"] = a["dilations"]
        if op == "AveragePool":
            if a.get("dilations") and any(d != 1 for d in a["dilations"]):
                raise Unsupported("AveragePool with dilations")
            attrs["count_include_pad"] = a.get("count_include_pad", 0)
        ctx.emit(op, [n.input[0]], attrs, n.output[0])
    return lower


LOWER["MaxPool"] = _pool("MaxPool")
LOWER["AveragePool"] = _pool("AveragePool")


def _global_max_pool(ctx, n, a):
    r = ctx.rank(n.input[0])
    if r is None:
        raise Unsupported("GlobalMaxPool on an input of unknown rank")
    ctx.emit("ReduceMax", [n.input[0]], {"axes": list(range(2, r)), "keepdims": 1}, n.output[0])


LOWER["GlobalMaxPool"] = _global_max_pool


def _batchnorm(ctx, n, a):
    if any(o for o in n.output[1:]):
        raise Unsupported("BatchNormalization training outputs")
    ctx.emit("BatchNormalization", list(n.input[:5]), {"epsilon": a.get("epsilon", 1e-5)}, n.output[0])


LOWER["BatchNormalization"] = _batchnorm


def _instancenorm(ctx, n, a):
    s = ctx.value(n.input[1])
    c = s.shape[0] if s is not None else None
    t = ctx.types.get(n.input[0])
    if c is None and t is not None and isinstance(t[1][1], int):
        c = t[1][1]
    if c is None:
        raise Unsupported("InstanceNormalization with an unknown channel count")
    ctx.emit("GroupNorm", list(n.input[:3]), {"num_groups": int(c), "epsilon": a.get("epsilon", 1e-5)}, n.output[0])


LOWER["InstanceNormalization"] = _instancenorm


def _layernorm(ctx, n, a):
    if any(o for o in n.output[1:]):
        raise Unsupported("LayerNormalization mean/inv-std outputs")
    ctx.emit("LayerNorm", [i for i in n.input if i], {"axis": a.get("axis", -1), "epsilon": a.get("epsilon", 1e-5)},
             n.output[0])


LOWER["LayerNormalization"] = _layernorm


def _rmsnorm(ctx, n, a):
    ctx.emit("RMSNorm", list(n.input[:2]), {"axis": a.get("axis", -1), "epsilon": a.get("epsilon", 1e-5)},
             n.output[0])


LOWER["RMSNormalization"] = _rmsnorm


def _lrn(ctx, n, a):
    x = n.input[0]
    if ctx.rank(x) != 4:
        raise Unsupported("LRN on a non-4-D input")
    size = a["size"]
    dt = _np(ctx, x)
    sq = ctx.emit("Mul", [x, x])
    sq5 = ctx.emit("Unsqueeze", [sq], {"axes": [1]})
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    mean = ctx.emit("AveragePool", [sq5], {"kernel_shape": [size, 1, 1], "pads": [lo, 0, 0, hi, 0, 0],
                                           "count_include_pad": 1})
    ssum = ctx.emit("Squeeze", [mean], {"axes": [1]})  # mean over `size` = sum / size
    base = ctx.emit("Add", [ctx.const(np.array(a.get("bias", 1.0), dt)),
                            ctx.emit("Mul", [ssum, ctx.const(np.array(a.get("alpha", 1e-4), dt))])])
    ctx.emit("Div", [x, ctx.emit("Pow", [base, ctx.const(np.array(a.get("beta", 0.75), dt))])], {}, n.output[0])


LOWER["LRN"] = _lrn


def _lp_norm(ctx, n, a):
    x, p, axis = n.input[0], a.get("p", 2), a.get("axis", -1)
    if p == 2:
        norm = ctx.emit("Sqrt", [ctx.emit("ReduceSum", [ctx.emit("Mul", [x, x])], {"axes": [axis]})])
    elif p == 1:
        norm = ctx.emit("ReduceSum", [ctx.emit("Abs", [x])], {"axes": [axis]})
    else:
        raise Unsupported(f"LpNormalization p={p}")
    ctx.emit("Div", [x, norm], {}, n.output[0])


LOWER["LpNormalization"] = _lp_norm


def _constant(ctx, n, a):
    if "value" in a:
        arr = numpy_helper.to_array(a["value"])
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
    dt = _DTYPES.get(a["value"].data_type) if "value" in a else ("f32" if arr.dtype.kind == "f" else "i64")
    if dt is not None:
        ctx.types[n.output[0]] = (dt, tuple(arr.shape))


LOWER["Constant"] = _constant


# ----------------------------------------------------------------------------------------- driver


def _value_type(vi) -> tuple[str, tuple] | None:
    tt = vi.type.tensor_type
    dt = _DTYPES.get(tt.elem_type)
    if dt is None or not tt.HasField("shape"):
        return (dt, None) if dt else None
    dims = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(f"{vi.name}:d{i}")
    return dt, tuple(dims)


def import_onnx(path: str | os.PathLike) -> tuple[Graph, WeightSet]:
    """Load an ONNX model as an rlx Graph plus its initializers (params with weights)."""
    if onnx is None:
        raise RlxError("ONNX import needs the onnx package: pip install 'rlx[onnx]'")
    path = Path(path)
    if not path.is_file():
        raise RlxError(f"{path}: no such ONNX file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises several types
        raise RlxError(f"{path}: not a valid ONNX model ({type(e).__name__}: {e})") from None
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is only a helper for ranks
        inferred = model
    ctx = _Ctx(model, path.parent)
    g = model.graph
    for vi in list(inferred.graph.value_info) + list(g.input) + list(g.output):
        t = _value_type(vi)
        if t is not None:
            ctx.types[vi.name] = t
    for t in g.initializer:
        try:
            ctx.inits[t.name] = ctx.tensor(t)
        except RlxError:
            raise
        except Exception as e:  # noqa: BLE001 - onnx/numpy raise many types for corrupt tensors
            raise RlxError(f"{path}: initializer {t.name!r} is malformed ({type(e).__name__}: {e})") from None
        ctx.init_dtype[t.name] = _DTYPES.get(t.data_type, "?")
        ctx.types[t.name] = (ctx.init_dtype[t.name], tuple(ctx.inits[t.name].shape))
        ctx.names.add(t.name)
    init_names = set(ctx.inits)
    inputs = []
    for vi in g.input:
        if vi.name in init_names:
            continue
        t = _value_type(vi)
        if t is None or t[1] is None:
            raise RlxError(f"{path}: graph input {vi.name!r} has an unsupported type or no shape")
        inputs.append(Value(vi.name, t[0], t[1]))
        ctx.names.add(vi.name)
    unsupported: Counter = Counter()
    where: dict[str, list[str]] = {}
    for i, n in enumerate(g.node):
        if n.domain not in ("", "ai.onnx"):
            key = f"{n.domain}.{n.op_type}"
        else:
            key = n.op_type
        label = n.name or (n.output[0] if n.output else f"#{i}")
        lower = LOWER.get(n.op_type) if n.domain in ("", "ai.onnx") else None
        if lower is None:
            unsupported[key] += 1
            where.setdefault(key, []).append(label)
            continue
        try:
            lower(ctx, n, _attrs(n))
        except Unsupported as e:
            key = f"{n.op_type} ({e})"
            unsupported[key] += 1
            where.setdefault(key, []).append(label)
        except KeyError as e:
            key = f"{n.op_type} (missing attribute {e})"
            unsupported[key] += 1
            where.setdefault(key, []).append(label)
        except RlxError:
            raise
        except Exception as e:  # noqa: BLE001 - a corrupt node (bad tensor attr, missing inputs, ...)
            raise RlxError(f"{path}: node {label!r} ({n.op_type}) is malformed ({type(e).__name__}: {e})") from None
    if unsupported:
        lines = [f"  {op}: {count} node(s), e.g. {', '.join(where[op][:5])}" for op, count in unsupported.most_common()]
        raise RlxError(f"{path}: {sum(unsupported.values())} node(s) use ops rlx does not support:\n"
                       + "\n".join(lines) + "\nsupported ONNX ops: " + ", ".join(sorted(LOWER)))
    used = {i for n in ctx.nodes for i in n.inputs} | {o.name for o in g.output}
    weights = WeightSet()
    weights.sources.append(str(path))
    params = []
    for name, arr in ctx.inits.items():
        if name not in used:
            continue
        dt = ctx.init_dtype[name]
        if dt == "?":
            raise RlxError(f"{path}: initializer {name!r} has an unsupported data type")
        params.append(Value(name, dt, tuple(arr.shape)))
        weights[name] = arr
        weights.dtypes[name] = dt
    consts = []
    for name, arr in ctx.consts.items():
        if name not in used:
            continue
        from rlx_format.dtypes import dtype_of_array
        dt = dtype_of_array(arr)
        consts.append(Value(name, dt, tuple(arr.shape), arr))
    outputs = [o.name for o in g.output]
    graph = Graph(g.name or path.stem, inputs, params, consts, ctx.nodes, outputs)
    return graph, weights
