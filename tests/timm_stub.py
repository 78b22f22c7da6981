"""Import timm's model code without torchvision, which has no CPU build on PyPI.

timm's model modules touch torchvision only for data transforms and a frozen BatchNorm; while one is
imported, every `torchvision...` module is a stub.  Afterwards sys.modules is restored (a stub left
behind breaks transformers); the imported classes keep working.  Where timm is not installed, or its
import fails even so, the calling test is skipped.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import types

import pytest


class _Anything(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return name


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return sys.modules.get(f"{self.__name__}.{name}") or _Anything(
            name, (), {"__init__": lambda self, *a, **k: None}
        )


class _StubFinder:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def import_timm(module_name: str) -> types.ModuleType:
    """`importlib.import_module(module_name)` with torchvision stubbed; skips the test when it fails."""
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed (the test command installs it with --no-deps)")
    if importlib.util.find_spec("torchvision") is not None:  # a real torchvision: plain import
        return importlib.import_module(module_name)
    before = set(sys.modules)
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        return importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - any failure of the stubbed import is a skip, not an error
        pytest.skip(f"timm not importable with a stubbed torchvision: {err!r}")
    finally:
        sys.meta_path.remove(finder)
        for name in set(sys.modules) - before:
            if name.split(".")[0] in ("torchvision", "timm"):
                del sys.modules[name]
