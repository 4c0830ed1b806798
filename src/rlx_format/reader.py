"""read_rlx: the one public reader, for plain (RLXBAKE1) and sealed (RLXENC01) files alike."""

from __future__ import annotations

import os

from .container import RlxFile, read_plain
from .errors import EncryptedFileError
from .sealed import read_sealed


def read_rlx(path: str | os.PathLike, password: str | bytes | None = None, *, verify: bool = False,
             mmap: bool = True) -> RlxFile:
    """Open an .rlx file. Sealed files need `password` (plain files ignore it).

    Digests are not checked unless `verify=True` (that reads every byte; see RlxFile.verify).
    With `mmap=True` (default) a plain file is memory-mapped and weights are zero-copy views: the file
    must not be truncated or rewritten in place while they are in use (the process would die of
    SIGBUS); replace it by rename, as write_rlx does. `mmap=False` reads the file into memory
    instead, for files on storage that others may rewrite. A sealed file is always decrypted into memory.
    """
    try:
        return read_plain(path, verify=verify, mmap=mmap)  # one open for the common case
    except EncryptedFileError:
        if password is None:
            raise
    return read_sealed(path, password, verify=verify)
