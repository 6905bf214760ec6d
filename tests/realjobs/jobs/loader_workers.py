# A DataLoader with 2 worker processes (forked, the default on Linux) as a user writes one: the
# dataset decodes each sample in the worker. With `leak`, the dataset keeps every sample it made in
# a cache that only grows (128 KiB a sample, in each worker's own copy: small allocations). The main
# loop trains a small model; no Trainer, no epochs. It does not import zerotrace.
# Usage: python loader_workers.py leak|clean [SAMPLES]
import sys
import time

import numpy as np
import torch

LEAK = sys.argv[1] == "leak"
SAMPLES = int(sys.argv[2]) if len(sys.argv) > 2 else 480


class Decoded(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n
        self.cache = {}

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        sample = np.random.default_rng(i).standard_normal(8192).astype(np.float32)  # 32 KiB
        if LEAK:
            self.cache[i] = np.concatenate([sample] * 4)  # LEAK: 128 KiB a sample, never read again
        return torch.from_numpy(sample[:64])


torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = torch.utils.data.DataLoader(Decoded(SAMPLES), batch_size=1, num_workers=2)
for step, x in enumerate(loader):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.005)
print(f"{step + 1} steps, loss {loss.item():.4f}")
