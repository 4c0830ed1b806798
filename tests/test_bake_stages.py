"""The bake's stage list (passes/registry.py) is the one declaration of its passes, and every pass has the
one contract (graph, ctx) -> PassResult, run by groups to a fixed point (bake and compile)."""

import json

import numpy as np
import pytest
from test_bake import f32
from test_cli import bundle, invoke  # noqa: F401 - bundle is a fixture

from rlx_bake import PROFILES, BakeOptions, bake
from rlx_bake.options import _check_flags
from rlx_bake.passes import registry
from rlx_bake.passes.registry import FLAGS, SECTIONS, STAGES, Stage, check_stages
from rlx_format import GraphBuilder
from rlx_runtime import CompileOptions, Session
from rlx_runtime.passes import Pass, PassContext, PassResult, run_group


def test_profiles_are_generated_unchanged():
    # the profiles as they were spelled out before the stage list (behaviour kept)
    assert PROFILES == {
        "merge": dict(fold=False, simplify=False, dce=False, skip=False, ternary=False, quant=False),
        "fold": dict(fold=True, simplify=True, dce=True, skip=False, ternary=False, quant=False),
        "exact": dict(fold=True, simplify=True, dce=True, skip=True, ternary=True, quant=False),
        "size": dict(fold=True, simplify=True, dce=True, skip=True, ternary=True, quant=True),
    }
    for name, flags in PROFILES.items():
        assert sorted(flags) == sorted(FLAGS)  # every profile names every pass
        opts = BakeOptions.from_profile(name)
        assert {f: getattr(opts, f) for f in FLAGS} == flags
    assert {f: getattr(BakeOptions(), f) for f in FLAGS} == PROFILES["exact"]  # the dataclass defaults too
    assert SECTIONS == ("skipped", "ternary", "quant")


def test_declaration_checks_catch_mistakes(monkeypatch):
    bad = (*STAGES, Stage("fold", "again", ("size",), (), "late"))
    monkeypatch.setattr(registry, "STAGES", bad)
    with pytest.raises(AssertionError, match="declared twice"):
        check_stages()
    monkeypatch.setattr(registry, "STAGES", (*STAGES[:-1], Stage("dce", "x", ("tiny",), (), "clean")))
    with pytest.raises(AssertionError, match=r"unknown profile\(s\) \['tiny'\]"):
        check_stages()
    split = (STAGES[0], STAGES[2], STAGES[1], *STAGES[3:])  # skip-zero no longer next to the fold
    monkeypatch.setattr(registry, "STAGES", split)
    with pytest.raises(AssertionError, match="must be adjacent"):
        check_stages()
    monkeypatch.setattr("rlx_bake.options.FLAGS", (*FLAGS, "newpass"))
    with pytest.raises(AssertionError, match="differ from the stages"):
        _check_flags()


def test_cli_flags_come_from_the_stages(bundle, tmp_path, monkeypatch):  # noqa: F811
    seen = []
    import rlx_bake.pipeline as pipeline

    real = pipeline.bake
    monkeypatch.setattr(pipeline, "bake", lambda g, w, opts, step: seen.append(opts) or real(g, w, opts, step))
    for stage in STAGES:
        if stage.flag == "quant":
            continue
        assert stage.help in " ".join(invoke("bake", "--help").output.split())
        assert invoke(bundle, "-o", tmp_path / "a.rlx", "--opt", "size", f"--no-{stage.flag}").exit_code == 0
        assert invoke(bundle, "-o", tmp_path / "b.rlx", "--opt", "merge", f"--{stage.flag}").exit_code == 0
        off, on = seen[-2:]
        assert getattr(off, stage.flag) is False and getattr(on, stage.flag) is True
        others = [f for f in FLAGS if f != stage.flag]
        assert all(getattr(off, f) == PROFILES["size"][f] for f in others)
        assert all(getattr(on, f) == PROFILES["merge"][f] for f in others)


def test_dce_help_says_what_it_does():
    text = " ".join(invoke("bake", "--help").output.split())
    assert "--dce / --no-dce Remove unused nodes and duplicate constants." in text


def _counting(name, changes):
    """A pass that reports a change the first `changes` times it runs."""
    calls = []

    def run(graph, ctx):
        calls.append(name)
        return PassResult(graph, len(calls) <= changes)
    return Pass(name, run), calls


def test_run_group_reaches_a_fixed_point_without_rerunning_idle_passes():
    a, ca = _counting("a", 0)
    b, cb = _counting("b", 1)
    c, cc = _counting("c", 0)
    ctx = PassContext(None)
    run_group(_gelu_graph(), [a, b, c], ctx)
    # b changed once: c (after it) and a (before it) run again, b itself does not
    assert [p for p, _ in ctx.report.passes] == ["a", "b", "c", "a"]
    a, ca = _counting("a", 0)
    ctx = PassContext(None)
    run_group(_gelu_graph(), [a], ctx)
    assert ca == ["a"]


def test_run_group_is_bounded():
    a, ca = _counting("a", 10 ** 6)
    b, cb = _counting("b", 10 ** 6)
    run_group(_gelu_graph(), [a, b], PassContext(None), max_rounds=3)
    assert ca == ["a"] * 3 and cb == ["b"] * 3


def _zero_middle_graph():
    g = GraphBuilder()
    x = g.input("x", "f32", [3, 8])
    h = g.relu(g.add(g.matmul(x, g.param("w0", "f32", [8, 8])), g.param("b0", "f32", [8])))
    g.output(g.add(g.matmul(h, g.param("w1", "f32", [8, 4])), g.param("b1", "f32", [4]), name="y"))
    return g.build()


def test_fold_reruns_after_skip_zero_because_it_changed_the_graph():
    ws = {"w0": np.zeros((8, 8), np.float32), "b0": f32(8), "w1": f32(8, 4), "b1": f32(4)}
    steps = []
    rf, rep = bake(_zero_middle_graph(), ws, BakeOptions.from_profile("exact"), steps.append)
    assert rep.skipped == ["matmul_1"]
    # static shapes: the zeros, Relu(b0) and the second MatMul on a known row all fold into the output
    assert rf.graph.nodes == [] and list(rf.weights) == ["y"]
    # the fold group ran until nothing changed: skip-zero's change brought the fold back
    assert steps[:8] == ["specialize", "affine", "fold", "skip-zero", "affine", "fold", "skip-zero", "affine"]
    x = f32(3, 8)
    want = np.maximum(ws["b0"], 0) @ ws["w1"] + ws["b1"]
    np.testing.assert_allclose(Session().compile(rf).run({"x": x})["y"], np.broadcast_to(want, (3, 4)), rtol=1e-6)


def _gelu_graph():
    g = GraphBuilder()
    x = g.input("x", "f32", [2, 16])
    s2 = g.constant(np.array(np.sqrt(2.0), np.float32))
    one, half = g.constant(np.array(1.0, np.float32)), g.constant(np.array(0.5, np.float32))
    h = g.mul(g.mul(x, g.add(g.erf(g.div(x, s2)), one)), half)
    g.output(g.matmul(h, g.param("w", "f32", [16, 4]), name="y"))
    return g.build()


def test_fuse_removes_what_it_absorbed_without_dce():
    rf, rep = bake(_gelu_graph(), {"w": f32(16, 4)}, BakeOptions.from_profile("exact", dce=False))
    assert sorted(n.op for n in rf.graph.nodes) == ["Gelu", "MatMul"]
    assert set(rf.weights) == {"w"}  # the 0.5, 1 and sqrt 2 scalars went with the nodes that read them


def test_compile_pipeline_uses_the_contract_and_its_fixed_point():
    comp = Session().compile_with(_gelu_graph(), CompileOptions(param_bindings={"w": f32(16, 4)}))
    names = [p for p, _ in comp.pass_report.passes]
    assert names[:5] == ["specialize", "simplify", "fuse", "affine", "fold"]
    assert names[-2:] == ["dce", "dedupe"] and comp.plan_ops() == ["Gelu", "MatMul"]


def test_report_json_keys_stay(bundle, tmp_path):  # noqa: F811
    rep = tmp_path / "r.json"
    assert invoke(bundle, "-o", tmp_path / "m.rlx", "--report-json", rep).exit_code == 0
    d = json.loads(rep.read_text())
    assert list(d) == ["profile", "nodes_before", "nodes_after", "params_baked", "params_unbound", "extra_weights",
                       "quant_type", "counts", "skipped", "ternary", "quant", "notes", "folds_refused", "weights",
                       "total_bytes_before", "total_bytes"]
    assert list(d["counts"]) == ["skipped", "ternary", "quant"]
