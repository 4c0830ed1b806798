"""numba's compiled-kernel cache lives in a per-user directory, never next to the installed sources."""

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import rlx_format
from rlx_format import numba_setup

SRC = Path(rlx_format.__file__).parent


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    return {**env, "XDG_CACHE_HOME": str(tmp_path / "cache"), **extra}


_QUANTIZE = ("import numpy as np; from rlx_format.quants import quantize_q8_0; "
             "quantize_q8_0(np.ones((1, 32), np.float32)); import numba; print(numba.config.CACHE_DIR)")


def test_cache_goes_to_the_per_user_directory(tmp_path):
    before = {p.name for p in (SRC / "__pycache__").glob("*.nbi")} if (SRC / "__pycache__").is_dir() else set()
    out = subprocess.run([sys.executable, "-c", _QUANTIZE], env=_env(tmp_path), check=True,
                         capture_output=True, text=True).stdout.strip()
    assert Path(out) == tmp_path / "cache" / "rlx" / "numba" / f"src-{numba_setup.kernel_sources_digest()}"
    assert list(Path(out).rglob("quants._q8_0_blocks*.nbi"))  # the kernel was cached there
    after = {p.name for p in (SRC / "__pycache__").glob("*.nbi")} if (SRC / "__pycache__").is_dir() else set()
    assert after == before  # nothing new next to the sources


def test_numba_cache_dir_from_the_user_wins(tmp_path):
    """The user's folder is used, with the per-digest subfolder inside: a kernel inlining another module's code
    must not keep stale code there either."""
    mine = tmp_path / "mine"
    out = subprocess.run([sys.executable, "-c", _QUANTIZE], env=_env(tmp_path, NUMBA_CACHE_DIR=str(mine)),
                         check=True, capture_output=True, text=True).stdout.strip()
    assert Path(out) == mine / f"src-{numba_setup.kernel_sources_digest()}" and list(Path(out).rglob("*.nbi"))
    assert not (tmp_path / "cache").exists()


def test_unusable_user_directory_falls_back_to_a_private_temp_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # mkdir under a regular file fails, even as root
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    d = numba_setup.cache_dir()
    assert d == tmp_path / "tmp" / f"rlx-numba-{os.getuid()}"
    assert (d.stat().st_mode & 0o777) == 0o700


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to chown")
def test_temp_folder_owned_by_someone_else_is_not_used(tmp_path, monkeypatch):
    """A shared temp directory is where another user could plant pickled cache entries."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"rlx-numba-{os.getuid()}"
    planted.mkdir(mode=0o700)
    os.chown(planted, 12345, 12345)
    assert numba_setup.cache_dir() is None
    os.chown(planted, os.getuid(), os.getgid())
    planted.chmod(0o777)  # ours, but writable by everyone
    assert numba_setup.cache_dir() is None
    planted.chmod(0o700)
    assert numba_setup.cache_dir() == planted


def test_kernel_cache_folder_follows_every_kernel_source(tmp_path):
    """numba keys a cached kernel on its own file only, so a kernel inlining one from another module kept stale
    code: the cache folder is per digest of all files that compile kernels, and only those."""
    tree = tmp_path / "src"
    for package in ("rlx_format", "rlx_runtime", "rlx_bake"):
        (tree / package).mkdir(parents=True)
    (tree / "rlx_runtime" / "ufuncs.py").write_text("@numba.njit\ndef f(): return 1\n")
    (tree / "rlx_runtime" / "conv_kernels.py").write_text("@numba.njit\ndef g(): return f()\n")
    (tree / "rlx_bake" / "cli.py").write_text("print('no kernels')\n")
    first = numba_setup.kernel_sources_digest(tree)
    (tree / "rlx_bake" / "cli.py").write_text("print('still none')\n")
    assert numba_setup.kernel_sources_digest(tree) == first  # editing other files keeps the compiled kernels
    (tree / "rlx_runtime" / "ufuncs.py").write_text("@numba.njit\ndef f(): return 2\n")
    second = numba_setup.kernel_sources_digest(tree)
    assert second != first
    # intrinsics (simd.py) hold no njit but are compiled into the kernels that call them
    (tree / "rlx_runtime" / "simd.py").write_text("@intrinsic\ndef v(typingctx): pass\n")
    third = numba_setup.kernel_sources_digest(tree)
    assert third != second
    (tree / "rlx_runtime" / "simd.py").write_text("@intrinsic\ndef v(typingctx): return None\n")
    assert numba_setup.kernel_sources_digest(tree) != third


def test_folders_of_other_sources_go_once_idle_for_a_week(tmp_path):
    current, recent, stale, foreign = (tmp_path / n for n in ("src-aaaa", "src-bbbb", "src-cccc", "mine"))
    for d in (current, recent, stale, foreign):
        d.mkdir()
    week_ago = time.time() - 8 * 86400
    for d in (current, stale, foreign):
        os.utime(d, (week_ago, week_ago))
    numba_setup._prune_other_sources(current)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "src-aaaa", "src-bbbb"]


_LEAN_LOAD = """
import sys
import numpy as np
import numba
from numba.core.base import BaseContext
from rlx_format.quants import quantize_q8_0

refreshes = []
numba_refresh = BaseContext.refresh
BaseContext.refresh = lambda self: (refreshes.append(1), numba_refresh(self))[1]
q = quantize_q8_0(np.arange(64, dtype=np.float32).reshape(2, 32) - 20.5)
lean = not refreshes and "numba.np.arraymath" not in sys.modules
from rlx_runtime.pool_kernels import panel_columns
panel = panel_columns(16)  # loaded from the cache in the second run: its bitcode left unparsed
unparsed = all(c.library._shared_module is None for c in panel_columns.overloads.values())

@numba.njit
def two_panels(k):  # links panel_columns' library into a new kernel: its bitcode is parsed now
    return 2 * panel_columns(k)

linked = two_panels(16) == 2 * panel > 0
import userk
before = len(refreshes)
total = userk.total(np.arange(10.0))
user_refreshed = len(refreshes) > before

@numba.njit
def descending(x):
    return np.sort(x)[::-1]

print(lean, unparsed, user_refreshed, linked, total, descending(np.array([2.0, 3.0, 1.0])).tolist(),
      q.tobytes().hex())
"""


def test_cached_rlx_kernels_load_without_numba_registries(tmp_path):
    """A cache hit of an rlx kernel skips numba's registry refresh (every lowering module, 0.3-0.6 s of a first
    forward) and leaves its bitcode unparsed; the kernel gives the same bytes, a user's own cached numba function
    keeps numba's full load, a kernel compiled after a lean load compiles as usual, and one that calls a kernel
    loaded that way links it."""
    (tmp_path / "userk.py").write_text("import numba\n\n@numba.njit(cache=True)\ndef total(x):\n    return x.sum()\n")
    env = _env(tmp_path, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    runs = [subprocess.run([sys.executable, "-c", _LEAN_LOAD], env=env, cwd=tmp_path, check=True,
                           capture_output=True, text=True).stdout.split() for _ in range(2)]
    compiled, cached = runs
    assert compiled[0] == "False"  # nothing cached yet: numba compiled, which refreshes its registries
    assert cached[:2] == ["True", "True"]  # no refresh, and panel_columns' bitcode not parsed at its load
    assert compiled[2] == cached[2] == "True"  # the user's function: numba's own load, registries and all
    assert compiled[3] == cached[3] == "True"
    assert compiled[4:] == cached[4:]
    assert cached[4] == "45.0" and "".join(cached[5:8]) == "[3.0,2.0,1.0]"


def test_cached_kernels_define_the_names_their_bitcode_does():
    """The names a cached kernel defines come from its object file's symbol table, not from parsing the bitcode
    beside it: the same set, for each of the worker pool's steps (kernels with code and constants of all kinds)
    and a plain kernel, as numba cached them; anything but a 64-bit ELF object gets None (numba's own load)."""
    import pickle

    import numba
    from llvmlite import binding as ll

    from rlx_runtime import pool_kernels

    pool_kernels.row_fns()  # compiled and cached here if they were not
    pool_kernels.panel_columns(16)
    cached = [p for pattern in ("pool_kernels._step_*.nbc", "pool_kernels.panel_columns-*.nbc")
              for p in Path(numba.config.CACHE_DIR).rglob(pattern)]
    assert len({p.name.split("-")[0] for p in cached}) == len(pool_kernels._STEPS) + 1
    for path in cached:
        (_, kind, (object_code, bitcode)), *_ = pickle.loads(path.read_bytes())  # numba's cache entry
        module = ll.parse_bitcode(bitcode)
        defined = {v.name for values in (module.functions, module.global_variables) for v in values
                   if not v.is_declaration}
        assert kind == "object" and defined
        assert numba_setup.elf_defined_symbols(object_code) == defined, path.name
    assert numba_setup.elf_defined_symbols(b"\xcf\xfa\xed\xfe" + bytes(60)) is None  # Mach-O
    assert numba_setup.elf_defined_symbols(b"\x7fELF\x01\x01" + bytes(58)) is None  # 32-bit ELF


_BSS_KERNEL = """
from llvmlite import ir
from numba import types
from numba.extending import intrinsic
from rlx_format.numba_setup import numba


@intrinsic
def scratch_byte(typingctx, i):
    def codegen(context, builder, sig, args):
        kind = ir.ArrayType(ir.IntType(8), 1 << 26)  # a 64 MiB zeroed global: its object file's .bss (.lbss)
        scratch = ir.GlobalVariable(builder.module, kind, name="rlx_test_scratch")
        scratch.initializer = ir.Constant(kind, None)
        at = builder.gep(scratch, [ir.Constant(ir.IntType(64), 0), args[0]])
        builder.store(ir.Constant(ir.IntType(8), 7), at)
        return builder.zext(builder.load(at), ir.IntType(64))
    return types.int64(types.int64), codegen


@numba.njit(cache=True)
def poke(i):
    return scratch_byte(i)


print(poke(12345))
"""


def test_cached_kernel_with_a_large_bss_loads(tmp_path):
    """The symbol table is read from the object file without touching other sections' bytes: a .bss section's
    size is its size in memory, and reading that much of a small object file crashed the cached load."""
    (tmp_path / "bss_kernel.py").write_text(_BSS_KERNEL)  # a file: numba caches no kernel defined in a -c string
    env = _env(tmp_path)
    runs = [subprocess.run([sys.executable, "bss_kernel.py"], env=env, cwd=tmp_path, capture_output=True, text=True)
            for _ in range(2)]
    assert [(r.returncode, r.stdout.strip()) for r in runs] == [(0, "7"), (0, "7")], runs[-1].stderr[-2000:]


def test_rlx_has_no_vectorized_kernels():
    """rlx's kernels load from the cache without numba's registry refresh (numba_setup._load_cached_kernels_lean),
    which @vectorize/@guvectorize cannot do: numba builds their ufunc wrappers after the cache hit with the
    registries that the refresh installs. Such a kernel needs that path to leave it to numba first."""
    used = re.compile(r"@\S*vectorize\b|\bvectorize\s*\(")  # a decorator or a call, not "the loops vectorize"
    offenders = [str(p.relative_to(SRC.parent)) for package in numba_setup._PACKAGES
                 for p in sorted((SRC.parent / package).rglob("*.py"))
                 if used.search(p.read_text()) and p.name != "numba_setup.py"]
    assert offenders == []
