"""The bake's passes, declared once. PROFILES, the BakeOptions flags, the CLI's --X/--no-X options, the
pipeline's order and the report's sections are all generated from STAGES.

A stage is one option flag (`--fold`, `--skip`, ...) and the passes it turns on. Consecutive stages of
the same `group` run together to a fixed point (pipeline.run_group): a pass that changed the graph
makes the others of its group run again, so what skip-zero turns into zeros is folded because the
fold shares its group, not because the fold is listed twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlx_runtime.passes import AFFINE, DCE, DEDUPE, FOLD, FUSE, SIMPLIFY, Pass

from .quant import quantize_weights
from .skip_zero import skip_zero_matmuls
from .ternary import pack_ternary_weights

PROFILE_NAMES = ("merge", "fold", "exact", "size")
PROFILE_HELP = {
    "merge": "package only: weights become constants and are stored; no graph rewrites",
    "fold": "+ constant folding, affine folds, simplification, removal of unused nodes",
    "exact": "+ lossless value-aware packing (skip-zero, ternary): bit-exact weights",
    "size": "+ lossy quantization (--quant TYPE, default q8_0)",
}


@dataclass(frozen=True)
class Stage:
    flag: str                    # BakeOptions field and CLI --flag/--no-flag
    help: str                    # CLI help
    profiles: tuple[str, ...]    # profiles that turn it on
    passes: tuple[Pass, ...]     # run in this order; Pass.name is the progress label
    group: str                   # consecutive stages of one group run to a fixed point together
    report: str | None = None    # BakeReport list that receives the passes' entries (JSON key, CLI count)


STAGES: tuple[Stage, ...] = (
    Stage("fold", "Constant-fold weight-only subgraphs (and fold BatchNorm/Mul/Add into Conv and MatMul weights).",
          ("fold", "exact", "size"), (AFFINE, FOLD), "fold"),
    Stage("skip", "Replace MatMuls with all-zero weights by zeros (IEEE caveat: NaN/Inf inputs give 0).",
          ("exact", "size"), (Pass("skip-zero", skip_zero_matmuls),), "fold", "skipped"),
    Stage("ternary", "Pack exactly ternary MatMul weights losslessly (TQ1_0).",
          ("exact", "size"), (Pass("ternary", pack_ternary_weights),), "ternary", "ternary"),
    Stage("quant", "Quantize (lossy) MatMul and Conv weights and embedding tables (--quant TYPE|auto).",
          ("size",), (Pass("quant", quantize_weights),), "quant", "quant"),
    Stage("simplify", "Algebraic simplification (x+0, x*1, Identity, Transpose pairs) and exact GELU/SiLU fusion.",
          ("fold", "exact", "size"), (SIMPLIFY, FUSE), "clean"),
    Stage("dce", "Remove unused nodes and duplicate constants.",
          ("fold", "exact", "size"), (DCE, DEDUPE), "clean"),
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
