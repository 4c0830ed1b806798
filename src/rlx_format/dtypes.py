"""Element types of the graph IR and their numpy counterparts.

bf16 has no numpy dtype: it is carried as its raw 16-bit pattern (uint16) in files and
widened to float32 when a tensor is used for compute.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import GraphError, RlxError

# IR dtype name -> numpy storage dtype (little-endian)
NUMPY_DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype("<f4"),
    "f16": np.dtype("<f2"),
    "bf16": np.dtype("<u2"),
    "f64": np.dtype("<f8"),
    "i64": np.dtype("<i8"),
    "i32": np.dtype("<i4"),
    "i16": np.dtype("<i2"),
    "i8": np.dtype("i1"),
    "u8": np.dtype("u1"),
    "bool": np.dtype("bool"),
}
DTYPES = tuple(NUMPY_DTYPES)
# foreign vocabularies -> IR dtype names (the storage dtype is then NUMPY_DTYPES[ir])
ONNX_DTYPES = {1: "f32", 10: "f16", 16: "bf16", 11: "f64", 7: "i64", 6: "i32", 5: "i16", 3: "i8", 2: "u8", 9: "bool"}
SAFETENSORS_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f64", "I64": "i64", "I32": "i32",
                      "I16": "i16", "I8": "i8", "U8": "u8", "BOOL": "bool"}
FLOAT_DTYPES = frozenset({"f32", "f16", "bf16", "f64"})
INT_DTYPES = frozenset({"i64", "i32", "i16", "i8", "u8"})

_FROM_NUMPY = {np.dtype(v).newbyteorder("="): k for k, v in NUMPY_DTYPES.items() if k != "bf16"}


def check_dtype(name: object, where: str) -> str:
    if not isinstance(name, str) or name not in NUMPY_DTYPES:
        raise GraphError(f"{where}: unknown dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return name


def dtype_of_array(a: np.ndarray) -> str:
    """IR dtype name of a numpy array (uint16 is not mapped: bf16 must be declared)."""
    dt = np.dtype(a.dtype).newbyteorder("=")
    try:
        return _FROM_NUMPY[dt]
    except KeyError:
        raise RlxError(
            f"numpy dtype {a.dtype} has no rlx equivalent; expected one of "
            f"float32/float16/float64/int64/int32/int16/int8/uint8/bool"
        ) from None


def compute_dtype(name: str) -> np.dtype:
    """numpy dtype used for arithmetic on a value of IR dtype `name` (bf16 -> f32)."""
    return np.dtype(np.float32) if name == "bf16" else NUMPY_DTYPES[name]


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def bf16_words(xp, x):
    """f32 rounded to nearest-even bf16, as uint32 words with the low 16 bits zero (NaN stays NaN).

    Array-module generic (`xp` = numpy or cupy): the runtime's Cast to bf16 uses it on the device."""
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return xp.where(xp.isnan(x), (u | 0x400000) & 0xFFFF0000, rounded).astype(xp.uint32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 bit patterns (NaN stays NaN)."""
    return (bf16_words(np, x) >> 16).astype(np.uint16).reshape(np.shape(x))


def float_to_int(xp, x, dtype):
    """Float -> integer cast defined for every input (spec/ops.md, "Defined results"): truncation toward
    zero; NaN -> 0; values past the type's range, ±Inf included, saturate to its min / max.

    A plain astype leaves those inputs to the CPU (undefined behaviour in C; numpy's AVX2 and AVX-512
    loops give different integers). Array-module generic (`xp` = numpy or cupy)."""
    dt = np.dtype(dtype)
    info = np.iinfo(dt)
    fmax = float(np.finfo(x.dtype).max)
    top = 2.0 ** (info.bits - (1 if info.min else 0))  # first value past the range: a power of two, exact
    hi = x >= (top if top <= fmax else math.inf)  # the float type may not reach it: then only +Inf is past
    lo = x < float(info.min) if -float(info.min) <= fmax else x == -math.inf
    bad = hi | lo | (x != x)
    safe = xp.where(bad, x.dtype.type(0), x).astype(dt)
    return xp.where(hi, dt.type(info.max), xp.where(lo, dt.type(info.min), safe))
