"""The bake's passes, declared once. PROFILES, the BakeOptions flags, the CLI's --X/--no-X options, the
pipeline's order and the report's sections are all generated from STAGES.

A stage is one option flag (`--fold`, `--skip`, ...) and the passes it turns on. Consecutive stages of
the same `group` run together to a fixed point (pipeline.run_group): a pass that changed the graph
makes the others of its group run again, so what skip-zero turns into zeros is folded because the
fold shares its group, not because the fold is listed twice.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

PROFILE_NAMES = ("merge", "fold", "exact", "size")
PROFILE_HELP = {
    "merge": "package only: weights become constants and are stored; no graph rewrites",
    "fold": "+ constant folding, affine folds, simplification, removal of unused nodes",
    "exact": "+ lossless value-aware packing (skip-zero, ternary): bit-exact weights",
    "size": "+ lossy quantization (--quant TYPE, default q8_0)",
}


def _resolve(spec):
    """A pass given as "module:name" (a Pass object, or a (label, "module:function") pair) -> the Pass. The
    passes are named, not imported, so the CLI can build its options without loading numpy-heavy code."""
    from rlx_runtime.passes import Pass

    if isinstance(spec, Pass):
        return spec
    label, where = (None, spec) if isinstance(spec, str) else spec
    module, _, name = where.partition(":")
    obj = getattr(importlib.import_module(module), name)
    return obj if label is None else Pass(label, obj)


@dataclass(frozen=True)
class Stage:
    flag: str                    # BakeOptions field and CLI --flag/--no-flag
    help: str                    # CLI help
    profiles: tuple[str, ...]    # profiles that turn it on
    pass_specs: tuple            # run in this order: "module:PASS" or (label, "module:function")
    group: str                   # consecutive stages of one group run to a fixed point together
    report: str | None = None    # BakeReport list that receives the passes' entries (JSON key, CLI count)

    @property
    def passes(self) -> tuple:
        """The Pass objects (Pass.name is the progress label), imported on first use."""
        return tuple(_resolve(p) for p in self.pass_specs)


_RT = "rlx_runtime.passes:"
STAGES: tuple[Stage, ...] = (
    Stage("fold", "Constant-fold weight-only subgraphs (and fold BatchNorm/Mul/Add into Conv and MatMul weights).",
          ("fold", "exact", "size"), (_RT + "AFFINE", _RT + "FOLD"), "fold"),
    Stage("skip", "Replace MatMuls with all-zero weights by zeros (IEEE caveat: NaN/Inf inputs give 0).",
          ("exact", "size"), (("skip-zero", "rlx_bake.passes.skip_zero:skip_zero_matmuls"),), "fold", "skipped"),
    Stage("ternary", "Pack exactly ternary MatMul weights losslessly (TQ1_0).",
          ("exact", "size"), (("ternary", "rlx_bake.passes.ternary:pack_ternary_weights"),), "ternary", "ternary"),
    Stage("quant", "Quantize (lossy) MatMul and Conv weights and embedding tables (--quant TYPE|auto).",
          ("size",), (("quant", "rlx_bake.passes.quant:quantize_weights"),), "quant", "quant"),
    Stage("simplify", "Algebraic simplification (x+0, x*1, Identity, Transpose pairs) and exact GELU/SiLU fusion.",
          ("fold", "exact", "size"), (_RT + "SIMPLIFY", _RT + "FUSE"), "clean"),
    Stage("dce", "Remove unused nodes and duplicate constants.",
          ("fold", "exact", "size"), (_RT + "DCE", _RT + "DEDUPE"), "clean"),
)
FLAGS: tuple[str, ...] = tuple(s.flag for s in STAGES)
PROFILES: dict[str, dict[str, bool]] = {p: {s.flag: p in s.profiles for s in STAGES} for p in PROFILE_NAMES}
SECTIONS: tuple[str, ...] = tuple(s.report for s in STAGES if s.report)


def check_stages() -> None:
    """Every stage names known profiles, flags and groups are unique, a group's stages are adjacent."""
    flags = [s.flag for s in STAGES]
    if len(set(flags)) != len(flags):
        raise AssertionError(f"bake stages: a flag is declared twice: {flags}")
    for s in STAGES:
        unknown = sorted(set(s.profiles) - set(PROFILE_NAMES))
        if unknown:
            raise AssertionError(f"bake stage {s.flag!r}: unknown profile(s) {unknown}")
    groups = [s.group for i, s in enumerate(STAGES) if i == 0 or STAGES[i - 1].group != s.group]
    if len(set(groups)) != len(groups):
        raise AssertionError(f"bake stages: the stages of a group must be adjacent; got groups {groups}")


check_stages()
