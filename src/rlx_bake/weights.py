"""WeightSet and load_safetensors: weights by name, memory-mapped from safetensors.

Each array is a zero-copy view of the file, kept in its stored dtype (bf16 as its 16-bit pattern), so
loading a multi-GB bundle costs no RAM.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import numpy as np
from safetensors import safe_open

from rlx_format.dtypes import NUMPY_DTYPES, SAFETENSORS_DTYPES
from rlx_format.errors import RlxError



class WeightSet(dict):
    """name -> numpy array, with the IR dtype of each entry in `.dtypes` (bf16 is stored as uint16)."""

    def __init__(self):
        super().__init__()
        self.dtypes: dict[str, str] = {}
        self.sources: list[str] = []


def load_safetensors(path: str | os.PathLike) -> WeightSet:
    path = Path(path)
    if not path.is_file():
        raise RlxError(f"{path}: weights file not found; expected a .safetensors file")
    try:
        with safe_open(str(path), framework="numpy") as f:  # the library validates the file
            keys = set(f.keys())
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise RlxError(f"{path}: not a valid safetensors file ({e})") from None
    ws = WeightSet()
    ws.sources.append(str(path))
    with open(path, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(fh.fileno()).st_size else b""
    base = 8 + n
    for name, info in header.items():
        if name == "__metadata__" or name not in keys:
            continue
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise RlxError(f"{path}: tensor {name!r} has dtype {info['dtype']}; rlx supports "
                           f"{', '.join(SAFETENSORS_DTYPES)}")
        ir_dt = SAFETENSORS_DTYPES[info["dtype"]]
        np_dt = NUMPY_DTYPES[ir_dt]
        start, end = info["data_offsets"]
        count = int(np.prod(info["shape"], dtype=np.int64))
        arr = np.frombuffer(mm, dtype=np.dtype(np_dt).newbyteorder("<"), count=count, offset=base + start)
        ws[name] = arr.reshape(info["shape"])
        ws.dtypes[name] = ir_dt
        assert end - start == arr.nbytes
    return ws
