"""read_rlx: the one public reader, for plain (RLXBAKE1) and sealed (RLXENC01) files alike."""

from __future__ import annotations

import os
from pathlib import Path

from .constants import RLXENC_MAGIC
from .container import RlxFile, read_plain
from .errors import EncryptedFileError
from .files import open_for_reading
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
    path = Path(path)
    with open_for_reading(path) as f:
        sealed = f.read(8) == RLXENC_MAGIC
    if not sealed:
        return read_plain(path, verify=verify, mmap=mmap)
    if password is None:
        raise EncryptedFileError(
            f"{path}: file is encrypted (RLXENC01); pass password=... to read_rlx, or --password-env VAR / "
            "--password-stdin on the CLI")
    return read_sealed(path, password, verify=verify)
