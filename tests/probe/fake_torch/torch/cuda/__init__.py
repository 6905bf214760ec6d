"""torch.cuda, as far as the zerotrace hook uses it, over a toy caching allocator: one 20 MiB
segment, blocks carved in order, each allocation and free recorded as PyTorch's history records
them (torch/cuda/memory.py), with the program's Python frames and time_us in Unix microseconds."""
import time
import traceback

from . import memory

_initialized = False
calls = []  # what the hook called, in order: "lazy_init", "record"
SEG = 0x7F0000000000
SEG_SIZE = 20 << 20
_next = SEG
_live = {}


_initializing = False


def _seed_all():
    _lazy_init()  # as torch's queued calls do, through the module's globals (the hook's wrapper)


_queued = [_seed_all]  # torch.manual_seed before the first CUDA tensor queues such a call


def _lazy_init():
    """As torch's: the queued calls run inside the initialization and call _lazy_init again,
    which returns at once while CUDA is not up yet."""
    global _initialized, _initializing
    if _initialized or _initializing:
        return
    calls.append("lazy_init")
    _initializing = True
    try:
        for fn in _queued:
            fn()
    finally:
        _initializing = False
    _initialized = True


def is_initialized():
    return _initialized


def _now():
    return time.time_ns() // 1000


def _frames():
    return [{"filename": f.filename, "line": f.lineno, "name": f.name}
            for f in reversed(traceback.extract_stack()[:-2])]


def _record(action, addr, size, frames):
    if memory._hist is not None:
        memory._hist.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": _now(),
                             "frames": frames})


def alloc(size):
    """A block of `size` bytes (rounded to 512, as PyTorch does); its address."""
    global _next
    _lazy_init()  # as torch does before a device's first allocation
    if memory._hist is None:
        raise RuntimeError("the allocator's history was not on before the first allocation")
    if not memory._hist:
        _record("segment_alloc", SEG, SEG_SIZE, _frames())
    size = (size + 511) // 512 * 512
    a = _next
    _next += size
    _live[a] = size
    _record("alloc", a, size, _frames())
    return a


def free(a):
    size = _live.pop(a)
    _record("free_requested", a, size, [])
    _record("free_completed", a, size, [])


def oom(size):
    """What PyTorch does when a request does not fit: the history's oom entry, the observers
    (before the lock is released), then the error."""
    if memory._hist is not None:
        memory._hist.append({"action": "oom", "size": size, "device_free": 0, "stream": 0, "time_us": _now(),
                             "frames": _frames()})
    from .. import _C
    for fn in _C.observers:
        fn(0, size, sum(_live.values()), 0)
    raise RuntimeError("CUDA out of memory. Tried to allocate %d bytes" % size)
