"""BakeOptions and profiles (generated from the stage list, passes/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from rlx_format.errors import RlxError
from rlx_runtime.options import DEFAULT_FOLD_GROWTH_LIMIT, DEFAULT_FOLD_MIN_BYTES

from .quant_choice import AUTO, DEFAULT_MIN_COSINE, DEFAULT_QUANT_TYPE, DENSE, check_quant_choice, quant_types
from .passes.registry import FLAGS, PROFILES

DEFAULT_PROFILE = "exact"
# the lossy codecs the quantization pass can use, by CLI name (ternary codecs are for the ternary pass);
# quant_types() reads the registry each time
QUANT_TYPES = quant_types()
_ON = PROFILES[DEFAULT_PROFILE]

__all__ = ["AUTO", "DENSE", "DEFAULT_MIN_COSINE", "DEFAULT_PROFILE", "DEFAULT_QUANT_TYPE", "PROFILES", "QUANT_TYPES",
           "BakeOptions"]


@dataclass
class BakeOptions:
    profile: str = DEFAULT_PROFILE
    # one flag per stage of passes/registry.py (checked below); defaults: the default profile's
    fold: bool = _ON["fold"]
    simplify: bool = _ON["simplify"]
    dce: bool = _ON["dce"]
    skip: bool = _ON["skip"]
    ternary: bool = _ON["ternary"]
    quant: bool = _ON["quant"]
    quant_type: str = DEFAULT_QUANT_TYPE  # codec of the quantization pass: one of quant_types(), or "auto"
    quant_min_cosine: float = DEFAULT_MIN_COSINE  # auto: the lowest weight cosine (dequantized vs f32) accepted
    quant_weights: tuple[tuple[str, str], ...] = ()  # (glob, type or "dense") per-weight overrides; the last wins
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
        opts.check()  # an unknown quant type fails here, before any work
        return opts

    def check(self) -> None:
        """RlxError for a choice that cannot work (unknown type, override without quantization)."""
        self.quant_weights = tuple((str(g), str(t)) for g, t in self.quant_weights)
        check_quant_choice(self.quant_type, self.quant_weights, self.quant_min_cosine)
        if self.quant_weights and not self.quant:
            raise RlxError("per-weight quant types (quant_weights / --quant-weight) need quantization on: use the "
                           "size profile (--opt size) or --quant TYPE")


def _check_flags() -> None:
    bools = [f.name for f in fields(BakeOptions) if f.type in ("bool", bool) and f.name != "strict"]
    if sorted(bools) != sorted(FLAGS):
        raise AssertionError(f"BakeOptions' pass flags {sorted(bools)} differ from the stages' {sorted(FLAGS)}")


_check_flags()
