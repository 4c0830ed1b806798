"""rlx-bake through click's CliRunner: every subcommand and the bad-input catalogue."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from rlx_bake.cli import main
from rlx_format import GraphBuilder, is_encrypted, read_rlx

EXAMPLE = Path(__file__).parent.parent / "examples" / "digits" / "ternary"
FAST = ["--kdf", "fast"]


@pytest.fixture
def bundle(tmp_path):
    d = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, d)
    return d


def invoke(*args, env=None, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env, input=input, catch_exceptions=False)


def test_bake_default_command_and_report(bundle, tmp_path):
    out, rep = tmp_path / "m.rlx", tmp_path / "report.json"
    r = invoke(bundle, "-o", out, "--report-json", rep)
    assert r.exit_code == 0, r.output
    assert f"wrote {out}" in r.output and "gguf_tq1_0" in r.output
    report = json.loads(rep.read_text())
    assert report["profile"] == "exact" and report["counts"]["ternary"] == 2
    assert read_rlx(out, verify=True).meta["bake"]["counts"]["ternary"] == 2
    r = invoke("-q", "bake", bundle, "-o", tmp_path / "q.rlx")
    assert r.exit_code == 0 and "gguf_tq1_0" not in r.output


def test_flags_and_profiles(bundle, tmp_path):
    r = invoke(bundle, "-o", tmp_path / "a.rlx", "--no-ternary", "--opt", "size")
    assert r.exit_code == 0, r.output
    rep = read_rlx(tmp_path / "a.rlx").meta["bake"]
    assert rep["counts"] == {"skipped": 0, "ternary": 0, "quant": 3}
    r = invoke(bundle, "-o", tmp_path / "b.rlx", "--opt", "merge")
    assert read_rlx(tmp_path / "b.rlx").meta["bake"]["counts"]["ternary"] == 0


def test_sealed_round_trip_and_subcommands(bundle, tmp_path):
    env = {"PW": "s3cret"}
    sealed, plain, resealed = tmp_path / "s.rlx", tmp_path / "p.rlx", tmp_path / "r.rlx"
    assert invoke(bundle, "-o", sealed, "--password-env", "PW", *FAST, env=env).exit_code == 0
    assert is_encrypted(sealed)
    r = invoke("inspect", sealed)
    assert r.exit_code == 0 and "encrypted: True" in r.output and "memory_kib: 8192" in r.output
    r = invoke("inspect", sealed, "--password-env", "PW", env=env)
    assert r.exit_code == 0 and "DequantMatMul" in r.output and ".tq1_0" in r.output
    assert "bake: profile exact; nodes" in r.output and "ternary 2" in r.output
    r = invoke("decrypt", sealed, "-o", plain, "--password-stdin", input="s3cret\n")
    assert r.exit_code == 0 and not is_encrypted(plain)
    r = invoke("encrypt", plain, "-o", resealed, "--password-env", "PW", *FAST, env=env)
    assert r.exit_code == 0 and is_encrypted(resealed)
    r = invoke("verify", resealed, "--password-env", "PW", "--against", bundle, env=env)
    assert r.exit_code == 0, r.output
    assert "digests OK" in r.output and "output probs: max abs diff" in r.output
    cos = float(r.output.split("cosine ")[1].split()[0])
    assert cos > 0.9999999


def test_inspect_json_and_run(bundle, tmp_path):
    out = tmp_path / "m.rlx"
    invoke(bundle, "-o", out)
    info = json.loads(invoke("inspect", out, "--json").output)
    assert info["inputs"] == [{"name": "x", "dtype": "f32", "shape": ["batch", 64]}]
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((3, 64), np.float32))
    r = invoke("run", out, "--input", f"x={x}", "-o", tmp_path / "o.npz")
    assert r.exit_code == 0, r.output
    assert "probs: float32[3, 10]" in r.output
    r2 = invoke("run", out, "--input", f"x={x}", "--unpack")
    assert r2.exit_code == 0 and "probs: float32[3, 10]" in r2.output
    with np.load(tmp_path / "o.npz") as z:
        np.testing.assert_allclose(z["probs"].sum(1), 1, rtol=1e-5)


def test_password_value_warns_and_python_m(bundle, tmp_path):
    r = invoke(bundle, "-o", tmp_path / "s.rlx", "--password", "pw", *FAST)
    assert r.exit_code == 0 and "visible to other users" in r.output
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "rlx_bake", "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "inspect" in p.stdout


def _graph_dir(tmp_path, graph_text=None, weights=None):
    d = tmp_path / "g"
    d.mkdir(parents=True, exist_ok=True)
    if graph_text is not None:
        (d / "graph.json").write_text(graph_text)
    if weights is not None:
        save_file(weights, str(d / "weights.safetensors"))
    return d


def _small_graph():
    g = GraphBuilder("s")
    x = g.input("x", "f32", ["b", 32])
    g.output(g.matmul(x, g.param("w", "f32", [32, 4]), name="y"))
    return g.build().to_json()


def _bad_cases(tmp_path):
    good_w = {"w": np.ones((32, 4), np.float32)}
    nan_w = {"w": np.full((32, 4), np.nan, np.float32)}
    sealed = tmp_path / "sealed.rlx"
    invoke(_graph_dir(tmp_path / "ok", _small_graph(), good_w), "-o", sealed, "--password-env", "PW", *FAST,
           env={"PW": "right"})
    plain = tmp_path / "plain.rlx"
    invoke(_graph_dir(tmp_path / "ok2", _small_graph(), good_w), "-o", plain)
    truncated = tmp_path / "truncated.rlx"
    truncated.write_bytes(plain.read_bytes()[:-10])
    outdir = tmp_path / "outdir"
    outdir.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "x.npy").write_bytes(b"nope")
    np.save(tmp_path / "x64.npy", np.zeros((2, 32)))
    mk = _graph_dir
    return [
        # (args, env, stdin, exit code, message)
        (["missing_dir", "-o", "o.rlx"], None, None, 1, "no such file or directory"),
        ([mk(tmp_path / "a"), "-o", "o.rlx"], None, None, 1, "directory has no graph.json"),
        ([mk(tmp_path / "b", "{oops"), "-o", "o.rlx"], None, None, 1, "invalid JSON at line 1"),
        ([mk(tmp_path / "c", _small_graph().replace("MatMul", "MatMull")), "-o", "o.rlx"], None, None, 1,
         "unknown op 'MatMull'; did you mean MatMul"),
        ([mk(tmp_path / "d", _small_graph(), {"w": np.ones((32, 4), np.float16)}), "-o", "o.rlx"], None, None, 1,
         "weight 'w': dtype f16"),
        ([mk(tmp_path / "e", _small_graph(), {"w": np.ones((4, 32), np.float32)}), "-o", "o.rlx"], None, None, 1,
         "weight 'w': shape [4, 32]"),
        ([mk(tmp_path / "f", _small_graph(), nan_w), "-o", "o.rlx", "--quant", "q8_0"], None, None, 1,
         "cannot be quantized to Q8_0"),
        ([mk(tmp_path / "g", _small_graph(), {"v": np.ones(3, np.float32)}), "-o", "o.rlx"], None, None, 1,
         "none of the 1 weights matches a param"),
        ([mk(tmp_path / "h", _small_graph()), "-o", "o.rlx", "--strict"], None, None, 1, "--strict: param(s)"),
        ([mk(tmp_path / "i", _small_graph()), "-o", "o.rlx", "--password-env", "PW", "--password-stdin"],
         {"PW": "x"}, None, 2, "give one password source"),
        ([mk(tmp_path / "j", _small_graph()), "-o", "o.rlx", "--password-env", "PW"], {"PW": ""}, None, 1,
         "environment variable PW is empty"),
        ([mk(tmp_path / "k", _small_graph()), "-o", "o.rlx", "--password-env", "NOPE_UNSET"], None, None, 1,
         "NOPE_UNSET is not set"),
        ([mk(tmp_path / "l", _small_graph()), "-o", "o.rlx", "--password-stdin"], None, "\n", 1, "empty password"),
        ([mk(tmp_path / "m", _small_graph()), "-o", "o.rlx", "--password"], None, None, 1, "stdin is not a terminal"),
        ([mk(tmp_path / "n", _small_graph()), "-o", "o.rlx", "--opt", "tiny"], None, None, 2, "Invalid value"),
        ([mk(tmp_path / "o", _small_graph()), "-o", "no_such_dir/o.rlx"], None, None, 1, "does not exist"),
        ([mk(tmp_path / "p", _small_graph())], None, None, 2, "Missing option '-o'"),
        (["inspect", "nothing.rlx"], None, None, 1, "no such file"),
        (["inspect", sealed, "--password-env", "PW"], {"PW": "wrong"}, None, 1, "decryption failed"),
        (["run", sealed], None, None, 1, "file is encrypted (RLXENC01)"),
        (["run", plain, "--input", "x"], None, None, 2, "expected NAME=FILE.npy"),
        (["run", plain, "--input", f"x={tmp_path / 'x.npy'}"], None, None, 1, "not a .npy array"),
        (["run", plain, "--input", f"x={tmp_path / 'x64.npy'}"], None, None, 1, "dtype float64; expected float32"),
        (["run", plain, "--input", f"z={tmp_path / 'x64.npy'}"], None, None, 1, "unknown input(s) ['z']"),
        (["run", plain, "--input", "x=missing.npy"], None, None, 1, "missing.npy: no such file"),
        (["decrypt", plain, "-o", "d.rlx", "--password-env", "PW"], {"PW": "x"}, None, 1, "not an encrypted rlx"),
        (["decrypt", sealed, "-o", "d.rlx"], None, None, 2, "decrypt needs a password"),
        (["decrypt", sealed, "-o", "d.rlx", "--password-env", "PW"], {"PW": "wrong"}, None, 1, "decryption failed"),
        (["encrypt", sealed, "-o", "e.rlx", "--password-env", "PW"], {"PW": "x"}, None, 1, "already encrypted"),
        (["encrypt", plain, "-o", "e.rlx"], None, None, 2, "encrypt needs a password"),
        (["encrypt", "ghost.rlx", "-o", "e.rlx", "--password-env", "PW", *FAST], {"PW": "x"}, None, 1, "no such file"),
        (["verify", tmp_path], None, None, 1, "is a directory"),
        (["run", truncated, "--input", f"x={tmp_path / 'x64.npy'}"], None, None, 1, "truncated or corrupted"),
        (["inspect", truncated], None, None, 1, "outside the data section"),
        (["verify", truncated], None, None, 1, "outside the data section"),
        ([mk(tmp_path / "q", _small_graph(), good_w), "-o", outdir], None, None, 1, "is a directory, not a"),
        ([mk(tmp_path / "r", _small_graph(), good_w), "-o", "/proc/rlx-test.rlx"], None, None, 1, "cannot create"),
        ([mk(tmp_path / "s", _small_graph(), good_w), "-o", afile / "o.rlx"], None, None, 1, "is not a directory"),
        (["decrypt", sealed, "-o", outdir, "--password-env", "PW"], {"PW": "right"}, None, 1, "is a directory, not"),
        (["verify", plain, "--against", tmp_path / "a"], None, None, 1, "directory has no graph.json"),
    ]


def test_bad_input_catalogue(tmp_path, monkeypatch):
    cases = _bad_cases(tmp_path)
    assert len(cases) >= 30
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for args, env, stdin, code, msg in cases:
        r = CliRunner().invoke(main, [str(a) for a in args], env=env, input=stdin)
        label = " ".join(map(str, args))
        assert r.exit_code == code, f"{label}: exit {r.exit_code}: {r.output}"
        assert msg in r.output, f"{label}: {r.output}"
        assert "Traceback" not in r.output, label
        assert r.exception is None or isinstance(r.exception, SystemExit), f"{label}: {r.exception!r}"
        assert sorted(p.name for p in work.iterdir()) == [], f"{label}: left {list(work.iterdir())}"
        assert list((tmp_path / "outdir").iterdir()) == [] and (tmp_path / "afile").read_text() == "x", label
        assert not any(p.name.endswith(".tmp") for p in tmp_path.rglob("*")), label


def test_inspect_sealed_without_password_shows_header_only(tmp_path):
    sealed = tmp_path / "s.rlx"
    invoke(_graph_dir(tmp_path, _small_graph(), {"w": np.ones((32, 4), np.float32)}), "-o", sealed,
           "--password-env", "PW", *FAST, env={"PW": "pw"})
    r = invoke("inspect", sealed)
    assert r.exit_code == 0 and "encrypted: True" in r.output and "--password-env" in r.output
    assert "MatMul" not in r.output


SECRET = "hunter2-Sekr3t!"


def test_password_never_appears_anywhere(tmp_path, capfd):
    d = _graph_dir(tmp_path, _small_graph(), {"w": np.ones((32, 4), np.float32)})
    out, rep = tmp_path / "s.rlx", tmp_path / "rep.json"
    env = {"PW": SECRET}
    outputs = [
        invoke(d, "-o", out, "--password-env", "PW", "--report-json", rep, *FAST, env=env).output,
        invoke(d, "-o", tmp_path / "v.rlx", "--password", SECRET, *FAST).output,
        invoke("inspect", out, "--password-env", "PW", "--json", env=env).output,
        invoke("verify", out, "--password-env", "PW", env=env).output,
        invoke("decrypt", out, "-o", tmp_path / "p.rlx", "--password-stdin", input=SECRET + "\n").output,
        CliRunner().invoke(main, ["--debug", "inspect", str(out), "--password-env", "PW"],
                           env={"PW": SECRET + "x"}).output,
        CliRunner().invoke(main, ["run", str(out), "--password-env", "PW"], env={"PW": "wrong"}).output,
    ]
    captured = capfd.readouterr()
    for text in outputs + [captured.out, captured.err, rep.read_text()]:
        assert SECRET not in text
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f
    assert SECRET not in str(read_rlx(tmp_path / "p.rlx").meta)


def test_debug_shows_traceback(tmp_path):
    r = CliRunner().invoke(main, ["--debug", "inspect", str(tmp_path / "nope.rlx")])
    assert r.exit_code == 1 and "Traceback" in r.output


def test_password_is_checked_before_any_work(tmp_path):
    # the input does not even exist: the password problem must be reported first, nothing baked
    r = CliRunner().invoke(main, [str(tmp_path / "missing"), "-o", str(tmp_path / "o.rlx"), "--password-env",
                                  "RLX_TEST_UNSET_VAR"])
    assert r.exit_code == 1 and "RLX_TEST_UNSET_VAR is not set" in r.output and "missing" not in r.output
    assert not (tmp_path / "o.rlx").exists()
