"""The rank and world size from the program's communicator: after torch.distributed.init_process_group
returns, this process is get_rank() of get_world_size() (LOCAL_RANK, where the launcher set it,
is its local rank). The probe's rank row takes them (a process no launcher variable named, a
torch.multiprocessing.spawn child, becomes that rank); without this hook it has the launcher's
variables (zt/probe: probe_main.cpp, docs/probe.md "Ranks"), and world size 1 without those.
"""

import functools
import os

from .. import _probe
from . import _imports, debug


def _patch(dist):
    original = getattr(dist, "init_process_group", None)
    if original is None or getattr(original, "_zerotrace", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        try:
            local = os.environ.get("LOCAL_RANK", "")
            _probe.set_world(dist.get_rank(), dist.get_world_size(), int(local) if local.isdigit() else -1)
        except Exception as err:
            debug("torch.distributed world size", err)
        return result

    init_process_group._zerotrace = True
    dist.init_process_group = init_process_group
    c10d = getattr(dist, "distributed_c10d", None)
    if c10d is not None and getattr(c10d, "init_process_group", None) is original:
        c10d.init_process_group = init_process_group


def install():
    _imports.when_imported("torch.distributed", _patch)
