"""One line that says which CPU and which compute paths this process runs on.

Results that are allowed to differ between machines (float summation order in BLAS, numba's SIMD
width) are traced with it: CI prints it first (`python -m rlx_runtime.machine`), pytest puts it in
its header, and the benchmarks print it above their tables.
"""

from __future__ import annotations

import os
import platform


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            info = f.read()
    except OSError:
        return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "cpu family", "model", "flags") and key not in fields:
            fields[key] = value.strip()
    flags = set(fields.get("flags", "").split())
    simd = next((name for name in ("avx512f", "avx2", "avx", "sse4_2", "neon", "asimd") if name in flags), "")
    model = fields.get("model name", platform.machine())
    if "cpu family" in fields:
        model += f" (family {fields['cpu family']} model {fields.get('model', '?')})"
    return f"{model}, {simd or 'baseline SIMD'}"


def _numpy_paths() -> str:
    import numpy as np

    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy < 2
        try:
            from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
        except ImportError:
            return f"numpy {np.__version__}"
    used = [name for name in __cpu_dispatch__ if __cpu_features__.get(name)]
    return f"numpy {np.__version__} dispatch {','.join(used) or 'baseline'}"


def _blas() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "BLAS ? (threadpoolctl not installed)"
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not libs:
        return "BLAS ?"
    i = libs[0]
    return (f"BLAS {i.get('internal_api')} {i.get('version')} {i.get('architecture') or ''} "
            f"({i.get('num_threads')} threads)").replace("  ", " ")


def _numba_target() -> str:
    from rlx_format.numba_setup import numba

    try:
        import llvmlite.binding as ll

        target = numba.config.CPU_NAME or ll.get_host_cpu_name()
    except Exception:  # noqa: BLE001 - informational only
        target = "?"
    return f"numba {numba.__version__} target {target}, cache {numba.config.CACHE_DIR or 'next to sources'}"


def describe() -> str:
    env = ", ".join(f"{k}={os.environ.get(k, 'unset')}" for k in ("OPENBLAS_CORETYPE", "NUMBA_CPU_NAME"))
    return (f"machine: {_cpu_model()}; {os.cpu_count()} CPUs; python {platform.python_version()}; "
            f"{_numpy_paths()}; {_blas()}; {_numba_target()}; {env}")


if __name__ == "__main__":
    print(describe())
