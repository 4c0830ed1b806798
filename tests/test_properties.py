"""Property tests over random graphs: every compile path agrees with the plain one.

Random DAGs mix inputs, params, constants (including neutral 0/1 constants that simplify removes),
unary and broadcasting binary ops, transposes and reshapes. For each: optimize (simplify/fold/DCE/
dedupe) with bound params, hoisting, shape caching and the bake must give the same outputs as a
plain compile with set_param.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlx_bake import BakeOptions, bake
from rlx_format import GraphBuilder
from rlx_runtime import CompileOptions, Session

UNARY = ["Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Relu", "Sin", "Softsign", "Identity", "Gelu", "Silu", "Erf"]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]
KINDS = ["unary", "binary", "binary", "transpose2", "reshape", "softmax", "rmean", "where", "concat_slice", "unsq"]


@st.composite
def random_graph(draw):
    r = np.random.default_rng(draw(st.integers(0, 2**31)))
    g = GraphBuilder("rand")
    vals = [g.input("x", "f32", ["b", 3]), g.param("p", "f32", [2, 3]), g.param("q", "f32", [3])]
    params = {"p": r.standard_normal((2, 3)).astype(np.float32), "q": r.standard_normal(3).astype(np.float32)}
    g.constant(np.zeros(3, np.float32), name="zero")
    g.constant(np.ones((1, 3), np.float32), name="one")
    vals += ["zero", "one", g.constant(r.standard_normal((2, 3)).astype(np.float32) * 0.5, name="c")]
    for _ in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(KINDS))
        a, b = draw(st.sampled_from(vals)), draw(st.sampled_from(vals))
        a2 = g.reshape(a, shape=[-1, 3])
        if kind == "unary":
            v = g.op(draw(st.sampled_from(UNARY)), a)
        elif kind == "binary":
            v = g.op(draw(st.sampled_from(BINARY)), a, b)
        elif kind == "transpose2":
            v = g.transpose(g.transpose(a2, perm=[1, 0]), perm=[1, 0])
        elif kind == "softmax":
            v = g.softmax(a2)
        elif kind == "rmean":
            v = g.add(a, g.reduce_mean(a2, axes=[0], keepdims=1))
        elif kind == "where":
            v = g.where(g.less(a, b), a, b)
        elif kind == "concat_slice":
            v = g.slice(g.concat(a2, a2, axis=1), starts=[1], ends=[4], axes=[1])
        elif kind == "unsq":
            v = g.squeeze(g.unsqueeze(a2, axes=[0]), axes=[0])
        else:
            v = a2
        vals.append(v)
    out = g.add(vals[-1], g.reduce_sum(vals[-2], axes=[-1], keepdims=1), name="y")
    g.output(out)
    return g.build(), params


def _plain(graph, params, feeds):
    c = Session().compile(graph)
    for k, v in params.items():
        c.set_param(k, v)
    return c.run(feeds)["y"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graph(), st.integers(1, 2))  # "b" broadcasts against the [2, 3] param: 1 or 2
def test_every_compile_path_agrees(gp, batch):
    graph, params = gp
    x = np.random.default_rng(batch).standard_normal((batch, 3)).astype(np.float32)
    feeds = {"x": x}
    ref = _plain(graph, params, feeds)
    tol = dict(rtol=1e-5, atol=1e-5, equal_nan=True)  # folded reductions/BLAS may reassociate sums
    folded = Session().compile_with(graph, CompileOptions(param_bindings=params)).run(feeds)["y"]
    np.testing.assert_allclose(folded, ref, **tol)
    for opts in (CompileOptions(cache_param_invariant=True), CompileOptions(cache_shape_invariant=True),
                 CompileOptions(cache_param_invariant=True, optimize=False)):
        h = Session().compile_with(graph, opts)
        for k, v in params.items():
            h.set_param(k, v)
        for _ in range(2):
            np.testing.assert_allclose(h.run(feeds)["y"], ref, **tol)
    for profile in ("merge", "fold", "exact"):
        rf, _ = bake(graph, params, BakeOptions.from_profile(profile))
        np.testing.assert_allclose(Session().compile(rf).run(feeds)["y"], ref, **tol)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graph(), st.lists(st.tuples(st.sampled_from(["p", "q", None]), st.integers(1, 2)), min_size=1,
                                max_size=6), st.booleans())
def test_hoisting_tracks_set_param_sequences(gp, steps, shape_mode):
    """After any sequence of set_param calls, a hoisted graph equals a fresh plain compile."""
    graph, params = gp
    opts = CompileOptions(cache_shape_invariant=True) if shape_mode else CompileOptions(cache_param_invariant=True)
    h = Session().compile_with(graph, opts)
    cur = dict(params)
    for k, v in cur.items():
        h.set_param(k, v)
    r = np.random.default_rng(len(steps))
    for name, batch in steps:
        if name is not None:
            cur[name] = (cur[name] + r.standard_normal(cur[name].shape)).astype(np.float32)
            h.set_param(name, cur[name])
        x = r.standard_normal((batch, 3)).astype(np.float32)
        np.testing.assert_allclose(h.run({"x": x})["y"], _plain(graph, cur, {"x": x}), rtol=1e-5, atol=1e-5,
                                   equal_nan=True)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graph())
def test_graph_json_round_trip_random_graphs(gp):
    from rlx_format import Graph
    graph, _ = gp
    text = graph.to_json()
    back = Graph.from_json(text)
    assert back.to_json() == text
    assert back.types == graph.types


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 20_000), st.sampled_from([4096, 8192, 65536]))
def test_sealed_round_trip_random_sizes(n_bytes, chunk):
    import tempfile
    from pathlib import Path

    from rlx_format import RlxFile, Weight, read_rlx_with_password, write_rlx_encrypted
    from rlx_format.sealed import KDF_PROFILES
    g = GraphBuilder("s")
    g.input("x", "f32", [1])
    g.output("x")
    rf = RlxFile.from_graph(g.build())
    rf.weights["w"] = Weight.plain("w", np.random.default_rng(n_bytes).integers(0, 255, n_bytes, dtype=np.uint8), "u8")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "s.rlx"
        write_rlx_encrypted(p, rf, "pw", KDF_PROFILES["fast"], chunk_size=chunk)
        assert read_rlx_with_password(p, "pw").to_bytes() == rf.to_bytes()
