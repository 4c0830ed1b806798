"""Views whose geometry compile knows run as inline expressions in the generated function (codegen._view_code): a
Reshape, Flatten, Squeeze or Unsqueeze to a static shape, a Transpose, a Slice by attrs of a static input.

Each must give the kernel's values and views bit for bit (the reference: the same graph compiled with
codegen.INLINE_VIEWS off, and numpy), in the generated code as an expression (no kernel call), and steps whose
geometry depends on run-time sizes keep the kernel call.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from rlx_format import GraphBuilder
from rlx_runtime import Session, codegen

RNG = np.random.default_rng(5)


def _compile(graph, inline: bool, monkeypatch):
    monkeypatch.setattr(codegen, "INLINE_VIEWS", inline)
    return Session().compile(graph)


def _kernel_calls(compiled) -> set[str]:
    """The ops of the steps the generated function calls as kernels."""
    plan = compiled._plan
    src = plan._fast.__globals__["SOURCE"]
    return {plan.steps[int(i)].op for i in re.findall(r"= K(\d+)\(", src)}


# (name, input shape, ops: (op, attrs) applied in turn, numpy reference)
CHAINS = [
    ("reshape -1 and 0", (2, 3, 4), [("Reshape", {"shape": [0, -1]})], lambda x: x.reshape(2, 12)),
    ("reshape then transpose", (2, 3, 4), [("Reshape", {"shape": [4, 6]}), ("Transpose", {"perm": [1, 0]})],
     lambda x: x.reshape(4, 6).T),
    ("transpose reversed (no perm)", (2, 3, 4), [("Transpose", {})], lambda x: x.transpose(2, 1, 0)),
    ("transpose then flatten (a copy)", (2, 3, 4), [("Transpose", {"perm": [0, 2, 1]}), ("Flatten", {"axis": 1})],
     lambda x: x.transpose(0, 2, 1).reshape(2, 12)),
    ("squeeze and unsqueeze", (1, 3, 1, 5), [("Squeeze", {"axes": [0, 2]}), ("Unsqueeze", {"axes": [-1, 0]})],
     lambda x: x.reshape(1, 3, 5, 1)),
    ("squeeze every 1", (1, 3, 1), [("Squeeze", {})], lambda x: x.reshape(3)),
    ("slice negative and clamped", (6, 7), [("Slice", {"starts": [-4, 2], "ends": [100, -1], "axes": [0, 1]})],
     lambda x: x[2:, 2:6]),
    ("slice backwards", (6, 7), [("Slice", {"starts": [-1], "ends": [-100], "axes": [1], "steps": [-2]})],
     lambda x: x[:, ::-2]),
    ("slice to empty", (6, 7), [("Slice", {"starts": [4], "ends": [2], "axes": [0]})], lambda x: x[4:2]),
    ("slice of a transpose", (4, 5, 6), [("Transpose", {"perm": [2, 0, 1]}),
                                         ("Slice", {"starts": [1, 3], "ends": [5, 4], "axes": [0, 2]})],
     lambda x: x.transpose(2, 0, 1)[1:5, :, 3:4]),
]


@pytest.mark.parametrize("name,shape,ops,want", CHAINS, ids=[c[0] for c in CHAINS])
def test_inline_views_match_the_kernels(name, shape, ops, want, monkeypatch):
    g = GraphBuilder("views")
    x = g.input("x", "f32", list(shape))
    v = g.op("Relu", x, name="fresh")  # a buffer of the forward's own: the views below see it
    for i, (op, attrs) in enumerate(ops):
        v = g.op(op, v, name=f"v{i}", **attrs)
    g.output(v)
    g.output(g.op("Mul", "fresh", g.constant(np.array(2.0, np.float32), name="two"), name="twice"))
    graph = g.build()
    xv = RNG.standard_normal(shape).astype(np.float32)
    inline = _compile(graph, True, monkeypatch)
    assert not _kernel_calls(inline) & {op for op, _ in ops}  # every view inline
    got = inline.run({"x": xv})
    plain = _compile(graph, False, monkeypatch)
    assert {op for op, _ in ops} <= _kernel_calls(plain)
    ref = plain.run({"x": xv})
    for k in ref:
        assert got[k].shape == ref[k].shape
        np.testing.assert_array_equal(got[k], ref[k])
    np.testing.assert_array_equal(got[f"v{len(ops) - 1}"], want(np.maximum(xv, 0)))
    np.testing.assert_array_equal(got["twice"], 2 * np.maximum(xv, 0))  # the views' source is not written in place


def test_views_of_run_time_sizes_call_their_kernels(monkeypatch):
    g = GraphBuilder("dynamic")
    x = g.input("x", "f32", ["N", 3, 4])
    r = g.op("Reshape", g.op("Relu", x, name="fresh"), name="r", shape=[0, 12])
    s = g.op("Slice", r, name="s", starts=[1], ends=[9], axes=[1])
    g.output(g.op("Transpose", s, name="t", perm=[1, 0]))
    compiled = _compile(g.build(), True, monkeypatch)
    assert _kernel_calls(compiled) >= {"Reshape", "Slice"} and "Transpose" not in _kernel_calls(compiled)
    for n in (1, 3):
        xv = RNG.standard_normal((n, 3, 4)).astype(np.float32)
        np.testing.assert_array_equal(compiled.run({"x": xv})["t"], np.maximum(xv, 0).reshape(n, 12)[:, 1:9].T)


def test_slice_by_inputs_calls_its_kernel(monkeypatch):
    g = GraphBuilder("slice_inputs")
    x = g.input("x", "f32", [5, 6])
    starts = g.constant(np.array([1], np.int64), name="starts")
    ends = g.constant(np.array([4], np.int64), name="ends")
    g.output(g.op("Slice", x, starts, ends, name="s", axes=[1]))
    compiled = _compile(g.build(), True, monkeypatch)
    assert "Slice" in _kernel_calls(compiled)
    xv = RNG.standard_normal((5, 6)).astype(np.float32)
    np.testing.assert_array_equal(compiled.run({"x": xv})["s"], xv[:, 1:4])
