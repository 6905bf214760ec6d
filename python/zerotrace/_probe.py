"""Where zerotrace's markers go: zt probe's library, else NVTX, else nowhere (see __init__).

Also the bootstrap hooks' way into the probe: an uncaught exception, the communicator's world
size. Every function returns at once, and never raises, where nothing records.
"""

import atexit
import sys
import time

DOMAIN = "zerotrace"

_backend = None  # "probe", "nvtx", "torch", "none"; None until the first call decides
_lib = None  # libzt_probe.so's entry points (ctypes), under zt probe
_nvtx = None  # the nvtx package, or torch.cuda.nvtx
_seen = (0, 0)  # (id, CLOCK_MONOTONIC ns) of the last exception seen leaving a zerotrace range


def _find_probe():
    """libzt_probe.so's entry points when zt probe preloaded it into this process, else None."""
    try:
        import ctypes
    except Exception:  # a Python built without ctypes
        return None
    try:
        lib = ctypes.CDLL(None)
        start = lib.zt_probe_range_start
    except (OSError, AttributeError):
        return None
    start.restype = ctypes.c_int64
    start.argtypes = [ctypes.c_char_p]
    lib.zt_probe_range_end.restype = None
    lib.zt_probe_range_end.argtypes = [ctypes.c_int64]
    lib.zt_probe_set_world.restype = None
    lib.zt_probe_set_world.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.zt_probe_python_exception.restype = None
    lib.zt_probe_python_exception.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64]
    return lib


def _decide():
    """The backend; "none" stays undecided while torch may still be imported."""
    global _backend, _lib, _nvtx
    if _backend is None:
        _lib = _find_probe()
        if _lib is not None:
            _backend = "probe"
            return _backend
        try:
            import importlib.util

            if importlib.util.find_spec("nvtx") is not None:
                import nvtx

                _nvtx = nvtx
                _backend = "nvtx"
                return _backend
        except Exception:
            pass
        _backend = "none"
    if _backend == "none" and "torch" in sys.modules:
        try:
            tn = sys.modules["torch"].cuda.nvtx
            if hasattr(tn, "range_start") and hasattr(tn, "range_end"):
                _nvtx = tn
                _backend = "torch"
        except Exception:
            pass
    return _backend


def backend():
    return _decide()


def range_start(name, domain=DOMAIN):
    """Begins the range "domain::name"; returns its handle for range_end (None when unrecorded)."""
    b = _backend if _backend in ("probe", "nvtx", "torch") else _decide()
    try:
        if b == "probe":
            return _lib.zt_probe_range_start((domain + "::" + name).encode("utf-8", "replace")) or None
        if b == "nvtx":
            return _nvtx.start_range(message=name, domain=domain)
        if b == "torch":
            return _nvtx.range_start(domain + "::" + name)
    except Exception:
        pass
    return None


def range_end(handle):
    if handle is None:
        return
    try:
        if _backend == "probe":
            _lib.zt_probe_range_end(handle)
        elif _backend == "nvtx":
            _nvtx.end_range(handle)
        elif _backend == "torch":
            _nvtx.range_end(handle)
    except Exception:
        pass


def exception_seen(exc):
    """`exc` leaves a zerotrace range now; the first time is when it happened, as far as we know.

    Only the id and the time are kept: holding the exception would hold its frames (and what
    they hold) alive."""
    global _seen
    if _seen[0] != id(exc):
        _seen = (id(exc), time.monotonic_ns())  # CLOCK_MONOTONIC on Linux: the trace's clock


def python_exception(exc, type_name, text, report):
    """An uncaught exception, for the trace's error row (only under zt probe). Its time is when it
    left the innermost zerotrace range, else now (the program's end)."""
    if _decide() != "probe":
        return
    enc = lambda s: str(s).encode("utf-8", "replace")
    t = _seen[1] if _seen[0] == id(exc) else 0
    _lib.zt_probe_python_exception(enc(type_name), enc(text), enc(report), t)


def set_world(rank, world_size, local_rank=-1):
    """The program's communicator: this process is `rank` of `world_size` (only under zt probe)."""
    if _decide() != "probe":
        return
    _lib.zt_probe_set_world(int(rank), int(world_size), int(local_rank))


def at_exit(fn):
    atexit.register(fn)
