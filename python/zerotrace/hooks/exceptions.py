"""An uncaught exception ends the run with an `error` row: its type, its text and its Python
traceback (the probe reads PyTorch's texts as zt's reproductions write them: device_mismatch with
the devices named, oom with PyTorch's figures; probe/include/zt/probe/python_error.h).

Nothing of the program's changes: no sys.excepthook of ours. Python keeps the exception it
printed for an uncaught exception in sys.last_value (3.12: sys.last_exc); an atexit handler
reports it. The probe writes the row only where the process then exits with a code other than
0 (a tool that stored a handled exception there, as an interactive console does, leaves none).
"""

import atexit
import sys

from .. import _probe


def _type_name(t):
    module = getattr(t, "__module__", "builtins")
    name = getattr(t, "__qualname__", getattr(t, "__name__", "Exception"))
    return name if module in ("builtins", "__main__") else module + "." + name


def _report():
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if exc is None or not isinstance(exc, BaseException) or isinstance(exc, SystemExit):
        return
    try:
        import traceback

        report = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            text = str(exc)
        except Exception:
            text = "<exception str() failed>"
        _probe.python_exception(exc, _type_name(type(exc)), text, report)
    except Exception:
        pass


def install():
    atexit.register(_report)
