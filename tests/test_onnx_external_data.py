"""ONNX external data is read only from regular files inside the model's folder (both CLI paths, the library)."""

import contextlib
import os
import signal
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from rlx_bake import bake
from rlx_bake.cli import main
from rlx_bake.onnx import import_onnx
from rlx_format import read_rlx, RlxError
from rlx_runtime import Session

W = np.arange(12, dtype=np.float32).reshape(4, 3) / 8 - 0.5  # 48 bytes
SECRET = b"TOP-SECRET-creds:hunter2;" + b"#" * 23                # exactly one tensor's worth
assert len(SECRET) == W.nbytes
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="symlinks/FIFOs need a POSIX filesystem")


def _model(location: str | None = None, offset: int | str | None = None, length: int | str | None = None,
           extra: list[tuple[str, str]] = (), constant: bool = False) -> onnx.ModelProto:
    """y = x @ w with w held as hand-written external data (an initializer, or a Constant node's value)."""
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4, 3])
    w.data_location = TensorProto.EXTERNAL
    for key, value in [("location", location), ("offset", offset), ("length", length), *extra]:
        if value is not None:
            entry = w.external_data.add()
            entry.key, entry.value = key, str(value)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    if constant:
        nodes.insert(0, helper.make_node("Constant", [], ["w"], name="cw", value=w))
    graph = helper.make_graph(nodes, "ext", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                              [] if constant else [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def dirs(tmp_path):
    """(model folder, a folder next to it holding a secret that a model must never reach)."""
    model_dir, outside = tmp_path / "model", tmp_path / "outside"
    model_dir.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(SECRET)
    return model_dir, outside


def _save(model_dir: Path, m: onnx.ModelProto) -> Path:
    p = model_dir / "m.onnx"
    p.write_bytes(m.SerializeToString())
    return p


def _refusal(p: Path) -> str:
    with pytest.raises(RlxError) as e:
        import_onnx(p)
    return str(e.value)


def _assert_cli_refuses(p: Path, tmp_path: Path) -> None:
    """Both CLI paths: exit 1, one message and no traceback, the secret nowhere, nothing written."""
    out, bundle = tmp_path / "out" / "m.rlx", tmp_path / "bundle"
    out.parent.mkdir()
    runner = CliRunner()
    for args, written in (([str(p), "-o", str(out)], out), (["import-onnx", str(p), "-o", str(bundle)], bundle)):
        r = runner.invoke(main, args)
        assert r.exit_code == 1, r.output
        assert isinstance(r.exception, SystemExit)
        assert "Traceback" not in r.output and r.output.startswith("error: ")
        assert b"hunter2" not in r.output.encode()
        assert not written.exists()
    assert list(out.parent.iterdir()) == []  # no temp file left either


def _ok(p: Path) -> None:
    graph, ws = import_onnx(p)
    np.testing.assert_array_equal(ws["w"], W)
    x = np.random.default_rng(0).standard_normal((1, 4)).astype(np.float32)
    rf, _ = bake(graph, ws)
    ours = Session().compile(rf).run({"x": x})["y"]
    ref = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours, x @ W, rtol=1e-6, atol=1e-6)


def _refusal_untouched(p: Path, monkeypatch, avoid: str = "outside") -> str:
    """The refusal, checking that no stat/lstat/open reached a path containing `avoid` on the way."""
    touched = []
    for name in ("stat", "lstat", "open"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda f, *a, _real=real, **k: (touched.append(str(f)), _real(f, *a, **k))[1])
    try:
        msg = _refusal(p)
    finally:
        monkeypatch.undo()
    assert not [f for f in touched if avoid in f], touched
    return msg


class _Hung(BaseException):
    """Raised by the deadline; a BaseException so that no `except Exception` turns it into an RlxError."""


@contextlib.contextmanager
def _deadline(seconds: int):
    """Fail instead of hanging (a blocking open of a FIFO would wait for a writer forever)."""
    def fire(*_):
        raise _Hung(f"still running after {seconds}s: something blocked")
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------- escapes are refused

def test_absolute_path_to_a_real_file_is_refused_untouched(dirs, tmp_path, monkeypatch):
    model_dir, outside = dirs
    secret = outside / "secret.bin"
    p = _save(model_dir, _model(str(secret), 0, W.nbytes))
    msg = _refusal_untouched(p, monkeypatch)  # refused on the text alone
    assert "initializer 'w'" in msg and repr(str(secret)) in msg and "absolute path" in msg
    assert "inside the model's folder" in msg and "next to the model" in msg
    _assert_cli_refuses(p, tmp_path)


@pytest.mark.parametrize("location", ["C:\\secret.bin", "C:/secret.bin", "C:secret.bin", "\\\\server\\share\\w.bin",
                                      "//server/share/w.bin", "\\secret.bin"])
def test_windows_absolute_forms_are_refused(dirs, location):
    msg = _refusal(_save(dirs[0], _model(location, 0, W.nbytes)))
    assert "absolute path" in msg and "refused" in msg


@pytest.mark.parametrize("location", ["../outside/secret.bin", "./../outside/secret.bin",
                                      "sub/../../outside/secret.bin", "sub/..", ".."])
def test_dotdot_is_refused_untouched(dirs, tmp_path, location, monkeypatch):
    model_dir, _ = dirs
    (model_dir / "sub").mkdir()
    p = _save(model_dir, _model(location, 0, W.nbytes))
    msg = _refusal_untouched(p, monkeypatch)
    assert "'..' component" in msg and repr(location) in msg
    _assert_cli_refuses(p, tmp_path)


@pytest.mark.parametrize("location, rule", [("", "empty"), ("w\0.bin", "NUL"), ("data\\w.bin", "backslash"),
                                            ("..\\outside\\secret.bin", "backslash")])
def test_malformed_locations_are_refused(dirs, location, rule):
    msg = _refusal(_save(dirs[0], _model(location, 0, W.nbytes)))
    assert rule in msg and "refused" in msg


def test_missing_location_is_refused(dirs):
    assert "empty" in _refusal(_save(dirs[0], _model(None)))


@posix_only
def test_symlink_out_of_the_folder_is_refused(dirs, tmp_path):
    model_dir, outside = dirs
    (model_dir / "link.bin").symlink_to(outside / "secret.bin")
    (model_dir / "data").symlink_to(outside, target_is_directory=True)
    (model_dir / "rel.bin").symlink_to(Path("..") / "outside" / "secret.bin")
    for location in ("link.bin", "data/secret.bin", "rel.bin"):
        p = _save(model_dir, _model(location, 0, W.nbytes))
        msg = _refusal(p)
        assert "outside the model's folder" in msg and "symbolic link" in msg and repr(location) in msg
    _assert_cli_refuses(p, tmp_path)


@posix_only
@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink", "symlinked folder"])
def test_refusal_does_not_tell_whether_the_target_exists(dirs, kind):
    model_dir, outside = dirs
    location = {"absolute": str(outside / "secret.bin"), "dotdot": "../outside/secret.bin",
                "symlink": "link.bin", "symlinked folder": "data/secret.bin"}[kind]
    (model_dir / "link.bin").symlink_to(outside / "secret.bin")
    (model_dir / "data").symlink_to(outside, target_is_directory=True)
    p = _save(model_dir, _model(location, 0, W.nbytes))
    exists = _refusal(p)
    (outside / "secret.bin").unlink()
    gone = _refusal(p)
    assert exists == gone
    # the size must not leak; the folders' own paths may hold those digits (pytest-48/...): left out of the check
    told = exists.replace(str(outside), "").replace(str(model_dir), "")
    assert str(len(SECRET)) not in told and "not found" not in exists


# ------------------------------------------------------------------------------- non-regular files inside

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_inside_the_folder_is_refused_without_blocking(dirs, tmp_path):
    model_dir, _ = dirs
    os.mkfifo(model_dir / "w.bin")
    p = _save(model_dir, _model("w.bin", 0, W.nbytes))
    with _deadline(20):
        msg = _refusal(p)
    with _deadline(20):
        _assert_cli_refuses(p, tmp_path)
    assert "FIFO" in msg and "not a regular file" in msg and "'w.bin'" in msg


def test_folder_is_refused(dirs, tmp_path):
    model_dir, _ = dirs
    (model_dir / "sub").mkdir()
    p = _save(model_dir, _model("sub", 0, W.nbytes))
    assert "is a folder, not a regular file" in _refusal(p)
    _assert_cli_refuses(p, tmp_path)
    assert "model's folder itself" in _refusal(_save(model_dir, _model(".", 0, W.nbytes)))


def test_missing_file_inside_the_folder(dirs):
    assert "not found in the model's folder" in _refusal(_save(dirs[0], _model("nope.bin", 0, W.nbytes)))


# ------------------------------------------------------------------------------------------ offset / length

@pytest.mark.parametrize("offset, length, file_bytes, expect", [
    (4, None, W.nbytes, "runs past its end"),              # offset + tensor past the end
    (W.nbytes, W.nbytes, W.nbytes, "runs past its end"),   # offset at the end
    (10**12, W.nbytes, W.nbytes, "runs past its end"),     # far past
    (0, W.nbytes, W.nbytes - 1, "runs past its end"),      # file one byte short
    (0, W.nbytes, 0, "runs past its end"),                 # empty file
    (0, W.nbytes - 4, W.nbytes, "does not match the tensor's 48 bytes"),
    (0, W.nbytes + 4, W.nbytes + 4, "does not match the tensor's 48 bytes"),
    ("-4", W.nbytes, W.nbytes, "offset must be a non-negative decimal integer"),
    (0, "-48", W.nbytes, "length must be a non-negative decimal integer"),
    ("abc", None, W.nbytes, "offset must be a non-negative decimal integer"),
    (" 4", None, W.nbytes, "offset must be a non-negative decimal integer"),
    ("1e3", None, W.nbytes, "offset must be a non-negative decimal integer"),
])
def test_offset_and_length_are_checked(dirs, tmp_path, offset, length, file_bytes, expect):
    model_dir, _ = dirs
    (model_dir / "w.bin").write_bytes(W.tobytes()[:file_bytes] + b"\0" * max(0, file_bytes - W.nbytes))
    p = _save(model_dir, _model("w.bin", offset, length))
    msg = _refusal(p)
    assert expect in msg and "initializer 'w'" in msg and "malformed" not in msg
    _assert_cli_refuses(p, tmp_path)


def test_duplicate_location_key_is_refused(dirs):
    (dirs[0] / "w.bin").write_bytes(W.tobytes())
    p = _save(dirs[0], _model("w.bin", 0, W.nbytes, extra=[("location", "../outside/secret.bin")]))
    assert "'location' is given twice" in _refusal(p)


# ------------------------------------------------------------------------------------ legitimate layouts

@pytest.mark.parametrize("location", ["weights.bin", "data/w.bin"])
def test_onnx_saved_external_data_loads(tmp_path, location):
    m = _model()
    m.graph.ClearField("initializer")
    m.graph.initializer.append(numpy_helper.from_array(W, "w"))
    (tmp_path / "data").mkdir()
    p = tmp_path / "m.onnx"
    onnx.save_model(m, p, save_as_external_data=True, all_tensors_to_one_file=True, location=location,
                    size_threshold=0)
    assert (tmp_path / location).is_file() and onnx.load(p, load_external_data=False).graph.initializer[0] \
        .data_location == TensorProto.EXTERNAL
    _ok(p)
    out = tmp_path / "m.rlx"
    r = CliRunner().invoke(main, [str(p), "-o", str(out)])
    assert r.exit_code == 0, r.output
    np.testing.assert_array_equal(read_rlx(out).weights["w"].array(), W)


def test_hand_written_offset_and_missing_length(dirs):
    model_dir, _ = dirs
    (model_dir / "w.bin").write_bytes(b"\xff" * 16 + W.tobytes() + b"\xee" * 8)
    _ok(_save(model_dir, _model("w.bin", 16, W.nbytes)))
    _ok(_save(model_dir, _model("./w.bin", 16, None, extra=[("checksum", "ignored")])))


@posix_only
def test_symlink_inside_the_folder_is_fine(dirs):
    model_dir, _ = dirs
    (model_dir / "store").mkdir()
    (model_dir / "store" / "real.bin").write_bytes(W.tobytes())
    (model_dir / "w.bin").symlink_to(Path("store") / "real.bin")
    (model_dir / "alias").symlink_to(model_dir / "store", target_is_directory=True)
    _ok(_save(model_dir, _model("w.bin", 0, W.nbytes)))
    _ok(_save(model_dir, _model("alias/real.bin", 0, W.nbytes)))


@posix_only
def test_model_reached_through_a_symlinked_folder(dirs, tmp_path):
    model_dir, _ = dirs
    (model_dir / "w.bin").write_bytes(W.tobytes())
    _save(model_dir, _model("w.bin", 0, W.nbytes))
    (tmp_path / "via").symlink_to(model_dir, target_is_directory=True)
    _ok(tmp_path / "via" / "m.onnx")


def test_constant_node_external_data_is_confined_too(dirs, tmp_path):
    model_dir, outside = dirs
    (model_dir / "w.bin").write_bytes(W.tobytes())
    graph, _ = import_onnx(_save(model_dir, _model("w.bin", 0, W.nbytes, constant=True)))
    np.testing.assert_array_equal(graph.constants["w"].value, W)
    p = _save(model_dir, _model(str(outside / "secret.bin"), 0, W.nbytes, constant=True))
    msg = _refusal(p)
    assert "Constant node 'cw'" in msg and "absolute path" in msg
    _assert_cli_refuses(p, tmp_path)


def test_constant_of_shape_external_value_is_confined_too(dirs):
    model_dir, outside = dirs
    value = TensorProto(name="v", data_type=TensorProto.FLOAT, dims=[1], data_location=TensorProto.EXTERNAL)
    for key, v in (("location", "../outside/secret.bin"), ("offset", "0"), ("length", "4")):
        entry = value.external_data.add()
        entry.key, entry.value = key, v
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill", value=value)
    shape = numpy_helper.from_array(np.array([2, 3], np.int64), "s")
    graph = helper.make_graph([node], "cos", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [shape])
    msg = _refusal(_save(model_dir, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])))
    assert "ConstantOfShape node 'fill'" in msg and "'..' component" in msg
