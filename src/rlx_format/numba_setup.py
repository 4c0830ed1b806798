"""numba, configured once for every rlx module that compiles kernels: import numba from here.

numba's `cache=True` writes compiled kernels next to the installed sources by default. A read-only
install cannot cache, and two users sharing one writable install race on the same files (and could
feed each other pickled cache entries). rlx points numba's cache at a per-user directory instead,
or the one the user chose with NUMBA_CACHE_DIR, in a subfolder per digest of rlx's kernel sources
(`src-<digest>`; see kernel_sources_digest). This module must be imported before any
`@numba.njit(cache=True)` decorator runs: numba picks the cache location at decoration time.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import tempfile
from pathlib import Path

import platformdirs

from .cpu_hold import unheld
from .files import use_cache_folder

with unheld():  # numba sizes its thread pool from the importing thread's CPU set (cpu_hold.py)
    import numba


def _usable(d: Path, *, private: bool) -> bool:
    """`d` exists (created if needed), is a directory we can write, and, for a directory in a shared
    place such as /tmp, is ours alone (no one else may plant cache entries in it)."""
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(d)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or not os.access(d, os.W_OK | os.X_OK):
        return False
    if private and (st.st_uid != os.getuid() or st.st_mode & 0o077):
        return False
    return True


def cache_dir() -> Path | None:
    """The directory under which rlx gives numba its cache folder: $NUMBA_CACHE_DIR if set, else the
    per-user cache directory (~/.cache/rlx/numba on Linux), else a private per-user folder in the temp
    directory; None when none is usable (numba then falls back to its own choice)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"])
    user = Path(platformdirs.user_cache_dir("rlx")) / "numba"
    if _usable(user, private=False):
        return user
    uid = os.getuid() if hasattr(os, "getuid") else os.getpid()
    tmp = Path(tempfile.gettempdir()) / f"rlx-numba-{uid}"
    if _usable(tmp, private=hasattr(os, "getuid")):
        return tmp
    return None


_PACKAGES = ("rlx_format", "rlx_runtime", "rlx_bake")
_SOURCE_ROOT = Path(__file__).resolve().parent.parent  # the folder holding the rlx packages


def kernel_sources_digest(root: Path = _SOURCE_ROOT) -> str:
    """A digest of every rlx source file that compiles numba kernels or defines code they inline (numba
    intrinsics: rlx_runtime/simd.py). numba keys a cached kernel on its own
    file's mtime and size only, so a kernel that inlines one from another module (the conv epilogue inlines
    ufuncs.py's sigmoid loop) kept the old code after that module changed; the cache folder is per digest."""
    h = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            data = path.read_bytes()
            if b"njit" in data or b"@intrinsic" in data:
                h.update(str(path.relative_to(root)).encode() + b"\0" + data + b"\0")
    return h.hexdigest()[:16]


def _prune_other_sources(current: Path) -> None:
    """Mark `current` in use; kernels compiled from other rlx sources (an upgrade, a checkout of another
    commit) go once unused for a week."""
    use_cache_folder(current, "src-*", 7 * 86400)


def _configure() -> None:
    # a folder the user chose gets the per-digest subfolder too: with NUMBA_CACHE_DIR kept as given, a kernel
    # inlining simd.py's intrinsics kept its old code after simd.py changed (the mutation check caught it)
    base = cache_dir()
    if base is None:
        return
    d = base / f"src-{kernel_sources_digest()}"
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        _prune_other_sources(d)
    except OSError:
        return  # numba falls back to its own choice
    numba.config.CACHE_DIR = str(d)


def _is_rlx_kernel(py_func: object) -> bool:
    return getattr(py_func, "__module__", "").split(".")[0] in _PACKAGES


def _load_cached_kernels_lean() -> None:
    """Loading an rlx kernel from the cache skips numba's registry refresh.

    numba's `Cache.load_overload` refreshes the whole target context before it looks in the cache: it imports
    every lowering module numba has (arraymath, linalg, random, typed containers...; scipy too where it is
    installed) and installs their registries, 0.3-0.6 s of a model's first forward, though rebuilding cached
    object code needs none of them. A load needs the runtime (NRT) initialised, which this keeps; a miss
    compiles, and numba's compiler refreshes the context itself. Other code's numba functions keep numba's own
    behaviour, as does any numba whose cache lacks the methods this relies on. Not for @vectorize/@guvectorize:
    after a cache hit numba builds their ufunc wrapper with the registries a refresh installs (rlx has none; a
    test keeps it so)."""
    from numba.core import caching
    from numba.core.runtime import rtsys

    numba_load = caching.Cache.load_overload
    if getattr(numba_load, "rlx_lean", False):
        return
    needed = (hasattr(caching.Cache, "_load_overload") and hasattr(caching.Cache, "_guard_against_spurious_io_errors")
              and hasattr(rtsys, "initialize"))
    if not needed:
        return

    def load_overload(self, sig, target_context):  # noqa: ANN001, ANN202 - numba's signature
        if not _is_rlx_kernel(getattr(self, "_py_func", None)):
            return numba_load(self, sig, target_context)
        rtsys.initialize(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)
        return None  # the guard swallowed an I/O error: numba compiles instead

    load_overload.rlx_lean = True
    caching.Cache.load_overload = load_overload


_ELF_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, section index, value, size
_DEFINED_TYPES = (0, 1, 2)  # STT_NOTYPE, STT_OBJECT, STT_FUNC (not sections or files)


def elf_defined_symbols(object_code: bytes) -> set[str] | None:
    """The names a 64-bit little-endian ELF object file defines (its .symtab entries with a section, of no type,
    object or function), or None for anything else (another format, no symbol table): the names numba otherwise
    takes from the bitcode it keeps beside a cached kernel's object code."""
    if object_code[:4] != b"\x7fELF" or object_code[4:6] != b"\x02\x01":  # 64-bit, little-endian
        return None
    from llvmlite import binding as ll

    # only these two sections' bytes: data() reads size() bytes from the section's place in the file, and a .bss
    # section's size is its size in memory (a 64 MiB zeroed global read 64 MiB past a 2.6 KB object: a segfault)
    sections = {s.name(): s.data() for s in ll.ObjectFileRef.from_data(object_code).sections()
                if s.name() in (b".symtab", b".strtab")}
    table, strings = sections.get(b".symtab"), sections.get(b".strtab")
    if table is None or strings is None:
        return None
    names = set()
    for name, info, _, section, _, _ in _ELF_SYMBOL.iter_unpack(table[:len(table) - len(table) % _ELF_SYMBOL.size]):
        if name and section and info & 0xF in _DEFINED_TYPES:
            names.add(strings[name:strings.index(b"\0", name)].decode())
    return names


def _load_kernels_without_bitcode() -> None:
    """A kernel loaded from the cache leaves the bitcode numba keeps beside its object code unparsed until another
    kernel's compile links it in.

    numba parses that bitcode at every cache load (34 of the 45 ms that loading the pool's direct-conv step took
    here), only to learn the names the object code defines and to have it ready for linking into other kernels;
    running the loaded kernel needs neither. The names come from the object file's symbol table instead (the
    same set; tests compare); on object files other than 64-bit little-endian ELF, numba's own load runs. This
    touches every numba cache load in the process, rlx's or not: the library is the same, its bitcode parsed
    when first needed."""
    from llvmlite import binding as ll
    from numba.core import codegen

    library = codegen.CPUCodeLibrary
    if getattr(library._get_module_for_linking, "rlx_lazy", False):
        return
    methods = ("_unserialize", "_get_module_for_linking", "_finalize_final_module", "enable_object_caching",
               "_set_compiled_object")
    if not (all(hasattr(library, m) for m in methods) and hasattr(codegen.JitEngine, "_load_defined_symbols")):
        return
    numba_unserialize = library._unserialize.__func__
    numba_linking = library._get_module_for_linking

    def _unserialize(cls, codegen_, state):  # noqa: ANN001, ANN202 - numba's signature
        name, kind, data = state
        names = elf_defined_symbols(data[0]) if kind == "object" else None
        if names is None:
            return numba_unserialize(cls, codegen_, state)
        self = codegen_.create_library(name)
        self.enable_object_caching()
        self._set_compiled_object(data[0])
        self._rlx_bitcode = data[1]
        self._finalize_final_module()
        codegen_._engine._defined_symbols |= names
        return self

    def _get_module_for_linking(self):  # noqa: ANN001, ANN202 - numba's signature
        bitcode = getattr(self, "_rlx_bitcode", None)
        if bitcode is not None:
            self._shared_module = ll.parse_bitcode(bitcode)
            self._rlx_bitcode = None
        return numba_linking(self)

    _get_module_for_linking.rlx_lazy = True
    library._unserialize = classmethod(_unserialize)
    library._get_module_for_linking = _get_module_for_linking


_configure()
_load_cached_kernels_lean()
_load_kernels_without_bitcode()

__all__ = ["numba", "cache_dir", "elf_defined_symbols", "kernel_sources_digest"]
