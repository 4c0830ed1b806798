"""Edge cases where a plausible bug changes an answer: skip-zero on a weight that is zero except in its
middle, the fold growth guard and memory budget just above and below their limits, and set_param on a
param that every one of several hoisted boundaries reads."""

import numpy as np
import pytest

from rlx_bake import BakeOptions, bake
from rlx_format import GraphBuilder
from rlx_runtime import CompileOptions, Session, split_param_invariant
from rlx_runtime.passes import PassReport, constant_fold

R = np.random.default_rng(11)

# ------------------------------------------------------------------------------------------ skip-zero


def _matmul_graph(k: int, n: int):
    g = GraphBuilder("mm")
    x = g.input("x", "f32", ["b", k])
    g.output(g.matmul(x, g.param("w", "f32", [k, n]), name="y"))
    return g.build()


@pytest.mark.parametrize("where", ["middle", "one_past_head", "one_before_tail"])
def test_skip_zero_reads_the_whole_weight(where):
    """Zeros at both ends (well past any head/tail probe) and one non-zero value inside."""
    k, n = 128, 96  # 12288 values: the probes cover the first and last 1024
    w = np.zeros((k, n), np.float32)
    flat = w.reshape(-1)
    flat[{"middle": flat.size // 2, "one_past_head": 1024, "one_before_tail": flat.size - 1025}[where]] = 0.25
    rf, rep = bake(_matmul_graph(k, n), {"w": w})
    assert rep.skipped == []
    x = R.standard_normal((3, k)).astype(np.float32)
    out = Session().compile(rf).run({"x": x})["y"]
    np.testing.assert_array_equal(out, x @ w)
    assert out.any()
    # the same weight all zero is skipped (the pass is on)
    rf0, rep0 = bake(_matmul_graph(k, n), {"w": np.zeros((k, n), np.float32)})
    assert rep0.skipped == ["y"] and "MatMul" not in [n.op for n in rf0.graph.nodes]


# ------------------------------------------------------------------------------- fold growth guard

ROW = 1024  # f32 values per constant row: 4096 bytes


def _tile_graph(reps: int, n_consts: int = 1):
    """Constants (each [1, ROW]) summed, tiled to [reps, ROW], read by dynamic work: one boundary whose
    closure reads n_consts * 4096 bytes of constants and which holds reps * 4096 bytes."""
    g = GraphBuilder("guard")
    x = g.input("x", "f32", [reps, ROW])
    v = g.constant(np.full((1, ROW), 1.0, np.float32), name="c0")
    for i in range(1, n_consts):
        v = g.add(v, g.constant(np.full((1, ROW), float(i + 1), np.float32), name=f"c{i}"), name=f"s{i}")
    g.output(g.add(x, g.op("Tile", v, repeats=[reps, 1], name="big"), name="y"))
    return g.build()


def _folds(graph, growth_limit, min_bytes, budget=None) -> tuple[bool, PassReport]:
    rep = PassReport()
    out = constant_fold(graph.copy(), rep, growth_limit, min_bytes, budget)
    return "big" in out.constants, rep


@pytest.mark.parametrize("n_consts", [1, 3])
def test_growth_guard_just_below_and_above(n_consts):
    """The boundary may be growth_limit x the bytes of the constants its closure reads, not one row more."""
    limit = 16
    at = limit * n_consts
    assert _folds(_tile_graph(at, n_consts), limit, 0)[0]
    folded, rep = _folds(_tile_graph(at + 1, n_consts), limit, 0)
    assert not folded
    assert [r["node"] for r in rep.fold_refused] == ["big"]
    assert f"({n_consts * ROW * 4} bytes)" in rep.fold_refused[0]["reason"]


def test_growth_guard_min_bytes_floor():
    """Below min_bytes anything folds, whatever the growth; one row past it the growth limit decides."""
    limit, reps = 2, 40  # 40x growth
    floor = reps * ROW * 4
    assert _folds(_tile_graph(reps), limit, floor)[0]
    assert not _folds(_tile_graph(reps + 1), limit, floor)[0]
    assert _folds(_tile_graph(reps + 1), 41, floor)[0]  # ... unless the growth limit allows it


def test_growth_guard_through_the_bake_options():
    rf, rep = bake(_tile_graph(17), {}, BakeOptions.from_profile("exact", fold_growth_limit=17, fold_min_bytes=0))
    assert "Tile" not in [n.op for n in rf.graph.nodes]
    rf, rep = bake(_tile_graph(18), {}, BakeOptions.from_profile("exact", fold_growth_limit=17, fold_min_bytes=0))
    assert "Tile" in [n.op for n in rf.graph.nodes] and "fold_growth_limit" in rep.folds_refused[0]["reason"]


def test_memory_budget_just_below_and_above():
    """At compile (no growth guard) the sweep holds the Tile result: exactly its bytes fit, one byte less not."""
    reps = 8
    need = reps * ROW * 4
    assert _folds(_tile_graph(reps), None, 0, need)[0]
    folded, rep = _folds(_tile_graph(reps), None, 0, need - 1)
    assert not folded and f"({need - 1} bytes)" in rep.fold_refused[0]["reason"]


# --------------------------------------------------------------------------- hoisted boundaries


def _shared_param_graph():
    """One param `w` read by three boundaries (and `v` by one), each used by per-forward work."""
    g = GraphBuilder("owners")
    x = g.input("x", "f32", ["b", 4])
    w, v = g.param("w", "f32", [4, 4]), g.param("v", "f32", [4, 4])
    b1 = g.mul(w, g.constant(np.float32(2.0), name="two"), name="b1")
    b2 = g.transpose(w, perm=[1, 0], name="b2")
    b3 = g.add(g.exp(w, name="ew"), v, name="b3")
    y = g.add(g.add(g.matmul(x, b1), g.matmul(x, b2)), g.matmul(x, b3), name="y")
    g.output(y)
    return g.build()


def _reference(params, x):
    c = Session().compile(_shared_param_graph())
    for k, a in params.items():
        c.set_param(k, a)
    return c.run({"x": x})["y"]


def test_set_param_invalidates_every_owner():
    split = split_param_invariant(_shared_param_graph())
    owners = [b for b, deps in split.deps.items() if "w" in deps]
    assert sorted(owners) == ["b1", "b2", "b3"]
    params = {"w": R.standard_normal((4, 4)).astype(np.float32), "v": R.standard_normal((4, 4)).astype(np.float32)}
    x = R.standard_normal((2, 4)).astype(np.float32)
    h = Session().compile_with(_shared_param_graph(), CompileOptions(cache_param_invariant=True, optimize=False))
    for k, a in params.items():
        h.set_param(k, a)
    np.testing.assert_allclose(h.run({"x": x})["y"], _reference(params, x), rtol=1e-6, atol=1e-6)
    # change w only through each boundary in turn: every owner has to see the new value
    for step in range(3):
        params["w"] = R.standard_normal((4, 4)).astype(np.float32)
        h.set_param("w", params["w"])
        np.testing.assert_allclose(h.run({"x": x})["y"], _reference(params, x), rtol=1e-6, atol=1e-6,
                                   err_msg=f"after set_param #{step}")
    for b in owners:  # and each boundary alone, read back from the cache
        np.testing.assert_allclose(h._cache[b], {"b1": params["w"] * 2, "b2": params["w"].T,
                                                 "b3": np.exp(params["w"]) + params["v"]}[b], rtol=1e-6)


def test_compile_budget_counts_the_folded_results_it_keeps():
    """At compile every folded value stays in RAM (bound into the plan): two boundaries of `need` bytes each
    need 2 x need, so with a budget just below that only one folds."""
    reps = 8
    need = reps * ROW * 4
    g = GraphBuilder("two")
    x = g.input("x", "f32", [reps, ROW])
    tiles = [g.op("Tile", g.constant(np.full((1, ROW), float(i), np.float32), name=f"c{i}"), repeats=[reps, 1],
                  name=f"big{i}") for i in range(2)]
    g.output(g.add(g.add(x, tiles[0]), tiles[1], name="y"))
    graph = g.build()
    for budget, folded in ((2 * need, 2), (2 * need - 1, 1)):
        rep = PassReport()
        out = constant_fold(graph.copy(), rep, None, 0, budget)
        assert sum(f"big{i}" in out.constants for i in range(2)) == folded, budget
        assert len(rep.fold_refused) == 2 - folded
