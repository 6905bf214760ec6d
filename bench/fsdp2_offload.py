#!/usr/bin/env python3
"""bench/fsdp2_offload.py: the baseline of bench/gpu_compare: PyTorch FSDP2 (fully_shard) with
CPUOffloadPolicy(pin_memory=True) and MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)
training GPT-2 of the same shape as zerotrace's presets, on one GPU, world size 1.

The model mirrors trainer/model/config.cpp (presets) and trainer/model/gpt2.h (the math): token and
position embeddings, pre-LayerNorm blocks with causal self-attention (F.scaled_dot_product_attention)
and a tanh-GELU MLP (4C), a final LayerNorm, an LM head tied to the token embedding, vocab 50257 (not
padded), context 1024, biases everywhere, mean cross-entropy over B*T. Its parameter count is checked
against model::num_params' formula. Initialization as model::init_params: N(0, 0.02), the two
residual projections N(0, 0.02/sqrt(2L)), biases 0, LayerNorm 1/0.

Optimizer: torch.optim.AdamW with zt train's defaults (lr 3e-3, betas (0.9, 0.95), eps 1e-8, weight
decay 0), on the CPU where CPUOffloadPolicy keeps the fp32 sharded parameters and gradients
(fused=True where this torch has the fused CPU kernel, else foreach; --adam-impl picks).

Each block is its own fully_shard unit (and, with --activation-checkpointing, wrapped in
torch.utils.checkpoint), then the root (embeddings, ln_f, the tied head). Synthetic token ids (a
seeded generator), copied from pinned host memory each micro-step as our trainer does.

Timing: --warmup steps untimed, then --steps timed steps, each between torch.cuda.synchronize()
calls: per-step seconds, tokens/s; a final line "FSDP2_RESULT {json}" and --json FILE with the same.
Exit 0 on success, 2 when torch or CUDA is missing (one line on stderr saying which), 1 when the
run fails (out of memory: the error's text).

Usage (the GPU machine): python3 bench/fsdp2_offload.py --model 124M --micro-batch 8 --seq-len 1024 \
    --grad-accum 1 --steps 10 --warmup 3 --json fsdp2-124M.json
"""
import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

# The presets of trainer/model/config.cpp: (vocab, context, layers, heads, width).
PRESETS = {
    "tiny": (256, 64, 2, 4, 64),
    "124M": (50257, 1024, 12, 12, 768),
    "350M": (50257, 1024, 24, 16, 1024),
    "774M": (50257, 1024, 36, 20, 1280),
    "1.5B": (50257, 1024, 48, 25, 1600),
}


def num_params(vocab, context, layers, heads, width):
    """model::num_params (trainer/model/config.cpp)."""
    C = width
    per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C)
    return vocab * C + context * C + layers * per_block + 2 * C


def flops_per_token(vocab, context, layers, heads, width, T):
    """model::flops (trainer/model/gpt2.cpp) for one token of forward+backward (3x forward)."""
    C = float(width)
    matmul = layers * 2.0 * 12.0 * C * C + 2.0 * C * vocab  # per token
    attention = layers * 2.0 * 2.0 * (T * (T + 1) / 2.0) * C / T  # per token, causal half
    return 3.0 * (matmul + attention)


def timed_steps(torch, one_step, warmup, steps, tokens_per_step):
    """`warmup` untimed then `steps` timed calls of one_step() (one optimizer step; returns its loss), each
    between torch.cuda.synchronize() calls, a line printed for each, the peak memory counted from the first:
    (seconds, losses) of the timed ones. Both baselines (this file's and deepspeed_offload.py's) time so."""
    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = one_step()
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        lv = float(loss)
        timed = i >= warmup
        if timed:
            times.append(dt)
            losses.append(lv)
        print("step %d/%d%s: %.1f ms, %.0f tok/s, loss %.4f"
              % (i + 1, warmup + steps, "" if timed else " (warm-up)", dt * 1e3, tokens_per_step / dt, lv), flush=True)
    return times, losses


def step_result(torch, cfg, T, tokens, times, losses, warmup):
    """The fields both baselines report of their timed steps: step seconds, tokens/s, model TFLOP/s, peak memory."""
    mean = statistics.mean(times)
    fpt = flops_per_token(*cfg, T)
    return dict(tokens_per_step=tokens, steps=len(times), warmup=warmup, step_seconds=times, step_seconds_mean=mean,
                step_seconds_median=statistics.median(times), step_seconds_min=min(times), tokens_per_s=tokens / mean,
                flops_per_token=fpt, model_tflop_per_s=fpt * tokens / mean / 1e12,
                peak_allocated_bytes=torch.cuda.max_memory_allocated(),
                peak_reserved_bytes=torch.cuda.max_memory_reserved(), first_loss=losses[0], last_loss=losses[-1])


def fail(code, msg):
    print("fsdp2_offload.py: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


def common_args(p, steps, warmup, clip_help):
    """The arguments both baselines take (this one and deepspeed_offload.py), with their defaults."""
    p.add_argument("--model", default="124M", choices=list(PRESETS))
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per micro-step (B)")
    p.add_argument("--seq-len", type=int, default=0, help="tokens per sequence (T; default: the model's context)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--steps", type=int, default=steps, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=warmup, help="untimed optimizer steps first")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--grad-clip", type=float, default=0.0, help=clip_help)
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute each block in backward")


def checked_args(p, argv):
    """Parses argv and checks the common arguments; --seq-len 0 becomes the model's context."""
    a = p.parse_args(argv)
    if a.seq_len == 0:
        a.seq_len = PRESETS[a.model][1]
    if a.seq_len > PRESETS[a.model][1] or a.seq_len < 1:
        p.error("--seq-len %d: must be 1..%d (the model's context)" % (a.seq_len, PRESETS[a.model][1]))
    for n in ("micro_batch", "grad_accum", "steps"):
        if getattr(a, n) < 1:
            p.error("--%s must be at least 1" % n.replace("_", "-"))
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    return a


def emit_result(tag, result, json_path):
    """The result line gpu_compare reads (TAG {json}), and the same JSON at json_path when given."""
    print(tag + " " + json.dumps(result), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            f.write(json.dumps(result, indent=2) + "\n")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(p, steps=10, warmup=3, clip_help="clip the global norm (0: off), as zt train")
    p.add_argument("--adam-impl", default="auto", choices=["auto", "fused", "foreach", "default"],
                   help="torch AdamW implementation on the CPU (auto: fused where supported, else foreach)")
    p.add_argument("--no-sync-accum", action="store_true",
                   help="skip the gradient reduce + offload on all but the last micro-step (set_requires_gradient_sync)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="", help="write the result here too")
    return checked_args(p, argv)


def import_torch():
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install
        fail(2, "torch is not importable (%s: %s); install PyTorch >= 2.4 with CUDA to run the FSDP2 baseline"
             % (type(e).__name__, e))
    if not torch.cuda.is_available():
        fail(2, "CUDA is not available to torch %s (torch.cuda.is_available() is False; built for CUDA %s): "
             "the FSDP2 baseline needs a GPU" % (torch.__version__, torch.version.cuda))
    try:  # torch >= 2.6 (public)
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
        where = "torch.distributed.fsdp"
    except ImportError:
        try:  # torch 2.4 / 2.5
            from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
            where = "torch.distributed._composable.fsdp"
        except ImportError as e:
            fail(2, "torch %s has no FSDP2 (fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy in "
                 "torch.distributed.fsdp or torch.distributed._composable.fsdp): %s; use torch >= 2.4"
                 % (torch.__version__, e))
    return torch, fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy, where


def build_model(torch, cfg, activation_checkpointing):
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    vocab, context, L, H, C = cfg

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, T, H, C // H).transpose(1, 2)
            k = k.view(B, T, H, C // H).transpose(1, 2)
            v = v.view(B, T, H, C // H).transpose(1, 2)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(C)
            self.mlp = MLP()

        def _forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

        def forward(self, x):
            if activation_checkpointing and self.training:
                return checkpoint(self._forward, x, use_reentrant=False)
            return self._forward(x)

    class GPT2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, C)
            self.wpe = nn.Embedding(context, C)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C)

        def forward(self, idx, targets):
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # the LM head, tied
            return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    model = GPT2()
    # model::init_params' distributions (not its exact values: a different generator).
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * L)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith("bias"):
                prm.zero_()
            elif "ln_" in name:  # LayerNorm weights (h.N.ln_1, h.N.ln_2, ln_f)
                prm.fill_(1.0)
            elif name.endswith("c_proj.weight"):
                prm.normal_(0.0, proj_std)
            else:
                prm.normal_(0.0, std)
    return model


def main(argv):
    a = parse_args(argv)
    torch, fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy, where = import_torch()
    import torch.distributed as dist

    cfg = PRESETS[a.model]
    vocab, context, L, H, C = cfg
    B, T, K = a.micro_batch, a.seq_len, a.grad_accum
    torch.manual_seed(a.seed)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(0)

    # World size 1, one process: a file rendezvous (no port), NCCL for CUDA tensors, gloo for CPU ones.
    rdv = tempfile.NamedTemporaryFile(prefix="fsdp2_rdv_", delete=False)
    rdv.close()
    os.unlink(rdv.name)  # init_process_group creates it
    try:
        dist.init_process_group(backend="cuda:nccl,cpu:gloo", init_method="file://" + rdv.name, rank=0, world_size=1)
    except Exception as e:
        fail(1, "init_process_group (cuda:nccl,cpu:gloo, file://%s): %s: %s" % (rdv.name, type(e).__name__, e))

    result = {"tool": "fsdp2_offload", "model": a.model, "device_name": name, "torch": torch.__version__,
              "cuda": torch.version.cuda, "fsdp2_module": where, "micro_batch": B, "seq_len": T, "grad_accum": K,
              "activation_checkpointing": a.activation_checkpointing, "precision": "bf16 params / fp32 reduce",
              "offload": "CPUOffloadPolicy(pin_memory=True)"}
    try:
        with torch.device(dev):
            model = build_model(torch, cfg, a.activation_checkpointing)
        n = sum(p.numel() for p in model.parameters())
        want = num_params(*cfg)
        if n != want:
            fail(1, "the model has %d parameters, model::num_params says %d: the shapes differ" % (n, want))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        off = CPUOffloadPolicy(pin_memory=True)
        for block in model.h:
            fully_shard(block, mp_policy=mp, offload_policy=off)
        fully_shard(model, mp_policy=mp, offload_policy=off)
        torch.cuda.synchronize()
        placed = {str(p.device) for p in model.parameters()}

        hp = dict(lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps, weight_decay=a.weight_decay)

        def make_opt(impl):
            if impl == "fused":
                return torch.optim.AdamW(model.parameters(), fused=True, **hp)
            return torch.optim.AdamW(model.parameters(), foreach=(impl == "foreach"), **hp)

        impl = "fused" if a.adam_impl in ("auto", "fused") else a.adam_impl
        try:
            opt = make_opt(impl)
        except Exception as e:  # no fused CPU AdamW in this torch
            if a.adam_impl == "fused":
                fail(1, "AdamW(fused=True) on the offloaded parameters: %s: %s" % (type(e).__name__, e))
            impl = "foreach"
            opt = make_opt(impl)
        result.update(params=n, parameters_on=sorted(placed), adam_impl=impl)
        print("fsdp2_offload: %s GPT-2 %s (%d params, layers=%d heads=%d width=%d vocab=%d), B=%d T=%d accum=%d, "
              "params on %s, AdamW %s, %s, torch %s (%s)"
              % (name, a.model, n, L, H, C, vocab, B, T, K, ",".join(sorted(placed)), impl,
                 "activation checkpointing" if a.activation_checkpointing else "no activation checkpointing",
                 torch.__version__, where), flush=True)

        g = torch.Generator().manual_seed(a.seed)
        host_x = torch.empty((B, T), dtype=torch.long).pin_memory()
        host_y = torch.empty((B, T), dtype=torch.long).pin_memory()
        can_nosync = hasattr(model, "set_requires_gradient_sync")

        def one_step():
            loss_sum = 0.0
            for micro in range(K):
                host_x.copy_(torch.randint(0, vocab, (B, T), generator=g))
                host_y.copy_(torch.randint(0, vocab, (B, T), generator=g))
                # Synchronous copies (as zt train's): host_x is rewritten at the next micro-step.
                x = host_x.to(dev)
                y = host_y.to(dev)
                if a.no_sync_accum and can_nosync:
                    model.set_requires_gradient_sync(micro == K - 1)
                loss = model(x, y) / K
                loss.backward()
                loss_sum += loss.detach()
            if a.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
            opt_step()
            opt.zero_grad(set_to_none=True)
            return loss_sum

        stepped = [False]

        def opt_step():
            # auto: the fused kernel may refuse the offloaded DTensor parameters only at the first step;
            # then foreach, from a fresh optimizer (no state exists yet).
            nonlocal opt, impl
            try:
                opt.step()
            except Exception as e:
                if stepped[0] or a.adam_impl != "auto" or impl != "fused":
                    raise
                print("fsdp2_offload: AdamW(fused=True) failed at its first step (%s: %s); using foreach"
                      % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""), flush=True)
                impl = "foreach"
                opt = make_opt(impl)
                result["adam_impl"] = impl
                opt.step()
            stepped[0] = True

        times, losses = timed_steps(torch, one_step, a.warmup, a.steps, B * T * K)
    except torch.cuda.OutOfMemoryError as e:
        fail(1, "CUDA out of memory: %s" % str(e).splitlines()[0])
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        if os.path.exists(rdv.name):
            os.unlink(rdv.name)

    tokens = B * T * K
    result.update(step_result(torch, cfg, T, tokens, times, losses, a.warmup))
    mean, med = result["step_seconds_mean"], result["step_seconds_median"]
    print("fsdp2_offload: %s %s: step %.1f ms (mean of %d; median %.1f), %.0f tok/s, %.1f model TFLOP/s, "
          "peak %.2f GiB allocated"
          % (name, a.model, mean * 1e3, len(times), med * 1e3, tokens / mean, result["model_tflop_per_s"],
             result["peak_allocated_bytes"] / 2**30), flush=True)
    emit_result("FSDP2_RESULT", result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
