"""PECache: a keyed cache for tensors computed from geometry, not weights (RoPE/position tables).

A key is a name plus its complete, type-tagged field list; keys compare every field, never a
pointer or a hash alone, so [1, 23] and [12, 3] (or 1, 1.0 and True) never collide. Each name has
independent storage; a miss replaces that name's entry (capacity 1 by default, so alternating
two keys under one name recomputes every time — give `capacity=N` to keep N keys per name).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import numpy as np

from rlx_format.errors import RlxError


class PECacheKey:
    __slots__ = ("name", "_fields")

    def __init__(self, name: str):
        if not isinstance(name, str) or not name:
            raise RlxError(f"PECacheKey name must be a non-empty string; got {name!r}")
        self.name = name
        self._fields: list[tuple] = []

    def add(self, value) -> PECacheKey:
        """int, float (by exact bit pattern), bool, str, or an array (dtype, shape and values)."""
        if isinstance(value, bool):
            self._fields.append(("bool", value))
        elif isinstance(value, (int, np.integer)):
            self._fields.append(("int", int(value)))
        elif isinstance(value, (float, np.floating)):
            self._fields.append(("float", struct.pack("<d", float(value))))
        elif isinstance(value, str):
            self._fields.append(("str", value))
        elif hasattr(value, "shape") and hasattr(value, "dtype"):
            host = value.get() if hasattr(value, "get") and not isinstance(value, np.ndarray) else value
            a = np.ascontiguousarray(host)
            self._fields.append(("array", a.dtype.str, tuple(a.shape), a.tobytes()))
        else:
            raise RlxError(f"PECacheKey.add: unsupported value type {type(value).__name__}; expected int, float, "
                           "bool, str or an array")
        return self

    def add_shape(self, shape: Sequence[int]) -> PECacheKey:
        dims = tuple(int(d) for d in shape)
        self._fields.append(("shape", len(dims), dims))
        return self

    def add_shapes(self, shapes: Sequence[Sequence[int]]) -> PECacheKey:
        self._fields.append(("shapes", len(shapes)))
        for s in shapes:
            self.add_shape(s)
        return self

    @property
    def fields(self) -> tuple:
        return tuple(self._fields)

    def __eq__(self, other) -> bool:
        return isinstance(other, PECacheKey) and self.name == other.name and self._fields == other._fields

    def __hash__(self) -> int:
        return hash((self.name, tuple(self._fields)))

    def __repr__(self) -> str:
        return f"PECacheKey({self.name!r}, {len(self._fields)} fields)"


class PECache:
    """name -> up to `capacity` (key, tensor) entries. Stored host arrays are read-only."""

    def __init__(self, capacity: int = 1, device=None, index: int = 0, backend=None):
        """`device` (Device.CUDA / index) or `backend` puts stored tensors on that device; None keeps them on
        the host."""
        if capacity < 1:
            raise RlxError(f"PECache capacity must be >= 1; got {capacity}")
        self.capacity = capacity
        self.device = backend.device if backend is not None else device
        self.index = backend.index if backend is not None else index
        self._backend = backend
        self._entries: dict[str, list[tuple[PECacheKey, object]]] = {}
        self.hits = 0
        self.misses = 0

    def _store(self, value):
        if self._backend is None and self.device is not None:
            from .backend import backend_for
            self._backend = backend_for(self.device, self.index)
        if self._backend is not None and not self._backend.host_arrays:
            return self._backend.upload(value)  # uploaded once; hits skip the host-to-device copy
        arr = np.asarray(value)
        if arr.flags.writeable:
            arr = arr.view()
            arr.flags.writeable = False
        return arr

    def get_or_create(self, key: PECacheKey, factory: Callable[[], object]):
        entries = self._entries.get(key.name, [])
        for i, (k, v) in enumerate(entries):
            if k == key:
                self.hits += 1
                if i:
                    entries.insert(0, entries.pop(i))
                return v
        self.misses += 1
        value = self._store(factory())  # a raising factory leaves the old entries untouched
        self._entries[key.name] = [(key, value)] + entries[: self.capacity - 1]
        return value

    def get(self, key: PECacheKey):
        return next((v for k, v in self._entries.get(key.name, []) if k == key), None)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def clear(self, name: str | None = None) -> None:
        if name is None:
            self._entries.clear()
        else:
            self._entries.pop(name, None)

    def __len__(self) -> int:
        return sum(len(v) for v in self._entries.values())
