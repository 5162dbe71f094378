"""A post-import hook: run a function on a module right after its code ran, without importing
it ahead of time (vLLM's modules are hooked only in the processes that import them).
Imports nothing from connector_tax or vLLM.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from typing import Any


class PostImportLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: Callable[[Any], None]) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package, ...
        return getattr(self._loader, name)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the hooked module names it asks the other finders and wraps
    the loader so that the hook runs right after the module's code."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        hook = self.hooks.get(fullname)
        if hook is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = PostImportLoader(spec.loader, hook)
        return spec
