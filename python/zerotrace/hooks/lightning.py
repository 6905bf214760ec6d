"""Epochs and steps of a PyTorch Lightning run: a Callback added to every Trainer (both
`lightning.pytorch` and `pytorch_lightning`) writes "zerotrace.lightning::epoch N"
(on_train_epoch_start .. end, N = trainer.current_epoch) and "zerotrace.lightning::step N"
(on_train_batch_start .. end, N = trainer.global_step: optimizer steps done before it).
"""

import functools
import importlib

from .. import _probe
from . import _imports, debug

DOMAIN = "zerotrace.lightning"


def _callback_class(package):
    base = importlib.import_module(package + ".callbacks").Callback

    class ZerotraceCallback(base):
        """zt probe's: marks epochs and steps in the trace (changes nothing of the training)."""

        def __init__(self):
            self._epoch = None
            self._step = None

        def _end(self, attr):
            _probe.range_end(getattr(self, attr))
            setattr(self, attr, None)

        def on_train_epoch_start(self, trainer, pl_module):
            self._end("_step")
            self._end("_epoch")
            self._epoch = _probe.range_start("epoch %d" % int(trainer.current_epoch), DOMAIN)

        def on_train_epoch_end(self, trainer, pl_module):
            self._end("_step")
            self._end("_epoch")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._end("_step")
            self._step = _probe.range_start("step %d" % int(trainer.global_step), DOMAIN)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self._end("_step")

        def on_train_end(self, trainer, pl_module):
            self._end("_step")
            self._end("_epoch")

    return ZerotraceCallback


def _patcher(package):
    def patch(module):
        trainer = getattr(module, "Trainer", None)
        if trainer is None or getattr(trainer.__init__, "_zerotrace", False):
            return
        original = trainer.__init__
        holder = {}

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            try:
                if "cls" not in holder:
                    holder["cls"] = _callback_class(package)  # the framework is whole by now
                callbacks = kwargs.get("callbacks")
                if callbacks is None:
                    callbacks = []
                elif not isinstance(callbacks, (list, tuple)):
                    callbacks = [callbacks]
                kwargs["callbacks"] = list(callbacks) + [holder["cls"]()]
            except Exception as err:
                debug("Lightning callback", err)
            original(self, *args, **kwargs)

        __init__._zerotrace = True
        trainer.__init__ = __init__

    return patch


def install():
    for package in ("lightning.pytorch", "pytorch_lightning"):
        _imports.when_imported(package + ".trainer.trainer", _patcher(package))
