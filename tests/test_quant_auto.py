"""--quant auto (per weight the smallest lossy type within a cosine), per-weight overrides by glob, and the
report of the chosen type, cosine and max abs error (#23)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file
from test_bake import run_baked
from test_cli import invoke

import rlx_bake.quant_choice as quant_mod
from rlx_bake import BakeOptions, bake
from rlx_format import GraphBuilder, RlxError
from rlx_format.codecs import CODECS
from rlx_format.quants import dequantize, quantize

R = np.random.default_rng(7)


def _graph():
    g = GraphBuilder()
    x = g.input("x", "f32", ["b", 64])
    ids = g.input("ids", "i64", ["b"])
    e = g.gather(g.param("emb.table", "f32", [50, 64]), ids, axis=0)
    h = g.add(g.matmul(x, g.param("enc.w", "f32", [64, 64])), e)
    g.output(g.matmul(h, g.param("head.w", "f32", [64, 32]), name="y"))
    return g.build()


def _weights():
    return {"emb.table": R.standard_normal((50, 64)).astype(np.float32),
            "enc.w": R.uniform(-1, 1, (64, 64)).astype(np.float32),
            "head.w": R.standard_t(2, (64, 32)).astype(np.float32)}


def _cosine(a, b):
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _expected(rows, min_cos):
    """Oracle: the first lossy codec by bits per weight whose round trip keeps the cosine."""
    for c in sorted((c for c in CODECS.values() if not c.ternary), key=lambda c: c.nbytes / c.block):
        if rows.shape[1] % c.block == 0 and _cosine(dequantize(quantize(rows, c.name), c.name), rows) >= min_cos:
            return c.name
    return None


ROWS = {"emb.table": lambda w: w, "enc.w": lambda w: w.T, "head.w": lambda w: w.T}


@pytest.mark.parametrize("min_cos", [0.99, 0.999, 0.9999])
def test_auto_picks_the_smallest_type_within_the_cosine(min_cos):
    ws = _weights()
    rf, rep = bake(_graph(), ws, BakeOptions.from_profile("size", quant_type="auto", quant_min_cosine=min_cos))
    by_src = {w.name.split(".")[0] + "." + w.name.split(".")[1]: w for w in rep.weights}
    chosen = set()
    for name, f in ROWS.items():
        want = _expected(np.ascontiguousarray(f(ws[name])), min_cos)
        w = by_src[name]
        assert w.encoding == want, name
        assert w.cosine >= min_cos and w.note.startswith(f"lossy {CODECS[want].ggml} (auto")
        back = dequantize(rf.weights[w.name].data, want)
        assert w.cosine == pytest.approx(_cosine(back, f(ws[name])), abs=1e-12)
        assert w.max_abs_err == pytest.approx(float(np.abs(back - f(ws[name])).max()))
        chosen.add(want)
    assert rep.quant_type == "auto" and len(rep.quant) == 3
    if min_cos == 0.999:
        assert len(chosen) > 1  # the three weights get different types: the choice is per weight
    x, ids = R.standard_normal((3, 64)).astype(np.float32), np.array([0, 7, 49])
    assert run_baked(rf, {"x": x, "ids": ids})["y"].shape == (3, 32)


def test_auto_keeps_a_weight_dense_when_no_type_is_close_enough():
    rf, rep = bake(_graph(), _weights(), BakeOptions.from_profile("size", quant_type="auto",
                                                                   quant_min_cosine=0.9999999))
    assert rep.quant == [] and all(w.encoding == "f32" for w in rep.weights)
    assert "no registered type keeps its cosine >= 0.9999999" in " ".join(rep.notes)


def test_auto_reads_the_codec_registry_when_it_runs(monkeypatch):
    ws = _weights()
    lo = BakeOptions.from_profile("size", quant_type="auto", quant_min_cosine=0.9)
    assert {w.encoding for w in bake(_graph(), ws, lo)[1].weights} == {"gguf_mxfp4"}
    monkeypatch.setattr(quant_mod, "CODECS", {k: c for k, c in CODECS.items() if k != "gguf_mxfp4"})
    assert {w.encoding for w in bake(_graph(), ws, lo)[1].weights} == {"gguf_q4_0"}
    assert "mxfp4" not in quant_mod.quant_types()


def test_overrides_by_glob_last_match_wins():
    ws = _weights()
    opts = BakeOptions.from_profile("size", quant_type="q4_0",
                                    quant_weights=(("*.w", "q5_1"), ("head.*", "dense"), ("emb.*", "q8_0")))
    rf, rep = bake(_graph(), ws, opts)
    enc = {w.name: w.encoding for w in rep.weights}
    assert enc == {"emb.table.q8_0": "gguf_q8_0", "enc.w.q5_1": "gguf_q5_1", "head.w": "f32"}
    assert "weight 'head.w': kept dense (override)" in rep.notes
    opts = BakeOptions.from_profile("size", quant_type="q8_0", quant_weights=(("head.*", "auto"),),
                                    quant_min_cosine=0.99)
    enc = {w.name.rsplit(".", 1)[0]: w.encoding for w in bake(_graph(), ws, opts)[1].weights}
    assert enc["emb.table"] == "gguf_q8_0" and enc["head.w"] == _expected(np.ascontiguousarray(ws["head.w"].T), 0.99)


def test_override_errors_name_the_choices():
    with pytest.raises(RlxError, match=r"emb\.\*=q3_k: unknown type 'q3_k'; expected one of q8_0, q4_0.*, auto or "
                                       r"dense"):
        BakeOptions.from_profile("size", quant_weights=(("emb.*", "q3_k"),))
    with pytest.raises(RlxError, match="unknown quant type 'q9'; expected one of q8_0.* or auto"):
        BakeOptions.from_profile("size", quant_type="q9")
    with pytest.raises(RlxError, match="need quantization on"):
        BakeOptions.from_profile("exact", quant_weights=(("emb.*", "q8_0"),))
    with pytest.raises(RlxError, match=r"embed\.\*=q8_0: the glob matches none of the weights the quantization pass "
                                       r"can pack \(emb.table, enc.w, head.w\)"):
        bake(_graph(), _weights(), BakeOptions.from_profile("size", quant_weights=(("embed.*", "q8_0"),)))
    with pytest.raises(RlxError, match="a cosine is a number in"):
        BakeOptions.from_profile("size", quant_type="auto", quant_min_cosine=1.5)


@pytest.fixture
def model(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "graph.json").write_text(_graph().to_json())
    save_file(_weights(), str(d / "weights.safetensors"))
    return d


def test_cli_auto_and_overrides(model, tmp_path):
    out, rep = tmp_path / "a.rlx", tmp_path / "r.json"
    r = invoke(model, "-o", out, "--quant", "auto", "--max-error", "0.999", "--quant-weight", "head.*=dense",
               "--report-json", rep)
    assert r.exit_code == 0, r.output
    report = json.loads(rep.read_text())
    assert report["quant_type"] == "auto" and report["counts"]["quant"] == 2
    rows = {w["name"]: w for w in report["weights"]}
    assert rows["head.w"]["encoding"] == "f32"
    packed = [w for w in report["weights"] if w["encoding"].startswith("gguf_")]
    assert len(packed) == 2 and all(w["cosine"] >= 0.999 and w["max_abs_err"] > 0 for w in packed)
    text = " ".join(r.output.split())
    for w in packed:  # the CLI table: name, chosen type, cosine, max abs error
        assert w["name"] in text and w["encoding"] in text and f"{w['cosine']:.6f}" in text
        assert f"{w['max_abs_err']:.3g}" in text
    assert "quant 2 (auto)" in text


def test_cli_override_mistakes_are_clear(model, tmp_path):
    out = tmp_path / "b.rlx"
    r = CliRunner().invoke(cli_main(), [str(model), "-o", str(out), "--opt", "size", "--quant-weight", "nope.*=q8_0"])
    assert r.exit_code == 1 and "matches none of the weights" in r.output and "emb.table" in r.output
    assert "Traceback" not in r.output and not out.exists()
    r = invoke(model, "-o", out, "--opt", "size", "--quant-weight", "emb.*=q7")
    assert r.exit_code == 1 and "unknown type 'q7'" in r.output and not out.exists()
    r = invoke(model, "-o", out, "--opt", "size", "--quant-weight", "emb.*")
    assert r.exit_code == 2 and "expected GLOB=TYPE" in r.output
    r = invoke(model, "-o", out, "--quant-weight", "emb.*=q8_0")
    assert r.exit_code == 1 and "need quantization on" in r.output
    r = invoke(model, "-o", out, "--no-quant", "--max-error", "0.99")
    assert r.exit_code == 2 and "contradict --no-quant" in r.output


def cli_main():
    from rlx_bake.cli import main
    return main


def test_a_block_whose_scale_collapses_to_zeros_is_kept_dense():
    """Q6_K at |x| ~ 1e20: its fp16 scale overflows and the block decodes to zeros (finite, but wrong); the
    pass keeps such a weight dense instead of shipping zeros."""
    g = GraphBuilder()
    x = g.input("x", "f32", [1, 256])
    g.output(g.matmul(x, g.param("w", "f32", [256, 8]), name="y"))
    w = R.standard_normal((256, 8)).astype(np.float32)
    w[:, 3] *= np.float32(1e20)
    back = dequantize(quantize(np.ascontiguousarray(w.T), "gguf_q6_k"), "gguf_q6_k")
    assert np.isfinite(back).all() and not back[3].any()  # the hazard is real
    rf, rep = bake(g.build(), {"w": w}, BakeOptions.from_profile("size", quant_type="q6_k"))
    assert rep.quant == [] and rf.weights["w"].encoding == "f32"
    assert any("fp16 scale can hold" in n for n in rep.notes)
    w[:, 3] /= np.float32(1e20)  # ordinary magnitudes still pack
    _, rep = bake(g.build(), {"w": w}, BakeOptions.from_profile("size", quant_type="q6_k"))
    assert rep.quant == ["w"]
