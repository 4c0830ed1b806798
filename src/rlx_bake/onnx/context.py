"""Shared state of an ONNX import: the context, the lowering table and small helpers."""


from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlx_format.dtypes import f32_to_bf16
from rlx_format.errors import RlxError
from rlx_format.graph import Node

from . import external_data


try:
    import onnx
    from onnx import numpy_helper
except ImportError:  # pragma: no cover - exercised only without the extra
    onnx = None

_DTYPES = {1: "f32", 10: "f16", 16: "bf16", 11: "f64", 7: "i64", 6: "i32", 5: "i16", 3: "i8", 2: "u8", 9: "bool"}


class Unsupported(Exception):
    """Raised by a lowering for a form rlx cannot express (collected, then reported together)."""


class _Ctx:
    def __init__(self, model, source: Path):
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.source = source
        self.base_dir = source.parent
        self.nodes: list[Node] = []
        self.consts: dict[str, np.ndarray] = {}   # Constant nodes and folded helper constants
        self.inits: dict[str, np.ndarray] = {}    # initializers (become params)
        self.init_dtype: dict[str, str] = {}
        self.types: dict[str, tuple[str, tuple]] = {}
        self.names: set[str] = set()
        self._mmaps: dict[str, mmap.mmap | None] = {}  # real path -> map (None: empty file)
        self._n = 0

    # -- values
    def fresh(self, base: str) -> str:
        while True:
            self._n += 1
            name = f"{base}/{self._n}"
            if name not in self.names:
                self.names.add(name)
                return name

    def emit(self, op: str, inputs: list[str], attrs: dict | None = None, name: str | None = None) -> str:
        name = name or self.fresh(op.lower())
        self.names.add(name)
        self.nodes.append(Node(name, op, list(inputs), dict(attrs or {})))
        return name

    def const(self, value, dtype=None, base: str = "const") -> str:
        arr = np.asarray(value, dtype=dtype)
        name = self.fresh(base)
        self.consts[name] = np.array(arr, copy=True, order="C")
        return name

    def value(self, name: str) -> np.ndarray | None:
        """The value of a constant operand (initializer or Constant node), else None."""
        if name in self.consts:
            return self.consts[name]
        return self.inits.get(name)

    def ints(self, name: str, what: str) -> list[int]:
        v = self.value(name)
        if v is None:
            raise Unsupported(f"{what} must be a constant (computed at run time here)")
        return [int(x) for x in np.asarray(v).reshape(-1)]

    def rank(self, name: str) -> int | None:
        t = self.types.get(name)
        return None if t is None or t[1] is None else len(t[1])

    def dtype(self, name: str) -> str | None:
        t = self.types.get(name)
        return None if t is None else t[0]

    # -- tensors
    def tensor(self, t) -> np.ndarray:
        """An initializer's value (bf16 as its uint16 bits); external data is read from inside the model's folder."""
        if t.data_location == onnx.TensorProto.EXTERNAL:
            return self._external(t, f"initializer {t.name!r}")
        arr = numpy_helper.to_array(t)
        if t.data_type == 16:  # bf16 arrives widened to float32 by some onnx versions
            arr = f32_to_bf16(arr) if arr.dtype == np.float32 else arr.view(np.uint16)
        return arr

    def attr_tensor(self, t, what: str) -> np.ndarray:
        """A tensor attribute's value (Constant, ConstantOfShape), external data read like an initializer's."""
        if t.data_location == onnx.TensorProto.EXTERNAL:
            return self._external(t, what)
        return numpy_helper.to_array(t)

    def _external(self, t, what: str) -> np.ndarray:
        what = f"{self.source}: {what}"
        dt = _DTYPES.get(t.data_type)
        if dt is None:
            raise RlxError(f"{what}: unsupported ONNX data type {t.data_type} for external data")
        dims = tuple(int(d) for d in t.dims)
        if any(d < 0 for d in dims):
            raise RlxError(f"{what}: negative dimension in shape {list(dims)}")
        np_dt = np.dtype(np.uint16 if dt == "bf16" else helper_np(t.data_type)).newbyteorder("<")
        location, offset, length = external_data.external_info(t, what)
        target = external_data.confined_path(self.base_dir, location, what)  # refuses before any stat/open
        if target not in self._mmaps:
            self._mmaps[target] = external_data.open_mapped(target, location, what)
        return external_data.view(self._mmaps[target], np_dt, dims, offset, length, location, what)


def helper_np(elem_type: int):
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


def _attrs(node) -> dict:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8")
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode("utf-8") for x in v]
        out[a.name] = v
    return out


# ----------------------------------------------------------------------------------------- lowerings

Lowering = Callable[[_Ctx, object, dict], None]
LOWER: dict[str, Lowering] = {}


def _direct(op):
    def lower(ctx, n, a):
        ctx.emit(op, [i for i in n.input if i], {}, n.output[0])
    return lower


def _attr_copy(op, keys):
    def lower(ctx, n, a):
        ctx.emit(op, [i for i in n.input if i], {k: a[k] for k in keys if k in a}, n.output[0])
    return lower


class _Fake:
    def __init__(self, inputs, outputs):
        self.input, self.output = list(inputs), list(outputs)


def _np(ctx, name):
    from rlx_format.dtypes import compute_dtype
    return compute_dtype(ctx.dtype(name) or "f32")


def _axes_from(ctx, n, a, pos: int, attr: str = "axes"):
    if attr in a:
        return list(a[attr])
    if len(n.input) > pos and n.input[pos]:
        return ctx.ints(n.input[pos], attr)
    return None
