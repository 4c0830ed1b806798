"""load_graph: graph.json, a bundle directory, or (later) an ONNX file, plus its weights.

Weights are memory-mapped from safetensors: each array is a zero-copy view of the file, kept
in its stored dtype (bf16 as its 16-bit pattern), so loading a multi-GB bundle costs no RAM.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import numpy as np
from safetensors import safe_open

from rlx_format.errors import RlxError
from rlx_format.files import atomic_write, check_output_path
from rlx_format.graph import Graph

# safetensors dtype tag -> (numpy storage dtype, IR dtype)
_ST_DTYPES = {
    "F32": (np.float32, "f32"), "F16": (np.float16, "f16"), "BF16": (np.uint16, "bf16"), "F64": (np.float64, "f64"),
    "I64": (np.int64, "i64"), "I32": (np.int32, "i32"), "I16": (np.int16, "i16"), "I8": (np.int8, "i8"),
    "U8": (np.uint8, "u8"), "BOOL": (np.bool_, "bool"),
}


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
        if info["dtype"] not in _ST_DTYPES:
            raise RlxError(f"{path}: tensor {name!r} has dtype {info['dtype']}; rlx supports "
                           f"{', '.join(_ST_DTYPES)}")
        np_dt, ir_dt = _ST_DTYPES[info["dtype"]]
        start, end = info["data_offsets"]
        count = int(np.prod(info["shape"], dtype=np.int64))
        arr = np.frombuffer(mm, dtype=np.dtype(np_dt).newbyteorder("<"), count=count, offset=base + start)
        ws[name] = arr.reshape(info["shape"])
        ws.dtypes[name] = ir_dt
        assert end - start == arr.nbytes
    return ws


def load_graph(path: str | os.PathLike, weights: str | os.PathLike | None = None) -> tuple[Graph, WeightSet]:
    """Load (graph, weights) from graph.json, a bundle dir (graph.json + weights.safetensors) or .onnx."""
    path = Path(path)
    if not path.exists():
        raise RlxError(f"{path}: no such file or directory; expected graph.json, a bundle directory or a .onnx file")
    if path.is_dir():
        gpath = path / "graph.json"
        if not gpath.is_file():
            raise RlxError(f"{path}: directory has no graph.json; a bundle is graph.json + weights.safetensors")
        if weights is None and (path / "weights.safetensors").is_file():
            weights = path / "weights.safetensors"
        path = gpath
    if path.suffix.lower() == ".onnx":
        from .onnx import import_onnx
        graph, ws = import_onnx(path)
        if weights is not None:
            extra = load_safetensors(weights)
            for k, v in extra.items():
                ws[k] = v
                ws.dtypes[k] = extra.dtypes[k]
        return graph, ws
    graph = Graph.from_json(path)
    ws = load_safetensors(weights) if weights is not None else WeightSet()
    return graph, ws


BUNDLE_FILES = ("graph.json", "weights.safetensors")


def check_bundle_output(directory: str | os.PathLike) -> Path:
    """Refuse a bundle directory path write_bundle could not fill: a non-directory, or a graph.json /
    weights.safetensors in it that is not a regular file (files.check_output_path)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise RlxError(f"{directory}: exists and is not a directory; expected a bundle directory path")
    if directory.is_dir():
        for name in BUNDLE_FILES:
            check_output_path(directory / name)
    return directory


def write_bundle(directory: str | os.PathLike, graph: Graph, weights: dict) -> None:
    """Write graph.json + weights.safetensors into `directory` (created if missing), each atomically."""
    from safetensors.numpy import save

    directory = check_bundle_output(directory)
    dtypes = getattr(weights, "dtypes", {})
    bf16 = [k for k, d in dtypes.items() if d == "bf16"]
    if bf16:
        raise RlxError(f"bf16 weights {bf16[:3]} cannot be written by safetensors' numpy API; bake the ONNX model "
                       "directly (rlx-bake model.onnx -o model.rlx) instead of converting it to a bundle")
    directory.mkdir(parents=True, exist_ok=True)
    data = save({k: np.ascontiguousarray(v) for k, v in weights.items()})
    text = graph.to_json().encode()
    atomic_write(directory / "weights.safetensors", lambda f: f.write(data))
    atomic_write(directory / "graph.json", lambda f: f.write(text))
