import numpy as np
import pytest

from rlx_format import GraphBuilder, RlxError
from rlx_runtime import CompileOptions, Session, split_param_invariant

R = np.random.default_rng(5)


def seed_graph():
    g = GraphBuilder("seed")
    x = g.input("x", "f32", ["batch", 4])
    w, s = g.param("w", "f32", [4, 3]), g.param("scale", "f32", [4, 3])
    g.output(g.matmul(x, g.mul(w, s, name="ws"), name="y"))
    return g.build()


def hoisted(graph, **kw):
    return Session().compile_with(graph, CompileOptions(cache_param_invariant=True, optimize=False, **kw))


def plain(graph, params):
    c = Session().compile(graph)
    for k, v in params.items():
        c.set_param(k, v)
    return c


def test_seed_example():
    split = split_param_invariant(seed_graph())
    assert split.boundary == ["ws"]
    assert [n.op for n in split.prepare.nodes] == ["Mul"]
    assert [n.op for n in split.main.nodes] == ["MatMul"]
    assert split.prepare_params == ["w", "scale"] and split.main_params == []
    assert split.boundary_inputs["ws"] not in {"x", "w", "scale", "ws", "y"}
    w, s = R.standard_normal((4, 3)).astype(np.float32), R.standard_normal((4, 3)).astype(np.float32)
    x = R.standard_normal((2, 4)).astype(np.float32)
    h = hoisted(seed_graph())
    h.set_param("w", w)
    h.set_param("scale", s)
    first = h.run({"x": x})["y"]
    np.testing.assert_allclose(first, plain(seed_graph(), {"w": w, "scale": s}).run({"x": x})["y"], atol=1e-6)
    for _ in range(5):
        np.testing.assert_array_equal(h.run({"x": x})["y"], first)
    h.set_param("scale", 2 * s)
    changed = h.run({"x": x})["y"]
    assert not np.allclose(changed, first)
    np.testing.assert_array_equal(changed, plain(seed_graph(), {"w": w, "scale": 2 * s}).run({"x": x})["y"])


def test_prepare_runs_once_and_invalidates_per_boundary():
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 4])
    a, sa = g.param("a", "f32", [4, 4]), g.param("sa", "f32", [4, 4])
    b = g.param("b", "f32", [4, 4])
    bias = g.param("bias", "f32", [4])
    wa = g.mul(a, sa, name="wa")
    wb = g.transpose(b, perm=[1, 0], name="wb")
    g.output(g.add(g.matmul(g.matmul(x, wa), wb), bias, name="y"))
    h = hoisted(g.build(), profile=True)
    vals = {k: R.standard_normal((4, 4)).astype(np.float32) for k in ("a", "sa", "b")}
    vals["bias"] = R.standard_normal(4).astype(np.float32)
    for k, v in vals.items():
        h.set_param(k, v)
    x = R.standard_normal((3, 4)).astype(np.float32)
    for _ in range(7):
        h.run({"x": x})
    p = h.profile()
    assert p["Mul"][0] == 1 and p["Transpose"][0] == 1 and p["MatMul"][0] == 14 and p["Add"][0] == 7
    h.set_param("sa", vals["sa"] * 3)  # invalidates wa only
    h.run({"x": x})
    p = h.profile()
    assert p["Mul"][0] == 2 and p["Transpose"][0] == 1
    h.set_param("bias", vals["bias"] + 1)  # main-only: nothing recomputed in prepare
    out = h.run({"x": x})["y"]
    p = h.profile()
    assert p["Mul"][0] == 2 and p["Transpose"][0] == 1
    vals["sa"] = vals["sa"] * 3
    vals["bias"] = vals["bias"] + 1
    np.testing.assert_allclose(out, plain(g.build(), vals).run({"x": x})["y"], rtol=1e-6, atol=1e-6)
    with pytest.raises(RlxError, match="unknown param 'nope'"):
        h.set_param("nope", np.zeros(1))


def test_rng_stays_in_main_and_symbolic_batch():
    g = GraphBuilder()
    x = g.input("x", "f32", ["batch", 4])
    w = g.param("w", "f32", [4, 4])
    noise = g.random_normal(shape=[4, 4], seed=0, name="noise")
    g.output(g.matmul(x, g.add(g.exp(w, name="ew"), noise), name="y"))
    split = split_param_invariant(g.build())
    assert split.boundary == ["ew"]
    assert "RandomNormal" in [n.op for n in split.main.nodes]
    h = hoisted(g.build())
    h.set_param("w", np.zeros((4, 4), np.float32))
    for batch in (1, 5):
        assert h.run({"x": np.ones((batch, 4), np.float32)})["y"].shape == (batch, 4)


def test_nothing_to_hoist_and_bindings_fold_first():
    g = GraphBuilder()
    x = g.input("x", "f32", [2])
    g.output(g.relu(x, name="y"))
    assert split_param_invariant(g.build()) is None
    w = R.standard_normal((4, 3)).astype(np.float32)
    c = Session().compile_with(seed_graph(), CompileOptions(param_bindings={"w": w, "scale": w},
                                                            cache_param_invariant=True))
    assert c.plan_ops() == ["MatMul"] and not hasattr(c, "split")


def test_env_flag(monkeypatch):
    monkeypatch.setenv("RLX_CACHE_PARAM_INVARIANT", "1")
    assert CompileOptions().cache_param_invariant
    monkeypatch.setenv("RLX_CACHE_PARAM_INVARIANT", "0")
    assert not CompileOptions().cache_param_invariant


def test_weight_only_output_and_no_aliasing():
    g = GraphBuilder()
    x = g.input("x", "f32", [3])
    w = g.param("w", "f32", [3])
    g.output(g.add(x, w, name="y"), g.exp(w, name="ew"))
    h = hoisted(g.build())
    h.set_param("w", np.zeros(3, np.float32))
    out = h.run({"x": np.ones(3, np.float32)})
    out["ew"][:] = 9
    np.testing.assert_array_equal(h.run({"x": np.ones(3, np.float32)})["ew"], np.ones(3))
