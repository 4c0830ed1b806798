"""A CPU stand-in for cupy, so the CUDA code path runs in CI on machines without a GPU.

`installed()` puts a numpy-backed module in place of `cupy` / `cupyx.scipy.special`. It is strict
where real cupy is strict, so host-only code fails here as it would on a GPU:
- arrays are `FakeArray`s (not numpy arrays); implicit conversion to numpy raises TypeError
  (`np.asarray(device_array)`), so do numba kernels and mixing numpy arrays into device ops;
- only the names cupy 14 really has are there (module, ndarray, cupyx.scipy.special), functions
  refuse keywords cupy's do not take, and ufunc.at is refused (cupy has it for a few ufuncs only):
  tests/data/cupy_api.json, written from an installed cupy by scripts/cupy_api_snapshot.py;
- reductions and indexing give 0-d arrays, not Python/numpy scalars;
- host<->device traffic is counted (`transfers`), so tests can prove weights and hoisted tensors
  are uploaded once and never per forward.
What it cannot check: custom CUDA kernels (RawModule is absent, so rlx takes its array-op path),
cupy's exact dtype promotion corners, and speed. Those need the `cuda` test tier on a GPU.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys
import types

import numpy as np
import scipy.special

_API = json.loads((pathlib.Path(__file__).parent / "data" / "cupy_api.json").read_text())
MODULE_NAMES = frozenset(_API["module"])
NDARRAY_NAMES = frozenset(_API["ndarray"])
SPECIAL_NAMES = frozenset(_API["special"])
SIGNATURES = _API["signatures"]          # keyword parameters of cupy's Python-level functions
UFUNC_KWARGS = frozenset({"out", "dtype", "casting"})  # all that cupy.ufunc.__call__ accepts


class Transfers:
    def __init__(self):
        self.reset()

    def reset(self):
        self.h2d = 0        # uploads (host arrays/lists turned into device arrays)
        self.h2d_bytes = 0
        self.d2h = 0        # downloads (.get(), asnumpy, scalar reads)

    def __repr__(self):
        return f"Transfers(h2d={self.h2d}, h2d_bytes={self.h2d_bytes}, d2h={self.d2h})"


transfers = Transfers()


def _check_kwargs(name: str, kwargs: dict) -> None:
    sig = SIGNATURES.get(name)
    if sig is not None and not sig["varkw"]:
        bad = sorted(set(kwargs) - set(sig["params"]))
        if bad:
            raise TypeError(f"cupy.{name}() got unexpected keyword argument(s) {bad}; cupy takes {sig['params']}")


def _reject_host(obj):
    raise TypeError(f"Unsupported type {type(obj)} (a host numpy array in a device operation; "
                    "real cupy refuses it too: upload it with cupy.asarray first)")


def _unwrap(obj):
    """Device arrays -> their numpy payload; numpy arrays are refused, as cupy refuses them."""
    if isinstance(obj, FakeArray):
        return obj._a
    if isinstance(obj, np.ndarray):
        _reject_host(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unwrap(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _unwrap(v) for k, v in obj.items()}
    return obj


def _wrap(obj):
    if isinstance(obj, np.ndarray):
        return FakeArray(obj)
    if isinstance(obj, np.generic):
        return FakeArray(np.asarray(obj))  # cupy gives 0-d arrays where numpy gives scalars
    if isinstance(obj, tuple):
        return tuple(_wrap(o) for o in obj)
    if isinstance(obj, list):
        return [_wrap(o) for o in obj]
    return obj


def _upload(obj, dtype=None) -> np.ndarray:
    """Host data -> a new device buffer (a copy: later host writes never show through)."""
    a = np.array(obj, dtype=dtype)
    transfers.h2d += 1
    transfers.h2d_bytes += a.nbytes
    return a


def _binary(ufunc, reflected=False):
    def op(self, other):
        return ufunc(other, self) if reflected else ufunc(self, other)
    return op


class FakeArray:
    """A device array: numpy payload, cupy's rules."""

    __slots__ = ("_a",)
    __array_priority__ = 100
    __hash__ = None

    def __init__(self, a: np.ndarray):
        self._a = a

    # --- attributes cupy has
    shape = property(lambda s: s._a.shape)
    dtype = property(lambda s: s._a.dtype)
    ndim = property(lambda s: s._a.ndim)
    size = property(lambda s: s._a.size)
    nbytes = property(lambda s: s._a.nbytes)
    itemsize = property(lambda s: s._a.itemsize)
    strides = property(lambda s: s._a.strides)
    flags = property(lambda s: s._a.flags)
    T = property(lambda s: FakeArray(s._a.T))
    base = property(lambda s: None if s._a.base is None else FakeArray(np.asarray(s._a.base)))

    def get(self):
        transfers.d2h += 1
        return self._a.copy()

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct "
                        "a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc.__name__ not in MODULE_NAMES:
            raise TypeError(f"cupy has no ufunc {ufunc.__name__!r} (a host-only function was given a device array)")
        if method == "__call__" and set(kwargs) - UFUNC_KWARGS:
            raise TypeError(f"cupy ufuncs take only {sorted(UFUNC_KWARGS)}; got {sorted(kwargs)}")
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        return _wrap(getattr(ufunc, method)(*_unwrap(inputs), **kwargs))

    def __array_function__(self, func, types_, args, kwargs):
        if func.__name__ not in MODULE_NAMES:
            raise TypeError(f"cupy has no function {func.__name__!r}")
        _check_kwargs(func.__name__, kwargs)
        return _wrap(func(*_unwrap(args), **_unwrap(kwargs)))

    def __getattr__(self, name):
        if name not in NDARRAY_NAMES:
            raise AttributeError(f"cupy.ndarray has no attribute {name!r}")
        attr = getattr(self._a, name)
        if name in ("item", "tolist"):
            transfers.d2h += 1
        if callable(attr):
            return lambda *a, **k: _wrap(attr(*_unwrap(a), **_unwrap(k)))
        return _wrap(attr)

    def __getitem__(self, idx):
        return _wrap(self._a[_unwrap(idx)])

    def __setitem__(self, idx, value):
        self._a[_unwrap(idx)] = _unwrap(value)

    def __len__(self):
        return len(self._a)

    def __iter__(self):
        return (_wrap(v) for v in self._a)

    def _scalar(self, cast):
        transfers.d2h += 1
        return cast(self._a)

    __bool__ = lambda s: s._scalar(bool)  # noqa: E731
    __int__ = lambda s: s._scalar(int)  # noqa: E731
    __float__ = lambda s: s._scalar(float)  # noqa: E731
    __index__ = lambda s: s._scalar(lambda a: a.__index__())  # noqa: E731

    def __repr__(self):
        return f"FakeArray({self._a!r})"

    __neg__ = lambda s: np.negative(s)  # noqa: E731
    __pos__ = lambda s: np.positive(s)  # noqa: E731
    __abs__ = lambda s: np.absolute(s)  # noqa: E731
    __invert__ = lambda s: np.invert(s)  # noqa: E731


for _name, _uf in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                   ("floordiv", np.floor_divide), ("mod", np.remainder), ("pow", np.power),
                   ("matmul", np.matmul), ("and", np.bitwise_and), ("or", np.bitwise_or),
                   ("xor", np.bitwise_xor), ("lshift", np.left_shift), ("rshift", np.right_shift)]:
    setattr(FakeArray, f"__{_name}__", _binary(_uf))
    setattr(FakeArray, f"__r{_name}__", _binary(_uf, reflected=True))
    setattr(FakeArray, f"__i{_name}__", lambda s, o, _uf=_uf: _uf(s, o, out=(s,)))
for _name, _uf in [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal)]:
    setattr(FakeArray, f"__{_name}__", _binary(_uf))


class _Ufunc:
    """cupy.add etc.: device arrays in, device arrays out; numpy arrays refused."""

    def __init__(self, uf):
        self._uf = uf

    def __call__(self, *args, **kwargs):
        if set(kwargs) - UFUNC_KWARGS:
            raise TypeError(f"cupy ufuncs take only {sorted(UFUNC_KWARGS)}; got {sorted(kwargs)}")
        if "out" in kwargs and not isinstance(kwargs["out"], tuple):
            kwargs["out"] = (kwargs["out"],)
        return _wrap(self._uf(*_unwrap(args), **_unwrap(kwargs)))

    def __getattr__(self, method):
        if method == "at":  # only some cupy ufuncs have .at (no multiply); rlx uses cupyx.scatter_*
            raise AttributeError("the CPU stand-in refuses ufunc.at: use cupyx.scatter_add/max/min")
        fn = getattr(self._uf, method)
        return lambda *a, **k: _wrap(fn(*_unwrap(a), **_unwrap(k)))


def _function(fn):
    def call(*args, **kwargs):
        _check_kwargs(fn.__name__, kwargs)
        return _wrap(fn(*_unwrap(args), **_unwrap(kwargs)))
    call.__name__ = fn.__name__
    return call


def _asarray(obj, dtype=None, order=None):
    if isinstance(obj, FakeArray):
        return obj if dtype is None or obj.dtype == dtype else FakeArray(obj._a.astype(dtype))
    return FakeArray(_upload(obj, dtype))


def _array(obj, dtype=None, copy=True, order="K", ndmin=0):
    a = _upload(obj, dtype) if not isinstance(obj, FakeArray) else obj._a
    return FakeArray(np.array(a, dtype=dtype, copy=copy, ndmin=ndmin))


def _asnumpy(a):
    if isinstance(a, FakeArray):
        return a.get()
    return np.asarray(a)


class _DeviceCtx:
    def __init__(self, index: int = 0):
        self.id = index

    def use(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_cuda = types.SimpleNamespace(
    runtime=types.SimpleNamespace(getDeviceCount=lambda: 1),
    Device=_DeviceCtx,
    Stream=types.SimpleNamespace(null=types.SimpleNamespace(synchronize=lambda: None)),
)

_SPECIAL_OVERRIDES = {"asarray": _asarray, "array": _array, "asnumpy": _asnumpy, "ndarray": FakeArray,
                      "cuda": _cuda, "get_array_module": lambda *a: sys.modules["cupy"]}


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name in _SPECIAL_OVERRIDES:
            return _SPECIAL_OVERRIDES[name]
        if name not in MODULE_NAMES or not hasattr(np, name):
            raise AttributeError(f"the CPU stand-in for cupy has no {name!r}"
                                 + (" (custom CUDA kernels need a real GPU)" if name in MODULE_NAMES else ""))
        obj = getattr(np, name)
        if isinstance(obj, np.ufunc):
            return _Ufunc(obj)
        if callable(obj) and not isinstance(obj, type):
            return _function(obj)
        return obj  # dtypes, constants (pi, inf, newaxis)


class _Special(types.ModuleType):
    def __getattr__(self, name):
        if name not in SPECIAL_NAMES:
            raise AttributeError(f"cupyx.scipy.special has no {name!r}")
        fn = getattr(scipy.special, name)
        return _Ufunc(fn) if isinstance(fn, np.ufunc) else _function(fn)


def _scatter(uf):
    def scatter(a, slices, value):
        uf.at(a._a, _unwrap(slices), _unwrap(value))
    return scatter


@contextlib.contextmanager
def installed():
    """Make `import cupy` (and cupyx.scipy.special) give the stand-in inside the block."""
    mods = {"cupy": _Module("cupy"), "cupyx": types.ModuleType("cupyx"), "cupyx.scipy": types.ModuleType("cupyx.scipy"),
            "cupyx.scipy.special": _Special("cupyx.scipy.special")}
    mods["cupyx"].scipy = mods["cupyx.scipy"]
    for name, uf in (("add", np.add), ("max", np.maximum), ("min", np.minimum)):
        setattr(mods["cupyx"], f"scatter_{name}", _scatter(uf))
    mods["cupyx.scipy"].special = mods["cupyx.scipy.special"]
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    transfers.reset()
    try:
        yield mods["cupy"]
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
