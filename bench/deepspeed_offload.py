#!/usr/bin/env python3
"""bench/deepspeed_offload.py: the second baseline of bench/gpu_compare: DeepSpeed ZeRO-3 with the optimizer
offloaded to the CPU (DeepSpeedCPUAdam), training the GPT-2 of bench/fsdp2_offload.py (the same shapes,
initialization and synthetic tokens) on one GPU, world size 1.

Config: zero_optimization stage 3, offload_optimizer {device: cpu, pin_memory: true} (and, with
--offload-param, offload_param {device: cpu, pin_memory: true}), overlap_comm, contiguous_gradients, the
other ZeRO keys at DeepSpeed's defaults; bf16; optimizer AdamW (DeepSpeed builds DeepSpeedCPUAdam for it
under offload) with zt train's defaults (lr 3e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0);
gradient_clipping --grad-clip (0: off, as bench/gpu_compare's runs). One optimizer step is
engine(x, y) -> engine.backward(loss) -> engine.step() per micro-step (DeepSpeed steps the optimizer
at the accumulation boundary), each timed between torch.cuda.synchronize() calls.

Runs as its own process with world size 1: RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT are set
when missing (a free loopback port). DeepSpeed's CPU Adam op compiles at its first use (about half a
minute, ninja and the CUDA toolkit needed): the set-up time is printed apart from the steps.

Output: per-step lines, a final line "DEEPSPEED_RESULT {json}" (the same fields as fsdp2_offload.py's:
step_seconds_mean/median, tokens_per_s, peak_allocated_bytes, ...) and --json FILE with the same.
Exit 0 on success, 2 when torch, CUDA or deepspeed is missing (one line saying which), 1 when the run
fails.

Usage (the GPU machine): python3 bench/deepspeed_offload.py --model 350M --micro-batch 8 --steps 4 \
    --warmup 2 --json ds-350M.json
"""
import argparse
import json
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fsdp2_offload as base  # noqa: E402  (the model, presets and formulas: one definition)


def fail(code, msg):
    print("deepspeed_offload.py: " + msg, file=sys.stderr, flush=True)
    sys.exit(code)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    base.common_args(p, steps=4, warmup=2, clip_help="gradient_clipping (0: off)")
    p.add_argument("--offload-param", action="store_true", help="offload_param to the CPU as well")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", default="", help="write the result here too")
    return base.checked_args(p, argv)


def ds_config(a):
    zero = {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
            "contiguous_gradients": True}
    if a.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": a.grad_accum,
        "gradient_clipping": a.grad_clip,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": a.lr, "betas": [a.beta1, a.beta2], "eps": a.eps,
                                                  "weight_decay": a.weight_decay}},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    a = parse_args(argv)
    try:
        import torch
    except Exception as e:
        fail(2, "torch is not importable (%s: %s)" % (type(e).__name__, e))
    if not torch.cuda.is_available():
        fail(2, "CUDA is not available to torch %s: the DeepSpeed baseline needs a GPU" % torch.__version__)
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(k, v)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    t_setup = time.perf_counter()
    try:
        import deepspeed
    except Exception as e:
        fail(2, "deepspeed is not importable (%s: %s); install it (bench/README.md says how on the GPU machine)"
             % (type(e).__name__, e))

    cfg = base.PRESETS[a.model]
    vocab, context, L, H, C = cfg
    B, T, K = a.micro_batch, a.seq_len, a.grad_accum
    torch.manual_seed(a.seed)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(0)
    deepspeed.init_distributed(dist_backend="nccl")
    result = {"tool": "deepspeed_offload", "model": a.model, "device_name": name, "torch": torch.__version__,
              "deepspeed": deepspeed.__version__, "cuda": torch.version.cuda, "micro_batch": B, "seq_len": T,
              "grad_accum": K, "activation_checkpointing": a.activation_checkpointing,
              "precision": "bf16", "offload": "ZeRO-3 offload_optimizer cpu" + (" + offload_param cpu" if a.offload_param else ""),
              "config": ds_config(a)}
    try:
        model = base.build_model(torch, cfg, a.activation_checkpointing)
        n = sum(p.numel() for p in model.parameters())
        want = base.num_params(*cfg)
        if n != want:
            fail(1, "the model has %d parameters, model::num_params says %d: the shapes differ" % (n, want))
        engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(a))
        torch.cuda.synchronize()
        setup_s = time.perf_counter() - t_setup
        result.update(params=n, optimizer=type(opt.optimizer if hasattr(opt, "optimizer") else opt).__name__,
                      setup_seconds=setup_s)
        print("deepspeed_offload: %s GPT-2 %s (%d params), B=%d T=%d accum=%d, DeepSpeed %s, torch %s, %s; set-up %.1f s"
              % (name, a.model, n, B, T, K, deepspeed.__version__, torch.__version__,
                 "activation checkpointing" if a.activation_checkpointing else "no activation checkpointing", setup_s),
              flush=True)
        g = torch.Generator().manual_seed(a.seed)
        host_x = torch.empty((B, T), dtype=torch.long).pin_memory()
        host_y = torch.empty((B, T), dtype=torch.long).pin_memory()

        def one_step():
            loss_sum = 0.0
            for _ in range(K):
                host_x.copy_(torch.randint(0, vocab, (B, T), generator=g))
                host_y.copy_(torch.randint(0, vocab, (B, T), generator=g))
                x = host_x.to(dev)
                y = host_y.to(dev)
                loss = engine(x, y)
                engine.backward(loss)
                engine.step()
                loss_sum += loss.detach().float() / K
            return loss_sum

        times, losses = base.timed_steps(torch, one_step, a.warmup, a.steps, B * T * K)
    except torch.cuda.OutOfMemoryError as e:
        fail(1, "CUDA out of memory: %s" % str(e).splitlines()[0])

    tokens = B * T * K
    result.update(base.step_result(torch, cfg, T, tokens, times, losses, a.warmup))
    mean, med = result["step_seconds_mean"], result["step_seconds_median"]
    print("deepspeed_offload: %s %s: step %.1f ms (mean of %d; median %.1f), %.0f tok/s, peak %.2f GiB allocated, "
          "%.2f GiB reserved"
          % (name, a.model, mean * 1e3, len(times), med * 1e3, tokens / mean, result["peak_allocated_bytes"] / 2**30,
             result["peak_reserved_bytes"] / 2**30), flush=True)
    base.emit_result("DEEPSPEED_RESULT", result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
