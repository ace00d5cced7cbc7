"""Lazy package faces (scientific Python's SPEC 1, as scikit-image and networkx do it).

``import datamask_dask.learn`` must load only the learner: a package's public names are
imported from their modules on first use, not when the package is imported.
"""

from __future__ import annotations

import importlib
import sys


def attach(package: str, exports: dict[str, list[str]]):
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package`` from ``{submodule: [names]}``."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        vars(sys.modules[package])[name] = value  # later look-ups skip this function
        return value

    def __dir__():
        return sorted(where)

    return __getattr__, __dir__, sorted(where)

