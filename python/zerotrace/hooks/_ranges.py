"""The epoch and step ranges a framework hook keeps open between its callbacks' begin and end."""

from .. import _probe


class EpochsAndSteps:
    """Ranges "DOMAIN::epoch N" and "DOMAIN::step N"; a new one ends what is still open of its
    kind (an epoch: its step too), and end_all() ends everything (the training's end)."""

    def __init__(self, domain):
        self._domain = domain
        self._epoch = None
        self._step = None

    def begin_epoch(self, n):
        self.end_epoch()
        self._epoch = _probe.range_start("epoch %d" % n, self._domain)

    def end_epoch(self):
        self.end_step()
        _probe.range_end(self._epoch)
        self._epoch = None

    def begin_step(self, n):
        self.end_step()
        self._step = _probe.range_start("step %d" % n, self._domain)

    def end_step(self):
        _probe.range_end(self._step)
        self._step = None

    def end_all(self):
        self.end_epoch()
