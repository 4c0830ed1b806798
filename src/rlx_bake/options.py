"""BakeOptions and profiles."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from rlx_format.codecs import BY_SHORT, CODECS, Codec
from rlx_format.errors import RlxError
from rlx_runtime.options import DEFAULT_FOLD_GROWTH_LIMIT, DEFAULT_FOLD_MIN_BYTES

PROFILES = {
    # package only: weights become constants and are stored; no graph rewrites
    "merge": dict(fold=False, simplify=False, dce=False, skip=False, ternary=False, quant=False),
    "fold": dict(fold=True, simplify=True, dce=True, skip=False, ternary=False, quant=False),
    "exact": dict(fold=True, simplify=True, dce=True, skip=True, ternary=True, quant=False),   # lossless
    "size": dict(fold=True, simplify=True, dce=True, skip=True, ternary=True, quant=True),     # exact + quant_type
}
DEFAULT_PROFILE = "exact"
# the lossy codecs the quantization pass can use, by CLI name (ternary codecs are for the ternary pass)
QUANT_TYPES = tuple(c.short for c in CODECS.values() if not c.ternary)
DEFAULT_QUANT_TYPE = "q8_0"


@dataclass
class BakeOptions:
    profile: str = DEFAULT_PROFILE
    fold: bool = True
    simplify: bool = True
    dce: bool = True
    skip: bool = True
    ternary: bool = True
    quant: bool = False
    quant_type: str = DEFAULT_QUANT_TYPE  # codec of the quantization pass: one of QUANT_TYPES
    strict: bool = False
    fold_growth_limit: float = DEFAULT_FOLD_GROWTH_LIMIT
    fold_min_bytes: int = DEFAULT_FOLD_MIN_BYTES
    fold_memory_budget: int | None = None  # bytes folding may hold at once (None: 1/8 of usable memory)

    @classmethod
    def from_profile(cls, name: str = DEFAULT_PROFILE, **overrides) -> BakeOptions:
        """Profile defaults, then fine flags (None = keep the profile's choice) on top, whatever their order."""
        if name not in PROFILES:
            raise RlxError(f"unknown profile {name!r}; expected one of {', '.join(PROFILES)}")
        known = {f.name for f in fields(cls)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise RlxError(f"unknown bake option(s) {bad}")
        opts = replace(cls(profile=name, **PROFILES[name]), **{k: v for k, v in overrides.items() if v is not None})
        opts.quant_codec()  # an unknown quant_type fails here, before any work
        return opts

    def quant_codec(self) -> Codec:
        """The codec of the quantization pass, or an RlxError naming the choices."""
        if self.quant_type not in QUANT_TYPES:
            raise RlxError(f"unknown quant type {self.quant_type!r}; expected one of {', '.join(QUANT_TYPES)}")
        return BY_SHORT[self.quant_type]
