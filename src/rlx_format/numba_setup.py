"""numba, configured once for every rlx module that compiles kernels: import numba from here.

numba's `cache=True` writes compiled kernels next to the installed sources by default. A read-only
install cannot cache, and two users sharing one writable install race on the same files (and could
feed each other pickled cache entries). rlx points numba's cache at a per-user directory instead,
unless the user chose one with NUMBA_CACHE_DIR. This module must be imported before any
`@numba.njit(cache=True)` decorator runs: numba picks the cache location at decoration time.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import numba
import platformdirs


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
    """The directory rlx gives numba for its cache: $NUMBA_CACHE_DIR if set (left to numba), else the
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


def _configure() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return  # numba read it at import
    d = cache_dir()
    if d is not None:
        numba.config.CACHE_DIR = str(d)


_configure()

__all__ = ["numba", "cache_dir"]
