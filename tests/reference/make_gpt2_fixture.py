#!/usr/bin/python3
"""Writes tests/reference/gpt2_tiny.bin: the PyTorch ground truth for the GPT-2 CPU reference.

GPT-2 written in plain torch ops (no transformers), computed in float64 from float32 weights, so the
fixture is exact to ~1e-15 and what the C++ test measures is the fp32 error of our code alone.
The layout below must match trainer/model/layout.cpp (the C++ test checks num_params and shapes);
the format is documented in tests/reference/README.md.

Run with Debian's python3-torch (1.13): /usr/bin/python3 tests/reference/make_gpt2_fixture.py
"""
import math
import os
import struct
import sys

import torch

MAGIC = b"ZTGPT2FX"
VERSION = 1

# The fixture's shape: small enough for a ~140 KB file, with 2 layers and 2 heads so the residual
# stream between blocks and the head slicing are both exercised; T < context so part of wpe gets
# no gradient.
VOCAB, CONTEXT, LAYERS, HEADS, WIDTH = 64, 16, 2, 2, 24
B, T = 2, 8
SEED = 1234
# AdamW: one parameter group, weight decay on every tensor (torch.optim.AdamW's own semantics).
LR, BETA1, BETA2, EPS, WEIGHT_DECAY, ADAM_STEPS = 1e-2, 0.9, 0.95, 1e-8, 0.1, 5


def param_shapes():
    """Our flat layout, in order: (name, shape). Weights are [out, in]."""
    C = WIDTH
    shapes = [("wte", (VOCAB, C)), ("wpe", (CONTEXT, C))]
    for l in range(LAYERS):
        p = f"block{l}."
        shapes += [
            (p + "ln1.weight", (C,)), (p + "ln1.bias", (C,)),
            (p + "attn.qkv.weight", (3 * C, C)), (p + "attn.qkv.bias", (3 * C,)),
            (p + "attn.proj.weight", (C, C)), (p + "attn.proj.bias", (C,)),
            (p + "ln2.weight", (C,)), (p + "ln2.bias", (C,)),
            (p + "mlp.fc.weight", (4 * C, C)), (p + "mlp.fc.bias", (4 * C,)),
            (p + "mlp.proj.weight", (C, 4 * C)), (p + "mlp.proj.bias", (C,)),
        ]
    shapes += [("final_ln.weight", (C,)), ("final_ln.bias", (C,))]
    return shapes


def make_weights(gen):
    """GPT-2-like init in float32, with noise on biases and LayerNorm weights so that no gradient
    path is trivially zero or one."""
    weights = {}
    for name, shape in param_shapes():
        if name.endswith(".bias"):
            w = 0.05 * torch.randn(shape, generator=gen)
        elif "ln" in name:
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:
            std = 0.02 / math.sqrt(2 * LAYERS) if name.endswith("proj.weight") else 0.02
            # 5x GPT-2's std: at this tiny width the logits would otherwise be nearly uniform and
            # the loss nearly flat, which would test little.
            w = 5 * std * torch.randn(shape, generator=gen)
        weights[name] = w.to(torch.float32)
    return weights


def layernorm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gpt2(P, tokens, targets):
    C, H = WIDTH, HEADS
    hs = C // H
    Bn, Tn = tokens.shape
    x = P["wte"][tokens] + P["wpe"][:Tn]
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(LAYERS):
        p = f"block{l}."
        h = layernorm(x, P[p + "ln1.weight"], P[p + "ln1.bias"])
        qkv = h @ P[p + "attn.qkv.weight"].T + P[p + "attn.qkv.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(Bn, Tn, H, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ P[p + "attn.proj.weight"].T + P[p + "attn.proj.bias"]
        h = layernorm(x, P[p + "ln2.weight"], P[p + "ln2.bias"])
        h = gelu_tanh(h @ P[p + "mlp.fc.weight"].T + P[p + "mlp.fc.bias"])
        x = x + h @ P[p + "mlp.proj.weight"].T + P[p + "mlp.proj.bias"]
    x = layernorm(x, P["final_ln.weight"], P["final_ln.bias"])
    logits = x @ P["wte"].T  # the LM head is tied to the token embedding
    loss = torch.nn.functional.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
    return logits, loss


def flat(tensors):
    return torch.cat([tensors[name].reshape(-1) for name, _ in param_shapes()])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "gpt2_tiny.bin")
    torch.use_deterministic_algorithms(True)
    gen = torch.Generator().manual_seed(SEED)
    weights32 = make_weights(gen)
    tokens = torch.randint(0, VOCAB, (B, T), generator=gen, dtype=torch.int64)
    targets = torch.randint(0, VOCAB, (B, T), generator=gen, dtype=torch.int64)

    P = {n: w.to(torch.float64).requires_grad_(True) for n, w in weights32.items()}
    logits, loss = gpt2(P, tokens, targets)
    loss.backward()
    grads = flat({n: p.grad for n, p in P.items()})

    # AdamW from the same float32 weights; losses after each update.
    P2 = {n: w.to(torch.float64).requires_grad_(True) for n, w in weights32.items()}
    opt = torch.optim.AdamW([P2[n] for n, _ in param_shapes()], lr=LR, betas=(BETA1, BETA2),
                            eps=EPS, weight_decay=WEIGHT_DECAY)
    adam_losses = []
    for _ in range(ADAM_STEPS):
        opt.zero_grad()
        _, l = gpt2(P2, tokens, targets)
        l.backward()
        opt.step()
        with torch.no_grad():
            adam_losses.append(gpt2(P2, tokens, targets)[1].item())

    params = flat(weights32)
    n = params.numel()
    with open(out, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<I", VERSION))
        f.write(struct.pack("<5q", VOCAB, CONTEXT, LAYERS, HEADS, WIDTH))
        f.write(struct.pack("<2i", B, T))
        f.write(struct.pack("<q", n))
        f.write(struct.pack("<5d", LR, BETA1, BETA2, EPS, WEIGHT_DECAY))
        f.write(struct.pack("<i", ADAM_STEPS))
        f.write(struct.pack("<d", loss.item()))
        f.write(params.numpy().astype("<f4").tobytes())
        f.write(tokens.numpy().astype("<i4").tobytes())
        f.write(targets.numpy().astype("<i4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        f.write(grads.numpy().astype("<f4").tobytes())
        f.write(struct.pack(f"<{ADAM_STEPS}d", *adam_losses))
    print(f"wrote {out}: {os.path.getsize(out)} bytes, {n} parameters, loss {loss.item():.6f}, "
          f"AdamW losses {' '.join(f'{x:.6f}' for x in adam_losses)}")


if __name__ == "__main__":
    main()
