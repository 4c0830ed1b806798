"""The op table: every catalogue op with its arity, attrs (type + default) and inference rule."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..dtypes import DTYPES
from ..errors import GraphError, brief
from .core import INT64_MAX, INT64_MIN, REQUIRED, Attr, OpSpec, infer_float_unary, infer_numeric_unary, infer_same
from .infer_control import infer_if, infer_item, infer_loop, infer_scan
from .infer_elementwise import (
    infer_argreduce, infer_arith, infer_axis_same, infer_cast, infer_clip, infer_compare, infer_logic, infer_not,
    infer_reduce, infer_where,
)
from .infer_integer import infer_conv_integer, infer_matmul_integer
from .infer_nn import (
    QUANT_BLOCKS, infer_batchnorm, infer_conv, infer_conv_transpose, infer_dequant_gather, infer_dequant_matmul,
    infer_dequantize, infer_fused_conv, infer_fused_matmul, infer_global_pool, infer_groupnorm, infer_matmul,
    infer_norm_last, infer_pool, infer_random, infer_sdpa, infer_squeeze_excite,
)
from .infer_rnn import OPTIONAL as RNN_OPTIONAL
from .infer_rnn import infer_recurrent
from .infer_shape import (
    infer_concat, infer_constant_of_shape, infer_depth_to_space, infer_einsum, infer_expand, infer_flatten,
    infer_gather, infer_gather_elements, infer_gather_nd, infer_pad, infer_range, infer_reshape, infer_resize,
    infer_scatter_elements, infer_scatter_nd, infer_shape_of, infer_slice, infer_squeeze, infer_tile, infer_topk,
    infer_transpose, infer_trilu, infer_unsqueeze,
)

# ---------------------------------------------------------------------------- the table

OPS: dict[str, OpSpec] = {}


def _reg(name, n_in, infer, attrs=None, kind="compute", doc=""):
    lo, hi = (n_in, n_in) if isinstance(n_in, int) else n_in
    OPS[name] = OpSpec(name, lo, hi, attrs or {}, infer, kind, doc)


_FLOAT_UNARY = ["Exp", "Log", "Sqrt", "Rsqrt", "Reciprocal", "Sin", "Cos", "Tan", "Tanh", "Sigmoid",
                "Silu", "Softplus", "Softsign", "Erf", "Floor", "Ceil", "Round", "Asin", "Acos", "Atan", "Sinh",
                "Cosh", "Asinh", "Acosh", "Atanh"]
for _n in _FLOAT_UNARY:
    _reg(_n, 1, infer_float_unary)
for _n in ["Neg", "Abs", "Relu", "Sign"]:
    _reg(_n, 1, infer_numeric_unary)
_reg("Identity", 1, infer_same)
_reg("LeakyRelu", 1, infer_float_unary, {"alpha": Attr("float", 0.01)})
_reg("Elu", 1, infer_float_unary, {"alpha": Attr("float", 1.0)})
_reg("Selu", 1, infer_float_unary, {"alpha": Attr("float", 1.6732632423543772),
                               "gamma": Attr("float", 1.0507009873554805)})
_reg("Gelu", 1, infer_float_unary, {"approximate": Attr("str", "none", ("none", "tanh"))})
_reg("Clip", (1, 3), infer_clip, {"min": Attr("float", None, nonfinite=True),
                                  "max": Attr("float", None, nonfinite=True)})
_reg("Cast", 1, infer_cast, {"to": Attr("dtype")})
_reg("Not", 1, infer_not)
for _n in ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]:
    _reg(_n, 2, infer_arith)
_reg("Mod", 2, infer_arith, {"fmod": Attr("int", 0, (0, 1))})
for _n in ["Equal", "Less", "LessEqual", "Greater", "GreaterEqual"]:
    _reg(_n, 2, infer_compare)
for _n in ["And", "Or", "Xor"]:
    _reg(_n, 2, infer_logic)
_reg("Where", 3, infer_where)
for _n in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd"]:
    _reg(_n, 1, infer_reduce, {"axes": Attr("ints", None), "keepdims": Attr("int", 1, (0, 1))})
for _n in ["ArgMax", "ArgMin"]:
    _reg(_n, 1, infer_argreduce, {"axis": Attr("int", 0), "keepdims": Attr("int", 1, (0, 1)),
                             "select_last_index": Attr("int", 0, (0, 1))})
for _n in ["Softmax", "LogSoftmax"]:
    _reg(_n, 1, infer_axis_same, {"axis": Attr("int", -1)})
_reg("CumSum", 1, infer_axis_same, {"axis": Attr("int", 0), "exclusive": Attr("int", 0, (0, 1)),
                               "reverse": Attr("int", 0, (0, 1))})
_reg("Reshape", (1, 2), infer_reshape, {"shape": Attr("ints", None, lo=-1), "allowzero": Attr("int", 0, (0, 1))})
_reg("Transpose", 1, infer_transpose, {"perm": Attr("ints", None)})
_reg("Concat", (1, 1 << 16), infer_concat, {"axis": Attr("int")})
_reg("Slice", (1, 3), infer_slice, {"starts": Attr("ints", None), "ends": Attr("ints", None),
                                    "axes": Attr("ints", None),
                          "steps": Attr("ints", None)})
_reg("Gather", 2, infer_gather, {"axis": Attr("int", 0)})
_reg("Expand", (1, 2), infer_expand, {"shape": Attr("ints", None, lo=0)})
_reg("Tile", (1, 2), infer_tile, {"repeats": Attr("ints", None, lo=0)})
_reg("Squeeze", 1, infer_squeeze, {"axes": Attr("ints", None)})
_reg("Unsqueeze", 1, infer_unsqueeze, {"axes": Attr("ints")})
_reg("Flatten", 1, infer_flatten, {"axis": Attr("int", 1)})
_reg("Pad", (1, 2), infer_pad, {"pads": Attr("ints", None),
                                "mode": Attr("str", "constant", ("constant", "reflect", "edge")),
                      "value": Attr("float", 0.0, nonfinite=True)})
_reg("Shape", 1, infer_shape_of)
_reg("Range", 3, infer_range)
_reg("ConstantOfShape", (0, 1), infer_constant_of_shape, {"shape": Attr("ints", None, lo=0),
                                                     "value": Attr("float", 0.0, nonfinite=True),
                                                     "dtype": Attr("dtype", "f32")})
_reg("DepthToSpace", 1, infer_depth_to_space, {"blocksize": Attr("int", lo=1),
                                               "mode": Attr("str", "DCR", ("DCR", "CRD"))})
_reg("MatMul", 2, infer_matmul)
# compile-time fusion of a MatMul and the bias Add that alone reads it, then a residual Add (rlx_runtime.passes.fuse)
_reg("FusedMatMul", (3, 4), infer_fused_matmul)
_CONV_ATTRS = {"strides": Attr("ints", None, lo=1), "pads": Attr("ints", None, lo=0),
               "dilations": Attr("ints", None, lo=1), "group": Attr("int", 1, lo=1)}
_reg("Conv", (2, 3), infer_conv, dict(_CONV_ATTRS))
# compile-time fusion of a Conv and the activation that alone reads it (rlx_runtime.passes.fuse_conv)
FUSED_CONV_ACTIVATIONS = ("Relu", "Sigmoid", "Silu", "LeakyRelu", "Clip")
# activations FusedConv takes from a pattern of several ops (HardSwish: v * Clip(v * alpha + beta, 0, 1))
FUSED_CONV_PATTERNS = ("HardSwish",)
# and Identity: a conv fused with the residual Add that alone reads it, no activation after (FusedConv's 4th operand)
_reg("FusedConv", (2, 4), infer_fused_conv, {**_CONV_ATTRS,
                                             "activation": Attr("str", choices=FUSED_CONV_ACTIVATIONS
                                                                + FUSED_CONV_PATTERNS + ("Identity",)),
                                             "alpha": Attr("float", 0.01), "beta": Attr("float", 0.5),
                                             "min": Attr("float", None, nonfinite=True),
                                             "max": Attr("float", None, nonfinite=True)})
# compile-time fusion of a squeeze-excite block (rlx_runtime.passes.fuse.fuse_squeeze_excite): x times the gate
# FusedConv(FusedConv(GlobalAveragePool(x), w1, b1), w2, b2), the convs' activations as FusedConv's attrs, the
# second's prefixed gate_
_SE_ACTIVATIONS = FUSED_CONV_ACTIVATIONS + FUSED_CONV_PATTERNS + ("Identity",)
_SE_CONV_ATTRS = {"activation": Attr("str", choices=_SE_ACTIVATIONS), "alpha": Attr("float", 0.01),
                  "beta": Attr("float", 0.5), "min": Attr("float", None, nonfinite=True),
                  "max": Attr("float", None, nonfinite=True)}
_reg("SqueezeExcite", 5, infer_squeeze_excite,
     {prefix + k: v for prefix in ("", "gate_") for k, v in _SE_CONV_ATTRS.items()})
_reg("ConvTranspose", (2, 3), infer_conv_transpose, {**_CONV_ATTRS, "output_padding": Attr("ints", None, lo=0)})
_POOL_ATTRS = {"kernel_shape": Attr("ints", lo=1), "strides": Attr("ints", None, lo=1),
               "pads": Attr("ints", None, lo=0),
               "ceil_mode": Attr("int", 0, (0, 1))}
_reg("MaxPool", 1, infer_pool, {**_POOL_ATTRS, "dilations": Attr("ints", None, lo=1)})
_reg("AveragePool", 1, infer_pool, {**_POOL_ATTRS, "count_include_pad": Attr("int", 0, (0, 1))})
_reg("GlobalAveragePool", 1, infer_global_pool)
_reg("BatchNormalization", 5, infer_batchnorm, {"epsilon": Attr("float", 1e-5, lo=0.0)})
_reg("LayerNorm", (2, 3), infer_norm_last, {"axis": Attr("int", -1), "epsilon": Attr("float", 1e-5, lo=0.0)})
_reg("RMSNorm", 2, infer_norm_last, {"axis": Attr("int", -1), "epsilon": Attr("float", 1e-6, lo=0.0)})
_reg("GroupNorm", 3, infer_groupnorm, {"num_groups": Attr("int", lo=1), "epsilon": Attr("float", 1e-5, lo=0.0)})
_reg("ScaledDotProductAttention", (3, 4), infer_sdpa, {"causal": Attr("int", 0, (0, 1)), "scale": Attr("float", None)})
_ENC = tuple(QUANT_BLOCKS)
_reg("Dequantize", 1, infer_dequantize, {"encoding": Attr("str", REQUIRED, _ENC), "shape": Attr("ints", lo=0)})
_reg("DequantMatMul", 2, infer_dequant_matmul, {"encoding": Attr("str", REQUIRED, _ENC), "N": Attr("int", lo=0),
                                           "K": Attr("int", lo=0)})
_reg("DequantGather", 2, infer_dequant_gather, {"encoding": Attr("str", REQUIRED, _ENC), "N": Attr("int", lo=0),
                                           "K": Attr("int", lo=0)})
_reg("Einsum", (1, 8), infer_einsum, {"equation": Attr("str")})
_REDUCTIONS = ("none", "add", "mul", "max", "min")
_reg("ScatterND", 3, infer_scatter_nd, {"reduction": Attr("str", "none", _REDUCTIONS)})
_reg("ScatterElements", 3, infer_scatter_elements, {"axis": Attr("int", 0),
                                                    "reduction": Attr("str", "none", _REDUCTIONS)})
_reg("TopK", 1, infer_topk, {"k": Attr("int", lo=0), "axis": Attr("int", -1), "largest": Attr("int", 1, (0, 1)),
                        "output": Attr("str", "values", ("values", "indices"))})
_reg("Trilu", 1, infer_trilu, {"upper": Attr("int", 1, (0, 1)), "k": Attr("int", 0)})
_reg("GatherElements", 2, infer_gather_elements, {"axis": Attr("int", 0)})
_reg("GatherND", 2, infer_gather_nd, {"batch_dims": Attr("int", 0, lo=0)})
_reg("Resize", (1, 2), infer_resize, {
    "scales": Attr("floats", None), "sizes": Attr("ints", None, lo=1),
    "mode": Attr("str", "nearest", ("nearest", "linear")),
    "coordinate_transformation_mode": Attr("str", "half_pixel",
                                           ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")),
    "nearest_mode": Attr("str", "round_prefer_floor", ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"))})
_reg("MatMulInteger", (2, 4), infer_matmul_integer, {"optional": Attr("strs", [])})
_reg("ConvInteger", (2, 4), infer_conv_integer, {**_CONV_ATTRS, "optional": Attr("strs", [])})
for _op in ("LSTM", "GRU", "RNN"):
    _rnn_attrs = {"hidden_size": Attr("int", lo=1),
                  "direction": Attr("str", "forward", ("forward", "reverse", "bidirectional")),
                  "activations": Attr("strs", None), "activation_alpha": Attr("floats", None),
                  "activation_beta": Attr("floats", None), "clip": Attr("float", None, lo=0.0),
                  "optional": Attr("strs", [])}
    if _op == "LSTM":
        _rnn_attrs["input_forget"] = Attr("int", 0, (0, 1))
    if _op == "GRU":
        _rnn_attrs["linear_before_reset"] = Attr("int", 0, (0, 1))
    _reg(_op, (3, 3 + len(RNN_OPTIONAL[_op])), infer_recurrent, _rnn_attrs)
_SEED = Attr("int", 0, lo=0)  # numpy's SeedSequence takes non-negative ints; int64 bounds the top
_reg("RandomNormal", 0, infer_random, {"shape": Attr("ints", lo=0), "mean": Attr("float", 0.0),
                                  "scale": Attr("float", 1.0), "seed": _SEED, "dtype": Attr("dtype", "f32")},
     kind="random")
_reg("RandomUniform", 0, infer_random, {"shape": Attr("ints", lo=0), "low": Attr("float", 0.0),
                                   "high": Attr("float", 1.0), "seed": _SEED, "dtype": Attr("dtype", "f32")},
     kind="random")

# control flow (infer_control.py): bodies are closed graphs; the last `num_captures` inputs feed their last inputs
_reg("If", (1, 1 << 16), infer_if, {"then_branch": Attr("graph"), "else_branch": Attr("graph")}, kind="control")
_reg("Loop", (0, 1 << 16), infer_loop, {"body": Attr("graph"), "optional": Attr("strs", []),
                                   "num_captures": Attr("int", 0, lo=0)}, kind="control")
_reg("Scan", (1, 1 << 16), infer_scan, {"body": Attr("graph"), "num_scan_inputs": Attr("int", lo=1),
                                   "scan_input_axes": Attr("ints", None), "scan_input_directions": Attr("ints", None),
                                   "scan_output_axes": Attr("ints", None), "scan_output_directions": Attr("ints", None),
                                   "num_captures": Attr("int", 0, lo=0)}, kind="control")
_reg("Item", 1, infer_item, {"index": Attr("int", lo=0)})

LEAF_OPS = ("Input", "Param", "Constant")
RANDOM_OPS = frozenset(n for n, s in OPS.items() if s.kind == "random")
# ops that map each element on its own (with one input): what passes may apply to a single broadcast row
UNARY_ELEMENTWISE = frozenset(n for n, s in OPS.items()
                              if s.infer in (infer_float_unary, infer_numeric_unary, infer_same, infer_cast))
CONTROL_OPS = frozenset(n for n, s in OPS.items() if s.kind == "control")  # values are tuples; never folded


# the class a "graph" attr holds: rlx_format.graph.Graph registers itself here (graph.py imports this module,
# so the catalogue never imports graph.py back)
BODY_TYPES: list[type] = []


def body_attrs(op: str) -> list[str]:
    """Names of an op's graph-valued attrs (its bodies), in schema order; empty for other ops."""
    spec = OPS.get(op)
    return [k for k, a in spec.attrs.items() if a.kind == "graph"] if spec is not None else []


def bodies(node) -> list:
    """The body graphs of a node (empty for ops without graph attrs), in attr order."""
    return [node.attrs[k] for k in body_attrs(node.op) if k in node.attrs]


def normalize_attrs(op: str, attrs: dict, where: str) -> dict[str, Any]:
    """Type-check attrs against the catalogue and fill defaults. Raises GraphError."""
    spec = OPS[op]
    if not isinstance(attrs, dict):
        raise GraphError(f"{where}: attrs must be an object; got {type(attrs).__name__}")
    unknown = sorted(set(attrs) - set(spec.attrs))
    if unknown:
        raise GraphError(f"{where}: unknown attr(s) {unknown} for {op}; expected a subset of {sorted(spec.attrs)}")
    out: dict[str, Any] = {}
    for name, a in spec.attrs.items():
        if name not in attrs:
            if a.default is REQUIRED:
                raise GraphError(f"{where}: missing required attr {name!r} ({a.kind}) for {op}")
            out[name] = a.default
            continue
        out[name] = _check_attr(attrs[name], a, f"{where}: attr {name!r}")
    return out


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)


def _check_attr(v, a: Attr, where: str):
    if v is None and a.default is None:
        return None
    ok = True
    if a.kind == "int":
        ok = _is_int(v) or isinstance(v, bool)
    elif a.kind == "float":
        ok = _is_number(v)
    elif a.kind == "str":
        ok = isinstance(v, str)
    elif a.kind == "dtype":
        ok = v in DTYPES
    elif a.kind == "strs":
        ok = isinstance(v, (list, tuple)) and all(isinstance(e, str) for e in v)
        v = list(v) if ok else v
    elif a.kind == "graph":
        ok = isinstance(v, tuple(BODY_TYPES))
    elif a.kind in ("ints", "floats"):
        ok = isinstance(v, (list, tuple)) and all(_is_int(e) if a.kind == "ints" else _is_number(e) for e in v)
    if not ok:
        raise GraphError(f"{where} has value {brief(v)}; expected {a.kind}")
    if a.kind in ("int", "ints", "float", "floats"):
        v = _check_numbers(v, a, where)
    if a.choices and v not in a.choices:
        raise GraphError(f"{where} is {v!r}; expected one of {list(a.choices)}")
    return v


def _check_numbers(v, a: Attr, where: str):
    """Convert to int/float (lists entry by entry) and apply the schema's range rules."""
    many = a.kind in ("ints", "floats")
    vals = list(v) if many else [v]
    out: list = []
    for e in vals:
        if a.kind.startswith("int"):
            e = int(e)
            if not INT64_MIN <= e <= INT64_MAX:
                raise GraphError(f"{where} holds {brief(e)}; expected an integer that fits int64")
        else:
            try:
                e = float(e)
            except OverflowError:  # an integer literal beyond float64 (JSON 10**400)
                raise GraphError(f"{where} holds {brief(e)}, beyond the float64 range; expected a finite "
                                 "float") from None
            if not a.nonfinite and not np.isfinite(e):
                raise GraphError(f"{where} holds {e}; expected a finite float")
        if a.lo is not None and e < a.lo:
            got = brief(list(v)) if many else repr(e)
            raise GraphError(f"{where} is {got}; expected {'every entry ' if many else ''}>= {a.lo}")
        out.append(e)
    return out if many else out[0]
