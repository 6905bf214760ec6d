// trainer/zero/optimizer_memory.h: the optimizer's own memory, by implementation (issue 41): the state it
// keeps for each tensor it is handed, and the temporaries its step allocates beside that state.
//
// Owns: the optimizer names a run may give (DeepSpeed's, the Hugging Face Trainer's `optim`, the libraries'
// class names), what each one is, and its bytes. Facts from the libraries' sources, not measurements
// (docs/zero-model.md has the table, file and function for each):
//  - DeepSpeed FusedAdam (ops/adam/fused_adam.py): exp_avg and exp_avg_sq, fp32 (the master's dtype), made
//    at the first step; the multi-tensor kernel updates in place: no temporaries. DeepSpeedCPUAdam
//    (ops/adam/cpu_adam.py): the same moments on the host (pageable), updated in place.
//  - torch.optim.AdamW (torch/optim/adam.py; AdamW is Adam with decoupled weight decay): exp_avg and
//    exp_avg_sq zeros_like the parameter (fp32 under DeepSpeed: its master partitions), and a step count.
//    foreach (_multi_tensor_adam, torch's default for CUDA tensors): torch._foreach_sqrt(exp_avg_sqs) makes a
//    copy of the second moment of every tensor of the call at once, divided and shifted in place, alive to
//    the update (4 bytes an element of the call). fused (_fused_adam, torch._fused_adamw_): in place, none.
//    for-loop (_single_tensor_adam, foreach=False): per tensor, (exp_avg_sq.sqrt() / bias_correction2_sqrt)
//    holds the square root and the quotient at once (8 bytes an element of the largest tensor).
//  - transformers' own AdamW (adamw_hf, transformers/optimization.py AdamW.step): per tensor
//    exp_avg_sq.sqrt().add_(eps): 4 bytes an element of the largest tensor.
//  - bitsandbytes' 8-bit Adam/AdamW (bitsandbytes/optim/optimizer.py Optimizer2State.init_state): a tensor
//    of 4096 elements or more keeps state1 and state2 as uint8 and, block-wise (the default), absmax1 and
//    absmax2 in fp32, one per block of 2048 elements; a smaller tensor keeps both states in fp32. The
//    8-bit blockwise kernel updates in place: no temporaries. Its kernels take device tensors only.
//  - transformers' Adafactor (adafactor; transformers/optimization.py Adafactor.step, scale_parameter and
//    relative_step off as the HF Trainer builds it, beta1 None): a tensor of one dimension (what DeepSpeed
//    hands it at every ZeRO stage: flat fp32 partitions) keeps exp_avg_sq whole (fp32); the step holds
//    update = grad**2 + eps and the next update (exp_avg_sq.rsqrt() * grad) at once: 8 bytes an element of
//    the largest tensor. A matrix would keep a row and a column factor instead: not modeled (shapes).
//  - torch.optim.SGD (torch/optim/sgd.py, foreach): a momentum_buffer (a clone of the first gradient) when
//    momentum is not 0, none without; with weight decay, torch._foreach_add(grads, params) makes a new
//    gradient list (4 bytes an element of the call).
// The tensors an optimizer is handed: DeepSpeed's flat fp32 partitions (stages 1-2: one a param group;
// stage 3: one a sub-group, stepped in turn; stage 0 in 16 bit: FP16_Optimizer's flat group), or the
// model's parameters themselves (stage 0 in fp32).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/train_config.h"
#include "zero/ds_memory.h"

namespace zt::trainer {

enum class OptimizerImpl : uint8_t {
  FusedAdam,         // DeepSpeed FusedAdam: the config's adam/adamw without offload_optimizer
  CpuAdam,           // DeepSpeedCPUAdam: adam/adamw under offload_optimizer
  TorchAdamWForeach, // torch.optim.AdamW, foreach (torch's default for CUDA tensors; HF adamw_torch)
  TorchAdamWFused,   // torch.optim.AdamW(fused=True) (HF adamw_torch_fused)
  TorchAdamWForLoop, // torch.optim.AdamW(foreach=False)
  HfAdamW,           // transformers.AdamW (HF adamw_hf)
  Bnb8bitAdam,       // bitsandbytes AdamW8bit / PagedAdamW8bit (HF adamw_bnb_8bit, adamw_8bit, paged_adamw_8bit)
  Adafactor,         // transformers.optimization.Adafactor (HF adafactor)
  Sgd,               // torch.optim.SGD (HF sgd; momentum 0 unless sgd_momentum or the DeepSpeed config's params say)
};

struct OptimizerSpec {
  std::string name;  // as the run gave it ("adamw_torch_fused"), or DeepSpeed's resolved name
  OptimizerImpl impl = OptimizerImpl::FusedAdam;
  bool momentum = false;  // SGD with a momentum buffer
  bool paged = false;     // bitsandbytes' paged state (CUDA managed memory, charged to the device)
  bool given = false;     // named by the run or its DeepSpeed config (false: the engine's default AdamW)
};

// A name the run gives (train.optimizer, --optimizer): DeepSpeed's (adam, adamw, FusedAdam,
// DeepSpeedCPUAdam), the HF Trainer's optim names (adamw_torch, adamw_torch_fused, adamw_hf, adamw_bnb_8bit,
// adamw_8bit, paged_adamw_8bit, adafactor, sgd), the library classes (AdamW8bit, PagedAdamW8bit) and ours
// for torch's modes (adamw_torch_foreach, adamw_torch_for_loop) and SGD with momentum (sgd_momentum).
// `offload`: DeepSpeed's adam/adamw is DeepSpeedCPUAdam under offload_optimizer. nullopt: not a name known.
std::optional<OptimizerSpec> parse_optimizer(const std::string& name, bool offload);
// The names parse_optimizer knows, for messages: "adam, adamw, ...".
std::string optimizer_names();
// The optimizer a run uses: cfg.optimizer when given; else the DeepSpeed config's (cfg.optimizer_name: adam,
// adamw); else the engine's AdamW, whose state is FusedAdam's
// (DeepSpeedCPUAdam's under offload_optimizer): what the memory model charged before the key existed.
// A DeepSpeed optimizer this model does not know (lamb, Adagrad, ...) keeps the default here; the DeepSpeed
// reader makes such a run's verdict INCONCLUSIVE.
OptimizerSpec optimizer_of(const TrainConfig& cfg);
// Whether the state is two fp32 moments a parameter (adam.m, adam.v): the engine's own AdamW, which a real
// run computes; the others are replayed for memory only (virtual mode).
bool adam_moments(OptimizerImpl impl);
// Where the library is, in words, for messages and the docs: "torch.optim.AdamW, foreach".
std::string optimizer_library(const OptimizerSpec& o);
// What is wrong with the optimizer against the run's settings, or "" (validate() asks it).
std::string optimizer_problem(const TrainConfig& cfg);

// The state the optimizer keeps for `numel` elements (a module's part of an fp32 master partition) of
// `module`, named for it: "adam.m[block0]", "bnb.state1[block0]", "adafactor.exp_avg_sq[block0]". `tensor`: the
// elements of the whole tensor the optimizer is handed that they lie in (DeepSpeed's flat partition at stages
// 0-2), which decides bitsandbytes' 8-bit or fp32 state (0: numel). The block scales are counted per module:
// at most one block a module more than the flat tensor's.
std::vector<MemoryTerm> optimizer_state_terms(const OptimizerSpec& o, const std::string& module, int64_t numel,
                                              int64_t tensor = 0);
int64_t optimizer_state_bytes(const OptimizerSpec& o, int64_t numel);
// The temporaries one step allocates beyond the state, all alive at its peak, over the tensors of one call
// (`tensors`: each one's numel, fp32), with the run's weight decay. Empty when the update is in place.
std::vector<MemoryTerm> optimizer_step_temporaries(const OptimizerSpec& o, const std::vector<int64_t>& tensors,
                                                   double weight_decay);
int64_t optimizer_step_temporary_bytes(const OptimizerSpec& o, const std::vector<int64_t>& tensors,
                                       double weight_decay);

}  // namespace zt::trainer
