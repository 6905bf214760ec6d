# A plain PyTorch loop that keeps in-memory checkpoints, as in the "Saving and Loading Models" tutorial's
# state_dict save, into io.BytesIO "to roll back to the best one": a snapshot every 2 steps (257 KiB each:
# small allocations, and a BytesIO grows by reallocating). With `leak` every snapshot is kept; clean keeps
# only the best. No Trainer, no epochs, no marks. It does not import zerotrace.
# Usage: python memory_snapshots.py leak|clean [STEPS]
import io
import sys
import time

import torch

LEAK = sys.argv[1] == "leak"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 300


def snapshot(model):
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)  # LEAK: with `leak`, every one is kept (257 KiB)
    return buf


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(256, 64), torch.randn(256, 64)
snapshots, best, best_loss = [], None, float("inf")
for step in range(STEPS):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    if step % 2 == 0:
        buf = snapshot(model)
        if LEAK:
            snapshots.append(buf)
        elif loss.item() < best_loss:
            best, best_loss = buf, loss.item()
    time.sleep(0.003)
print(f"{STEPS} steps, loss {loss.item():.4f}, {len(snapshots)} snapshots kept")
