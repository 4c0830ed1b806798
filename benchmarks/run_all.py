"""Run every benchmark and print one table of ratios (rlx vs peer, measured in the same run)."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from common import env_note  # noqa: E402

BENCHES = ["runtime_overhead", "onnx_vs_ort", "minilm", "quant_sizes", "real_models", "hoist", "pe_cache", "quants",
           "load", "crypto", "bake", "cli_start"]


def main(selected: list[str]) -> int:
    print(env_note())
    rows, not_run, t0 = [], [], time.perf_counter()
    for name in selected or BENCHES:
        t = time.perf_counter()
        try:
            module = importlib.import_module(name)
        except ImportError as e:  # e.g. the MiniLM weights package is not installed
            not_run.append(f"{name} ({e})")
            print(f"[{name}: not run: {e}]", file=sys.stderr)
            continue
        rows += module.main()
        print(f"[{name}: {time.perf_counter() - t:.1f}s]", file=sys.stderr)
    print()
    for r in rows:
        print(r.line())
    missed = [r for r in rows if not r.met()]
    print(f"\n{len(rows) - len(missed)} goals met, {len(missed)} missed ({time.perf_counter() - t0:.0f}s)")
    if not_run:  # a missing peer (or model) is a failed run, not a shorter table
        print(f"not run ({len(not_run)}): " + "; ".join(not_run))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
