"""Lazy imports: package namespaces whose public names are imported on first use (PEP 562), and modules
imported on first attribute use, so importing a package (or building the CLI) does not load every module
behind its names."""

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


class LazyModule:
    """The module `name`, imported on first attribute access (then every access reads that module)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)
