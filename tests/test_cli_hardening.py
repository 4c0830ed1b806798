"""CLI hardening: text from files shown safely, password sources checked up front, run's .npz and .npy I/O."""

import json
import pathlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from rlx_bake.cli import main
from rlx_format import GraphBuilder, RlxFile, is_encrypted, write_rlx

FAST = ["--kdf", "fast"]
# raw characters that must never reach the output: ESC (CSI, OSC title), C1 CSI, BEL, CR, bidi overrides
RAW = ["\x1b", "\x9b", "\x07", "\r", "\u202e", "\u2066", "\u2069", "\u202a"]


def invoke(*args, env=None, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], env=env, input=input)


def _model(path: Path, outputs=("y",), *, inp="x", weight="w", gname="g", meta=None) -> Path:
    """x[b, 4] @ weight -> outputs[0]; every further output is Relu of the one before."""
    g = GraphBuilder(gname)
    g.input(inp, "f32", ["b", 4])
    w = g.constant(np.arange(16, dtype=np.float32).reshape(4, 4) - 6, name=weight)
    prev = g.matmul(inp, w, name=outputs[0])
    for name in outputs[1:]:
        prev = g.op("Relu", prev, name=name)
    g.output(*outputs)
    write_rlx(path, RlxFile.from_graph(g.build(), {"tool": "test"} if meta is None else meta))
    return path


def _clean(r, code: int) -> None:
    assert r.exit_code == code, r.output
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)


# ------------------------------------------------------------------------------ item 8: inspect output


MARKUP = ["[/]", "[bold red]w[/]", "[link=https://example.com]click[/link]", ":cross_mark:"]


def test_inspect_shows_markup_in_names_literally(tmp_path):
    f = _model(tmp_path / "m.rlx", outputs=(MARKUP[2],), inp=MARKUP[0], weight=MARKUP[1], gname="[bold]g[/]",
               meta={"tool": "[red]t[/]", "[k]": "[/]", "n": MARKUP[3]})
    r = invoke("inspect", f)
    _clean(r, 0)
    for text in [*MARKUP, "'[bold]g[/]'", "tool=[red]t[/]", "meta: [k]=[/]"]:
        assert text in r.output, (text, r.output)


def test_inspect_escapes_control_characters_even_into_a_pipe(tmp_path):
    # names may hold bidi and other invisible format characters (control characters are refused at load,
    # see below); meta values may hold anything
    name = "w[31mred\u202eabc\u2066"
    f = _model(tmp_path / "m.rlx", outputs=("y\u202e",), weight=name, inp="x\u2067[2J",
               meta={"tool": "t\x1b[5m\x07\x9b2J\r", "k\x1b": "v\u2069\u202a",
                     "bake": {"counts": {}, "profile": "p\x1b[0m"}})
    terminal = {"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1", "COLUMNS": "300"}
    for env in (None, terminal):  # CliRunner's stdout is a pipe; FORCE_COLOR makes rich treat it as a terminal
        r = invoke("inspect", f, env=env)
        _clean(r, 0)
        body = r.output if env is None else r.output.replace("\x1b[1m", "").replace("\x1b[0m", "")
        for ch in RAW:
            assert ch not in body, (ch, r.output)
        for shown in ["w[31mred\\u202eabc\\u2066", "x\\u2067[2J", "y\\u202e",
                      "tool=t\\x1b[5m\\x07\\x9b2J\\r", "k\\x1b=v\\u2069\\u202a", "profile p\\x1b[0m"]:
            assert shown in r.output, (shown, r.output)
    # --json stays JSON: ASCII only (control and bidi characters as \u escapes), names round-trip exactly
    r = invoke("inspect", f, "--json")
    _clean(r, 0)
    assert r.output.isascii()
    info = json.loads(r.output)
    assert info["weights"][0]["name"] == name and info["inputs"][0]["name"] == "x\u2067[2J"
    assert info["meta"]["k\x1b"] == "v\u2069\u202a"


def test_a_control_character_in_a_stored_name_is_refused_and_not_echoed(tmp_path):
    """A crafted file whose graph names hold ESC/BEL (patched in after writing: the library never writes
    them): inspect refuses the file at load and its message shows the name escaped."""
    f = _model(tmp_path / "m.rlx", weight="wQQQQQQQ")
    data = f.read_bytes()
    assert data.count(b"wQQQQQQQ") >= 1
    f.write_bytes(data.replace(b"wQQQQQQQ", b"w\x1b[31m\x07Q"))
    r = invoke("inspect", f)
    _clean(r, 1)
    assert "\x1b" not in r.output and "\x07" not in r.output, r.output
    assert "control characters" in r.output


def test_error_messages_do_not_echo_raw_escapes(tmp_path):
    r = invoke("inspect", tmp_path / "gone\x1b[31m\u202e.rlx")
    _clean(r, 1)
    assert "gone\\x1b[31m\\u202e.rlx: no such file" in r.output
    assert "\x1b" not in r.output and "\u202e" not in r.output


def _deep_meta_file(path: Path, depth: int = 1000) -> Path:
    """A file whose meta holds a list nested `depth` deep (over json's and repr's recursion limit, under
    msgpack's): written with a placeholder string, then the placeholder's bytes swapped in place."""
    n = depth + 200
    _model(path, meta={"tool": "t", "deep": "X" * n, b"raw\x1b": b"\x00\xff"})
    data = path.read_bytes()
    old = b"\xda" + n.to_bytes(2, "big") + b"X" * n
    pad = len(old) - depth - 2
    new = b"\x91" * depth + b"\xd9" + bytes([pad]) + b"p" * pad
    assert data.count(old) == 1 and len(new) == len(old) and pad < 256
    path.write_bytes(data.replace(old, new))
    return path


def test_inspect_survives_bad_meta_values(tmp_path):
    bake = {"counts": {"skipped": "[/]"}, "profile": ["x", {"y": None}], "total_bytes_before": "abc",
            "total_bytes": {"no": "number"}, "nodes_before": True}
    f = _model(tmp_path / "m.rlx", meta={"tool": 7, "bake": bake})
    r = invoke("inspect", f)
    _clean(r, 0)
    assert "meta: tool=7" in r.output
    assert ('bake: profile ["x", {"y": null}]; nodes true -> null; weights abc -> {"no": "number"}; skipped [/]'
            in r.output), r.output
    f = _model(tmp_path / "n.rlx", meta={"tool": "t", "bake": {"counts": {}, "total_bytes_before": 2048,
                                                               "total_bytes": 512}})
    assert "weights 2.0 KiB -> 512 B" in invoke("inspect", f).output
    deep = _deep_meta_file(tmp_path / "deep.rlx")
    for args in (["inspect", deep], ["inspect", deep, "--json"]):
        r = invoke(*args)
        _clean(r, 0)
        assert "nested deeper than 32 levels" in r.output
    info = json.loads(r.output)
    assert info["meta"]["b'raw\\x1b'"] == "b'\\x00\\xff'"  # bytes keys and values from msgpack shown as repr


def test_bake_report_shows_names_from_the_model_literally(tmp_path):
    g = GraphBuilder("g")
    x = g.input("x", "f32", ["b", 4])
    g.output(g.matmul(x, g.param("[/]\u202e[2J", "f32", [4, 4]), name="y"))
    d = tmp_path / "bundle"
    d.mkdir()
    g.build().to_json(d / "graph.json")
    save_file({"[/]\u202e[2J": np.ones((4, 4), np.float32)}, str(d / "weights.safetensors"))
    r = invoke(d, "-o", tmp_path / "o.rlx")
    _clean(r, 0)
    assert "[/]\\u202e[2J" in r.output and "\u202e" not in r.output


# ------------------------------------------------------------------------------ item 14: passwords


def _bundle(tmp_path: Path) -> Path:
    g = GraphBuilder("s")
    x = g.input("x", "f32", ["b", 4])
    g.output(g.matmul(x, g.param("w", "f32", [4, 4]), name="y"))
    d = tmp_path / "bundle"
    d.mkdir(exist_ok=True)
    g.build().to_json(d / "graph.json")
    save_file({"w": np.ones((4, 4), np.float32)}, str(d / "weights.safetensors"))
    return d


def _no_secret_leak(output: str) -> None:
    for leak in ("\\udcff", "\udcff", "0xff", "\\xff", "position", "surrogate", "hunter"):
        assert leak not in output, (leak, output)


def test_invalid_utf8_env_password_fails_before_any_work(tmp_path):
    env = {"PW": "hunter\udcff2"}  # what os.environ holds for the bytes b"hunter\xff2" (surrogateescape)
    out = tmp_path / "o.rlx"
    r = invoke(tmp_path / "missing", "-o", out, "--password-env", "PW", env=env)  # input error would come later
    _clean(r, 1)
    assert "--password-env PW: environment variable PW is not valid UTF-8 text" in r.output
    _no_secret_leak(r.output)
    r = invoke(_bundle(tmp_path), "-o", out, "--password-env", "PW", *FAST, env=env)
    _clean(r, 1)
    assert "not valid UTF-8" in r.output and not out.exists() and list(tmp_path.glob("*.tmp")) == []
    sealed = tmp_path / "s.rlx"
    assert invoke(_bundle(tmp_path), "-o", sealed, "--password-env", "PW", *FAST, env={"PW": "ok"}).exit_code == 0
    for args in (["inspect", sealed], ["verify", sealed], ["decrypt", sealed, "-o", tmp_path / "p.rlx"],
                 ["run", sealed, "--input", "x=missing.npy"]):
        r = invoke(*args, "--password-env", "PW", env=env)
        _clean(r, 1)
        assert "not valid UTF-8" in r.output, (args, r.output)
        _no_secret_leak(r.output)
    r = invoke(_bundle(tmp_path), "-o", out, "--password", "hunter\udcff", *FAST)
    _clean(r, 1)
    assert "--password VALUE is not valid UTF-8" in r.output and not out.exists()


def test_invalid_utf8_stdin_password_is_a_clean_error(tmp_path):
    out = tmp_path / "o.rlx"
    r = invoke(tmp_path / "missing", "-o", out, "--password-stdin", input=b"hunter\xff2\n")
    _clean(r, 1)
    assert "--password-stdin: the first line of standard input is not valid utf-8 text" in r.output
    _no_secret_leak(r.output)
    assert not out.exists()


def test_stdin_password_strips_one_crlf_or_lf(tmp_path):
    sealed, plain = tmp_path / "s.rlx", tmp_path / "p.rlx"
    r = invoke(_bundle(tmp_path), "-o", sealed, "--password-env", "PW", *FAST, env={"PW": "s3cret"})
    assert r.exit_code == 0 and is_encrypted(sealed)
    for line in (b"s3cret\r\n", b"s3cret\n", b"s3cret", b"s3cret\r\nsecond line\n"):
        r = invoke("decrypt", sealed, "-o", plain, "--password-stdin", input=line)
        _clean(r, 0)
        plain.unlink()
    for line in (b"s3cret \n", b"s3cret\r\r\n", b"s3cret\r", b"\ts3cret\n"):
        r = invoke("decrypt", sealed, "-o", plain, "--password-stdin", input=line)  # other whitespace is kept
        _clean(r, 1)
        assert "decryption failed" in r.output and not plain.exists()
    # sealed from a CRLF stdin line, opened with the same text from the environment
    crlf = tmp_path / "c.rlx"
    assert invoke(_bundle(tmp_path), "-o", crlf, "--password-stdin", *FAST, input=b"pa ss\r\n").exit_code == 0
    r = invoke("inspect", crlf, "--password-env", "PW", env={"PW": "pa ss"})
    _clean(r, 0)
    assert "MatMul" in r.output


# ------------------------------------------------------------------------------ item 15: run -o out.npz


@pytest.mark.parametrize("outputs", [("file", "allow_pickle"), ("allow_pickle",), ("y", "y.npy.npy", "x.npz")])
def test_run_saves_every_output_under_its_own_name(tmp_path, outputs):
    f = _model(tmp_path / "m.rlx", outputs=outputs)
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out.npz"
    r = invoke("run", f, "--input", f"x={tmp_path / 'x.npy'}", "-o", out)
    _clean(r, 0)
    want = x @ (np.arange(16, dtype=np.float32).reshape(4, 4) - 6)
    with np.load(out) as z:
        assert sorted(z.files) == sorted(outputs)
        for i, name in enumerate(outputs):
            np.testing.assert_array_equal(z[name], want if i == 0 else np.maximum(want, 0))


@pytest.mark.parametrize("bad,why", [("../../x", "path separator"), ("a/b", "path separator"),
                                     ("a\\b", "path separator"), ("/abs", "path separator"),
                                     ("..", "relative directory"), (".", "relative directory"),
                                     ("y\u202e", "control or invisible"),
                                     ("y.npy", "np.load would confuse it with output 'y'")])
def test_run_refuses_unsafe_npz_member_names_before_running(tmp_path, bad, why):
    f = _model(tmp_path / "m.rlx", outputs=("y", bad))
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    out = tmp_path / "out.npz"
    r = invoke("run", f, "--input", f"x={tmp_path / 'x.npy'}", "-o", out)
    _clean(r, 1)
    assert f"output {bad!r} cannot be saved in an .npz file: it" in r.output and why in r.output, r.output
    assert "float32[2, 4]" not in r.output  # refused before the model ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.rlx", "x.npy"]
    assert "\x1b" not in r.output and "\u202e" not in r.output
    r = invoke("run", f, "--input", f"x={tmp_path / 'x.npy'}")  # without -o the same model runs
    _clean(r, 0)


# ------------------------------------------------------------------------------ item 17: run --input


class _Touch:
    """Unpickling this creates a file: proof that pickled input data is never loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def _npy_header_only(path: Path, shape, descr="<f4", data=b"") -> Path:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
        f.write(data)
    return path


def test_run_input_files_are_checked_before_reading(tmp_path):
    f = _model(tmp_path / "m.rlx")
    x = np.ones((2, 4), np.float32)
    np.save(tmp_path / "good.npy", x)
    full = (tmp_path / "good.npy").read_bytes()
    (tmp_path / "short.npy").write_bytes(full[:-4])
    (tmp_path / "empty.npy").write_bytes(b"")
    _npy_header_only(tmp_path / "huge.npy", (1 << 40, 4))
    _npy_header_only(tmp_path / "neg.npy", (-1, 4), data=x.tobytes())
    marker = tmp_path / "pwned"
    np.save(tmp_path / "obj.npy", np.array([_Touch(marker)], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "z.npz", x=x)
    v4 = bytearray(full)
    v4[6] = 4  # format version 4.0
    (tmp_path / "v4.npy").write_bytes(bytes(v4))
    (tmp_path / "adir.npy").mkdir()
    cases = [
        ("huge.npy", "header declares float32[1099511627776, 4] (17592186044416 bytes of data) but only 0 bytes "
                     "follow it; the file is truncated or corrupted"),
        ("short.npy", "header declares float32[2, 4] (32 bytes of data) but only 28 bytes follow it"),
        ("empty.npy", "the file is empty; expected a .npy array"),
        ("neg.npy", "header shape [-1, 4] has a negative dim"),
        ("obj.npy", "dtype object holds Python objects, which are never unpickled"),
        ("z.npz", "not a .npy array"),
        ("v4.npy", "not a .npy array (format version 4.0 is not supported)"),
        ("adir.npy", "is a directory"),
    ]
    for file, msg in cases:
        r = invoke("run", f, "--input", f"x={tmp_path / file}")
        _clean(r, 1)
        assert f"--input x: {tmp_path / file}: {msg}" in r.output, (file, r.output)
        assert "Aborted" not in r.output
    assert not marker.exists()
    r = invoke("run", f, "--input", f"x={tmp_path / 'good.npy'}")
    _clean(r, 0)
    assert "y: float32[2, 4] min 0 max 12" in r.output
    fortran = tmp_path / "fortran.npy"
    np.save(fortran, np.asfortranarray(np.arange(8, dtype=np.float32).reshape(2, 4)))
    r = invoke("run", f, "--input", f"x={fortran}", "-o", tmp_path / "o.npz")
    _clean(r, 0)
    with np.load(tmp_path / "o.npz") as z:
        want = np.arange(8, dtype=np.float32).reshape(2, 4) @ (np.arange(16, dtype=np.float32).reshape(4, 4) - 6)
        np.testing.assert_array_equal(z["y"], want)



def test_library_refuses_unencodable_password_with_rlx_error(tmp_path):
    from rlx_format import RlxError, read_rlx, write_rlx_encrypted
    from rlx_format.sealed import KDF_PROFILES
    f = _model(tmp_path / "m.rlx")
    with pytest.raises(RlxError, match="not valid UTF-8") as e:
        write_rlx_encrypted(tmp_path / "s.rlx", read_rlx(f), "pw\udcff", KDF_PROFILES["fast"])
    assert "udcff" not in str(e.value) and not (tmp_path / "s.rlx").exists()
