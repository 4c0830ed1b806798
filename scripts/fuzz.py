"""`make fuzz`: run every fuzz target for a while and print cases/s.

Usage: python scripts/fuzz.py [seconds per target, default 30] [seed]
Exits 1 on the first escape (a non-RlxError exception or a call over the time limit), printing
the seed and the mutated input's size so it can be replayed.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import fuzz_targets as ft  # noqa: E402


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 30.0
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    # each target mutates one of its seeds: a valid one first, then crafted ones that once got through
    seeds = {"read_rlx": [ft.seed_rlx(), *ft.hostile_rlx().values()], "rlx_header": [ft.seed_rlx()],
             "sealed": [ft.seed_sealed()], "safetensors": [ft.seed_safetensors()],
             "graph_json": [ft.seed_graph().to_dict(), *ft.hostile_graphs().values()], "graph_ops": [None],
             "onnx": [ft.seed_onnx()]}
    targets = {"read_rlx": ft.target_read_rlx, "rlx_header": ft.target_read_rlx, "sealed": ft.target_sealed,
               "safetensors": ft.target_safetensors, "graph_json": ft.target_graph_json,
               "graph_ops": ft.target_graph_lifecycle, "onnx": ft.target_onnx}
    total = 0
    for name, target in targets.items():
        rng = np.random.default_rng(seed)
        cases = accepted = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            pool = seeds[name]  # the valid seed half the time, else one of the crafted ones
            seed_case = pool[0] if len(pool) == 1 or rng.random() < 0.5 else pool[int(rng.integers(1, len(pool)))]
            if name == "graph_json":
                case = seed_case
                for _ in range(int(rng.integers(1, 4))):
                    case = ft.mutate_json(case, rng)
            elif name == "graph_ops":  # one random op with edge-value inputs and attrs, loaded, written, run
                case = ft.random_op_doc(rng)
            elif name == "rlx_header":
                case = ft.mutate_header(seed_case, rng)
            elif rng.random() < 0.1:
                case = bytes(rng.integers(0, 256, int(rng.integers(0, 256)), dtype=np.uint8))
            else:
                case = ft.mutate(seed_case, rng)
            try:
                accepted += target(case)
            except Exception:  # noqa: BLE001 - report any escape
                traceback.print_exc()
                print(f"ESCAPE in {name} after {cases} cases (seed {seed})", file=sys.stderr)
                return 1
            cases += 1
        rate = cases / (time.perf_counter() - t0)
        total += cases
        print(f"{name:12} {cases:8d} cases  {rate:9.0f} cases/s  {accepted:6d} accepted  0 escapes")
    print(f"total {total} cases, 0 escapes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
