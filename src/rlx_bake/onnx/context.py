"""Shared state of an ONNX import: the context, the lowering table and small helpers."""


from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlx_format.dtypes import ONNX_DTYPES, dtype_of_array, f32_to_bf16
from rlx_format.errors import RlxError
from rlx_format.graph import Node
from rlx_format.ops import OPS, RANDOM_OPS, normalize_attrs
from rlx_runtime.backend import CPU
from rlx_runtime.kernels import prepare_attrs

from . import external_data


try:
    import onnx
    from onnx import numpy_helper
except ImportError:  # pragma: no cover - exercised only without the extra
    onnx = None



_FOLD_BYTES = 1 << 20           # import-time folds bigger than this stay nodes (the bake's fold decides)
_FOLD_INIT_ELEMENTS = 4096      # integer initializers up to this size count as known (shape operands)


class Unsupported(Exception):
    """Raised by a lowering for a form rlx cannot express (collected, then reported together)."""


class ImportContext:
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
        self.outputs = {o.name for o in model.graph.output}  # stay node outputs, never folded away
        self.static_inputs = True  # every graph input fully static (set by the importer before lowering)

    # -- values
    def fresh(self, base: str) -> str:
        while True:
            self._n += 1
            name = f"{base}/{self._n}"
            if name not in self.names:
                self.names.add(name)
                return name

    def emit(self, op: str, inputs: list[str], attrs: dict | None = None, name: str | None = None) -> str:
        """Add a node, or its value when every operand is known at import (Constant-only subgraphs fold)."""
        name = name or self.fresh(op.lower())
        self.names.add(name)
        value = self._fold(op, list(inputs), dict(attrs or {}))
        if value is not None and name not in self.outputs:
            self.consts[name] = value
            self.types[name] = (dtype_of_array(value), tuple(value.shape))
            return name
        self.nodes.append(Node(name, op, list(inputs), dict(attrs or {})))
        return name

    def known(self, name: str) -> np.ndarray | None:
        """A value import-time folding may read: a constant or a small integer initializer (a shape operand)."""
        if name in self.consts:
            return self.consts[name]
        v = self.inits.get(name)
        if v is not None and v.dtype.kind in "iub" and v.size <= _FOLD_INIT_ELEMENTS:
            return v
        return None

    def _fold(self, op: str, inputs: list[str], attrs: dict) -> np.ndarray | None:
        if op in RANDOM_OPS or op not in OPS:
            return None
        if op == "Shape":  # the shape of a statically typed value is a constant
            t = self.types.get(inputs[0])
            if t is None or t[1] is None or not all(isinstance(d, int) for d in t[1]):
                return None
            if not self.static_inputs and self.known(inputs[0]) is None and inputs[0] not in self.inits:
                # with symbolic input dims, a model's value_info may hold the export-time shapes of values
                # that really vary (torch's dynamo exporter writes such): rlx's own inference decides later
                return None
            return np.array(t[1], np.int64)
        vals = [self.known(i) for i in inputs]
        if any(v is None for v in vals):
            return None
        try:  # a node the kernel cannot evaluate is left to graph validation, which names it
            a = prepare_attrs(op, normalize_attrs(op, attrs, op))
            out = np.asarray(CPU.kernel(op)(np, a, *vals))
            dtype_of_array(out)
        except Exception:  # noqa: BLE001
            return None
        return np.array(out, order="C") if out.nbytes <= _FOLD_BYTES else None

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
        dt = ONNX_DTYPES.get(t.data_type)
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


def onnx_attrs(node) -> dict:
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

Lowering = Callable[[ImportContext, object, dict], None]
LOWER: dict[str, Lowering] = {}


def direct(op):
    def lower(ctx, n, a):
        ctx.emit(op, [i for i in n.input if i], {}, n.output[0])
    return lower


def attr_copy(op, keys):
    def lower(ctx, n, a):
        ctx.emit(op, [i for i in n.input if i], {k: a[k] for k in keys if k in a}, n.output[0])
    return lower


class NodeLike:
    def __init__(self, inputs, outputs):
        self.input, self.output = list(inputs), list(outputs)


def numpy_dtype(ctx, name):
    from rlx_format.dtypes import compute_dtype
    return compute_dtype(ctx.dtype(name) or "f32")


def axes_from(ctx, n, a, pos: int, attr: str = "axes"):
    if attr in a:
        return list(a[attr])
    if len(n.input) > pos and n.input[pos]:
        return ctx.ints(n.input[pos], attr)
    return None
