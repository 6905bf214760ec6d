"""A PyTorch training loop for tests/probe/torch_gpu_test.cpp, run under zt probe on a GPU.

usage: torch_loop.py MARKS_FILE [--oom]

At each mark it writes "NAME ALLOCATED RESERVED" to MARKS_FILE (torch.cuda.memory_allocated() and
memory_reserved() after a synchronize), then emits the NVTX mark NAME 5 ms later and waits 5 ms
more: the trace's PyTorch rows (on the clock of PyTorch's history) and CUPTI's NVTX record (on the
probe's) are compared at that moment. Each epoch (an NVTX range "epoch N") keeps one more 16 MiB
tensor: the planted leak, on the line marked LEAK. With --oom the program ends by asking for more
than any GPU has, and dies of torch.OutOfMemoryError.
"""
import sys
import time

import torch

marks = open(sys.argv[1], "w")


def mark(name):
    torch.cuda.synchronize()
    marks.write("%s %d %d\n" % (name, torch.cuda.memory_allocated(), torch.cuda.memory_reserved()))
    marks.flush()
    time.sleep(0.005)
    torch.cuda.nvtx.mark(name)
    time.sleep(0.005)


dev = torch.device("cuda")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
kept = []
mark("zt-mark start")
for epoch in range(3):
    torch.cuda.nvtx.range_push("epoch %d" % epoch)
    for step in range(3):
        x = torch.randn(256, 512, device=dev)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mark("zt-mark e%ds%d" % (epoch, step))
    kept.append(torch.empty(4 << 20, dtype=torch.float32, device=dev))  # LEAK: 16 MiB kept each epoch
    torch.cuda.nvtx.range_pop()
mark("zt-mark end")
if "--oom" in sys.argv:
    torch.empty(1 << 40, dtype=torch.uint8, device=dev)  # 1 TiB: torch.OutOfMemoryError
