"""A program for tests/probe/torch_hook_test.cpp, over tests/probe/fake_torch (no GPU needed).

usage: torch_fake_prog.py [--oom-then-exit]
Three steps, each allocating a 1 MiB block it frees and a 3 MiB block it keeps (the line marked
KEEP). With --oom-then-exit it then catches an out-of-memory error and leaves by os._exit(3),
which runs no atexit handler: only the snapshot the OOM observer wrote reaches the trace.
"""
import os
import sys
import time

import torch

kept = []


def step():
    a = torch.cuda.alloc(1 << 20)
    kept.append(torch.cuda.alloc(3 << 20))  # KEEP
    time.sleep(0.01)
    torch.cuda.free(a)


for _ in range(3):
    step()
print("calls", torch.cuda.calls, "history", torch.cuda.memory.args)
sys.stdout.flush()
if "--oom-then-exit" in sys.argv:
    try:
        torch.cuda.oom(1 << 40)
    except RuntimeError as err:
        print("caught:", err)
        sys.stdout.flush()
    os._exit(3)
