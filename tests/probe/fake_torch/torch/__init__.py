"""A stand-in for torch (tests/probe/torch_hook_test.cpp): just enough of torch.cuda for the
zerotrace hook (python/zerotrace/hooks/torch_memory.py) to run where there is no GPU and no
PyTorch: _lazy_init, is_initialized, memory._record_memory_history, memory._snapshot, the OOM
observer, and a toy caching allocator whose history has PyTorch's format."""
from . import _C, cuda  # noqa: F401
