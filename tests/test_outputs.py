"""Output files (rlx_format.files): non-regular paths are refused, modes, unnamed temps, stale-temp cleanup."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

import rlx_format
from rlx_bake import BakeOptions, bake
from rlx_bake.cli import main
from rlx_bake.loader import write_bundle
from rlx_format import GraphBuilder, decrypt_file, encrypt_file, read_rlx, write_rlx, write_rlx_encrypted
from rlx_format import files as files_mod
from rlx_format.constants import RLXBAKE_MAGIC
from rlx_format.errors import OutputError
from rlx_format.files import atomic_write
from rlx_format.sealed import KDF_PROFILES

FAST = KDF_PROFILES["fast"]
PW = "pw"
ENV = {"PW": PW}
SRC = str(Path(rlx_format.__file__).parents[1])
LINUX_UNNAMED = sys.platform.startswith("linux") and hasattr(os, "O_TMPFILE")


@pytest.fixture(autouse=True)
def no_hang():
    """A FIFO opened by mistake blocks forever; fail instead."""
    def boom(*_):
        raise TimeoutError("an output step blocked (opened a FIFO?)")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.fixture(params=["unnamed", "named"])
def temp_kind(request, monkeypatch, tmp_path):
    """Both ways atomic_write makes its new file: O_TMPFILE (Linux) and the named-temp fallback."""
    if request.param == "unnamed":
        fd = files_mod._open_unnamed(tmp_path, 0o600)
        if fd is None:
            pytest.skip("no O_TMPFILE here")
        os.close(fd)
    else:
        monkeypatch.setattr(files_mod, "_open_unnamed", lambda directory, mode: None)
    return request.param


def _graph():
    g = GraphBuilder("o")
    x = g.input("x", "f32", ["b", 32])
    g.output(g.matmul(x, g.param("w", "f32", [32, 4]), name="y"))
    return g.build()


WEIGHTS = {"w": np.arange(128, dtype=np.float32).reshape(32, 4)}


@pytest.fixture
def inputs(tmp_path):
    """A bundle, a plain and a sealed .rlx, an input .npy and an ONNX model, all in tmp_path/in."""
    d = tmp_path / "in"
    (d / "bundle").mkdir(parents=True)
    _graph().to_json(d / "bundle" / "graph.json")
    save_file(WEIGHTS, str(d / "bundle" / "weights.safetensors"))
    rf, _ = bake(_graph(), dict(WEIGHTS), BakeOptions.from_profile("merge"))
    write_rlx(d / "plain.rlx", rf)
    write_rlx_encrypted(d / "sealed.rlx", rf, PW, FAST)
    np.save(d / "x.npy", np.ones((2, 32), np.float32))
    onnx = pytest.importorskip("onnx")
    model = Path(onnx.__file__).parent / "backend/test/data/pytorch-converted/test_Conv2d/model.onnx"
    return {"dir": d, "bundle": d / "bundle", "plain": d / "plain.rlx", "sealed": d / "sealed.rlx",
            "x": d / "x.npy", "onnx": model}


# ------------------------------------------------------------------------------ non-regular outputs

def _make(kind: str, p: Path) -> str:
    """Create a non-regular file at p; return the words the error must use for it."""
    if kind == "fifo":
        os.mkfifo(p)
        return "is a FIFO (named pipe), not a regular file"
    if kind == "chardev":
        os.mknod(p, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
        return "is a character device, not a regular file"
    if kind == "dir":
        p.mkdir()
        return "is a directory, not a regular file"
    if kind == "symlink-fifo":
        os.mkfifo(p.parent / "target-fifo")
        p.symlink_to(p.parent / "target-fifo")
        return "is a symlink to a FIFO (named pipe)"
    raise AssertionError(kind)


def _snapshot(d: Path) -> dict:
    """Every entry of d with its type (and a symlink's target type), to prove nothing was replaced."""
    out = {}
    for e in sorted(d.iterdir()):
        st = os.lstat(e)
        out[e.name] = (stat.S_IFMT(st.st_mode), stat.S_IFMT(os.stat(e).st_mode) if e.is_symlink() else None)
    return out


def _tripwire(*_a, **_k):
    raise AssertionError("expensive work started before the output path was checked")


# command -> (args builder, functions that must not run before the check)
COMMANDS = {
    "bake": (lambda i, p: [i["bundle"], "-o", p], ["rlx_bake.loader.load_graph", "rlx_bake.cli.resolve_password"]),
    "bake-sealed": (lambda i, p: [i["bundle"], "-o", p, "--password-env", "PW", "--kdf", "fast"],
                    ["rlx_bake.loader.load_graph", "rlx_bake.cli.resolve_password"]),
    "report-json": (lambda i, p: [i["bundle"], "-o", p.parent / "ok.rlx", "--report-json", p],
                    ["rlx_bake.loader.load_graph"]),
    "encrypt": (lambda i, p: ["encrypt", i["plain"], "-o", p, "--password-env", "PW", "--kdf", "fast"],
                ["rlx_bake.cli.resolve_password", "rlx_format.sealed.encrypt_file"]),
    "decrypt": (lambda i, p: ["decrypt", i["sealed"], "-o", p, "--password-env", "PW"],
                ["rlx_bake.cli.resolve_password", "rlx_format.sealed.decrypt_file"]),
    "run": (lambda i, p: ["run", i["plain"], "--input", f"x={i['x']}", "-o", p], ["rlx_bake.cli._open"]),
    "import-onnx": (lambda i, p: ["import-onnx", i["onnx"], "-o", p.parent], ["rlx_bake.onnx.import_onnx"]),
}
KINDS = ["fifo", "chardev", "dir", "symlink-fifo"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", list(COMMANDS))
def test_cli_refuses_non_regular_outputs_before_any_work(inputs, tmp_path, monkeypatch, command, kind):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / ("graph.json" if command == "import-onnx" else "target")
    words = _make(kind, target)
    before = _snapshot(out_dir)
    args, guarded = COMMANDS[command]
    for name in guarded:
        monkeypatch.setattr(name, _tripwire)
    r = CliRunner().invoke(main, [str(a) for a in args(inputs, target)], env=ENV)
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert f"error: {target}: exists and {words}" in r.output, r.output
    assert "Give the path of a regular file" in r.output and "Traceback" not in r.output
    assert _snapshot(out_dir) == before  # still a FIFO / device / directory / symlink, and nothing added


@pytest.mark.parametrize("kind", KINDS)
def test_library_writers_refuse_non_regular_outputs(inputs, tmp_path, kind):
    rf = read_rlx(inputs["plain"])
    writers = {
        "atomic_write": lambda p: atomic_write(p, _tripwire),
        "write_rlx": lambda p: write_rlx(p, rf),
        "write_rlx_encrypted": lambda p: write_rlx_encrypted(p, rf, PW, FAST),
        "encrypt_file": lambda p: encrypt_file(inputs["plain"], p, PW, FAST),
        # a wrong password: the path is refused before the key is derived or any chunk is read
        "decrypt_file": lambda p: decrypt_file(inputs["sealed"], p, "wrong"),
        "write_bundle": lambda p: write_bundle(p.parent, _graph(), WEIGHTS),
    }
    for name, write in writers.items():
        d = tmp_path / name
        d.mkdir()
        target = d / ("graph.json" if name == "write_bundle" else "target")
        words = _make(kind, target)
        before = _snapshot(d)
        with pytest.raises(OutputError, match="exists and " + words.replace("(", r"\(").replace(")", r"\)")):
            write(target)
        assert _snapshot(d) == before, name


def test_symlink_to_a_regular_file_is_replaced_not_followed(tmp_path, temp_kind):
    target = tmp_path / "real.bin"
    target.write_bytes(b"old")
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    atomic_write(link, lambda f: f.write(b"new"))
    assert not link.is_symlink() and link.read_bytes() == b"new"
    assert target.read_bytes() == b"old"  # rename semantics: the link itself is replaced
    dangling = tmp_path / "dangling.bin"
    dangling.symlink_to(tmp_path / "nowhere")
    atomic_write(dangling, lambda f: f.write(b"x"))
    assert not dangling.is_symlink() and dangling.read_bytes() == b"x"


def test_replacing_breaks_hard_links(tmp_path, temp_kind):
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    atomic_write(a, lambda f: f.write(b"one"))
    os.link(a, b)
    atomic_write(a, lambda f: f.write(b"two"))
    assert a.read_bytes() == b"two" and b.read_bytes() == b"one"  # documented: a new inode, as rename gives
    assert os.stat(a).st_nlink == 1


# ------------------------------------------------------------------------------------------- modes

def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_plain_outputs_follow_the_umask_private_ones_are_0600(inputs, tmp_path, umask, temp_kind, mask):
    out = tmp_path / "out"
    out.mkdir()
    old = out / "plain.rlx"  # replacing a file does not keep its old mode either
    old.write_bytes(b"x")
    os.chmod(old, 0o640)
    umask(mask)
    i = inputs
    cli = [
        [i["bundle"], "-o", out / "plain.rlx", "--report-json", out / "report.json"],
        [i["bundle"], "-o", out / "sealed.rlx", "--password-env", "PW", "--kdf", "fast"],
        ["encrypt", i["plain"], "-o", out / "enc.rlx", "--password-env", "PW", "--kdf", "fast"],
        ["decrypt", i["sealed"], "-o", out / "dec.rlx", "--password-env", "PW"],
        ["run", i["plain"], "--input", f"x={i['x']}", "-o", out / "y.npz"],
        ["import-onnx", i["onnx"], "-o", out / "bundle"],
    ]
    for args in cli:
        r = CliRunner().invoke(main, [str(a) for a in args], env=ENV)
        assert r.exit_code == 0, r.output
    plain = 0o666 & ~mask
    for name in ("plain.rlx", "report.json", "y.npz", "bundle/graph.json", "bundle/weights.safetensors"):
        assert _mode(out / name) == plain, (name, oct(_mode(out / name)))
    for name in ("sealed.rlx", "enc.rlx", "dec.rlx"):
        assert _mode(out / name) == 0o600, (name, oct(_mode(out / name)))
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["plain.rlx", "report.json", "sealed.rlx", "enc.rlx", "dec.rlx", "y.npz", "bundle"])


def test_private_outputs_are_0600_even_under_an_owner_masking_umask(tmp_path, umask, temp_kind):
    umask(0o277)
    atomic_write(tmp_path / "p.bin", lambda f: f.write(b"secret"), private=True)
    assert _mode(tmp_path / "p.bin") == 0o600 and (tmp_path / "p.bin").read_bytes() == b"secret"


# ------------------------------------------------------------------------------ temps while writing

def test_no_named_file_exists_while_writing_on_linux(tmp_path, temp_kind):
    seen = []

    def writer(f):
        f.write(b"secret")
        f.flush()
        seen.extend(p.name for p in tmp_path.iterdir())

    atomic_write(tmp_path / "p.rlx", writer, private=True)
    if temp_kind == "unnamed":
        assert seen == []  # the new file has no name until it is complete
    else:
        assert len(seen) == 1 and seen[0].startswith(".p.rlx.") and seen[0].endswith(".tmp")
    assert [p.name for p in tmp_path.iterdir()] == ["p.rlx"]


def test_a_failing_writer_leaves_nothing(tmp_path, temp_kind):
    (tmp_path / "p.rlx").write_bytes(b"previous")

    def writer(f):
        f.write(b"half")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "p.rlx", writer, private=True)
    assert [p.name for p in tmp_path.iterdir()] == ["p.rlx"] and (tmp_path / "p.rlx").read_bytes() == b"previous"


# A child runs `rlx-bake decrypt` and SIGKILLs itself mid-stream (after 3 chunks) or with the whole
# plaintext written but not yet named (at the fsync); `named` forces the fallback without O_TMPFILE.
CHILD = """
import os, signal, sys
import rlx_format.files, rlx_format.sealed as sealed
where, kind = sys.argv.pop(1), sys.argv.pop(1)
if kind == "named":
    rlx_format.files._open_unnamed = lambda directory, mode: None
def die(*_):
    os.kill(os.getpid(), signal.SIGKILL)
if where == "fsync":
    os.fsync = die
else:
    real = sealed._decrypt_chunks
    def chunks(f, h, key, sink):
        n = [0]
        def dying(off, data):
            sink(off, data)
            n[0] += 1
            if n[0] == 3:
                die()
        real(f, h, key, dying)
    sealed._decrypt_chunks = chunks
from rlx_bake.cli import main
main()
"""


@pytest.fixture(scope="module")
def big_sealed(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    g = GraphBuilder("big")
    x = g.input("x", "f32", ["b", 256])
    g.output(g.matmul(x, g.param("w", "f32", [256, 8192]), name="y"))  # 8 MiB of weights: 8+ chunks
    marker = np.full((256, 8192), 1234.5, np.float32)
    rf, _ = bake(g.build(), {"w": marker}, BakeOptions.from_profile("merge"))
    write_rlx_encrypted(d / "sealed.rlx", rf, PW, FAST)
    return d / "sealed.rlx", marker[:1, :64].tobytes()


def _leaks(d: Path, marker: bytes) -> list[str]:
    return [p.name for p in d.iterdir() if p.is_file() and (RLXBAKE_MAGIC in p.read_bytes()
                                                            or marker in p.read_bytes())]


@pytest.mark.parametrize("where", ["chunks", "fsync"])
@pytest.mark.parametrize("kind", ["unnamed", "named"])
def test_killed_decrypt_leaves_no_named_plaintext(big_sealed, tmp_path, where, kind):
    if kind == "unnamed" and not LINUX_UNNAMED:
        pytest.skip("O_TMPFILE is Linux-only")
    sealed, marker = big_sealed
    out = tmp_path / "p.rlx"
    env = {**os.environ, "PW": PW, "PYTHONPATH": SRC}
    proc = subprocess.run([sys.executable, "-c", CHILD, where, kind, "decrypt", str(sealed), "-o", str(out),
                           "--password-env", "PW"], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    left = sorted(p.name for p in tmp_path.iterdir())
    if kind == "unnamed":
        assert left == [], left  # O_TMPFILE: the partial plaintext vanished with the process
        return
    # the fallback (and every write before this change) leaves the plaintext in a hidden temp ...
    assert len(left) == 1 and left[0].startswith(".p.rlx.") and left[0].endswith(".tmp"), left
    assert _leaks(tmp_path, marker) == left and _mode(tmp_path / left[0]) == 0o600
    # ... which the next write of the same output removes, as nothing holds its lock any more
    past = time.time() - 2 * files_mod.STALE_GRACE_SECONDS
    os.utime(tmp_path / left[0], (past, past))
    decrypt_file(sealed, out, PW)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.rlx"]


# ----------------------------------------------------------------------------------- stale temps

def _age(p: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(p, (t, t), follow_symlinks=False)


@pytest.mark.parametrize("name", ["*", "m[1]*?.rlx", "?", "[ab]", "a*b"])
def test_stale_cleanup_matches_names_exactly(tmp_path, name):
    # files the old glob(f".{name}.*.tmp") matched although they belong to other outputs
    bystanders = {
        "*": [".x.y.tmp", ".other.rlx.abcdefgh.tmp"],
        "m[1]*?.rlx": [".m1ab.rlx.abcdefgh.tmp", ".m1z.rlx.q.tmp"],
        "?": [".z.abcdefgh.tmp", ".a.b.tmp"],
        "[ab]": [".a.abcdefgh.tmp", ".b.x.tmp"],
        "a*b": [".ab.abcdefgh.tmp", ".axxb.abcdefgh.tmp"],
    }[name]
    stale = tmp_path / f".{name}.abcd_123.tmp"  # a real leftover of this output, 8 mkstemp characters
    for n in bystanders + [stale.name, f".{name}.short.tmp"]:
        (tmp_path / n).write_bytes(b"data")
        _age(tmp_path / n, 2 * 86400)
    write_rlx(tmp_path / name, _tiny())
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(bystanders + [name, f".{name}.short.tmp"]), left
    read_rlx(tmp_path / name)


def _tiny():
    rf, _ = bake(_graph(), dict(WEIGHTS), BakeOptions.from_profile("merge"))
    return rf


def test_stale_cleanup_spares_live_writers_young_files_and_non_regular_entries(tmp_path):
    live = tmp_path / ".m.rlx.live0000.tmp"
    young = tmp_path / ".m.rlx.young000.tmp"
    dead = tmp_path / ".m.rlx.dead0000.tmp"
    fifo = tmp_path / ".m.rlx.fifo0000.tmp"
    sub = tmp_path / ".m.rlx.dir00000.tmp"
    for p in (live, young, dead):
        p.write_bytes(b"partial")
    os.mkfifo(fifo)
    sub.mkdir()
    for p in (live, dead, fifo, sub):
        _age(p, 3600)  # an hour: the old rule (a day) would have kept all of them
    holder = os.open(live, os.O_RDONLY)
    try:
        import fcntl
        fcntl.flock(holder, fcntl.LOCK_EX)  # what a running atomic_write holds on its temp
        write_rlx(tmp_path / "m.rlx", _tiny())
        assert live.exists() and young.exists() and not dead.exists()
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and sub.is_dir()
    finally:
        os.close(holder)
    write_rlx(tmp_path / "m.rlx", _tiny())
    assert not live.exists() and young.exists()  # its writer is gone now


def test_a_running_write_keeps_its_temp_from_another_writers_cleanup(tmp_path, monkeypatch):
    monkeypatch.setattr(files_mod, "_open_unnamed", lambda directory, mode: None)
    out = tmp_path / "m.bin"

    def outer(f):
        f.write(b"outer")
        (mine,) = [p for p in tmp_path.iterdir() if p.name.startswith(".m.bin.")]
        _age(mine, 3600)  # old enough to be judged by its lock alone
        atomic_write(out, lambda g: g.write(b"inner"))  # its cleanup must see the lock and spare `mine`
        assert mine.exists()

    atomic_write(out, outer)
    assert out.read_bytes() == b"outer" and [p.name for p in tmp_path.iterdir()] == ["m.bin"]


def test_a_non_regular_file_appearing_during_the_write_is_not_replaced(tmp_path, temp_kind):
    out = tmp_path / "m.bin"
    with pytest.raises(OutputError, match="is a FIFO"):
        atomic_write(out, lambda f: os.mkfifo(out))
    assert stat.S_ISFIFO(os.lstat(out).st_mode) and [p.name for p in tmp_path.iterdir()] == ["m.bin"]
