import numpy as np
import pytest
from conftest import run_op
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rlx_format import GraphBuilder, RlxError
from rlx_runtime import CompileOptions, Device, Session


def mlp():
    g = GraphBuilder("mlp")
    x = g.input("x", "f32", ["batch", 4])
    m = g.input("m", "f32", ["batch", 3])
    w = g.param("w", "f32", [4, 3])
    g.output(g.add(g.relu(g.matmul(x, w)), m, name="y"))
    return g.build()


def test_run_and_set_param(rng):
    c = Session(Device.CPU).compile(mlp())
    w = rng.standard_normal((4, 3)).astype(np.float32)
    c.set_param("w", w)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    m = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(c.run({"x": x, "m": m})["y"], np.maximum(x @ w, 0) + m)


@pytest.mark.parametrize("feeds,match", [
    ({"x": np.zeros((2, 4), np.float32)}, "missing input 'm'"),
    ({"x": np.zeros((2, 4), np.float32), "m": np.zeros((2, 3), np.float32), "z": 1}, "unknown input\\(s\\) \\['z'\\]"),
    ({"x": np.zeros((2, 4)), "m": np.zeros((2, 3), np.float32)}, "input 'x': dtype float64; expected float32"),
    ({"x": np.zeros((4,), np.float32), "m": np.zeros((2, 3), np.float32)}, "input 'x': rank 1.*expected rank 2"),
    ({"x": np.zeros((2, 5), np.float32), "m": np.zeros((2, 3), np.float32)}, "input 'x': dim 1 is 5; expected 4"),
    ({"x": np.zeros((2, 4), np.float32), "m": np.zeros((3, 3), np.float32)},
     "input 'm': dim 0 \\('batch'\\) is 3, but input 'x' bound 'batch' = 2"),
])
def test_input_validation(feeds, match):
    c = Session(Device.CPU).compile(mlp())
    c.set_param("w", np.zeros((4, 3), np.float32))
    with pytest.raises(RlxError, match=match):
        c.run(feeds)


def test_unset_and_unknown_params():
    c = Session(Device.CPU).compile(mlp())
    feeds = {"x": np.zeros((2, 4), np.float32), "m": np.zeros((2, 3), np.float32)}
    with pytest.raises(RlxError, match="param 'w' is not set; call set_param"):
        c.run(feeds)
    with pytest.raises(RlxError, match="unknown param 'v'"):
        c.set_param("v", np.zeros(3))
    with pytest.raises(RlxError, match="param 'w': dim 0 is 5; expected 4"):
        c.set_param("w", np.zeros((5, 3), np.float32))


def test_outputs_never_alias_inputs_or_each_other(rng):
    g = GraphBuilder()
    x = g.input("x", "f32", [2, 3])
    r = g.reshape(x, shape=[3, 2], name="r")
    g.output(x, r, g.identity(r, name="r2"))
    c = Session().compile(g.build())
    xin = rng.standard_normal((2, 3)).astype(np.float32)
    out = c.run({"x": xin})
    assert not np.shares_memory(out["x"], xin)
    assert not np.shares_memory(out["r"], xin)
    assert not np.shares_memory(out["r"], out["r2"])
    out["r"][:] = 7
    assert not (c.run({"x": xin})["r"] == 7).any()


def test_a_view_of_a_fresh_result_is_handed_out_uncopied_and_alone(rng):
    """An output that is a view of a result nothing else holds (a reshaped Exp; an aligned numba array, as the
    conv kernels' outputs are) comes out as that view, not a copy; two views of one result, a view of a feed and a
    view of a weight are still copies, and nothing seen through one output changes another or the next run."""
    from rlx_runtime import aligned, plan
    g = GraphBuilder()
    x = g.input("x", "f32", [2, 3])
    e = g.exp(x, name="e")
    r = g.reshape(e, shape=[3, 2], name="r")
    two = g.exp(x, name="two")
    g.output(r, g.reshape(two, shape=[6], name="t1"), g.reshape(two, shape=[3, 2], name="t2"),
             g.reshape(x, shape=[6], name="xr"))
    c = Session().compile(g.build())
    xin = rng.standard_normal((2, 3)).astype(np.float32)
    out = c.run({"x": xin})
    assert out["r"].base is not None  # the view itself
    np.testing.assert_array_equal(out["r"], np.exp(xin).reshape(3, 2))
    for name in ("t1", "t2", "xr"):
        assert out[name].base is None, name
    assert not np.shares_memory(out["t1"], out["t2"]) and not np.shares_memory(out["xr"], xin)
    out["r"][:] = 7
    assert not (c.run({"x": xin})["r"] == 7).any()

    y = aligned.empty((1, 32, 8, 8), 64)
    alone = plan._held_alone(y)  # apart from the assert: pytest's rewriting would hold y.base while it runs
    assert alone
    view = y.reshape(-1)
    assert not plan._held_alone(y) and not plan._held_alone(view)  # two views of one allocation
    w = np.zeros(64, np.float32)
    held = w.reshape(8, 8)
    assert not plan._held_alone(held)  # w holds the memory too
    ro = np.zeros(8, np.float32).reshape(2, 4)
    ro.flags.writeable = False
    assert not plan._held_alone(ro)


def test_intermediates_are_freed_after_last_use():
    g = GraphBuilder()
    x = g.input("x", "f32", [4])
    a = g.exp(x, name="a")
    b = g.neg(a, name="b")
    g.output(g.abs(b, name="c"))
    c = Session().compile(g.build())
    frees = {s.name: s.frees for s in c._plan.steps}
    assert frees["b"] == (c._plan.slot["a"],) and frees["c"] == (c._plan.slot["b"],)


def test_profile_counts_calls():
    c = Session().compile_with(mlp(), CompileOptions(profile=True, optimize=False))
    c.set_param("w", np.zeros((4, 3), np.float32))
    for _ in range(3):
        c.run({"x": np.zeros((1, 4), np.float32), "m": np.zeros((1, 3), np.float32)})
    prof = c.profile()
    assert prof["MatMul"][0] == 3 and prof["Relu"][0] == 3 and prof["Add"][0] == 3
    assert Session().compile(mlp()).profile() == {}


def test_kernel_failure_names_node():
    g = GraphBuilder()
    x = g.input("x", "f32", [3])
    i = g.input("i", "i64", [1])
    g.output(g.gather(x, i, name="gathered"))
    with pytest.raises(RlxError, match="node 'gathered' \\(Gather\\) failed at run time"):
        Session().compile(g.build()).run({"x": np.zeros(3, np.float32), "i": np.array([5])})


def test_random_ops_draw_fresh_values_each_run():
    g = GraphBuilder()
    g.output(g.random_normal(shape=[4], seed=3, name="r"))
    c = Session().compile(g.build())
    a, b = c.run({})["r"], c.run({})["r"]
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(Session().compile(g.build()).run({})["r"], a)  # seeded


def test_cuda_without_gpu_is_a_clear_error():
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy present")
    except ImportError:
        pass
    with pytest.raises(RlxError, match="install the CUDA extra"):
        Session(Device.CUDA)
    assert Device.parse("cuda:1") is Device.CUDA
    with pytest.raises(RlxError, match="unknown device"):
        Device.parse("tpu")


shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=1, max_side=4)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from(["Add", "Sub", "Mul", "Max", "Min", "Less", "Equal"]))
def test_binary_broadcasting_matches_numpy(data, op):
    a_shape, b_shape = data.draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=4, max_side=4)).input_shapes
    elems = st.floats(-100, 100, width=32)
    a = data.draw(hnp.arrays(np.float32, a_shape, elements=elems))
    b = data.draw(hnp.arrays(np.float32, b_shape, elements=elems))
    ref = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum,
           "Less": np.less, "Equal": np.equal}[op](a, b)
    np.testing.assert_array_equal(run_op(op, [a, b]), ref)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.sampled_from(["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"]))
def test_reductions_match_numpy(data, op):
    x = data.draw(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=5),
                             elements=st.floats(-10, 10, width=32)))
    axes = data.draw(st.lists(st.integers(0, x.ndim - 1), unique=True, min_size=1, max_size=x.ndim))
    keep = data.draw(st.integers(0, 1))
    fn = {"ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min, "ReduceMean": np.mean}[op]
    ref = fn(x, axis=tuple(axes), keepdims=bool(keep))
    np.testing.assert_allclose(run_op(op, [x], {"axes": axes, "keepdims": keep}), ref, rtol=1e-5, atol=1e-5)


def test_in_place_elementwise_never_widens_a_buffer():
    # a + b where both have symbolic leading dims that differ at run time (1 vs 3): out must be [3, 4]
    g = GraphBuilder()
    a = g.input("a", "f32", ["s1", 4])
    b = g.input("b", "f32", ["s2", 4])
    g.output(g.add(g.exp(a), b, name="y"))
    c = Session().compile(g.build())
    out = c.run({"a": np.zeros((1, 4), np.float32), "b": np.ones((3, 4), np.float32)})["y"]
    np.testing.assert_array_equal(out, np.full((3, 4), 2.0))


def test_in_place_never_writes_a_buffer_that_a_view_still_shows():
    # m is fresh and dies at Tanh, but Reshape(m) is a view of it that is read afterwards
    g = GraphBuilder()
    x = g.input("x", "f32", [2, 3])
    m = g.max(x, g.constant(np.zeros((2, 3), np.float32)), name="m")
    view = g.reshape(m, shape=[3, 2], name="view")
    t = g.tanh(m, name="t")
    g.output(g.add(g.reshape(view, shape=[2, 3]), t, name="y"))
    xin = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], np.float32)
    m_ref = np.maximum(xin, 0)
    np.testing.assert_array_equal(Session().compile(g.build()).run({"x": xin})["y"], m_ref + np.tanh(m_ref))


def test_compiled_graphs_run_from_many_threads():
    """numba's workqueue layer aborts on concurrent parallel calls; rlx serializes them."""
    import subprocess
    import sys
    code = """
import threading, numpy as np
from rlx_format import GraphBuilder
from rlx_format.quants import quantize_q8_0
from rlx_runtime import Session
g = GraphBuilder()
x = g.input("x", "f32", ["b", 512])
w = g.constant(quantize_q8_0(np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)), name="w")
h = g.dequant_mat_mul(x, w, encoding="gguf_q8_0", N=256, K=512)
g.output(g.gelu(g.reshape(g.tile(h, repeats=[1, 200]), shape=[-1]), name="y"))
c = Session().compile(g.build())
xin = np.random.default_rng(1).standard_normal((4, 512)).astype(np.float32)
ref = c.run({"x": xin})["y"]
bad = []
def work():
    for _ in range(100):
        if not np.array_equal(c.run({"x": xin})["y"], ref):
            bad.append(1)
ts = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print("ok" if not bad else "mismatch")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-500:]


def test_random_ops_have_the_stated_distributions():
    n = 200_000
    normal = run_op("RandomNormal", [], {"shape": [n], "mean": 2.0, "scale": 0.5, "seed": 1})
    uniform = run_op("RandomUniform", [], {"shape": [n], "low": -1.0, "high": 3.0, "seed": 2, "dtype": "f64"})
    assert normal.dtype == np.float32 and uniform.dtype == np.float64
    assert abs(normal.mean() - 2.0) < 0.01 and abs(normal.std() - 0.5) < 0.01
    assert uniform.min() >= -1.0 and uniform.max() < 3.0 and abs(uniform.mean() - 1.0) < 0.02


def test_importing_rlx_never_imports_cupy():
    import subprocess
    import sys

    code = ("import sys, rlx_format, rlx_runtime, rlx_bake, rlx_runtime.packed, rlx_runtime.backend, "
            "rlx_runtime.cuda.fused; "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("count,match", [(RuntimeError("cudaErrorNoDevice"), "no usable GPU/driver was found"),
                                         (0, "no GPU is visible")])
def test_cuda_with_cupy_but_no_gpu_is_a_clear_error(monkeypatch, count, match):
    import sys
    import types

    def device_count():
        if isinstance(count, Exception):
            raise count
        return count

    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=device_count)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    with pytest.raises(RlxError, match=match):
        Session(Device.CUDA)


def test_chains_of_0d_values_run():
    """A full reduction without keepdims gives a 0-d value; numpy returns scalars for elementwise ops on
    those, which the plan must never use as an in-place output buffer."""
    g = GraphBuilder("scalars")
    x = g.input("x", "f32", [3, 4])
    lo = g.op("Min", g.constant(np.float32(0), name="zero"), g.op("ReduceMin", x, keepdims=0))
    hi = g.op("ReduceMax", x, keepdims=0)
    s = g.op("Sub", g.op("Sub", hi, lo), g.constant(np.float32(0.5), name="half"))
    g.output(g.op("Mul", g.op("Neg", s), s, name="y"))
    xv = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    want = -((6 - (-5)) - 0.5) ** 2
    y = Session().compile(g.build()).run({"x": xv})["y"]
    assert isinstance(y, np.ndarray) and y.shape == () and float(y) == pytest.approx(want)  # an array, not a scalar


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("threads", [1, 2])
def test_tall_matmul_weights_are_held_column_major(rows, threads):
    """A weight matrix with more rows than columns that only MatMul reads, as its right operand, is held in
    column-major order on the CPU (plan.MIN_COLUMN_MAJOR); a wide one, a small one, or one another op also reads,
    keeps its layout. The products are numpy's (float64) within float32 rounding, at 1 and 2 threads."""
    from threadpoolctl import threadpool_limits

    from rlx_runtime import plan as plan_module

    rng = np.random.default_rng(7)
    k = 512
    consts = {"tall": rng.standard_normal((k, 256)), "wide": rng.standard_normal((256, 640)),
              "shared": rng.standard_normal((k, 256)), "small": rng.standard_normal((64, 8))}
    g = GraphBuilder()
    x = g.input("x", "f32", ["m", k])
    c = {n: g.constant(v.astype(np.float32), name=n) for n, v in consts.items()}
    h = g.op("MatMul", x, c["tall"], name="h")
    y = g.op("MatMul", h, c["wide"], name="y")
    s = g.op("MatMul", x, c["shared"], name="s")
    g.output(y)
    z = g.input("z", "f32", [256, 3])
    g.output(s)
    g.output(g.op("MatMul", c["shared"], z, name="s2"))  # also the left operand: keeps its layout
    g.output(g.op("MatMul", g.op("Slice", x, starts=[0], ends=[64], axes=[1]), c["small"], name="t"))
    compiled = Session().compile(g.build())
    plan = compiled._plan
    layout = {n: plan.base[plan.slot[n]].flags.f_contiguous for n in consts}
    assert layout == {"tall": True, "wide": False, "shared": False, "small": False}
    assert consts["tall"].size >= plan_module.MIN_COLUMN_MAJOR > consts["small"].size
    xin = rng.standard_normal((rows, k)).astype(np.float32)
    zin = rng.standard_normal((256, 3)).astype(np.float32)
    with threadpool_limits(threads, "blas"):
        out = compiled.run({"x": xin, "z": zin})
    w = {n: v.astype(np.float32).astype(np.float64) for n, v in consts.items()}
    x64 = xin.astype(np.float64)
    np.testing.assert_allclose(out["y"], x64 @ w["tall"] @ w["wide"], rtol=1e-4, atol=2e-3)
    np.testing.assert_allclose(out["s"], x64 @ w["shared"], rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out["s2"], w["shared"] @ zin.astype(np.float64), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(out["t"], x64[:, :64] @ w["small"], rtol=1e-4, atol=1e-4)


def test_a_few_rows_matmul_runs_before_numba_is_loaded():
    """A small batch through a linear layer (2-16 rows: the few-rows GEMM, a numba kernel) in a process that has
    not loaded numba takes the BLAS instead of failing, and leaves numba unloaded."""
    import subprocess
    import sys
    code = ("import sys, numpy as np\nfrom rlx_format import GraphBuilder\nfrom rlx_runtime import Session\n"
            "g = GraphBuilder()\nx = g.input('x', 'f32', [5, 64])\n"
            "w = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)\n"
            "g.output(g.op('MatMul', x, g.constant(w, name='w'), name='y'))\n"
            "xin = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)\n"
            "y = Session().compile(g.build()).run({'x': xin})['y']\n"
            "assert np.allclose(y, xin.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)\n"
            "print('numba' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "False"


def test_a_graph_that_loads_numba_loads_it_at_compile_so_the_first_forward_is_every_forwards():
    """LayerNorm, then an exact Gelu (whose kernel loads numba), in a fresh process: compile loads numba, so the
    first forward's LayerNorm already takes its numba row kernel (other bits than the numpy steps) and equals the
    second forward bit for bit; so does a DequantMatMul (its CPU kernel is numba's), and a float32 conv graph (its
    numba conv and pool kernels run ResNet-50 1.2-1.5x faster than the numpy path) and a LayerNorm graph with 8 MiB
    of float32 weights (a row kernel beats numpy's steps once weights stream through the caches), while a Relu
    graph, a float64 conv or a LayerNorm with 4 MiB of weights leaves numba unloaded."""
    import subprocess
    import sys
    head = "import sys, numpy as np\nfrom rlx_format import GraphBuilder\nfrom rlx_runtime import Session\n"
    gelu = (head + "rng = np.random.default_rng(0)\ng = GraphBuilder()\nx = g.input('x', 'f32', [8, 128, 384])\n"
            "s = g.constant(rng.standard_normal(384).astype(np.float32), name='s')\n"
            "g.output(g.op('Gelu', g.op('LayerNorm', x, s, axis=-1, epsilon=1e-5), name='y'))\n"
            "c = Session().compile(g.build())\nloaded = 'numba' in sys.modules\n"
            "xin = (rng.standard_normal((8, 128, 384)) * 3 + 1).astype(np.float32)\n"
            "a, b = c.run({'x': xin})['y'], c.run({'x': xin})['y']\n"
            "print(loaded, np.array_equal(a.view(np.uint32), b.view(np.uint32)))\n")
    relu = (head + "g = GraphBuilder()\ng.output(g.op('Relu', g.input('x', 'f32', [4]), name='y'))\n"
            "Session().compile(g.build())\nprint('numba' in sys.modules)\n")
    conv = (head + "g = GraphBuilder()\nx = g.input('x', '{dt}', [1, 3, 8, 8])\n"
            "w = g.constant(np.ones((4, 3, 3, 3), {npdt}), name='w', dtype='{dt}')\n"
            "g.output(g.op('MaxPool', g.op('Relu', g.op('Conv', x, w)), kernel_shape=[2, 2], name='y'))\n"
            "Session().compile(g.build())\nprint('numba' in sys.modules)\n")
    q8 = (head + "g = GraphBuilder()\nx = g.input('x', 'f32', [2, 64])\n"  # zero Q8_0 blocks: 34 bytes per 32
          "w = g.constant(np.zeros((8, 68), np.uint8), name='w')\n"
          "g.output(g.dequant_mat_mul(x, w, encoding='gguf_q8_0', N=8, K=64, name='y'))\n"
          "Session().compile(g.build())\nprint('numba' in sys.modules)\n")
    ln = (head + "rng = np.random.default_rng(0)\ng = GraphBuilder()\nx = g.input('x', 'f32', [1, 1024])\n"
          "w = g.constant(rng.standard_normal((1024, {rows})).astype(np.float32), name='w')\n"
          "s = g.constant(np.ones(1024, np.float32), name='s')\n"
          "g.output(g.op('MatMul', g.op('LayerNorm', x, s, axis=-1, epsilon=1e-5), w, name='y'))\n"
          "Session().compile(g.build())\nprint('numba' in sys.modules)\n")
    for code, want in ((gelu, ["True", "True"]), (relu, ["False"]), (q8, ["True"]),
                       (ln.format(rows=2048), ["True"]), (ln.format(rows=1024), ["False"]),
                       (conv.format(dt="f32", npdt="np.float32"), ["True"]),
                       (conv.format(dt="f64", npdt="np.float64"), ["False"])):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split() == want


_NUMBA_UNIMPORTABLE = """
import sys
class _NoNumba:  # numba cannot be imported (not installed, llvmlite's library missing): not even tried before
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "numba":
            raise ImportError("numba blocked for this test")
sys.meta_path.insert(0, _NoNumba())
import numpy as np
from rlx_format import GraphBuilder, RlxError
from rlx_runtime import Session
rng = np.random.default_rng(0)
g = GraphBuilder()
x = g.input("x", "f32", [1, 3, 8, 8])
w = g.constant(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), name="w")
g.output(g.op("Relu", g.op("Conv", x, w), name="y"))
xin = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
y = Session().compile(g.build()).run({"x": xin})["y"]  # a conv wants numba but has its numpy path
g = GraphBuilder()
g.output(g.op("Sigmoid", g.input("x", "f32", [4]), name="y"))
try:
    Session().compile(g.build())
    print("compiled")
except RlxError as e:
    print("refused", "numba could not be imported (ImportError: numba blocked" in str(e), "pip install numba" in str(e))
print(y.shape == (1, 4, 6, 6) and bool(np.all(y >= 0)), "numba" in sys.modules)
"""


def test_without_numba_a_conv_graph_compiles_and_a_graph_that_needs_numba_is_refused_clearly():
    """In a process where numba cannot be imported: a float32 conv graph, for which compile would load numba, compiles
    and runs on its numpy path; a Sigmoid graph, whose kernel needs numba, is refused at compile with an RlxError
    that says why and how to fix it."""
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", _NUMBA_UNIMPORTABLE], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["refused", "True", "True", "True", "False"]


@pytest.mark.parametrize("ctm", ["asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners",
                                 "tf_half_pixel_for_nn"])
@pytest.mark.parametrize("nearest", ["floor", "ceil", "round_prefer_floor", "round_prefer_ceil"])
def test_cpu_nearest_upsample_by_whole_factors_is_the_generic_gather(ctm, nearest, monkeypatch):
    """Once numba is loaded, a 4-D float32 nearest Resize whose source indices repeat each input row and column a
    whole number of times copies rows (conv_kernels.repeat_planes): the generic kernel's values, bit for bit, and
    the same kernel for every other case (N or C resized, index patterns that are not repeats)."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the row copies run once numba is loaded
    from rlx_runtime import conv_kernels
    from rlx_runtime.backend import CPU
    from rlx_runtime.kernels import data

    calls = []
    real = conv_kernels.repeat_planes
    monkeypatch.setattr(conv_kernels, "repeat_planes", lambda *a: calls.append(a[2:]) or real(*a))
    rng = np.random.default_rng(13)
    taken = 0
    one_row = rng.standard_normal((1, 2, 1, 3)).astype(np.float32)  # 0.5 of one row: an empty output
    a = {"sizes": None, "scales": [1.0, 1.0, 0.5, 2.0], "mode": "nearest", "coordinate_transformation_mode": ctm,
         "nearest_mode": nearest}
    np.testing.assert_array_equal(CPU.kernel("Resize")(np, dict(a), one_row), data._resize(np, a, one_row))
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    x[0, 0, 0, :3] = [np.nan, -0.0, np.inf]
    for scales in ([1, 1, 2, 2], [1, 1, 2, 3], [1, 1, 1, 2], [1, 1, 3, 1], [1, 2, 2, 2], [2, 1, 1, 1],
                   [1, 1, 1.5, 2], [1, 1, 0.5, 1]):
        a = {"sizes": None, "scales": [float(v) for v in scales], "mode": "nearest",
             "coordinate_transformation_mode": ctm, "nearest_mode": nearest}
        calls.clear()
        got = CPU.kernel("Resize")(np, dict(a), x)
        want = data._resize(np, a, x)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg=str(scales))
        taken += bool(calls)
        assert not calls or calls == [tuple(int(v) for v in scales[2:])]
        if scales[:2] != [1, 1] or scales[2] % 1 or scales[3] % 1 or min(scales) < 1:
            assert not calls, scales
    if (ctm, nearest) in (("asymmetric", "floor"), ("half_pixel", "round_prefer_floor")):
        assert taken == 4  # PyTorch's and the ONNX default's nearest upsample: repeats for every whole factor


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("shape", [(8, 12, 128, 128), (3, 7), (5, 1), (2, 3, 45), (0, 5)], ids=str)
def test_cpu_softmax_rows_match_the_generic_kernel(shape, monkeypatch):
    """Once numba is loaded a float32 Softmax over the last axis runs a row at a time (ufuncs.softmax_rows): the
    generic kernel's values within float32 rounding (its own exp and sum order) and float64's, the same NaN
    pattern (a NaN row, a row with +inf, a row of -inf: the last two by the generic steps), deterministic from run
    to run; another axis or float64 takes the generic kernel."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the row kernel runs once numba is loaded
    from rlx_runtime import ufuncs
    from rlx_runtime.backend import CPU
    from rlx_runtime.kernels import elementwise

    calls = []
    real = ufuncs.softmax_rows
    monkeypatch.setattr(ufuncs, "softmax_rows", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(12)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    if x.size and x.size // shape[-1] > 3 and shape[-1] > 2:
        rows = x.reshape(-1, shape[-1])
        rows[0, 1], rows[1, 2], rows[2, :] = np.nan, np.inf, -np.inf
    a = {"axis": -1}
    got = CPU.kernel("Softmax")(np, a, x)
    want = elementwise._softmax(np, a, x)
    assert calls == ([1] if x.size else []) and got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    ref = x.astype(np.float64)
    with np.errstate(all="ignore"):
        e = np.exp(ref - ref.max(axis=-1, keepdims=True))
        exact = e / e.sum(axis=-1, keepdims=True)
    fin = np.isfinite(exact)
    np.testing.assert_allclose(got[fin], exact[fin], rtol=3e-6, atol=1e-8)
    np.testing.assert_array_equal(CPU.kernel("Softmax")(np, a, x.copy()), got)
    calls.clear()
    if x.size:  # (an empty axis has no max)
        CPU.kernel("Softmax")(np, {"axis": 0}, x)
    CPU.kernel("Softmax")(np, a, x.astype(np.float64))
    assert calls == []


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("shape,axis,with_bias", [((8, 16, 384), -1, True), ((3, 7), -1, False),
                                                  ((2, 5, 3, 11), -2, True), ((4, 1), -1, True),
                                                  ((2, 3, 40), 1, False)], ids=str)
def test_cpu_layer_norm_rows_match_the_generic_kernel(shape, axis, with_bias, monkeypatch):
    """Once numba is loaded a float32 LayerNorm runs a row at a time (ufuncs.layer_norm_rows): the generic
    kernel's values within float32 rounding (its sums in another order), NaN and Inf rows as NaN rows, the same
    shape; float64 and a scale of another size take the generic kernel."""
    from rlx_format.numba_setup import numba  # noqa: F401 - the row kernel runs once numba is loaded
    from rlx_runtime import ufuncs
    from rlx_runtime.backend import CPU
    from rlx_runtime.kernels import nn

    calls = []
    real = ufuncs.layer_norm_rows
    monkeypatch.setattr(ufuncs, "layer_norm_rows", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    norm = shape[axis % len(shape):]
    scale = rng.standard_normal(norm).astype(np.float32)
    bias = rng.standard_normal(norm).astype(np.float32) if with_bias else None
    x.reshape(-1, int(np.prod(norm)))[0, 0] = np.nan  # a NaN row
    if x.reshape(-1, int(np.prod(norm))).shape[0] > 2:
        x.reshape(-1, int(np.prod(norm)))[2, -1] = np.inf
    a = {"axis": axis, "epsilon": 1e-5}
    args = (scale,) if bias is None else (scale, bias)
    got = CPU.kernel("LayerNorm")(np, a, x, *args)
    want = nn._layernorm(np, a, x, *args)
    assert calls == [1] and got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    ref = x.astype(np.float64)
    axes = tuple(range(axis % x.ndim, x.ndim))
    d = ref - ref.mean(axis=axes, keepdims=True)
    exact = d / np.sqrt((d * d).mean(axis=axes, keepdims=True) + 1e-5) * scale + (0 if bias is None else bias)
    fin = np.isfinite(exact)
    np.testing.assert_allclose(got[fin], exact[fin], rtol=1e-4, atol=1e-4)
    calls.clear()
    CPU.kernel("LayerNorm")(np, a, x.astype(np.float64), *(v.astype(np.float64) for v in args))
    assert calls == []
