"""Post-import hooks: run a function on a module right after the program imports it.

when_imported(name, fn) calls fn(module) once `name` has been imported and executed (at once
when it already is). A finder first on sys.meta_path answers only for the names asked for: it
finds the module's spec through the other finders and wraps its loader, whose exec_module runs
the module as usual (the module sees its own loader) and then the hooks. Every other import
goes past it untouched.
"""

import importlib.util
import sys

from . import debug

_hooks = {}  # module name -> [fn]
_busy = set()  # names being looked up by the finder itself


def _run(name, module):
    for fn in _hooks.pop(name, []):
        try:
            fn(module)
        except Exception as err:
            debug("after importing " + name, err)


class _Loader:
    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name not in _hooks or name in _busy:
            return None
        _busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            return None
        finally:
            _busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # the ordinary finders answer as they would have
        spec.loader = _Loader(spec.loader, name)
        return spec

    def invalidate_caches(self):
        pass


_finder = _Finder()


def when_imported(name, fn):
    module = sys.modules.get(name)
    if module is not None:
        try:
            fn(module)
        except Exception as err:
            debug("hooking " + name, err)
        return
    _hooks.setdefault(name, []).append(fn)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
