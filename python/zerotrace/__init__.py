"""zerotrace: mark the epochs, steps and phases of a training loop for zerotrace.

    import zerotrace

    for e in range(epochs):
        with zerotrace.epoch(e):
            for s, batch in enumerate(loader):
                with zerotrace.step(e * len(loader) + s):
                    loss = model(batch)
                    with zerotrace.phase("backward"):
                        loss.backward()
                    optimizer.step()

`zerotrace.step(n)` also works as a plain call: the step then lasts until the next
`zerotrace.step(...)`, the end of its epoch, or the program's end (`zerotrace.epoch(n)`
likewise).

Where the markers go, decided at the first call:
  1. under `zt probe`: straight into the probe (libzt_probe.so, found with ctypes): no CUDA
     needed, so a CPU-only program has steps and epochs too;
  2. else, where NVTX is present (the `nvtx` package, or PyTorch's torch.cuda.nvtx once torch
     is imported): NVTX ranges in the domain "zerotrace" (with torch.cuda.nvtx, which has no
     domains, the range is named "zerotrace::step 3"), which Nsight Systems shows and zt probe
     on a GPU records;
  3. else nothing: each call returns at once.

In the trace these are ranges named "zerotrace::epoch N", "zerotrace::step N" and
"zerotrace::NAME"; `zt probe` turns them into epoch, step and phase markers when the program
has ended (db/SCHEMA.md, "Steps of probed programs"): `zt db info` counts them, `zt check
--leaks` compares epochs, the viewer navigates by them. A program that says its steps
otherwise (`zt probe --step-range`, NVTX ranges "step N", DeepSpeed's own ranges, the HF
Trainer's or Lightning's callbacks) has those first; see probe/README.md.

Standard library only; Python 3.8 and later. Outside `zt probe`, put the directory holding
this package on PYTHONPATH (`zt probe --python-path` prints it).
"""

import sys

from . import _probe

__all__ = ["epoch", "step", "phase", "recording"]

_open = {}  # "epoch" / "step": the range a plain call left open


class _Range:
    """A range begun at construction; `with` ends it at the block's end."""

    __slots__ = ("_id", "_kind")

    def __init__(self, name, kind=None):
        self._kind = kind
        if kind is not None:
            # A plain call's step ends where the next one begins; an epoch ends its last step.
            if kind == "epoch":
                _end_open("step")
            _end_open(kind)
        self._id = _probe.range_start(name)
        if kind is not None:
            _open[kind] = self

    def end(self):
        """Ends the range (once; later calls do nothing)."""
        if self._id is not None:
            _probe.range_end(self._id)
            self._id = None
        if self._kind is not None and _open.get(self._kind) is self:
            del _open[self._kind]
            if self._kind == "epoch":
                _end_open("step")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None:
            _probe.exception_seen(exc)  # when it left this range: the error's time, if uncaught
        self.end()
        return False


def _end_open(kind):
    r = _open.pop(kind, None)
    if r is not None:
        r.end()


def epoch(n):
    """Epoch `n` (an int) begins: `with zerotrace.epoch(n): ...`, or a plain call."""
    return _Range("epoch %d" % n, "epoch")


def step(n):
    """Step `n` (an int; count optimizer steps from 0) begins: `with zerotrace.step(n): ...`, or a
    plain call that lasts until the next step."""
    return _Range("step %d" % n, "step")


def phase(name):
    """A named part of a step ("forward", "backward", "optimizer"): `with zerotrace.phase(...)`."""
    return _Range(str(name))


def recording():
    """True when the markers go straight into zt probe's trace."""
    return _probe.backend() == "probe"


def _end_all():
    # A run that ends with an uncaught exception died inside its open step and epoch: they stay
    # open (never ended), as a killed run's would.
    if getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None:
        return
    _end_open("step")
    _end_open("epoch")


_probe.at_exit(_end_all)
