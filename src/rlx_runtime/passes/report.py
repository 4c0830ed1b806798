"""What the passes did (nodes before/after, folds refused and why)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PassReport:
    nodes_before: int = 0
    nodes_after: int = 0
    specialized: list[str] = field(default_factory=list)
    folded: int = 0
    fold_refused: list[dict] = field(default_factory=list)  # {"node", "op", "reason"}
    simplified: int = 0
    dce_removed: int = 0
    deduped: int = 0
    affine_folded: list[dict] = field(default_factory=list)  # {"node", "op", "into", "into_op"}
    inlined: list[str] = field(default_factory=list)  # control flow the fold decided (If inlined, Loop skipped)
    passes: list[tuple[str, int]] = field(default_factory=list)  # (pass, nodes after it)
    # folded constant -> the one param/constant it was computed from (e.g. a transposed weight)
    folded_from: dict[str, str] = field(default_factory=dict)
    # folded constant -> bytes of the original constants it was computed from: a later fold pass judges
    # growth against these, so folding in several passes cannot grow 16x per pass
    fold_origin_bytes: dict[str, int] = field(default_factory=dict)
    # constant -> xxh3-64 hex digest of its bytes, as computed by dedupe (the writer reuses them)
    digests: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
                "specialized": list(self.specialized), "folded": self.folded,
                "fold_refused": list(self.fold_refused), "simplified": self.simplified,
                "dce_removed": self.dce_removed, "deduped": self.deduped,
                "affine_folded": list(self.affine_folded), "inlined": list(self.inlined),
                "passes": [list(p) for p in self.passes]}
