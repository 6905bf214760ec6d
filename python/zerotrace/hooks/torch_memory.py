"""PyTorch's caching allocator in the trace: tensors, not only the segments CUDA sees.

CUPTI sees a cudaMalloc when PyTorch's caching allocator grows its pool, never the tensors carved
out of it. When a probed program initializes CUDA through torch (torch.cuda's lazy
initialization, which every first CUDA tensor runs), this hook turns on PyTorch's own allocator
history (torch.cuda.memory._record_memory_history: each block's alloc and free, its stream and
Python frames), and pickles torch.cuda.memory._snapshot() beside the trace when the program ends
(and at its first out-of-memory error, from torch's OOM observer, so a process killed later still
leaves what was alive then), with zerotrace's clock pair (time.time_ns() and time.monotonic_ns(),
read together: the snapshot's time_us are Unix microseconds, the trace's clock is
CLOCK_MONOTONIC). zt probe then adds it to the process's trace as block rows inside the segments
that hold them (zt/db/torch_snapshot.h) and removes the file.

The file: "<trace without .db>.torch.pid<PID>.pickle" (zt/probe/probe_config.h:
torch_history_path). ZT_PROBE_TORCH=0 leaves the history off; ZT_PROBE_TORCH_ENTRIES bounds it
(default 1000000 entries; older ones are dropped, and zt rebuilds what was alive before).
The history costs PyTorch about 2 us per allocation with Python frames (torch/cuda/memory.py).
Nothing happens in a program that never uses CUDA, or outside zt probe.
"""

import atexit
import os
import pickle
import sys
import time

from . import _imports, debug

_state = {"on": False, "oom_dumped": False}


def install():
    if os.environ.get("ZT_PROBE_TORCH", "1") == "0" or not os.environ.get("ZT_PROBE_OUTPUT"):
        return
    _imports.when_imported("torch.cuda", _patch)


def history_path():
    out = os.environ["ZT_PROBE_OUTPUT"]
    stem = out[:-3] if len(out) > 3 and out.endswith(".db") else out
    return "%s.torch.pid%d.pickle" % (stem, os.getpid())


def _patch(cuda):
    original = getattr(cuda, "_lazy_init", None)
    if original is None or getattr(original, "_zerotrace", False):
        return

    def _lazy_init(*args, **kwargs):
        result = original(*args, **kwargs)
        # Not while the initialization is still under way: torch runs its queued calls (a
        # manual_seed before the first CUDA tensor, ...) inside it, and they call _lazy_init again,
        # which returns at once, before CUDA is up.
        if not _state["on"] and cuda.is_initialized():
            _start(cuda)
        return result

    _lazy_init._zerotrace = True
    _lazy_init.__wrapped__ = original
    _lazy_init.__doc__ = original.__doc__
    # torch's C++ side looks `_lazy_init` up on the module at each first use of a device, and
    # torch.cuda's own functions through the module's globals: both find this one.
    cuda._lazy_init = _lazy_init


def _start(cuda):
    _state["on"] = True  # once, whatever happens below
    entries = os.environ.get("ZT_PROBE_TORCH_ENTRIES", "1000000")
    try:
        entries = max(1, int(entries))
    except ValueError:
        entries = 1000000
    try:
        try:
            cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=entries)
        except TypeError:  # PyTorch before 2.1: the first form of the call
            cuda.memory._record_memory_history(True, trace_alloc_max_entries=entries, trace_alloc_record_context=True)
    except Exception as err:  # e.g. PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, which has no history
        debug("PyTorch's allocator history", err)
        return
    atexit.register(_dump, "exit")
    try:
        sys.modules["torch"]._C._cuda_attach_out_of_memory_observer(_on_oom)
    except Exception as err:
        debug("PyTorch's out-of-memory observer", err)


def _on_oom(device, alloc, device_allocated, device_free):
    # Called by the allocator before it raises torch.OutOfMemoryError, outside its lock.
    if not _state["oom_dumped"]:
        _state["oom_dumped"] = True
        _dump("oom")


def _dump(reason):
    try:
        torch = sys.modules.get("torch")
        if torch is None:
            return
        snapshot = torch.cuda.memory._snapshot()
        snapshot["zerotrace"] = {
            "unix_ns": time.time_ns(),
            "monotonic_ns": time.monotonic_ns(),
            "run_id": os.environ.get("ZT_PROBE_RUN_ID", ""),
            "pid": os.getpid(),
            "reason": reason,
        }
        path = history_path()
        tmp = path + ".writing"
        with open(tmp, "wb") as f:
            pickle.dump(snapshot, f, protocol=4)
        os.replace(tmp, path)
    except Exception as err:
        debug("PyTorch's memory snapshot", err)
