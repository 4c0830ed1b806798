"""Shared benchmark helpers: timing, RSS, the result row, the environment note."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Row:
    bench: str
    case: str
    rlx: float        # seconds (or MB for memory rows)
    peer: float
    peer_name: str
    goal: str         # e.g. "<= 3.0x"
    unit: str = "ms"
    origin: str = ""  # where the goal comes from (the commit that set it, or what it is derived from)

    @property
    def ratio(self) -> float:
        return self.rlx / self.peer if self.peer else float("inf")

    def met(self) -> bool:
        op, val = self.goal.split()
        val = float(val.rstrip("x"))
        return self.ratio <= val if op == "<=" else self.ratio >= val

    def line(self) -> str:
        scale = 1e3 if self.unit == "ms" else 1.0
        return (f"{self.bench:14} {self.case:42} rlx {self.rlx * scale:10.3f} {self.unit:3} "
                f"{self.peer_name:>22} {self.peer * scale:10.3f} {self.unit:3} ratio {self.ratio:7.3f}x "
                f"goal {self.goal:8} {'met' if self.met() else 'MISSED'}")


def best_of(fn: Callable[[], object], repeat: int = 7, number: int = 1) -> float:
    """Best (minimum) wall time of `number` calls, over `repeat` rounds, per call."""
    fn()  # warm-up (JIT, caches)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t) / number)
    return best


_SETTLE_S = 0.2  # idle time before each round: the other engine's spinning worker threads go back to sleep


def best_interleaved(a, b, repeat: int = 9, number: int = 2) -> tuple[float, float]:
    """Best per-call times of a and b, timed in alternating rounds so that a load change on a shared
    machine hits both sides alike. Each round starts after a short idle pause (onnxruntime's intra-op
    threads, and OpenBLAS's, spin for a while after a run and would otherwise take a core from the engine
    timed next) and one untimed call (which wakes that engine's threads and cores from idle), so each
    engine is timed in its steady state in its own quiet window."""
    a(), b()
    best_a = best_b = float("inf")
    for _ in range(repeat):
        for fn, slot in ((a, 0), (b, 1)):
            time.sleep(_SETTLE_S)
            fn()
            t = time.perf_counter()
            for _ in range(number):
                fn()
            dt = (time.perf_counter() - t) / number
            if slot == 0:
                best_a = min(best_a, dt)
            else:
                best_b = min(best_b, dt)
    return best_a, best_b


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def env_note() -> str:
    from rlx_runtime.machine import describe

    return f"{describe()} (the benchmarks change neither)"


def print_rows(rows: list[Row]) -> None:
    for r in rows:
        print(r.line())
