import os

import numpy as np
import pytest
from hypothesis import settings

from rlx_format import GraphBuilder
from rlx_runtime import Device, Session

# CI runs the property tests with a fixed example sequence, so a submission is judged on the same cases
# every time; local runs (and `make fuzz`) keep exploring new ones.
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_report_header(config):
    from rlx_runtime.machine import describe

    return describe()  # which CPU, SIMD paths and BLAS kernel the run used, to trace machine-dependent failures


def _has_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU / cupy on this machine")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def big_scratch(tmp_path):
    """For the multi-GB tests: `big_scratch(need_bytes)` checks the disk has room first and returns a folder that
    is emptied after the test, passed or failed, so gigabytes never pile up in pytest's retained temp folders.
    Too little disk is a property of the machine, not of the code: the test is skipped, saying how much it needs
    and how much is free (before, it died of ENOSPC deep inside a subprocess, with no message)."""
    import shutil

    folder = tmp_path / "big"

    def claim(need_bytes: int):
        free = shutil.disk_usage(tmp_path).free
        if free < need_bytes + (1 << 30):  # 1 GiB left over for everything else on the machine
            pytest.skip(f"{tmp_path}: this test writes {need_bytes / 2**30:.1f} GiB, but only {free / 2**30:.1f} GiB "
                        f"is free there (with 1 GiB spare); free some disk or point --basetemp at a larger one")
        folder.mkdir()
        return folder

    yield claim
    shutil.rmtree(folder, ignore_errors=True)


def run_op(op: str, inputs: list[np.ndarray], attrs: dict | None = None, consts: tuple[int, ...] = (),
           session=None) -> np.ndarray:
    """Build a one-node graph (inputs fed at run time, `consts` indices as constants) and run it
    (on the CPU unless another `session` is given)."""
    from rlx_format.dtypes import dtype_of_array

    g = GraphBuilder(op)
    names, feeds = [], {}
    for i, a in enumerate(inputs):
        if i in consts:
            names.append(g.constant(a, name=f"c{i}"))
        else:
            names.append(g.input(f"in{i}", dtype_of_array(a), list(a.shape)))
            feeds[f"in{i}"] = a
    g.output(g.op(op, *names, name="out", **(attrs or {})))
    return (session or Session(Device.CPU)).compile(g.build()).run(feeds)["out"]


def assert_same_dot_products(got, want, a, b):
    """got and want hold the same dot products over K terms, summed in possibly different orders: each element
    may differ by at most K * eps * sum|a_i * b_i| (the classic bound for a reordered float sum, times 2)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    k = a.shape[-1]
    bound = 2 * k * np.finfo(want.dtype).eps * np.matmul(np.abs(a).astype(np.float64), np.abs(b).astype(np.float64))
    assert np.all(np.abs(got.astype(np.float64) - want) <= bound), np.max(np.abs(got.astype(np.float64) - want) - bound)


def numpy_blas_threads() -> int:
    """numpy's BLAS thread count, as threadpoolctl reads it (scipy's own copy, when a test loaded it after rlx
    found the BLAS, is not numpy's)."""
    from threadpoolctl import threadpool_info
    return next(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas" and "numpy" in i["filepath"])
