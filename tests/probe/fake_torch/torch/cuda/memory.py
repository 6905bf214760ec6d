"""torch.cuda.memory's history switch and snapshot, over the toy allocator in cuda/__init__.py."""
_hist = None
args = None


def _record_memory_history(enabled=None, context=None, stacks=None, max_entries=None):
    global _hist, args
    from . import calls
    calls.append("record")
    args = (enabled, context, stacks, max_entries)
    _hist = []


def _snapshot():
    from . import SEG, SEG_SIZE, _live
    blocks, at = [], SEG
    for a in sorted(_live):
        if a > at:
            blocks.append({"address": at, "size": a - at, "requested_size": 0, "state": "inactive", "frames": []})
        blocks.append({"address": a, "size": _live[a], "requested_size": _live[a], "state": "active_allocated",
                       "frames": []})
        at = a + _live[a]
    blocks.append({"address": at, "size": SEG + SEG_SIZE - at, "requested_size": 0, "state": "inactive", "frames": []})
    segments = [{"device": 0, "address": SEG, "total_size": SEG_SIZE, "stream": 0, "segment_type": "large",
                 "blocks": blocks}] if _hist else []
    return {"segments": segments, "device_traces": [list(_hist or [])]}
