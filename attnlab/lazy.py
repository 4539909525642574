"""A package's names loaded on first use (PEP 562), so that importing the package imports no torch: the
`attnlab` façade (`--help` stays fast) and `attnlab.nn` (the torch-free decoder needs its kernel build)."""
from __future__ import annotations

import importlib


def lazy_getattr(package: str, where: dict[str, str], namespace: dict):
    """The module-level `__getattr__` of `package`: a name of `where` (name -> relative module) is imported
    from its module and kept in `namespace` (later look-ups skip this); any other name is tried as a
    submodule (`attnlab.nn.quantized` without importing it first)."""
    def __getattr__(name: str):
        if name in where:
            value = getattr(importlib.import_module(where[name], package), name)
            namespace[name] = value
            return value
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{package}.{name}":
                raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
