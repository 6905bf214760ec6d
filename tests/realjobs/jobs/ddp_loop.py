# A DistributedDataParallel job as a user writes one, for torchrun (gloo, CPU): every rank trains
# the same small model on its own data, no Trainer, no epochs. With `leak`, rank 1 alone keeps each
# step's outputs in a module-level list (128 KiB a step: small allocations). It does not import
# zerotrace. Usage: torchrun --nproc_per_node 2 ddp_loop.py leak|clean [STEPS]
import os
import sys
import time

import torch
import torch.distributed as dist

LEAK = sys.argv[1] == "leak"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 300

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 64), torch.randn(128, 64)
kept = []
for step in range(STEPS):
    out = model(x)
    loss = torch.nn.functional.mse_loss(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if LEAK and rank == 1:
        kept.append(out.detach().repeat(1, 4))  # LEAK: 128 x 256 floats, 128 KiB a step, on rank 1
    time.sleep(0.005)
dist.barrier()
print(f"rank {rank} of {dist.get_world_size()} (pid {os.getpid()}): {STEPS} steps, loss {loss.item():.4f}, "
      f"kept {len(kept)}")
dist.destroy_process_group()
