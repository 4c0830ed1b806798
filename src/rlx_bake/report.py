"""BakeReport: what the bake did, per weight. Stored in the file's meta and printed by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field

from .passes.registry import SECTIONS


@dataclass
class WeightReport:
    name: str
    encoding: str
    shape: list
    bytes_before: int
    bytes_after: int
    max_abs_err: float | None = None
    cosine: float | None = None
    note: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class BakeReport:
    profile: str = "exact"
    nodes_before: int = 0
    nodes_after: int = 0
    params_baked: list[str] = field(default_factory=list)
    params_unbound: list[str] = field(default_factory=list)
    extra_weights: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)      # MatMul nodes replaced by zeros
    ternary: list[str] = field(default_factory=list)      # weights packed losslessly as ternary (TQ1_0)
    quant: list[str] = field(default_factory=list)        # weights quantized (lossy) to quant_type
    quant_type: str | None = None                         # the quantization pass's type ("q8_0", "auto"), None: off
    notes: list[str] = field(default_factory=list)
    folds_refused: list[dict] = field(default_factory=list)
    weights: list[WeightReport] = field(default_factory=list)
    packed_from: dict[str, str] = field(default_factory=dict)  # packed constant -> the dense weight it replaces
    folded_from: dict[str, str] = field(default_factory=dict)  # folded constant -> the param it came from

    def summary(self) -> str:
        """`skipped 1, ternary 2, quant 3 (q8_0)`: the report sections' counts (the CLI's line)."""
        text = ", ".join(f"{s} {len(getattr(self, s))}" for s in SECTIONS)
        return text + (f" ({self.quant_type})" if self.quant_type else "")

    @property
    def total_bytes(self) -> int:
        return sum(w.bytes_after for w in self.weights)

    @property
    def total_bytes_before(self) -> int:
        return sum(w.bytes_before for w in self.weights)

    def to_dict(self) -> dict:
        return {
            "profile": self.profile, "nodes_before": self.nodes_before, "nodes_after": self.nodes_after,
            "params_baked": list(self.params_baked), "params_unbound": list(self.params_unbound),
            "extra_weights": list(self.extra_weights), "quant_type": self.quant_type,
            "counts": {s: len(getattr(self, s)) for s in SECTIONS},
            **{s: list(getattr(self, s)) for s in SECTIONS},
            "notes": list(self.notes), "folds_refused": list(self.folds_refused),
            "weights": [w.to_dict() for w in self.weights],
            "total_bytes_before": self.total_bytes_before, "total_bytes": self.total_bytes,
        }
