"""torch._C's out-of-memory observers (torch._C._cuda_attach_out_of_memory_observer)."""
observers = []


def _cuda_attach_out_of_memory_observer(fn):
    observers.append(fn)
