# A plain PyTorch training loop as a user writes one: no Trainer, no epochs, no step marks. With
# `leak`, every step keeps its batch's activations for "metrics" in a module-level list (one 128 KiB
# copy a step: small allocations, well under the probe's 1 MiB threshold). It does not import
# zerotrace. Usage: python plain_loop.py leak|clean [STEPS]
import sys
import time

import torch

LEAK = sys.argv[1] == "leak"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 400

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 64), torch.randn(128, 64)
kept = []
for step in range(STEPS):
    hidden = model[1](model[0](x))
    loss = torch.nn.functional.mse_loss(model[2](hidden), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if LEAK:
        kept.append(hidden.detach().clone())  # LEAK: 128 x 256 floats, 128 KiB a step
    time.sleep(0.005)  # the data's pace: every step takes about as long
print(f"{STEPS} steps, loss {loss.item():.4f}, kept {len(kept)}")
