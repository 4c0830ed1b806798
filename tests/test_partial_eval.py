"""The partial evaluator: binding times, boundary-based folds, the memory budget, precompute at compile,
affine (BatchNorm/Mul/Add) folds, and the one executable interface of hoisted graphs."""

import inspect
import resource
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import assert_same_dot_products
from onnx import numpy_helper

from rlx_bake import BakeOptions, bake
from rlx_format import GraphBuilder, read_rlx, write_rlx
from rlx_runtime import CompileOptions, CompiledGraph, Session
from rlx_runtime.hoist import HoistedGraph
from rlx_runtime.passes import PassReport, constant_fold
from rlx_runtime.passes.evaluate import DYNAMIC, KNOWN, PARAM, SHAPE, binding_times

R = np.random.default_rng(3)


# ------------------------------------------------------------------------------- binding times


def test_binding_times():
    g = GraphBuilder("bt")
    x = g.input("x", "f32", ["b", 4])
    s = g.input("s", "f32", [2, 4])
    w = g.param("w", "f32", [4, 4])
    c = g.constant(np.ones((4, 4), np.float32), name="c")
    g.op("Add", w, c, name="wc")
    g.op("Exp", c, name="ec")
    g.op("Shape", x, name="shx")
    g.op("Shape", s, name="shs")  # static shape: known although s is an input
    g.op("RandomNormal", shape=[4], name="rn")
    g.output(g.matmul(x, g.op("Add", "wc", "ec", name="m"), name="y"))
    graph = g.build()
    bt = binding_times(graph)
    assert (bt["ec"], bt["wc"], bt["m"], bt["y"]) == (KNOWN, PARAM, PARAM, DYNAMIC)
    assert (bt["shs"], bt["shx"], bt["rn"]) == (KNOWN, DYNAMIC, DYNAMIC)
    assert binding_times(graph, through_shape=True)["shx"] == SHAPE


# ------------------------------------------------------------------------------- the LoRA example


def _lora():
    g = GraphBuilder("lora")
    x = g.input("x", "f32", ["b", 1024])
    w, a, b, s = (g.param("w", "f32", [1024, 1024]), g.param("a", "f32", [1024, 16]),
                  g.param("bb", "f32", [16, 1024]), g.param("s", "f32", [1]))
    merged = g.exp(g.transpose(g.mul(g.add(w, g.matmul(a, b)), s), perm=[1, 0]))
    g.output(g.matmul(x, merged, name="y"))
    vals = {"w": (R.standard_normal((1024, 1024)) * 0.01).astype(np.float32),
            "a": (R.standard_normal((1024, 16)) * 0.01).astype(np.float32),
            "bb": (R.standard_normal((16, 1024)) * 0.01).astype(np.float32), "s": np.array([0.5], np.float32)}
    return g.build(), vals


def test_lora_merge_folds_into_one_weight_at_compile():
    """a @ b is 32x larger than a and b, but the closure's boundary (the merged weight) is W-sized."""
    graph, vals = _lora()
    bound = Session().compile_with(graph, CompileOptions(param_bindings=vals))
    assert bound.plan_ops() == ["MatMul"]
    assert bound.pass_report.fold_refused == []
    plain = Session().compile(graph)
    assert plain.plan_ops() == ["MatMul", "Add", "Mul", "Transpose", "Exp", "MatMul"]  # params unbound
    for k, v in vals.items():
        plain.set_param(k, v)
    x = R.standard_normal((8, 1024)).astype(np.float32)
    got, want = bound.run({"x": x})["y"], plain.run({"x": x})["y"]
    # the folded weight is contiguous (rlx's few-rows kernel: fma in order of k), the unbound one a transposed view
    # (an OpenBLAS GEMM): the same dot products summed in two orders, each within its rounding bound
    w = np.exp(((vals["w"] + vals["a"] @ vals["bb"]) * vals["s"]).T).astype(np.float64)
    assert_same_dot_products(got, want, x, w)
    np.testing.assert_allclose(got, x.astype(np.float64) @ w, rtol=1e-4)


def test_lora_merge_bakes_into_one_constant(tmp_path):
    graph, vals = _lora()
    rf, report = bake(graph, vals, BakeOptions.from_profile("exact"))
    assert [n.op for n in rf.graph.nodes] == ["MatMul"]
    assert list(rf.weights) == [rf.graph.nodes[0].inputs[1]] and rf.weights[rf.graph.nodes[0].inputs[1]].shape == \
        (1024, 1024)
    assert report.folds_refused == [] and report.to_dict()["nodes_after"] == 1
    write_rlx(tmp_path / "l.rlx", rf)
    x = R.standard_normal((2, 1024)).astype(np.float32)
    ref = x @ np.exp(((vals["w"] + vals["a"] @ vals["bb"]) * vals["s"]).T)
    out = Session().compile(read_rlx(tmp_path / "l.rlx")).run({"x": x})["y"]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- guards and budget


def _tile_chain(reduce: bool = True):
    """ConstantOfShape [262144] -> Tile x16 -> Tile x16 -> Tile x16 (4 GiB of f32) -> ReduceSum."""
    g = GraphBuilder("tiles")
    x = g.input("x", "f32", [1])
    v = g.constant_of_shape(shape=[262144], value=1.0, name="c0")
    for i in range(3):
        v = g.op("Tile", v, repeats=[16], name=f"t{i}")
    g.output(g.add(x, g.reduce_sum(v, keepdims=1, name="total") if reduce else v, name="y"))
    return g.build()


def test_growth_guard_and_budget_at_bake():
    rf, report = bake(_tile_chain(), {}, BakeOptions.from_profile("exact", fold_memory_budget=512 << 20))
    refused = {r["node"]: r["reason"] for r in report.folds_refused}
    assert "fold memory budget" in refused["total"]  # small, but needs the 4 GiB tensor at once
    assert "fold_growth_limit" in refused["t2"] and "fold_growth_limit" in refused["t0"]
    assert [n.op for n in rf.graph.nodes] == ["Tile", "Tile", "Tile", "ReduceSum", "Add"]  # c0 (1 MiB) folded


def test_compile_precomputes_what_the_file_does_not_hold():
    """The bake keeps ConstantOfShape -> Tile out of the file (growth guard); compile evaluates it once."""
    g = GraphBuilder("light")
    x = g.input("x", "f32", ["b", 64, 32])
    w = g.op("Tile", g.constant_of_shape(shape=[1, 1, 32], value=0.5), repeats=[1, 64, 1], name="w")
    g.output(g.add(x, w, name="y"))
    rf, report = bake(g.build(), {}, BakeOptions.from_profile("exact", fold_min_bytes=0))
    assert "Tile" in [n.op for n in rf.graph.nodes]
    c = Session().compile(rf)
    assert c.plan_ops() == ["Add"]
    x = R.standard_normal((2, 64, 32)).astype(np.float32)
    np.testing.assert_array_equal(c.run({"x": x})["y"], x + np.float32(0.5))
    off = Session().compile_with(rf, CompileOptions(optimize=False, precompute=False))
    assert off.plan_ops() == ["ConstantOfShape", "Tile", "Add"]


def test_compile_budget_refusal_is_reported_and_runs_per_forward():
    g = GraphBuilder("b")
    x = g.input("x", "f32", [256, 256])
    big = g.op("Tile", g.constant(np.ones((1, 256), np.float32)), repeats=[256, 1], name="big")
    g.output(g.add(x, big, name="y"))
    c = Session().compile_with(g.build(), CompileOptions(fold_memory_budget=1000))
    assert c.plan_ops() == ["Tile", "Add"]
    assert "fold memory budget (1000 bytes)" in c.pass_report.fold_refused[0]["reason"]
    x = R.standard_normal((256, 256)).astype(np.float32)
    np.testing.assert_array_equal(c.run({"x": x})["y"], x + 1)


def test_refused_value_that_a_folded_boundary_also_reads_stays_computed():
    """`big` is over the growth limit but `total` (folded) is computed from it; a dynamic node reads
    `big` too, so it stays a node while `total` becomes a constant."""
    g = GraphBuilder("shared")
    x = g.input("x", "f32", [64, 4096])
    big = g.op("Tile", g.constant(np.arange(4096, dtype=np.float32).reshape(1, 4096)), repeats=[64, 1], name="big")
    total = g.reduce_sum(big, keepdims=1, name="total")
    g.output(g.add(g.add(x, big), total, name="y"))
    rep = PassReport()
    graph = constant_fold(g.build().copy(), rep, 16, 0)
    assert {n.name for n in graph.nodes} == {"big", "y"} | {n.name for n in graph.nodes if n.op == "Add"}
    assert "total" in graph.constants and "big" in {r["node"] for r in rep.fold_refused}
    x = R.standard_normal((64, 4096)).astype(np.float32)
    ref = x + np.tile(np.arange(4096, dtype=np.float32), (64, 1)) + np.float32(np.arange(4096).sum() * 64)
    np.testing.assert_allclose(Session().compile_with(graph, CompileOptions(precompute=False)).run({"x": x})["y"],
                               ref, rtol=1e-6)


def test_budget_bounds_what_folding_really_allocates():
    """The simulation's accounting is what the evaluation holds: the traced peak stays within the budget."""
    g = GraphBuilder("chain")
    x = g.input("x", "f32", [1])
    v = g.constant_of_shape(shape=[1 << 16], value=1.0)  # 256 KiB
    for i in range(3):
        v = g.op("Tile", v, repeats=[4], name=f"t{i}")  # 1, 4, 16 MiB
    g.output(g.add(x, g.reduce_sum(v, keepdims=1), name="y"))
    graph = g.build()
    for budget, folds in ((24 << 20, True), (18 << 20, False)):  # the sweep holds t1 and t2 at once: 20 MiB
        rep = PassReport()
        tracemalloc.start()
        out = constant_fold(graph.copy(), rep, None, 0, budget)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak <= budget + (1 << 20), (budget, peak)
        assert ("t2" not in {n.name for n in out.nodes}) == folds


# the child's own peak RSS in KiB: /proc's VmHWM belongs to the exec'd image alone. getrusage's ru_maxrss does not:
# Linux keeps it across fork and execve, so a child forked from a pytest process that had grown past 1 GB (a
# whole `make test` run) reported the parent's size, not its own
_PEAK = ("import resource\n"
         "def _peak():\n"
         "    try:\n"
         "        for line in open('/proc/self/status'):\n"
         "            if line.startswith('VmHWM:'):\n"
         "                return int(line.split()[1])\n"
         "    except OSError:\n"
         "        pass\n"
         "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n")


def _child_peak_mb(code: str, limit: int) -> tuple[int, float, str]:
    """Run `code` in a fresh interpreter under a data-size limit; its own peak RSS in MB."""
    def cap():
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

    wrapped = (f"{_PEAK}try:\n    exec({code!r})\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
               "print('peak', _peak())")
    p = subprocess.run([sys.executable, "-c", wrapped], preexec_fn=cap, capture_output=True, text=True, timeout=300)
    peak = [line.split()[1] for line in p.stdout.splitlines() if line.startswith("peak ")]
    return p.returncode, int(peak[0]) / 1024 if peak else float("inf"), p.stdout + p.stderr


def test_tile_chain_bake_and_compile_stay_under_1_gb(tmp_path):
    """The hardening issue's 628-byte graph: the bake and a compile under a 2 GiB data limit keep peak RSS
    below 1 GB (before: 4.6 GB, the whole chain materialized)."""
    path = tmp_path / "graph.json"
    _tile_chain().to_json(path)
    assert path.stat().st_size < 1200
    out = tmp_path / "t.rlx"
    code = (f"import sys; from rlx_bake.cli import main; sys.argv = ['rlx-bake', '-q', {str(path)!r}, '-o', "
            f"{str(out)!r}]; main()")
    rc, peak, text = _child_peak_mb(code, 2 << 30)
    assert rc == 0, text
    assert peak < 1000, peak
    code = (f"from rlx_format import read_rlx; from rlx_runtime import Session; "
            f"c = Session().compile(read_rlx({str(out)!r})); print(c.plan_ops())")
    rc, peak, text = _child_peak_mb(code, 2 << 30)
    assert rc == 0 and "ReduceSum" in text, text
    assert peak < 1000, peak


# --------------------------------------------------------------------------------- affine folds


def _conv_bn_graph(with_bias: bool, tail: str):
    g = GraphBuilder("cbn")
    x = g.input("x", "f32", ["n", 3, 8, 8])
    w = g.param("w", "f32", [6, 3, 3, 3])
    ins = [x, w] + ([g.param("b", "f32", [6])] if with_bias else [])
    h = g.op("Conv", *ins, pads=[1, 1, 1, 1], name="conv")
    h = g.op("BatchNormalization", h, *(g.param(n, "f32", [6]) for n in ("g", "beta", "mean", "var")),
             epsilon=1e-3, name="bn")
    if tail == "mul_add":
        h = g.mul(h, g.param("k", "f32", [1, 6, 1, 1]), name="mul")
        h = g.add(h, g.param("c", "f32", [6, 1, 1]), name="add")
    g.output(g.relu(h, name="y"))
    vals = {"w": R.standard_normal((6, 3, 3, 3)).astype(np.float32), "b": R.standard_normal(6).astype(np.float32),
            "g": R.standard_normal(6).astype(np.float32), "beta": R.standard_normal(6).astype(np.float32),
            "mean": R.standard_normal(6).astype(np.float32), "var": R.random(6).astype(np.float32) + 0.1,
            "k": R.standard_normal((1, 6, 1, 1)).astype(np.float32),
            "c": R.standard_normal((6, 1, 1)).astype(np.float32)}
    graph = g.build()
    return graph, {k: v for k, v in vals.items() if k in graph.param_names}


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("tail", ["bn", "mul_add"])
def test_conv_batchnorm_mul_add_fold_into_the_conv(with_bias, tail):
    graph, vals = _conv_bn_graph(with_bias, tail)
    folded = Session().compile_with(graph, CompileOptions(param_bindings=vals))
    assert folded.plan_ops() == ["FusedConv"]  # the Relu then joins the Conv (fuse_conv, after affine)
    assert {f["node"] for f in folded.pass_report.affine_folded} >= {"bn"}
    plain = Session().compile(graph)
    for k, v in vals.items():
        plain.set_param(k, v)
    x = R.standard_normal((2, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(folded.run({"x": x})["y"], plain.run({"x": x})["y"], rtol=1e-5, atol=1e-5)


def test_matmul_followed_by_per_column_mul_and_batchnorm():
    g = GraphBuilder("mm")
    x = g.input("x", "f32", ["n", 5])
    w = g.param("w", "f32", [5, 4])
    h = g.mul(g.matmul(x, w, name="mm"), g.param("k", "f32", [4]), name="scaled")
    h = g.op("BatchNormalization", h, *(g.param(n, "f32", [4]) for n in ("g", "beta", "mean", "var")), name="bn")
    g.output(g.identity(h, name="y"))
    vals = {"w": R.standard_normal((5, 4)).astype(np.float32), "k": R.standard_normal(4).astype(np.float32),
            "g": R.standard_normal(4).astype(np.float32), "beta": R.standard_normal(4).astype(np.float32),
            "mean": R.standard_normal(4).astype(np.float32), "var": R.random(4).astype(np.float32) + 0.5}
    folded = Session().compile_with(g.build(), CompileOptions(param_bindings=vals))
    # the folded scale is in w, the shift a bias the Add adds: that Add then joins the MatMul (fuse_linear)
    assert folded.plan_ops() == ["FusedMatMul", "Identity"] or folded.plan_ops() == ["FusedMatMul"]
    x = R.standard_normal((3, 5)).astype(np.float32)
    s = vals["g"] / np.sqrt(vals["var"] + np.float32(1e-5))
    ref = (x @ vals["w"] * vals["k"] - vals["mean"]) * s + vals["beta"]
    np.testing.assert_allclose(folded.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)


def test_no_affine_fold_when_the_conv_output_has_another_reader_or_the_scale_is_dynamic():
    g = GraphBuilder("keep")
    x = g.input("x", "f32", [1, 3, 4, 4])
    k = g.input("k", "f32", [1, 2, 1, 1])
    w = g.constant(R.standard_normal((2, 3, 1, 1)).astype(np.float32))
    conv = g.op("Conv", x, w, name="conv")
    g.output(g.mul(conv, k, name="y"))  # a run-time scale: cannot move into the weight
    conv2 = g.op("Conv", x, w, name="conv2")
    g.output(g.add(g.mul(conv2, g.constant(np.full((1, 2, 1, 1), 2, np.float32))), conv2, name="z"))
    c = Session().compile_with(g.build(), CompileOptions())
    assert c.pass_report.affine_folded == []
    assert c.plan_ops().count("Conv") == 2


def _light_resnet_with_random_weights(tmp_path: Path) -> Path:
    """The onnx package's light_resnet50 builds every weight with ConstantOfShape (one value each): turned
    into random initializers here (BatchNorm variances positive), so the folds meet real numbers."""
    src = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    m = onnx.load(str(src))
    bn_inputs = {}
    for n in m.graph.node:
        if n.op_type == "BatchNormalization":
            for role, name in zip(("scale", "bias", "mean", "var"), n.input[1:]):
                bn_inputs[name] = role
    rng = np.random.default_rng(50)
    nodes, inits = [], list(m.graph.initializer)
    for n in m.graph.node:
        if n.op_type != "ConstantOfShape":
            nodes.append(n)
            continue
        shape = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == n.input[0]))
        role = bn_inputs.get(n.output[0])
        if role == "var":
            v = rng.uniform(0.5, 1.5, shape)
        elif role == "scale":
            v = rng.uniform(0.5, 1.5, shape)
        elif role in ("bias", "mean"):
            v = rng.normal(0, 0.1, shape)
        else:  # conv / fc weights: He-style scale keeps activations O(1) through 50 layers
            fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            v = rng.normal(0, np.sqrt(1.0 / fan_in), shape)
        inits.append(numpy_helper.from_array(v.astype(np.float32), n.output[0]))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    del m.graph.initializer[:]
    m.graph.initializer.extend(inits)
    out = tmp_path / "resnet50_random.onnx"
    onnx.save(m, str(out))
    return out


def test_resnet50_light_runs_without_constant_of_shape_or_batchnorm(tmp_path):
    import onnxruntime as ort

    from rlx_bake.onnx import import_onnx

    src = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    graph, weights = import_onnx(src)  # as shipped: ConstantOfShape weights, kept out of the file
    rf, _ = bake(graph, weights, BakeOptions.from_profile("exact"))
    ops = Session().compile(rf).plan_ops()
    assert "ConstantOfShape" not in ops and "BatchNormalization" not in ops
    assert ops.count("Conv") + ops.count("FusedConv") == 53

    path = _light_resnet_with_random_weights(tmp_path)
    graph, weights = import_onnx(path)
    rf, report = bake(graph, weights, BakeOptions.from_profile("exact"))
    assert sum("folded into the weights of Conv" in n for n in report.notes) == 53
    c = Session().compile(rf)
    assert "BatchNormalization" not in c.plan_ops()
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    ref = sess.run(None, {name: x})[0]
    out = c.run({c.input_names[0]: x})[c.output_names[0]]
    assert ref.std() > 1e-4  # the outputs are not a constant softmax
    # measured: max abs difference 6.9e-7 folded, 7.6e-7 with BatchNormalization kept (softmax probabilities)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=3e-6)


# ------------------------------------------------------------------------ one executable interface


def _public(cls) -> set[str]:
    return {n for n, _ in inspect.getmembers(cls) if not n.startswith("_")}


def test_hoisted_graph_has_the_compiled_graph_interface():
    assert _public(CompiledGraph) <= _public(HoistedGraph), _public(CompiledGraph) - _public(HoistedGraph)
    graph, vals = _lora()
    h = Session().compile_with(graph, CompileOptions(cache_param_invariant=True))
    p = Session().compile(graph)
    assert isinstance(h, HoistedGraph)
    for attr in ("input_names", "output_names", "param_names"):
        assert getattr(h, attr) == getattr(p, attr), attr
    instance_attrs = {"graph", "device", "device_index", "options", "pass_report"}
    assert all(hasattr(h, a) for a in instance_attrs) and all(hasattr(p, a) for a in instance_attrs)


def test_hoist_uses_the_same_analysis_static_shape_is_not_an_input_read():
    """Shape of a statically shaped input is known: it is prepared as a constant, never a read of x."""
    g = GraphBuilder("sh")
    x = g.input("x", "f32", [3, 4])
    w = g.param("w", "f32", [4])
    n = g.op("Cast", g.op("Shape", x, name="shape"), to="f32", name="n")
    scaled = g.mul(w, g.reduce_sum(n, keepdims=0, name="s"), name="ws")
    g.output(g.add(x, scaled, name="y"))
    c = Session().compile_with(g.build(), CompileOptions(optimize=False, precompute=False,
                                                         cache_param_invariant=True))
    wv = R.standard_normal(4).astype(np.float32)
    c.set_param("w", wv)
    xv = R.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(c.run({"x": xv})["y"], xv + wv * 7, rtol=1e-6)
    assert c.plan_ops() == ["Add"]
