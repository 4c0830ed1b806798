"""Shape/dtype inference for every op in the catalogue, with symbolic dims."""

import numpy as np
import pytest

from rlx_format import GraphBuilder, GraphError
from rlx_format.ops import CONTROL_OPS, OPS

B = "batch"

# op -> (inputs as (dtype, shape) or np.ndarray for constants, attrs, expected (dtype, shape))
CASES = {
    "Identity": ([("f32", [B, 3])], {}, ("f32", (B, 3))),
    "Cast": ([("f32", [B, 3])], {"to": "i64"}, ("i64", (B, 3))),
    "Not": ([("bool", [B])], {}, ("bool", (B,))),
    "Clip": ([("f32", [B, 2])], {"min": 0.0}, ("f32", (B, 2))),
    "Add": ([("f32", [B, 1, 4]), ("f32", [3, 1])], {}, ("f32", (B, 3, 4))),
    "Mod": ([("i64", [4]), ("i64", [1])], {}, ("i64", (4,))),
    "Equal": ([("i32", [B, 4]), ("i32", [4])], {}, ("bool", (B, 4))),
    "And": ([("bool", [B, 1]), ("bool", [5])], {}, ("bool", (B, 5))),
    "Where": ([("bool", [B, 1]), ("f32", [3]), ("f32", [1])], {}, ("f32", (B, 3))),
    "ReduceSum": ([("f32", [B, 3, 4])], {"axes": [1]}, ("f32", (B, 1, 4))),
    "ReduceMean": ([("f32", [B, 3, 4])], {"axes": [-1], "keepdims": 0}, ("f32", (B, 3))),
    "ArgMax": ([("f32", [B, 3, 4])], {"axis": 2, "keepdims": 0}, ("i64", (B, 3))),
    "ArgMin": ([("f32", [B, 3, 4])], {"axis": 1}, ("i64", (B, 1, 4))),
    "Softmax": ([("f32", [B, 7])], {}, ("f32", (B, 7))),
    "CumSum": ([("f32", [B, 7])], {"axis": 1}, ("f32", (B, 7))),
    "Reshape": ([("f32", [B, 3, 4])], {"shape": [0, -1]}, ("f32", (B, 12))),
    "Transpose": ([("f32", [B, 3, 4])], {"perm": [2, 0, 1]}, ("f32", (4, B, 3))),
    "Concat": ([("f32", [B, 3]), ("f32", [B, 5])], {"axis": 1}, ("f32", (B, 8))),
    "Slice": ([("f32", [B, 10])], {"starts": [2], "ends": [-1], "axes": [1], "steps": [3]}, ("f32", (B, 3))),
    "Gather": ([("f32", [100, 16]), ("i64", [B, "seq"])], {}, ("f32", (B, "seq", 16))),
    "Expand": ([("f32", [1, 4])], {"shape": [3, 1]}, ("f32", (3, 4))),
    "Tile": ([("f32", [2, B])], {"repeats": [3, 1]}, ("f32", (6, B))),
    "Squeeze": ([("f32", [B, 1, 4])], {"axes": [1]}, ("f32", (B, 4))),
    "Unsqueeze": ([("f32", [B, 4])], {"axes": [0, -1]}, ("f32", (1, B, 4, 1))),
    "Flatten": ([("f32", [2, 3, 4])], {"axis": 1}, ("f32", (2, 12))),
    "Pad": ([("f32", [2, 3])], {"pads": [1, 0, 1, 2]}, ("f32", (4, 5))),
    "Shape": ([("f32", [B, 3])], {}, ("i64", (2,))),
    "Range": ([np.array(0, np.int64), np.array(10, np.int64), np.array(3, np.int64)], {}, ("i64", (4,))),
    "ConstantOfShape": ([], {"shape": [2, 3], "dtype": "i32"}, ("i32", (2, 3))),
    "DepthToSpace": ([("f32", [B, 8, 3, 4])], {"blocksize": 2}, ("f32", (B, 2, 6, 8))),
    "MatMul": ([("f32", [B, 784]), ("f32", [784, 128])], {}, ("f32", (B, 128))),
    "FusedMatMul": ([("f32", [B, "seq", 64]), ("f32", [64, 32]), ("f32", [1, 32]), ("f32", [B, "seq", 32])], {},
                    ("f32", (B, "seq", 32))),
    "Conv": ([("f32", [B, 4, 9, 9]), ("f32", [8, 2, 3, 3])], {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]},
             ("f32", (B, 8, 5, 5))),
    "FusedConv": ([("f32", [B, 4, 9, 9]), ("f32", [8, 2, 3, 3]), ("f32", [8])],
                  {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1], "activation": "Silu"}, ("f32", (B, 8, 5, 5))),
    "SqueezeExcite": ([("f32", [B, 16, "seq", 7]), ("f32", [4, 16, 1, 1]), ("f32", [4]), ("f32", [16, 4, 1, 1]),
                       ("f32", [16])], {"activation": "Relu", "gate_activation": "Clip", "gate_min": 0.0},
                      ("f32", (B, 16, "seq", 7))),
    "ConvTranspose": ([("f32", [B, 4, 5]), ("f32", [4, 3, 3])], {"strides": [2]}, ("f32", (B, 3, 11))),
    "MaxPool": ([("f32", [B, 3, 7, 7])], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
                ("f32", (B, 3, 3, 3))),
    "AveragePool": ([("f32", [B, 3, 8])], {"kernel_shape": [2], "strides": [2]}, ("f32", (B, 3, 4))),
    "GlobalAveragePool": ([("f32", [B, 3, 8, 8])], {}, ("f32", (B, 3, 1, 1))),
    "BatchNormalization": ([("f32", [B, 3, 8]), ("f32", [3]), ("f32", [3]), ("f32", [3]), ("f32", [3])], {},
                           ("f32", (B, 3, 8))),
    "LayerNorm": ([("f32", [B, "seq", 64]), ("f32", [64]), ("f32", [64])], {}, ("f32", (B, "seq", 64))),
    "RMSNorm": ([("f32", [B, 64]), ("f32", [64])], {}, ("f32", (B, 64))),
    "GroupNorm": ([("f32", [B, 6, 4]), ("f32", [6]), ("f32", [6])], {"num_groups": 3}, ("f32", (B, 6, 4))),
    "ScaledDotProductAttention": ([("f32", [B, 4, "q", 16]), ("f32", [B, 4, "k", 16]), ("f32", [B, 4, "k", 8])],
                                  {"causal": 1}, ("f32", (B, 4, "q", 8))),
    "Dequantize": ([("u8", [4, 68])], {"encoding": "gguf_q8_0", "shape": [4, 64]}, ("f32", (4, 64))),
    "DequantMatMul": ([("f32", [B, 256]), ("u8", [8, 66])], {"encoding": "gguf_tq2_0", "N": 8, "K": 256},
                      ("f32", (B, 8))),
    "DequantGather": ([("u8", [100, 68]), ("i64", [B, "seq"])], {"encoding": "gguf_q8_0", "N": 100, "K": 64},
                      ("f32", (B, "seq", 64))),
    "Trilu": ([("f32", [B, 4, 4])], {"upper": 0, "k": 1}, ("f32", (B, 4, 4))),
    "GatherElements": ([("f32", [B, 5]), ("i64", [B, 2])], {"axis": 1}, ("f32", (B, 2))),
    "ScatterND": ([("f32", [4, 5, 6]), ("i64", [3, 2]), ("f32", [3, 6])], {}, ("f32", (4, 5, 6))),
    "ScatterElements": ([("f32", [4, 5]), ("i64", [2, 5]), ("f32", [2, 5])], {"axis": 0}, ("f32", (4, 5))),
    "TopK": ([("f32", [B, 10])], {"k": 3, "output": "indices"}, ("i64", (B, 3))),
    "Einsum": ([("f32", [B, 4, 5]), ("f32", [5, 6])], {"equation": "...ij,jk->...ik"}, ("f32", (B, 4, 6))),
    "Resize": ([("f32", [B, 3, 4, 5])], {"scales": [1.0, 1.0, 2.0, 1.5], "mode": "linear"}, ("f32", (B, 3, 8, 7))),
    "RandomNormal": ([], {"shape": [2, 3]}, ("f32", (2, 3))),
    "RandomUniform": ([], {"shape": [4], "dtype": "f16"}, ("f16", (4,))),
}
for _op in ["Neg", "Abs", "Exp", "Log", "Sqrt", "Rsqrt", "Reciprocal", "Sin", "Cos", "Tan", "Tanh", "Sigmoid",
            "Relu", "LeakyRelu", "Elu", "Selu", "Gelu", "Silu", "Softplus", "Softsign", "Erf", "Floor", "Ceil",
            "Round", "Sign", "LogSoftmax", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"]:
    CASES[_op] = ([("f32", [B, 5])], {}, ("f32", (B, 5)))
for _op in ["Sub", "Mul", "Div", "Pow", "Max", "Min"]:
    CASES[_op] = ([("f32", [B, 5]), ("f32", [5])], {}, ("f32", (B, 5)))
for _op in ["Less", "LessEqual", "Greater", "GreaterEqual"]:
    CASES[_op] = ([("f32", [B, 5]), ("f32", [1])], {}, ("bool", (B, 5)))
CASES["LSTM"] = ([("f32", [7, B, 5]), ("f32", [2, 24, 5]), ("f32", [2, 24, 6]), ("f32", [2, 48])],
                 {"hidden_size": 6, "direction": "bidirectional", "optional": ["B"]}, ("f32", (9, 2, B, 6)))
CASES["GRU"] = ([("f32", [7, B, 5]), ("f32", [1, 18, 5]), ("f32", [1, 18, 6]), ("i32", [B])],
                {"hidden_size": 6, "optional": ["sequence_lens"]}, ("f32", (8, 1, B, 6)))
CASES["RNN"] = ([("f32", [7, B, 5]), ("f32", [1, 6, 5]), ("f32", [1, 6, 6])], {"hidden_size": 6},
                ("f32", (8, 1, B, 6)))
CASES["GatherND"] = ([("f32", [B, 5, 6, 7]), ("i64", [B, 3, 2])], {"batch_dims": 1}, ("f32", (B, 3, 7)))
CASES["MatMulInteger"] = ([("u8", [B, 16]), ("i8", [16, 4]), ("i8", [4])], {"optional": ["b_zero_point"]},
                          ("i32", (B, 4)))
CASES["ConvInteger"] = ([("u8", [B, 3, 8, 8]), ("u8", [4, 3, 3, 3])], {}, ("i32", (B, 4, 6, 6)))
for _op in ["Or", "Xor"]:
    CASES[_op] = ([("bool", [B, 5]), ("bool", [5])], {}, ("bool", (B, 5)))
for _op in ["ReduceMax", "ReduceMin", "ReduceProd"]:
    CASES[_op] = ([("f32", [B, 5])], {"axes": [1], "keepdims": 0}, ("f32", (B,)))


def build(op, inputs, attrs):
    g = GraphBuilder(op)
    names = []
    for i, spec in enumerate(inputs):
        if isinstance(spec, np.ndarray):
            names.append(g.constant(spec, name=f"c{i}"))
        else:
            names.append(g.input(f"in{i}", spec[0], spec[1]))
    out = g.op(op, *names, name="out", **attrs)
    g.output(out)
    return g.build()


def test_every_op_has_an_inference_case():
    # control flow (a tuple-valued node and Item): tests/test_control_flow_format.py
    assert set(CASES) == set(OPS) - CONTROL_OPS - {"Item"}


@pytest.mark.parametrize("op", sorted(CASES))
def test_inference(op):
    inputs, attrs, (dtype, shape) = CASES[op]
    t = build(op, inputs, attrs).types["out"]
    assert (t.dtype, t.shape) == (dtype, shape)


def test_reshape_from_shape_of_static_tensor_is_static():
    g = GraphBuilder()
    x = g.input("x", "f32", [2, 3, 4])
    y = g.input("y", "f32", [6, 4])
    g.output(g.reshape(x, g.shape(y), name="r"))
    assert g.build().types["r"].shape == (6, 4)


def test_dynamic_range_gets_fresh_symbol():
    g = GraphBuilder()
    x = g.input("x", "f32", ["seq", 4])
    n = g.squeeze(g.slice(g.shape(x), starts=[0], ends=[1]), axes=[0])
    g.output(g.range(g.constant(np.array(0, np.int64)), n, g.constant(np.array(1, np.int64)), name="pos"))
    t = g.build().types["pos"]
    assert t.dtype == "i64" and len(t.shape) == 1 and isinstance(t.shape[0], str)


@pytest.mark.parametrize("op,inputs,attrs,match", [
    ("Add", [("f32", [3]), ("f32", [4])], {}, "do not broadcast"),
    ("Add", [("f32", [3]), ("i64", [3])], {}, "expected one dtype"),
    ("MatMul", [("f32", [2, 3]), ("f32", [4, 5])], {}, "inner dims differ"),
    ("LSTM", [("f32", [7, 2, 5]), ("f32", [1, 20, 5]), ("f32", [1, 24, 6])], {"hidden_size": 6},
     r"W has shape \[1, 20, 5\]; expected \[1, 24, 5\]"),
    ("GRU", [("f32", [7, 2, 5]), ("f32", [1, 18, 5]), ("f32", [1, 18, 6])], {"hidden_size": 6, "optional": ["P"]},
     "expected a subset of"),
    ("MatMulInteger", [("f32", [2, 3]), ("u8", [3, 5])], {}, "input 0 has dtype f32; expected u8 or i8"),
    ("Conv", [("f32", [1, 3, 8, 8]), ("f32", [4, 2, 3, 3])], {}, "input channels 3 != weight in-channels 2"),
    ("Reshape", [("f32", [2, 3])], {"shape": [4, 2]}, "cannot reshape"),
    ("Squeeze", [("f32", [2, 3])], {"axes": [0]}, "cannot squeeze axis 0 of size 2"),
    ("Where", [("f32", [2]), ("f32", [2]), ("f32", [2])], {}, "condition has dtype f32; expected bool"),
    ("Gather", [("f32", [2]), ("f32", [2])], {}, "indices have dtype f32"),
    ("Softmax", [("i32", [2])], {}, "expected a float dtype"),
    ("Concat", [("f32", [2, 3]), ("f32", [3, 3])], {"axis": 1}, "dim 0 is 3; expected 2"),
    ("Gelu", [("f32", [2])], {"approximate": "fast"}, "expected one of \\['none', 'tanh'\\]"),
    ("DequantMatMul", [("f32", [1, 100]), ("u8", [8, 66])], {"encoding": "gguf_tq2_0", "N": 8, "K": 100},
     "K=100 not a multiple of 256"),
    ("ReduceSum", [("f32", [2, 3])], {"axes": [2]}, "out of range"),
])
def test_inference_errors(op, inputs, attrs, match):
    with pytest.raises(GraphError, match=match):
        build(op, inputs, attrs)
