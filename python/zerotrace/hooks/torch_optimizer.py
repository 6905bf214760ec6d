"""Steps of a plain PyTorch loop (no Trainer, no marks): each outermost call of an optimizer's
`step` (any torch.optim.Optimizer subclass, wrapped once per class when its first instance is made)
writes the range "zerotrace.torch::optimizer step", numbered in time order when the steps are derived.
One name for every step: the probe interns each new name with a few small allocations that live to the
end, and one a step (in the program's heap, between its blocks) grew a loop's RSS by about 47 KiB a step. A step called
from inside another optimizer's step (a wrapper such as accelerate's AcceleratedOptimizer) is the
same step. They are the last source of steps (db/include/zt/db/derive_steps.h): a Trainer's
callbacks, DeepSpeed's ranges and the zerotrace module's marks come first.
"""

import functools

from . import _imports
from .. import _probe
from ._wrap import wrap_init

DOMAIN = "zerotrace.torch"
NAME = "optimizer step"
_state = {"depth": 0}


def _wrap_step(optimizer):
    cls = type(optimizer)
    step = getattr(cls, "step", None)
    if step is None or getattr(step, "_zerotrace", False):
        return

    @functools.wraps(step)
    def wrapped(*args, **kwargs):
        if _state["depth"]:
            return step(*args, **kwargs)
        _state["depth"] += 1
        marker = _probe.range_start(NAME, DOMAIN)
        try:
            return step(*args, **kwargs)
        finally:
            _probe.range_end(marker)
            _state["depth"] -= 1

    wrapped._zerotrace = True
    cls.step = wrapped


def _patch(module):
    wrap_init(getattr(module, "Optimizer", None), "torch.optim optimizer steps", after=_wrap_step)


def install():
    _imports.when_imported("torch.optim.optimizer", _patch)
