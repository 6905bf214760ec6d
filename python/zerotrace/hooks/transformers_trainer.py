"""Epochs and steps of an HF transformers.Trainer run: a TrainerCallback added to every Trainer
(subclasses too: SFTTrainer, Seq2SeqTrainer) writes the ranges "zerotrace.transformers::epoch N"
(on_epoch_begin .. on_epoch_end, N from state.epoch) and "zerotrace.transformers::step N"
(on_step_begin .. on_step_end, N = state.global_step: optimizer steps done before it).
"""

from . import _imports
from ._ranges import EpochsAndSteps
from ._wrap import wrap_init

DOMAIN = "zerotrace.transformers"


def _callback_class():
    from transformers.trainer_callback import TrainerCallback

    class ZerotraceCallback(TrainerCallback):
        """zt probe's: marks epochs and steps in the trace (changes nothing of the training)."""

        def __init__(self):
            self._ranges = EpochsAndSteps(DOMAIN)

        def on_epoch_begin(self, args, state, control, **kwargs):
            self._ranges.begin_epoch(int(round(state.epoch or 0)))

        def on_epoch_end(self, args, state, control, **kwargs):
            self._ranges.end_epoch()

        def on_step_begin(self, args, state, control, **kwargs):
            self._ranges.begin_step(int(state.global_step or 0))

        def on_step_end(self, args, state, control, **kwargs):
            self._ranges.end_step()

        def on_train_end(self, args, state, control, **kwargs):
            self._ranges.end_all()

    return ZerotraceCallback


def _patch(module):
    holder = {}

    def add_callback(trainer):
        if "cls" not in holder:
            holder["cls"] = _callback_class()  # the framework is whole by now
        trainer.add_callback(holder["cls"]())

    wrap_init(getattr(module, "Trainer", None), "transformers.Trainer callback", after=add_callback)


def install():
    _imports.when_imported("transformers.trainer", _patch)
