"""ONNX external data, confined to the model's folder.

A model names the file that holds a tensor's bytes (`location`, plus optional `offset`/`length`).
The model is untrusted input, so a location may only name a regular file inside the folder that
holds the .onnx file: no absolute or drive paths, no `..`, no symbolic link leading out. The text
is checked before any file is looked at; links are then resolved, and the target is stat'ed and
opened only once it is known to be inside. A refusal of a location that leaves the folder says
the same thing whether or not the target exists.
"""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

import numpy as np

from rlx_format.errors import RlxError

_USED = ("location", "offset", "length")  # others (checksum, basepath, tool-specific) are ignored
_FIX = ("external data must be a relative path, with '/' separators, to a regular file inside the model's folder "
        "(no absolute path, no '..', no symbolic link leading out of the folder): put the data file next to the "
        "model or in a subfolder of it and set the location to e.g. 'weights.bin' or 'data/weights.bin'")


def _show(location: str) -> str:
    text = repr(location)
    return text if len(text) <= 200 else text[:197] + "..."


def _refuse(what: str, location: str, rule: str) -> RlxError:
    return RlxError(f"{what}: external data location {_show(location)} refused: {rule}; {_FIX}")


def external_info(t, what: str) -> tuple[str, int, int | None]:
    """(location, offset, length or None) of an external tensor; touches no file."""
    seen: dict[str, str] = {}
    for entry in t.external_data:
        if entry.key in _USED and entry.key in seen:  # readers disagree on which one wins: refuse
            raise RlxError(f"{what}: external data key {entry.key!r} is given twice; each key may appear once")
        seen[entry.key] = entry.value
    location = seen.get("location", "")

    def number(key: str) -> int | None:
        v = seen.get(key)
        if v is None:
            return None
        if not (v.isascii() and v.isdigit()):
            raise RlxError(f"{what}: external data {key} must be a non-negative decimal integer, got {_show(v)}")
        return int(v)

    return location, number("offset") or 0, number("length")


def check_location(location: str, what: str) -> None:
    """Refuse a location that could name something outside the model's folder (text only)."""
    if not location:
        raise _refuse(what, location, "it is empty")
    if "\0" in location:
        raise _refuse(what, location, "it contains a NUL byte")
    win = PureWindowsPath(location)
    if PurePosixPath(location).is_absolute() or win.drive or win.root:
        raise _refuse(what, location, "it is an absolute path (or names a drive or network share)")
    if "\\" in location:
        raise _refuse(what, location, "it contains a backslash")
    if ".." in location.split("/"):
        raise _refuse(what, location, "it has a '..' component")


def confined_path(base_dir: Path, location: str, what: str) -> str:
    """The real path (symbolic links resolved) a checked location names, refused if outside base_dir."""
    check_location(location, what)
    base = os.path.realpath(base_dir)
    # realpath, unlike Path.resolve, never stat()s the result: nothing outside is examined beyond links
    target = os.path.realpath(os.path.join(base, *location.split("/")))
    if target == base:
        raise _refuse(what, location, "it names the model's folder itself")
    try:
        inside = os.path.commonpath([base, target]) == base
    except ValueError:  # different drives
        inside = False
    if not inside:
        raise _refuse(what, location, "it resolves, through a symbolic link, to a path outside the model's folder")
    return target


def open_mapped(target: str, location: str, what: str) -> mmap.mmap | None:
    """Memory-map a regular file (None for an empty one); FIFOs, devices and folders are refused unopened."""
    try:
        st = os.stat(target)
    except FileNotFoundError:
        raise RlxError(f"{what}: external data file {_show(location)} not found in the model's folder; "
                       "put it next to the model (or in the subfolder its location names)") from None
    except OSError as e:
        raise RlxError(f"{what}: external data file {_show(location)} cannot be read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO, device or socket"
        raise RlxError(f"{what}: external data location {_show(location)} is {kind}, not a regular file; "
                       "point it at the file that holds the tensor's bytes")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(target, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise RlxError(f"{what}: external data file {_show(location)} cannot be opened ({e.strerror})") from None
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise RlxError(f"{what}: external data file {_show(location)} changed while it was being opened")
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if now.st_size else None
    finally:
        os.close(fd)


def view(mm: mmap.mmap | None, np_dt: np.dtype, dims: tuple[int, ...], offset: int, length: int | None,
         location: str, what: str) -> np.ndarray:
    """The tensor as a read-only view of the mapped file, after checking offset/length against both sizes."""
    count = 1
    for d in dims:
        count *= d
    nbytes = count * np_dt.itemsize
    if length is not None and length != nbytes:
        raise RlxError(f"{what}: external data length {length} does not match the tensor's {nbytes} bytes "
                       f"(shape {list(dims)}, {np_dt.itemsize} byte(s) per element); fix the length or the shape")
    size = len(mm) if mm is not None else 0
    if offset + nbytes > size:
        raise RlxError(f"{what}: external data {_show(location)} is {size} bytes, but offset {offset} + "
                       f"{nbytes} bytes runs past its end; the offset/length do not belong to this file")
    if nbytes == 0:
        return np.zeros(dims, np_dt)
    return np.frombuffer(mm, np_dt, count=count, offset=offset).reshape(dims)  # zero-copy
