"""Cold start of the CLI: `rlx-bake --help` and `rlx-bake inspect` on a small file, each in a fresh process
(best of 7), next to `python -c "import numpy"` (the floor every command pays). Goal (issue #24): both
under 0.25 s; printed as rows against that absolute budget."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import Row, env_note, print_rows


def _best(cmd: list[str], n: int = 7) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> list[Row]:
    from rlx_bake import bake
    from rlx_format import GraphBuilder, write_rlx

    g = GraphBuilder()
    x = g.input("x", "f32", [1, 4])
    g.output(g.relu(g.matmul(x, g.param("w", "f32", [4, 4])), name="y"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "small.rlx"
        write_rlx(path, bake(g.build(), {"w": np.eye(4, dtype=np.float32)})[0])
        cli = [sys.executable, "-m", "rlx_bake"]
        t_numpy = _best([sys.executable, "-c", "import numpy"])
        t_help = _best([*cli, "--help"])
        t_inspect = _best([*cli, "inspect", str(path)])
    print(f"cli start: python -c 'import numpy' alone {t_numpy:.3f} s (information)")
    origin = "issue #24: rlx-bake --help and inspect under 0.25 s"
    return [Row("cli", "rlx-bake --help (fresh process)", t_help, 0.25, "(absolute s)", "<= 1.0x", "s", origin),
            Row("cli", "rlx-bake inspect small.rlx (fresh process)", t_inspect, 0.25, "(absolute s)", "<= 1.0x",
                "s", origin)]


if __name__ == "__main__":
    print(env_note())
    print_rows(main())
