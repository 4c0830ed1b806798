"""Lazy package namespaces (PEP 562): a package's public names imported on first use, so importing the
package (or one light submodule of it) does not load every module behind its names."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, where: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """(__getattr__, __dir__) for `package`: name -> the submodule (relative to it) that defines it. A resolved
    name is stored in `namespace` (the package's globals), so later lookups are plain attribute reads."""

    def __getattr__(name: str):
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
