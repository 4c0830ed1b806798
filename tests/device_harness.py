"""Run CPU tests again on the CUDA code path: on a real GPU (`cuda`) or on the CPU stand-in (`fake`).

`backend(kind)` yields a Backend whose `Session` and `run_op` drop into the CPU tests in place of the
real ones: graphs compile for Device.CUDA, inputs go in as numpy (uploaded by rlx), every output must
come back as a device array (nothing silently ran on the host), and is then copied to the host so
the CPU tests' assertions apply unchanged.

Tolerances vs the numpy reference (`run_op`): integer, bool and data-movement results exact; float32
rtol 1e-4 / atol 1e-5 on a GPU (libm and summation order differ: cuBLAS, CUDA's erf/exp), 1e-6 on
the stand-in (which runs numpy's own code, except erf via scipy instead of rlx's numba kernel).
"""

from __future__ import annotations

import contextlib

import numpy as np
from conftest import run_op as cpu_run_op

import fake_cupy
from rlx_runtime import Device
from rlx_runtime import Session as RealSession
from rlx_runtime import to_host


class DeviceCompiled:
    """A compiled graph whose run() checks outputs stayed on the device, then returns host copies."""

    def __init__(self, inner, backend: Backend):
        self._inner = inner
        self._backend = backend

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def run(self, feeds):
        out = self._inner.run(feeds)
        for k, v in out.items():
            assert isinstance(v, self._backend.xp.ndarray), f"output {k!r} is {type(v).__name__}, not on the device"
        # on the device too, outputs are distinct buffers and never the caller's inputs
        assert len({id(v) for v in out.values()}) == len(out), "two outputs share one device array"
        assert not {id(v) for v in out.values()} & {id(v) for v in feeds.values()}, "an output is an input"
        return to_host(out)


class Backend:
    def __init__(self, xp, kind: str):
        self.xp = xp
        self.kind = kind
        self.rtol, self.atol = (1e-4, 1e-5) if kind == "cuda" else (1e-6, 1e-6)

    @property
    def transfers(self):
        return fake_cupy.transfers if self.kind == "fake" else None

    def Session(self, device=None):  # noqa: N802 - stands in for the class
        backend = self

        class _S:
            def __init__(self):
                self._s = RealSession(Device.CUDA)

            def compile(self, g):
                return DeviceCompiled(self._s.compile(g), backend)

            def compile_with(self, g, options=None):
                return DeviceCompiled(self._s.compile_with(g, options), backend)

        return _S()

    def run_op(self, op, inputs, attrs=None, consts=()):
        """Like conftest.run_op, on the device, checked against the CPU result, which it returns."""
        ref = cpu_run_op(op, inputs, attrs, consts)
        got = cpu_run_op(op, inputs, attrs, consts, session=self.Session())
        assert got.shape == ref.shape and got.dtype == ref.dtype, (op, got.shape, ref.shape, got.dtype, ref.dtype)
        if ref.dtype.kind in "fc":
            np.testing.assert_allclose(got, ref, rtol=self.rtol, atol=self.atol, err_msg=f"{op} on {self.kind}")
        else:
            np.testing.assert_array_equal(got, ref, err_msg=f"{op} on {self.kind}")
        return ref


@contextlib.contextmanager
def backend(kind: str):
    if kind == "fake":
        with fake_cupy.installed() as xp:
            yield Backend(xp, "fake")
    else:
        import cupy

        yield Backend(cupy, "cuda")
