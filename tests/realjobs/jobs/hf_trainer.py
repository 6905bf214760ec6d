# An HF Trainer job as a user writes one: a tiny GPT-2 built from its config (no download), trained
# on CPU for a few epochs of a few steps. With `leak`, compute_loss keeps 0.5 MiB a step in a
# module-level list of small numpy arrays (8 x 64 KiB: each well under the probe's 1 MiB threshold).
# It does not import zerotrace. Usage: python hf_trainer.py leak|clean OUTPUT_DIR [EPOCHS] [STEPS]
import sys

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

LEAK = sys.argv[1] == "leak"
OUT = sys.argv[2]
EPOCHS = int(sys.argv[3]) if len(sys.argv) > 3 else 4
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 16
BATCH, SEQ = 4, 32

history = []  # "for debugging": every step's per-token losses, kept forever


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 256, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LeakyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False):
        loss = super().compute_loss(model, inputs, return_outputs)
        if LEAK:
            for _ in range(8):
                history.append(np.ones(8192))  # LEAK: 64 KiB, 8 a step
        return loss


torch.manual_seed(0)
config = GPT2Config(vocab_size=256, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)
args = TrainingArguments(output_dir=OUT, num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH,
                         learning_rate=1e-3, save_strategy="no", logging_strategy="no", report_to=[],
                         use_cpu=True, dataloader_num_workers=0, disable_tqdm=True, seed=0)
trainer = LeakyTrainer(model=model, args=args, train_dataset=Tokens(BATCH * STEPS))
result = trainer.train()
print(f"trained {result.global_step} steps, loss {result.training_loss:.3f}, kept {len(history)} arrays")
