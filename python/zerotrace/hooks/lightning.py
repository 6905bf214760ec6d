"""Epochs and steps of a PyTorch Lightning run: a Callback added to every Trainer (both
`lightning.pytorch` and `pytorch_lightning`) writes "zerotrace.lightning::epoch N"
(on_train_epoch_start .. end, N = trainer.current_epoch) and "zerotrace.lightning::step N"
(on_train_batch_start .. end, N = trainer.global_step: optimizer steps done before it).
"""

import importlib

from . import _imports
from ._ranges import EpochsAndSteps
from ._wrap import wrap_init

DOMAIN = "zerotrace.lightning"


def _callback_class(package):
    base = importlib.import_module(package + ".callbacks").Callback

    class ZerotraceCallback(base):
        """zt probe's: marks epochs and steps in the trace (changes nothing of the training)."""

        def __init__(self):
            self._ranges = EpochsAndSteps(DOMAIN)

        def on_train_epoch_start(self, trainer, pl_module):
            self._ranges.begin_epoch(int(trainer.current_epoch))

        def on_train_epoch_end(self, trainer, pl_module):
            self._ranges.end_epoch()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._ranges.begin_step(int(trainer.global_step))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._ranges.end_step()

        def on_train_end(self, trainer, pl_module):
            self._ranges.end_all()

    return ZerotraceCallback


def _patcher(package):
    def patch(module):
        holder = {}

        def add_callback(kwargs):
            if "cls" not in holder:
                holder["cls"] = _callback_class(package)  # the framework is whole by now
            callbacks = kwargs.get("callbacks")
            if callbacks is None:
                callbacks = []
            elif not isinstance(callbacks, (list, tuple)):
                callbacks = [callbacks]
            kwargs["callbacks"] = list(callbacks) + [holder["cls"]()]

        wrap_init(getattr(module, "Trainer", None), "Lightning callback", before=add_callback)

    return patch


def install():
    for package in ("lightning.pytorch", "pytorch_lightning"):
        _imports.when_imported(package + ".trainer.trainer", _patcher(package))
