"""The quantization type as a bake option and CLI choice (--quant TYPE), and the ternary pass's choice of
the smallest lossless packing (TQ1_0)."""

import json

import numpy as np
import pytest
from test_bake import f32, run_baked, run_ref, tern
from test_cli import bundle, invoke  # noqa: F401 - bundle is a fixture

from rlx_bake import BakeOptions, bake
from rlx_bake.options import QUANT_TYPES
from rlx_format import GraphBuilder, RlxError, read_rlx
from rlx_format.codecs import BY_SHORT
from rlx_format.quants import dequantize


def _graph(k=64, n=32):
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", k])
    g.output(g.matmul(x, g.param("w", "f32", [k, n]), name="y"))
    return g.build()


def test_quant_types_are_the_lossy_codecs():
    assert set(QUANT_TYPES) == {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4", "q4_k", "q5_k", "q6_k"}


@pytest.mark.parametrize("qt", QUANT_TYPES)
def test_every_quant_type_bakes_runs_and_reports(qt):
    c = BY_SHORT[qt]
    k = max(64, c.block)  # K a multiple of the block (the K-quants: 256)
    w = {"w": f32(k, 32)}
    rf, rep = bake(_graph(k), w, BakeOptions.from_profile("size", quant_type=qt))
    assert rep.quant == ["w"] and rep.quant_type == qt
    (wr,) = rep.weights
    assert wr.encoding == c.name and wr.note == f"lossy {c.ggml}" and wr.name == f"w.{qt}"
    assert wr.bytes_after == 32 * k // c.block * c.nbytes
    back = dequantize(rf.weights[wr.name].data, c.name)
    assert wr.max_abs_err == pytest.approx(float(np.abs(back - w["w"].T).max()))
    assert 0 < wr.max_abs_err < 0.25 * float(np.abs(w["w"]).max()) and wr.cosine > 0.99
    X = f32(10, k)
    np.testing.assert_allclose(run_baked(rf, {"x": X})["y"], X @ back.T, rtol=1e-4, atol=1e-4)
    assert rf.meta["bake"]["quant_type"] == qt


def test_fewer_bits_more_error():
    w = {"w": f32(64, 32)}
    err = {qt: bake(_graph(), w, BakeOptions.from_profile("size", quant_type=qt))[1].weights[0].max_abs_err
           for qt in ("q8_0", "q5_0", "q4_0")}
    assert err["q8_0"] < err["q5_0"] < err["q4_0"]


def test_unknown_quant_type_is_refused_before_any_work():
    with pytest.raises(RlxError, match="unknown quant type 'q3_0'; expected one of q8_0, q4_0"):
        BakeOptions.from_profile("size", quant_type="q3_0")
    with pytest.raises(RlxError, match="unknown quant type 'tq1_0'"):  # ternary codecs belong to the ternary pass
        bake(_graph(), {"w": f32(64, 32)}, BakeOptions(quant=True, quant_type="tq1_0"))


def test_k_not_a_multiple_of_the_block_stays_dense():
    rf, rep = bake(_graph(k=48), {"w": f32(48, 32)}, BakeOptions.from_profile("size", quant_type="q4_0"))
    assert rep.quant == [] and "K=48 is not a multiple of 32" in " ".join(rep.notes)


def test_exact_packs_ternary_weights_as_tq1_0_losslessly():
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 512])
    g.output(g.matmul(x, g.param("w", "f32", [512, 64]), name="y"))
    w = {"w": tern(512, 64, a=0.25)}
    rf, rep = bake(g.build(), w)
    (wr,) = rep.weights
    assert rep.ternary == ["w"] and wr.encoding == "gguf_tq1_0" and wr.note == "lossless TQ1_0"
    assert wr.bytes_after == 64 * 2 * 54  # vs 64 * 2 * 66 as TQ2_0
    np.testing.assert_array_equal(rf.weights["w.tq1_0"].dense(), w["w"].T)
    X = f32(20, 512)
    np.testing.assert_allclose(run_baked(rf, {"x": X})["y"], run_ref(g.build(), w, {"x": X})["y"],
                               rtol=1e-5, atol=1e-4)


def test_cli_quant_choice(bundle, tmp_path):  # noqa: F811
    out, rep = tmp_path / "q.rlx", tmp_path / "r.json"
    r = invoke(bundle, "-o", out, "--no-ternary", "--quant", "q4_1", "--report-json", rep)
    assert r.exit_code == 0, r.output
    assert "gguf_q4_1" in r.output and "lossy Q4_1" in r.output and "quant 3 (q4_1)" in r.output
    report = json.loads(rep.read_text())
    assert report["quant_type"] == "q4_1" and report["counts"]["quant"] == 3
    packed = [w for w in report["weights"] if w["encoding"] == "gguf_q4_1"]
    assert len(packed) == 3 and all(w["max_abs_err"] > 0 and w["note"] == "lossy Q4_1" for w in packed)
    assert sum(w.encoding == "gguf_q4_1" for w in read_rlx(out).weights.values()) == 3
    r = invoke("inspect", out)
    assert r.exit_code == 0 and "quant 3 (q4_1)" in r.output
    # --quant always takes its type (a bundle path after it is not read as one); --no-quant turns the size
    # profile's quantization off
    r = invoke(bundle, "-o", tmp_path / "a.rlx", "--no-ternary", "--quant")
    assert r.exit_code == 2 and "'--quant' requires an argument" in r.output and not (tmp_path / "a.rlx").exists()
    r = invoke("--quant", bundle, "-o", tmp_path / "a.rlx")
    assert r.exit_code == 2 and "is not one of 'q8_0'" in r.output and not (tmp_path / "a.rlx").exists()
    r = invoke(bundle, "-o", tmp_path / "a.rlx", "--no-ternary", "--quant", "q8_0")
    assert r.exit_code == 0 and "quant 3 (q8_0)" in r.output
    r = invoke(bundle, "-o", tmp_path / "b.rlx", "--no-ternary", "--opt", "size", "--no-quant")
    assert r.exit_code == 0 and read_rlx(tmp_path / "b.rlx").meta["bake"]["counts"]["quant"] == 0
    r = invoke(bundle, "-o", tmp_path / "c.rlx", "--quant", "q3_0")
    assert r.exit_code == 2 and "'q3_0' is not one of" in r.output
    r = invoke(bundle, "-o", tmp_path / "d.rlx", "--quant", "q4_0", "--no-quant")
    assert r.exit_code == 2 and "contradict" in r.output and not (tmp_path / "d.rlx").exists()
