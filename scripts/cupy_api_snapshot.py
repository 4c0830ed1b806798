"""Write tests/data/cupy_api.json: the names cupy really has, for the CPU stand-in of a GPU.

The CUDA code path is tested on machines without a GPU through tests/fake_cupy.py, a numpy-backed
module that exposes only what cupy exposes. This script records cupy's public names (module
functions and dtypes, ndarray attributes, cupyx.scipy.special functions) from an installed cupy;
importing cupy needs no GPU. Rerun it when moving to a new cupy release:

    pip install cupy-cuda12x && python scripts/cupy_api_snapshot.py
"""

from __future__ import annotations

import inspect
import json
import pathlib

import cupy
import cupyx.scipy.special


def public(obj) -> list[str]:
    return sorted(n for n in dir(obj) if not n.startswith("_"))


def signatures(obj) -> dict[str, dict]:
    """name -> {"params": keyword-passable parameter names, "varkw": takes **kwargs} where Python can tell."""
    out = {}
    for name in public(obj):
        fn = getattr(obj, name)
        if not callable(fn) or isinstance(fn, type):
            continue
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # Cython functions and ufuncs carry no signature
            continue
        ps = sig.parameters.values()
        out[name] = {"params": [p.name for p in ps if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)],
                     "varkw": any(p.kind is p.VAR_KEYWORD for p in ps)}
    return out


def main() -> None:
    out = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "cupy_api.json"
    data = {
        "cupy_version": cupy.__version__,
        "module": public(cupy),
        "ndarray": sorted(set(public(cupy.ndarray)) | {"__getitem__", "__setitem__", "__len__"}),
        "special": public(cupyx.scipy.special),
        "signatures": signatures(cupy),
    }
    out.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")
    print(f"wrote {out} (cupy {cupy.__version__}: {len(data['module'])} names)")


if __name__ == "__main__":
    main()
