"""Wrapping a framework class's __init__ once, without changing what it does."""

import functools

from . import debug


def wrap_init(cls, what, before=None, after=None):
    """cls.__init__ calls before(kwargs) first and after(self) last; each may fail (said with
    ZT_PROBE_PYTHON_DEBUG) without stopping the program. A class wrapped before is left alone."""
    if cls is None or getattr(cls.__init__, "_zerotrace", False):
        return
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if before is not None:
            try:
                before(kwargs)
            except Exception as err:
                debug(what, err)
        original(self, *args, **kwargs)
        if after is not None:
            try:
                after(self)
            except Exception as err:
                debug(what, err)

    __init__._zerotrace = True
    cls.__init__ = __init__
