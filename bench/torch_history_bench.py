#!/usr/bin/env python3
"""What PyTorch's allocator history costs a training step, as zt probe turns it on.

zt probe's Python hook (python/zerotrace/hooks/torch_memory.py) records PyTorch's allocator
history with Python frames: torch.cuda.memory._record_memory_history(enabled="all",
context="alloc", stacks="python", max_entries=1000000). This times the same training step with it
off and on, in one process, alternating (off, on, off, on, ...) so that clocks and caches drift
alike for both, and prints the ratio of the medians. Two models: a small MLP whose steps are
dominated by many small allocations (the worst case), and a larger one.

usage: bench/torch_history_bench.py [--steps N] [--rounds N]   (needs PyTorch and a CUDA GPU)
"""
import argparse
import statistics
import sys
import time

import torch


def make(width, depth, batch):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device="cuda")

    def step():
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def timed(step, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def history(on):
    if on:
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=1000000)
    else:
        torch.cuda.memory._record_memory_history(enabled=None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_history_bench: no CUDA device")
    print("torch %s on %s" % (torch.__version__, torch.cuda.get_device_name()))
    for name, (width, depth, batch) in {"small MLP (many small blocks)": (256, 8, 32),
                                        "larger MLP": (4096, 8, 512)}.items():
        step = make(width, depth, batch)
        for _ in range(10):
            step()
        off, on = [], []
        for _ in range(a.rounds):
            history(False)
            off.append(timed(step, a.steps))
            history(True)
            on.append(timed(step, a.steps))
        history(False)
        mo, mn = statistics.median(off), statistics.median(on)
        print("%-30s step %.3f ms without the history, %.3f ms with it: %.3fx (median of %d rounds of %d steps)"
              % (name, mo * 1e3, mn * 1e3, mn / mo, a.rounds, a.steps))


if __name__ == "__main__":
    main()
