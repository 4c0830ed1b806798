"""The Backend object: one place for what differs between devices; a hand-built backend runs graphs."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

from rlx_format import GraphBuilder
from rlx_format.errors import RlxError
from rlx_runtime import Device, Session
from rlx_runtime.backend import CPU, Backend, backend_for, backend_of
from rlx_runtime.kernels import KERNELS, OVERRIDES, check_table, kernel

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"


def _graph():
    g = GraphBuilder()
    x = g.input("x", "f32", [2, 3])
    g.output(g.relu(g.add(x, x), name="y"))
    return g.build()


def test_cpu_backend_and_its_overrides():
    assert backend_for(Device.CPU) is CPU and backend_of(np) is CPU
    assert CPU.host_arrays and CPU.inplace_ufuncs
    for op in ("Gelu", "Silu", "FusedConv", "Dequantize", "DequantMatMul"):
        assert CPU.kernel(op) is OVERRIDES["cpu"][op] is not KERNELS[op]
    assert CPU.kernel("Add") is KERNELS["Add"]
    assert OVERRIDES["cuda"]["DequantMatMul"] is not KERNELS["DequantMatMul"]
    with pytest.raises(RlxError, match="CUDA only"):
        backend_for(Device.CPU, 1)


def test_a_hand_built_backend_runs_with_its_own_override(monkeypatch):
    calls = []

    def traced_add(xp, a, x, y):
        calls.append(x.shape)
        return KERNELS["Add"](xp, a, x, y)

    monkeypatch.setitem(OVERRIDES, "traced", {"Add": traced_add})
    mine = Backend("traced", Device.CPU, np, host_arrays=True)  # no in-place ufuncs: every op calls its kernel
    compiled = Session(mine).compile(_graph())
    assert compiled.backend is mine and compiled.device is Device.CPU
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    np.testing.assert_array_equal(compiled.run({"x": x})["y"], np.maximum(2 * x, 0))
    assert calls == [(2, 3)]
    with pytest.raises(RlxError, match="already names"):
        Session(mine, 0)


def test_an_override_of_an_unknown_op_is_refused(monkeypatch):
    monkeypatch.setitem(OVERRIDES, "typo", {})
    kernel("Gelux", backend="typo")(lambda xp, a, x: x)
    with pytest.raises(RlxError, match=r"backend 'typo' overrides unknown ops \['Gelux'\]"):
        check_table()


def test_nothing_outside_the_backend_compares_array_modules():
    """Device checks live in rlx_runtime/backend.py only (`xp is np` elsewhere was the old way)."""
    pattern = re.compile(r"\bxp is (not )?np\b|is_cupy|== ['\"]cupy['\"]")
    hits = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py") if p.name != "backend.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []
