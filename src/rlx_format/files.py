"""Opening inputs and writing outputs: every file rlx writes goes through `atomic_write`
(spec/rlx-format.md, "Writer").

An output is written to a new file in the target directory, fsynced and renamed over the target, so the
target is always the old file or the complete new one. On Linux the new file is an unnamed O_TMPFILE
that gets a name only once complete, so a killed write leaves nothing behind; elsewhere (or where the
filesystem lacks O_TMPFILE) it is a hidden `.NAME.<8 chars>.tmp` file, locked while it is written, which
the next write of the same NAME removes.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from .errors import FormatError, OutputError

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; stale temps are then judged by age only
    fcntl = None

PLAIN_MODE = 0o666   # the kernel reduces it by the umask (and applies default ACLs), like any new file
PRIVATE_MODE = 0o600  # decrypted plaintext and sealed files, whatever the umask
# tempfile.mkstemp's alphabet and length, so temps of earlier rlx versions are recognised too
TEMP_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"
TEMP_TOKEN_LEN = 8
# A temp nobody holds locked is stale once older than this (covers the instant between create and lock).
STALE_GRACE_SECONDS = 10
STALE_TEMP_SECONDS = 24 * 3600  # without locks (no fcntl) a temp is only presumed dead after a day

_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFSOCK: "a socket"}


def open_for_reading(path: str | os.PathLike, expected: str = "an .rlx file", label: str | None = None) -> BinaryIO:
    """open(path, "rb") with the library's errors for missing files, directories and OS failures;
    messages start with `label` (default: the path) and name what was `expected`."""
    where = label or str(path)
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise FormatError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise FormatError(f"{where}: is a directory; expected {expected}") from None
    except OSError as e:
        raise FormatError(f"{where}: cannot open ({e.strerror})") from None


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def check_output_path(path: str | os.PathLike) -> Path:
    """Refuse an output path that atomic_write must not replace: an existing directory, device, FIFO,
    socket, or a symlink to one. Absent paths, regular files and symlinks to regular files (or dangling
    ones) pass; a symlink is replaced by the new file, as rename does, and its target is left alone."""
    path = Path(path)
    directory = path.parent
    if not directory.exists():
        raise OutputError(f"{path}: directory {directory} does not exist; create it first")
    if not directory.is_dir():
        raise OutputError(f"{path}: {directory} is not a directory; choose an output path inside a directory")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError as e:
        raise OutputError(f"{path}: cannot check the output path ({e.strerror})") from None
    if stat.S_ISREG(st.st_mode):
        return path
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.stat(path)
        except FileNotFoundError:
            return path
        except OSError as e:
            raise OutputError(f"{path}: is a symlink that cannot be resolved ({e.strerror}); remove it or choose "
                              "another output path") from None
        if stat.S_ISREG(target.st_mode):
            return path
        what = f"a symlink to {_kind(target.st_mode)} ({os.path.realpath(path)})"
        is_dir = stat.S_ISDIR(target.st_mode)
    else:
        what = _kind(st.st_mode)
        is_dir = stat.S_ISDIR(st.st_mode)
    hint = f" such as {path / 'NAME'}" if is_dir else ""
    raise OutputError(f"{path}: exists and is {what}, not a regular file; outputs are written by replacing the "
                      f"file as a whole, which would destroy it, so it is left alone. Give the path of a regular "
                      f"file or of a new one{hint}")


def _temp_name(name: str) -> str:
    return f".{name}.{''.join(secrets.choice(TEMP_CHARS) for _ in range(TEMP_TOKEN_LEN))}.tmp"


def _is_temp_of(entry: str, name: str) -> bool:
    """Exact match of `.{name}.<token>.tmp`; `name` is compared as text, never as a pattern."""
    prefix = f".{name}."
    if len(entry) != len(prefix) + TEMP_TOKEN_LEN + 4 or not entry.startswith(prefix) or not entry.endswith(".tmp"):
        return False
    return all(c in TEMP_CHARS for c in entry[len(prefix):-4])


def _lock(fd: int) -> None:
    """Exclusive, non-blocking flock; BlockingIOError when another open file holds it."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def remove_stale_temps(path: str | os.PathLike) -> None:
    """Delete temps of earlier writes to `path` whose writer is gone: no process holds their lock (or,
    without locks, they are a day old). Only regular files named exactly `.NAME.<token>.tmp` are touched."""
    path = Path(path)
    directory = path.parent
    now = time.time()
    try:
        entries = [e for e in os.scandir(directory) if _is_temp_of(e.name, path.name)]
    except OSError:
        return
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_mtime > now - STALE_GRACE_SECONDS:
                continue
            if fcntl is None:
                if st.st_mtime < now - STALE_TEMP_SECONDS:
                    os.unlink(e.path)
                continue
            fd = os.open(e.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                if not os.path.samestat(os.fstat(fd), st):
                    continue
                _lock(fd)  # BlockingIOError: a live writer holds it
                os.unlink(e.path)
            finally:
                os.close(fd)
        except OSError:
            continue


def _open_unnamed(directory: Path, mode: int) -> int | None:
    """An O_TMPFILE descriptor in `directory`, or None where the OS, the filesystem or a missing /proc
    (needed to link it) rule it out."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None:
        return None
    try:
        fd = os.open(directory, flag | os.O_WRONLY | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
            return None
        raise
    if not os.path.exists(f"/proc/self/fd/{fd}"):
        os.close(fd)
        return None
    return fd


def _new_name(directory: Path, name: str, make: Callable[[str], Any]) -> tuple[str, Any]:
    for _ in range(100):
        tmp = str(directory / _temp_name(name))
        try:
            return tmp, make(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary file name", str(directory))


def _link_unnamed(fd: int, directory: Path, name: str) -> str:
    """Give the O_TMPFILE `fd` a temp name in `directory`: linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N.
    A directory fd makes os.link call linkat with that flag; plain link() would fail with EXDEV."""
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        tmp, _ = _new_name(directory, name, lambda p: os.link(f"/proc/self/fd/{fd}", os.path.basename(p),
                                                              dst_dir_fd=dfd, follow_symlinks=True))
    finally:
        os.close(dfd)
    return tmp


def _fsync_dir(directory: Path) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def atomic_write(path: str | os.PathLike, writer: Callable[[BinaryIO], Any], *, private: bool = False) -> None:
    """Call writer(fileobj) on a new file next to `path`, fsync, then rename it over `path`.

    `path` must be absent, a regular file or a symlink to one (check_output_path). New files get mode
    0666 minus the umask, or exactly 0600 with `private=True` (plaintext of sealed models, sealed files).
    Replacing a file gives it a new inode: hard links to the old one keep the old contents."""
    path = check_output_path(path)
    directory = path.parent
    remove_stale_temps(path)
    mode = PRIVATE_MODE if private else PLAIN_MODE
    tmp = None
    try:
        fd = _open_unnamed(directory, mode)
        if fd is None:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
            tmp, fd = _new_name(directory, path.name, lambda p: os.open(p, flags, mode))
    except OSError as e:
        raise OutputError(f"{path}: cannot create a file in {directory} ({e.strerror}); choose a writable "
                          "directory") from None
    try:
        with os.fdopen(fd, "wb") as f:
            try:
                _lock(f.fileno())  # held until the rename: remove_stale_temps leaves a live write alone
            except OSError:
                pass  # no locks on this filesystem (e.g. ENOLCK): the cleaner cannot lock it either
            if private and hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), PRIVATE_MODE)  # exact, even under an odd umask such as 0277
            writer(f)
            f.flush()
            os.fsync(f.fileno())
            if tmp is None:  # linkat cannot replace a file, so link to a temp name and rename that
                tmp = _link_unnamed(f.fileno(), directory, path.name)
            check_output_path(path)  # again: something may have appeared at `path` meanwhile
            os.replace(tmp, path)
            tmp = None
    except BaseException:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise
    _fsync_dir(directory)


def use_cache_folder(current: Path, siblings: str, idle_seconds: float) -> None:
    """Mark the cache folder `current` as in use (its mtime) and remove the sibling folders matching the glob
    `siblings` that have gone unused for `idle_seconds`: a cache keyed by versions gains a folder per version,
    and an idle period, not "every other key", spares a checkout of another version running at the same time."""
    os.utime(current)
    now = time.time()
    for other in current.parent.glob(siblings):
        try:
            if other != current and other.is_dir() and now - other.stat().st_mtime > idle_seconds:
                shutil.rmtree(other, ignore_errors=True)
        except OSError:
            pass
