"""Kernel facts (rlx_runtime.kernels.registry.KernelFacts) agree with what the kernels really do.

Generated code writes an elementwise result into its dying first input when that buffer is fresh; a kernel
that returns its input (or a view of it) without saying so would let a later in-place op change a value
that is still live. Every op of the catalogue is run here on fresh arrays and checked."""

from __future__ import annotations

import numpy as np
import pytest
from test_inference import CASES, build

from rlx_format import GraphBuilder
from rlx_format.ops import OPS
from rlx_runtime import Session
from rlx_runtime.backend import CPU
from rlx_runtime.kernels import FACTS, prepare_attrs

DIMS = {"batch": 2, "seq": 3, "q": 3, "k": 3}
# extra attr sets that reach a kernel's no-op path (where returning the input would be tempting)
PROBES = [
    ("Clip", [("f32", [2, 3])], {}),
    ("Pad", [("f32", [2, 3])], {"pads": [0, 0, 0, 0]}),
    ("Tile", [("f32", [2, 3])], {"repeats": [1, 1]}),
    ("Expand", [("f32", [2, 3])], {"shape": [2, 3]}),
    ("Concat", [("f32", [2, 3])], {"axis": 0}),
    ("Cast", [("f32", [2, 3])], {"to": "f32"}),
    ("Resize", [("f32", [1, 1, 2, 3])], {"scales": [1.0, 1.0, 1.0, 1.0]}),
    ("Slice", [("f32", [2, 3])], {"starts": [0], "ends": [3], "axes": [1]}),
    ("Transpose", [("f32", [2, 3])], {"perm": [0, 1]}),
    ("Einsum", [("f32", [2, 3])], {"equation": "ij->ji"}),
    ("Max", [("f32", [2, 3]), ("f32", [2, 3])], {}),
    ("Where", [("bool", [2, 3]), ("f32", [2, 3]), ("f32", [2, 3])], {}),
]


def _arrays(graph):
    rng = np.random.default_rng(0)
    out = []
    for v in graph.inputs:
        shape = tuple(DIMS.get(d, d) if isinstance(d, str) else d for d in v.shape)
        dt = np.dtype({"f32": np.float32, "f16": np.float16, "i64": np.int64, "i32": np.int32, "u8": np.uint8,
                       "i8": np.int8, "bool": np.bool_}[v.dtype])
        if dt.kind == "f":
            out.append(rng.standard_normal(shape).astype(dt))
        elif dt == np.bool_:
            out.append(rng.random(shape) < 0.5)
        elif v.dtype == "u8" and graph.nodes[0].op.startswith("Dequant"):
            out.append(np.zeros(shape, np.uint8))  # zero blocks: finite scales
        else:
            out.append(np.zeros(shape, dt))  # valid indices / lengths everywhere
    return out


def _cases():
    for op, (inputs, attrs, _) in sorted(CASES.items()):
        yield pytest.param(op, inputs, attrs, id=op)
    for op, inputs, attrs in PROBES:
        yield pytest.param(op, inputs, attrs, id=f"{op}-probe")


@pytest.mark.parametrize("op,inputs,attrs", list(_cases()))
def test_results_alias_only_where_the_facts_say_so(op, inputs, attrs):
    g = build(op, inputs, attrs)
    consts = [g.constants[n].value for n in g.nodes[0].inputs if n in g.constants]
    args = _arrays(g) if not consts else consts
    node = g.nodes[0]
    fn = CPU.kernel(op)
    a = prepare_attrs(op, node.attrs)
    first = fn(np, a, *args)
    second = fn(np, prepare_attrs(op, node.attrs), *args)
    assert not np.shares_memory(first, second) or FACTS[op].aliases, f"{op}: two calls return one buffer"
    for i, x in enumerate(args):
        if np.shares_memory(np.asarray(first), x):
            assert i == 0, f"{op}: the result shares memory with input {i} (only input 0 may be aliased)"
            assert FACTS[op].aliases, f"{op}: the result aliases input 0 but its kernel facts say aliases=False"


def test_every_op_has_facts_and_in_place_ops_never_alias():
    assert set(FACTS) == set(OPS)
    for op, f in FACTS.items():
        assert not (f.aliases and f.inplace), op


@pytest.mark.parametrize("make", ["clip", "identity", "reshape"])
def test_an_in_place_op_never_changes_a_value_seen_through_an_alias(make):
    """x = a + a; y = alias(x); z = -x (x's last use: computed in place into x); out = y + z must be 0."""
    g = GraphBuilder()
    a = g.input("a", "f32", [2, 3])
    x = g.add(a, a)
    y = {"clip": lambda: g.clip(x), "identity": lambda: g.identity(x),
         "reshape": lambda: g.reshape(x, shape=[2, 3])}[make]()
    g.output(g.add(y, g.neg(x), name="o"))
    out = Session().compile(g.build()).run({"a": np.ones((2, 3), np.float32)})["o"]
    np.testing.assert_array_equal(out, np.zeros((2, 3), np.float32))
