"""Load-time validation (spec/graph-json.md "Numbers and strings", spec/ops.md "Load-time rules").

Every hostile or nonsensical graph is refused by Graph.from_json with a GraphError naming the node, attr
and value, and by `rlx-bake graph.json -o out.rlx` with exit 1, one message, no traceback and no file.
"""

import json
import struct

import msgpack
import numpy as np
import pytest
from click.testing import CliRunner

from rlx_bake.cli import main
from rlx_format import Graph, GraphBuilder, GraphError, RlxError, RlxFile, read_rlx_bytes
from rlx_format.constants import RLXBAKE_MAGIC
from rlx_runtime import CompileOptions, Device, Session

X4 = ("x", "f32", [2, 4, 4, 4])


def big(digits: int) -> str:
    """A placeholder for the integer 10**digits: json.dumps cannot write one over 4300 digits."""
    return f"__BIG{digits}__"


def doc(*nodes, inputs=(X4,), consts=(), name="g", outputs=None) -> dict:
    return {"format": "rlx.graph", "version": 1, "name": name,
            "inputs": [{"name": n, "dtype": d, "shape": s} for n, d, s in inputs],
            "constants": list(consts), "nodes": list(nodes), "outputs": outputs or [nodes[-1]["name"]]}


def node(op, *inputs, name="y", **attrs) -> dict:
    return {"name": name, "op": op, "inputs": list(inputs), "attrs": attrs}


def const(name, dtype, data, shape=None) -> dict:
    return {"name": name, "dtype": dtype, "shape": [] if shape is None else shape, "data": data}


def scalar_in(dtype="f32"):
    return (("s", dtype, []),)


def rng_consts(dtype, start, limit, delta):
    return (const("a", dtype, [start]), const("b", dtype, [limit]), const("c", dtype, [delta]))


CONV_IN = (("x", "f32", [1, 2, 4, 4]), ("w", "f32", [2, 2, 3, 3]))

# (id, graph document, fragment of the expected message)
CASES = [
    # wrong-typed fields
    ("nodes-int", {"format": "rlx.graph", "version": 1, "nodes": 5, "outputs": ["x"]}, "'nodes' must be a list"),
    ("attrs-int", doc({"name": "y", "op": "Relu", "inputs": ["x"], "attrs": 5}), "node 'y': attrs must be an object"),
    ("shape-int", {"format": "rlx.graph", "version": 1, "inputs": [{"name": "x", "dtype": "f32", "shape": 5}],
                   "outputs": ["x"]}, "inputs[0] 'x': shape must be a list"),
    ("graph-name-int", {**doc(node("Relu", "x")), "name": 5}, "'name' must be a string"),
    # rank-0 inputs to ops that take an axis
    ("concat-rank0", doc(node("Concat", "s", "s", axis=0), inputs=scalar_in()),
     "node 'y' (Concat): axis 0 given for a rank-0"),
    ("topk-rank0", doc(node("TopK", "s", k=1, axis=0), inputs=scalar_in()),
     "node 'y' (TopK): axis 0 given for a rank-0"),
    ("squeeze-rank0", doc(node("Squeeze", "s", axes=[0]), inputs=scalar_in()),
     "node 'y' (Squeeze): axis 0 given for a rank-0"),
    ("slice-rank0", doc(node("Slice", "s", starts=[0], ends=[1]), inputs=scalar_in()),
     "node 'y' (Slice): axis 0 given for a rank-0"),
    ("cumsum-rank0", doc(node("CumSum", "s"), inputs=scalar_in()), "node 'y' (CumSum): axis 0 given for a rank-0"),
    # found by the random-op fuzz target: inference and kernel disagreed on the output shape
    ("tile-dynamic-repeats-length", doc(node("Tile", "s", "r"), inputs=scalar_in() + (("r", "i64", [3]),)),
     "node 'y' (Tile): repeats input has 3 entries; expected rank 0"),
    ("slice-repeated-axis", doc(node("Slice", "x", starts=[1, 0], ends=[1, 1], axes=[-1, 3])),
     "node 'y' (Slice): axes [-1, 3] repeat an axis"),
    ("gather-elements-indices-too-big", doc(node("GatherElements", "x", "i"), inputs=(
        ("x", "f32", [4, 1]), ("i", "i64", [4, 2]))), "indices shape [4, 2] exceeds data shape [4, 1] on axis 1"),
    ("scatter-elements-updates-shape", doc(node("ScatterElements", "x", "i", "u"), inputs=(
        ("x", "f32", [4, 4]), ("i", "i64", [2, 4]), ("u", "f32", [4, 4]))),
     "updates shape [4, 4]; expected the indices shape [2, 4]"),
    # attr ranges and lengths
    ("depth-to-space-block0", doc(node("DepthToSpace", "x", blocksize=0)),
     "node 'y': attr 'blocksize' is 0; expected >= 1"),
    ("conv-transpose-output-padding-length", doc(node("ConvTranspose", "x", "w", output_padding=[1]), inputs=CONV_IN),
     "node 'y' (ConvTranspose): output_padding [1] has 1 entries; expected 2"),
    ("maxpool-kernel0", doc(node("MaxPool", "x", kernel_shape=[0, 0])),
     "node 'y': attr 'kernel_shape' is [0, 0]; expected every entry >= 1"),
    ("conv-strides0", doc(node("Conv", "x", "w", strides=[1, 0]), inputs=CONV_IN),
     "node 'y': attr 'strides' is [1, 0]; expected every entry >= 1"),
    ("conv-empty-kernel", doc(node("Conv", "x", "w"), inputs=(CONV_IN[0], ("w", "f32", [2, 2, 0, 3]))),
     "node 'y' (Conv): weight shape [2, 2, 0, 3] has an empty kernel"),
    ("conv-group-negative", doc(node("Conv", "x", "w", group=-1), inputs=CONV_IN),
     "node 'y': attr 'group' is -1; expected >= 1"),
    ("conv-group-divides", doc(node("Conv", "x", "w", group=2), inputs=(("x", "f32", [1, "c", 4, 4]),
                                                                        ("w", "f32", [3, 1, 3, 3]))),
     "node 'y' (Conv): weight out-channels 3 not divisible by group 2"),
    ("groupnorm-groups0", doc(node("GroupNorm", "x", "s", "s", num_groups=0), inputs=(X4, ("s", "f32", [4]))),
     "node 'y': attr 'num_groups' is 0; expected >= 1"),
    ("seed-negative", doc(node("RandomNormal", shape=[2], seed=-1), inputs=()),
     "node 'y': attr 'seed' is -1; expected >= 0"),
    ("seed-beyond-int64", doc(node("RandomNormal", shape=[2], seed=2**64), inputs=()),
     "nodes[0] 'y' attrs.seed: 18446744073709551616 does not fit int64"),
    ("random-uniform-span", doc(node("RandomUniform", shape=[2], low=-1e308, high=1e308), inputs=()),
     "node 'y' (RandomUniform): high - low = 1e+308 - -1e+308 overflows"),
    ("einsum-non-ascii", doc(node("Einsum", "x", equation="a\u00e9bc")),
     "operand subscripts 'a\u00e9bc' must be lower-case letters"),
    # negative dims
    ("expand-negative", doc(node("Expand", "x", shape=[-5])),
     "node 'y': attr 'shape' is [-5]; expected every entry >= 0"),
    ("expand-negative-constant", doc(node("Expand", "x", "t"), inputs=(("x", "f32", [1]),),
                                     consts=(const("t", "i64", [-5], [1]),)),
     "node 'y' (Expand): inferred output shape [-5] has dim -5"),
    ("tile-negative", doc(node("Tile", "x", repeats=[1, -1, 1, 1])),
     "node 'y': attr 'repeats' is [1, -1, 1, 1]; expected every entry >= 0"),
    ("tile-negative-constant", doc(node("Tile", "x", "r"), inputs=(("x", "f32", ["n"]),),
                                   consts=(const("r", "i64", [-1], [1]),)),
     "node 'y' (Tile): repeats [-1] has a negative entry"),
    ("conv-transpose-negative-output", doc(node("ConvTranspose", "x", "w", pads=[5, 5, 5, 5]),
                                           inputs=(("x", "f32", [1, 2, 1, 1]), ("w", "f32", [2, 2, 3, 3]))),
     "node 'y' (ConvTranspose): inferred output shape [1, 2, -7, -7] has dim -7"),
    # Range / Resize with constants and attrs
    ("range-inf", doc(node("Range", "a", "b", "c"), inputs=(), consts=rng_consts("f32", 0.0, float("inf"), 1.0)),
     "node 'y' (Range): start, limit, delta = 0.0, inf, 1.0; expected finite values"),
    ("range-nan", doc(node("Range", "a", "b", "c"), inputs=(), consts=rng_consts("f32", 0.0, 3.0, float("nan"))),
     "node 'y' (Range): start, limit, delta = 0.0, 3.0, nan; expected finite values"),
    ("range-delta0", doc(node("Range", "a", "b", "c"), inputs=(), consts=rng_consts("i64", 0, 3, 0)),
     "node 'y' (Range): delta is 0"),
    ("range-overflowing-count", doc(node("Range", "a", "b", "c"), inputs=(),
                                    consts=rng_consts("f64", -1e308, 1e308, 1.0)),
     "node 'y' (Range): start, limit, delta = -1e+308, 1e+308, 1.0 give inf elements"),
    ("resize-inf", doc(node("Resize", "x", scales=[1, 1, float("inf"), 1])), "node 'y': attr 'scales' holds inf"),
    ("resize-nan", doc(node("Resize", "x", scales=[1, 1, float("nan"), 1])), "node 'y': attr 'scales' holds nan"),
    ("resize-zero", doc(node("Resize", "x", scales=[1, 1, 0, 1])), "scales [1.0, 1.0, 0.0, 1.0] must be positive"),
    ("resize-huge", doc(node("Resize", "x", scales=[1, 1, 1e300, 1])), "exceed the dim cap"),
    # huge numbers
    ("float-attr-10e400", doc(node("LeakyRelu", "x", alpha=big(400))),
     "nodes[0] 'y' attrs.alpha: an integer of about 401 digits does not fit int64"),
    ("float-attr-inf", doc(node("LeakyRelu", "x", alpha=float("inf"))), "node 'y': attr 'alpha' holds inf"),
    ("sdpa-scale-nan", doc(node("ScaledDotProductAttention", "q", "q", "q", scale=float("nan")),
                           inputs=(("q", "f32", [2, 2]),)), "node 'y': attr 'scale' holds nan"),
    ("constant-10e400", doc(node("Relu", "c"), inputs=(), consts=(const("c", "f32", [big(400)], [1]),)),
     "constants[0] 'c' data[0]: an integer of about 401 digits does not fit int64"),
    ("int-attr-5000-digits", doc(node("Softmax", "x", axis=big(5000))), "fit int64"),
    ("dim-5000-digits", {"format": "rlx.graph", "version": 1,
                         "inputs": [{"name": "x", "dtype": "f32", "shape": [big(5000)]}], "outputs": ["x"]},
     "fit int64"),
    ("version-5000-digits", {**doc(node("Relu", "x")), "version": "1." + "9" * 5000}, "'version' is '1.999"),
    # odd names
    ("graph-name-nul", doc(node("Relu", "x"), name="a\x00b"), "graph name: name 'a\\x00b' contains '\\x00'"),
    ("node-name-newline", doc(node("Relu", "x", name="y\nz")), "name 'y\\nz' contains '\\n'"),
    ("node-name-surrogate", doc(node("Relu", "x", name="y\ud800")), "'y\\ud800' holds a lone surrogate"),
    ("symbolic-dim-surrogate", {"format": "rlx.graph", "version": 1,
                                "inputs": [{"name": "x", "dtype": "f32", "shape": ["\udc00"]}], "outputs": ["x"]},
     "inputs[0] 'x' shape[0]: '\\udc00' holds a lone surrogate"),
]


def _as_dict(v):
    """The document with every big() placeholder replaced by its integer."""
    if isinstance(v, dict):
        return {k: _as_dict(e) for k, e in v.items()}
    if isinstance(v, list):
        return [_as_dict(e) for e in v]
    if isinstance(v, str) and v.startswith("__BIG") and v.endswith("__"):
        return 10 ** int(v[5:-2])
    return v


def _as_text(d: dict) -> str:
    """JSON text (ensure_ascii keeps lone surrogates as \\udXXX escapes, NaN/Infinity as tokens)."""
    text = json.dumps(d)
    for n in (400, 5000):
        text = text.replace(f'"{big(n)}"', "1" + "0" * n)
    return text


@pytest.mark.parametrize("case_id, d, fragment", CASES, ids=[c[0] for c in CASES])
def test_refused_at_load(case_id, d, fragment):
    with pytest.raises(GraphError) as e:
        Graph.from_json(_as_dict(d))
    assert fragment in str(e.value)
    with pytest.raises(GraphError) as e:  # the same document as text
        Graph.from_json(_as_text(d))
    assert fragment in str(e.value) or case_id.endswith("5000-digits") and "fit int64" in str(e.value)


@pytest.mark.parametrize("case_id, d, fragment", CASES, ids=[c[0] for c in CASES])
def test_refused_by_cli(tmp_path, case_id, d, fragment):
    src, out = tmp_path / "graph.json", tmp_path / "out.rlx"
    src.write_text(_as_text(d), encoding="utf-8")
    r = CliRunner().invoke(main, [str(src), "-o", str(out)], catch_exceptions=False)  # an escape fails the test
    assert r.exit_code == 1, r.output
    assert "error:" in r.output and "Traceback" not in r.output
    assert fragment in r.output or case_id.endswith("5000-digits") and "fit int64" in r.output, r.output
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


def test_edge_values_that_are_valid_still_load_and_run():
    """The rules are not broader than stated: fill values may be non-finite, int64 extremes are ints."""
    d = doc(node("Pad", "x", name="p", pads=[0, 0, 0, 1, 0, 0, 0, 1], value=float("-inf")),
            node("Clip", "p", name="c", min=float("-inf"), max=float("inf")),
            node("Slice", "c", name="s", starts=[-2**63], ends=[2**63 - 1], axes=[3]),
            node("MaxPool", "s", name="m", kernel_shape=[1, 1]),
            node("ConstantOfShape", name="k", shape=[2], value=float("nan")),
            node("RandomUniform", name="r", shape=[2], seed=2**63 - 1),
            node("Range", "a", "b", "c1", name="n"),
            consts=rng_consts("i64", 0, 7, 3)[:2] + (const("c1", "i64", [3]),),
            outputs=["m", "k", "r", "n"], name="edge \u00e9\u4e2d")
    g = Graph.from_json(_as_text(d))
    assert g.types["m"].shape == (2, 4, 4, 6) and g.types["n"].shape == (3,)
    out = Session(Device.CPU).compile(g).run({"x": np.ones((2, 4, 4, 4), np.float32)})
    assert np.isneginf(out["m"][..., [0, -1]]).all() and (out["m"][..., 1:-1] == 1).all()
    assert np.isnan(out["k"]).all()
    np.testing.assert_array_equal(out["n"], [0, 3, 6])


def test_builder_graphs_get_the_same_rules():
    """Graphs made in Python (no JSON document) are checked by validate(): names and attr numbers."""
    with pytest.raises(GraphError, match="graph name: name 'a\\\\x00b' contains"):
        b = GraphBuilder("a\x00b")
        b.output(b.relu(b.input("x", "f32", [2]), name="y"))
        b.build()
    b = GraphBuilder("g")
    with pytest.raises(GraphError, match="lone surrogates"):
        b.output(b.relu(b.input("x\udfff", "f32", [2]), name="y"))
        b.build()
    b = GraphBuilder("g")
    b.output(b.softmax(b.input("x", "f32", [2]), name="y", axis=10**5000))
    with pytest.raises(GraphError, match="attr 'axis' holds an integer of about 5001 digits; expected an integer "
                                         "that fits int64"):
        b.build()
    b = GraphBuilder("g")
    b.output(b.leaky_relu(b.input("x", "f32", [2]), name="y", alpha=10**400))
    with pytest.raises(GraphError, match="attr 'alpha' holds an integer of about 401 digits, beyond the float64"):
        b.build()
    b = GraphBuilder("g")
    with pytest.raises(GraphError, match="dim an integer of about 5001 digits"):
        b.output(b.relu(b.input("x", "f32", [10**5000]), name="y"))
        b.build()


def test_generated_plan_does_not_splice_the_graph_name():
    """codegen quotes the name it puts in compile()'s filename: a graph renamed after validation (a NUL,
    quotes, a newline) still compiles and runs."""
    b = GraphBuilder("g")
    b.output(b.relu(b.input("x", "f32", [2]), name="y"))
    g = b.build()
    g.name = "a\x00b\"'\n>"
    raw = CompileOptions(optimize=False, precompute=False)  # the passes would re-validate (and refuse) the name
    out = Session(Device.CPU).compile(g, raw).run({"x": np.array([-1, 2], np.float32)})
    np.testing.assert_array_equal(out["y"], [0, 2])


def _container(header: dict) -> bytes:
    body = msgpack.packb(header, use_bin_type=True)
    return RLXBAKE_MAGIC + struct.pack("<IQ", 2, len(body)) + body


@pytest.mark.parametrize("where, value", [
    (("graph", "nodes"), 5), (("graph", "inputs"), "x"), (("graph", "outputs"), 5), (("graph", "name"), 5),
    (("graph", "nodes", 0, "attrs"), [1]), (("graph", "inputs", 0, "shape"), [2**64 - 1]),
    (("graph", "nodes", 0, "name"), b"y"), (("weights",), 5), (("meta",), []),
])
def test_container_header_with_wrong_typed_fields(where, value):
    b = GraphBuilder("s")
    b.output(b.relu(b.input("x", "f32", [2]), name="y"))
    header = {"graph": RlxFile.from_graph(b.build()).graph.to_dict(), "weights": [], "meta": {}}
    read_rlx_bytes(_container(header))  # the untouched header loads
    parent = header
    for k in where[:-1]:
        parent = parent[k]
    parent[where[-1]] = value
    with pytest.raises(RlxError):
        read_rlx_bytes(_container(header))


@pytest.mark.parametrize("src", ["a\x00b.json", "\ud800.json"])
def test_path_that_cannot_exist(src):
    """from_json takes a string that does not look like JSON as a path; one no filesystem can hold is an
    RlxError, not the ValueError open() raises."""
    with pytest.raises(GraphError, match="not a usable path"):
        Graph.from_json(src)
