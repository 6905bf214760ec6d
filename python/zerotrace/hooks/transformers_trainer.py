"""Epochs and steps of an HF transformers.Trainer run: a TrainerCallback added to every Trainer
(subclasses too: SFTTrainer, Seq2SeqTrainer) writes the ranges "zerotrace.transformers::epoch N"
(on_epoch_begin .. on_epoch_end, N from state.epoch) and "zerotrace.transformers::step N"
(on_step_begin .. on_step_end, N = state.global_step: optimizer steps done before it).
"""

import functools

from .. import _probe
from . import _imports, debug

DOMAIN = "zerotrace.transformers"


def _callback_class():
    from transformers.trainer_callback import TrainerCallback

    class ZerotraceCallback(TrainerCallback):
        """zt probe's: marks epochs and steps in the trace (changes nothing of the training)."""

        def __init__(self):
            self._epoch = None
            self._step = None

        def _end(self, attr):
            _probe.range_end(getattr(self, attr))
            setattr(self, attr, None)

        def on_epoch_begin(self, args, state, control, **kwargs):
            self._end("_step")
            self._end("_epoch")
            self._epoch = _probe.range_start("epoch %d" % int(round(state.epoch or 0)), DOMAIN)

        def on_epoch_end(self, args, state, control, **kwargs):
            self._end("_step")
            self._end("_epoch")

        def on_step_begin(self, args, state, control, **kwargs):
            self._end("_step")
            self._step = _probe.range_start("step %d" % int(state.global_step or 0), DOMAIN)

        def on_step_end(self, args, state, control, **kwargs):
            self._end("_step")

        def on_train_end(self, args, state, control, **kwargs):
            self._end("_step")
            self._end("_epoch")

    return ZerotraceCallback


def _patch(module):
    trainer = getattr(module, "Trainer", None)
    if trainer is None or getattr(trainer.__init__, "_zerotrace", False):
        return
    original = trainer.__init__
    holder = {}

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            if "cls" not in holder:
                holder["cls"] = _callback_class()  # the framework is whole by now
            self.add_callback(holder["cls"]())
        except Exception as err:
            debug("transformers.Trainer callback", err)

    __init__._zerotrace = True
    trainer.__init__ = __init__


def install():
    _imports.when_imported("transformers.trainer", _patch)
