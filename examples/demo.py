"""`make demo`: bake the digits classifier every way, run each artifact, print accuracy and size.

Uses the real CLI (`python -m rlx_bake`) for the bakes and the runtime API for inference.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


HERE = Path(__file__).parent
sys.path.insert(0, str(HERE / "digits"))
from train import split  # noqa: E402

from rlx_format import read_rlx  # noqa: E402
from rlx_runtime import Device, Session  # noqa: E402

OUT = HERE / "out"
PASSWORD_VAR = "RLX_DEMO_PASSWORD"


def bake(bundle: str, name: str, *flags: str) -> Path:
    out = OUT / name
    cmd = [sys.executable, "-m", "rlx_bake", "-q", str(HERE / "digits" / bundle), "-o", str(out), *flags]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


def main() -> None:
    OUT.mkdir(exist_ok=True)
    os.environ.setdefault(PASSWORD_VAR, "demo-password-not-a-secret")
    _, (x, y) = split()
    runs = [
        ("float", "digits_float_merge.rlx", ["--opt", "merge"]),
        ("float", "digits_float_exact.rlx", []),
        ("float", "digits_float_size.rlx", ["--opt", "size"]),
        ("ternary", "digits_ternary_exact.rlx", []),
        ("ternary", "digits_ternary_sealed.rlx", ["--password-env", PASSWORD_VAR, "--kdf", "fast"]),
    ]
    src = (HERE / "digits" / "float" / "weights.safetensors").stat().st_size
    print(f"{'artifact':34} {'bytes':>8} {'vs safetensors':>15} {'accuracy':>9}  ops")
    for bundle, name, flags in runs:
        path = bake(bundle, name, *flags)
        sealed = "--password-env" in flags
        rf = read_rlx(path, password=os.environ[PASSWORD_VAR] if sealed else None)
        compiled = Session(Device.CPU).compile(rf)
        probs = compiled.run({"x": x})["probs"]
        acc = float((probs.argmax(1) == y).mean())
        ops = sorted({n.op for n in rf.graph.nodes})
        size = path.stat().st_size
        print(f"{name:34} {size:8d} {size / src:14.2f}x {acc:9.4f}  {','.join(ops)}")


if __name__ == "__main__":
    main()
