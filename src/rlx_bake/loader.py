"""load_graph: graph.json, a bundle directory or an ONNX file, plus its weights (rlx_bake.weights)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rlx_format.errors import RlxError
from rlx_format.files import atomic_write, check_output_path
from rlx_format.graph import Graph

from .weights import WeightSet, load_safetensors



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
