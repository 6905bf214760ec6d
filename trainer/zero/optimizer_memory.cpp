#include "zero/optimizer_memory.h"

#include <algorithm>
#include <numeric>

namespace zt::trainer {

namespace {

struct Name {
  const char* name;
  OptimizerImpl impl;
  bool momentum, paged;
};
// adam/adamw: DeepSpeed's config names (any case: DeepSpeed lower-cases its own); the rest as written.
// The impl of adam/adamw/FusedAdam is resolved against offload_optimizer below.
const Name kNames[] = {
    {"adam", OptimizerImpl::FusedAdam, false, false},
    {"adamw", OptimizerImpl::FusedAdam, false, false},
    {"FusedAdam", OptimizerImpl::FusedAdam, false, false},
    {"DeepSpeedCPUAdam", OptimizerImpl::CpuAdam, false, false},
    {"adamw_torch", OptimizerImpl::TorchAdamWForeach, false, false},
    {"adamw_torch_foreach", OptimizerImpl::TorchAdamWForeach, false, false},
    {"adamw_torch_fused", OptimizerImpl::TorchAdamWFused, false, false},
    {"adamw_torch_for_loop", OptimizerImpl::TorchAdamWForLoop, false, false},
    {"adamw_hf", OptimizerImpl::HfAdamW, false, false},
    {"adamw_bnb_8bit", OptimizerImpl::Bnb8bitAdam, false, false},
    {"adamw_8bit", OptimizerImpl::Bnb8bitAdam, false, false},
    {"AdamW8bit", OptimizerImpl::Bnb8bitAdam, false, false},
    {"paged_adamw_8bit", OptimizerImpl::Bnb8bitAdam, false, true},
    {"PagedAdamW8bit", OptimizerImpl::Bnb8bitAdam, false, true},
    {"adafactor", OptimizerImpl::Adafactor, false, false},
    {"sgd", OptimizerImpl::Sgd, false, false},
    {"sgd_momentum", OptimizerImpl::Sgd, true, false},
};

// bitsandbytes' Optimizer2State.init_state: 8-bit states from 4096 elements (min_8bit_size), absmax per
// block of 2048 elements (block_wise, the default).
constexpr int64_t kBnbMin8bit = 4096, kBnbBlock = 2048;

int64_t largest(const std::vector<int64_t>& t) { return t.empty() ? 0 : *std::max_element(t.begin(), t.end()); }
int64_t total(const std::vector<int64_t>& t) { return std::accumulate(t.begin(), t.end(), int64_t(0)); }

}  // namespace

std::optional<OptimizerSpec> parse_optimizer(const std::string& name, bool offload) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  for (const Name& n : kNames) {
    const bool ds_name = std::string(n.name) == "adam" || std::string(n.name) == "adamw";
    if (ds_name ? lower != n.name : name != n.name) continue;
    OptimizerSpec o;
    o.name = ds_name ? lower : name;
    o.impl = n.impl;
    o.momentum = n.momentum;
    o.paged = n.paged;
    o.given = true;
    // engine.py _configure_basic_optimizer: the config's adam/adamw is DeepSpeedCPUAdam under offload.
    if (ds_name && offload) o.impl = OptimizerImpl::CpuAdam;
    return o;
  }
  return std::nullopt;
}

std::string optimizer_names() {
  std::string s;
  for (const Name& n : kNames) s += (s.empty() ? "" : ", ") + std::string(n.name);
  return s;
}

OptimizerSpec optimizer_of(const TrainConfig& cfg) {
  const bool offload = cfg.zero.offload_optimizer;
  if (!cfg.optimizer.empty())
    if (auto o = parse_optimizer(cfg.optimizer, offload)) return *o;
  if (cfg.optimizer_name == "adam" || cfg.optimizer_name == "adamw")
    if (auto o = parse_optimizer(cfg.optimizer_name, offload)) return *o;
  OptimizerSpec o;
  o.name = offload ? "DeepSpeedCPUAdam" : "FusedAdam";
  o.impl = offload ? OptimizerImpl::CpuAdam : OptimizerImpl::FusedAdam;
  return o;
}

bool adam_moments(OptimizerImpl impl) {
  return impl == OptimizerImpl::FusedAdam || impl == OptimizerImpl::CpuAdam || impl == OptimizerImpl::TorchAdamWForeach ||
         impl == OptimizerImpl::TorchAdamWFused || impl == OptimizerImpl::TorchAdamWForLoop ||
         impl == OptimizerImpl::HfAdamW;
}

std::string optimizer_library(const OptimizerSpec& o) {
  switch (o.impl) {
    case OptimizerImpl::FusedAdam: return "DeepSpeed FusedAdam";
    case OptimizerImpl::CpuAdam: return "DeepSpeedCPUAdam";
    case OptimizerImpl::TorchAdamWForeach: return "torch.optim.AdamW, foreach";
    case OptimizerImpl::TorchAdamWFused: return "torch.optim.AdamW, fused";
    case OptimizerImpl::TorchAdamWForLoop: return "torch.optim.AdamW, for-loop";
    case OptimizerImpl::HfAdamW: return "transformers.AdamW";
    case OptimizerImpl::Bnb8bitAdam: return o.paged ? "bitsandbytes PagedAdamW8bit" : "bitsandbytes AdamW8bit";
    case OptimizerImpl::Adafactor: return "transformers Adafactor";
    case OptimizerImpl::Sgd: return o.momentum ? "torch.optim.SGD with momentum" : "torch.optim.SGD";
  }
  return "?";
}

std::string optimizer_problem(const TrainConfig& c) {
  if (!c.optimizer.empty() && !parse_optimizer(c.optimizer, c.zero.offload_optimizer))
    return "optimizer '" + c.optimizer + "' is not a name zerotrace knows (" + optimizer_names() + ")";
  const OptimizerSpec o = optimizer_of(c);
  const std::string who = "optimizer " + o.name + " (" + optimizer_library(o) + ")";
  if (o.impl == OptimizerImpl::CpuAdam && !c.zero.offload_optimizer)
    return who + " updates host tensors: it needs offload_optimizer (DeepSpeed builds it only there)";
  // (the config's adam/adamw is DeepSpeedCPUAdam under offload: anything else there is a client optimizer)
  if (o.impl != OptimizerImpl::CpuAdam && c.zero.offload_optimizer)
    return who + " with offload_optimizer: DeepSpeed refuses a client optimizer under ZeRO-Offload (\"Please either "
                 "use deepspeed.ops.adam.DeepSpeedCPUAdam or set an optimizer in your ds_config\") unless "
                 "zero_force_ds_cpu_optimizer is false, and zerotrace models only DeepSpeedCPUAdam's state on the host" +
           std::string(o.impl == OptimizerImpl::Bnb8bitAdam ? "; bitsandbytes' kernels take device tensors only" : "");
  if (adam_moments(o.impl)) return "";
  if (!c.virtual_mode)
    return who + " is replayed for memory in virtual mode only (--virtual): real compute trains AdamW, whose state "
                 "is two fp32 moments a parameter";
  if (o.impl == OptimizerImpl::Adafactor && c.zero.stage == 0)
    return who + " at ZeRO stage 0 keeps each matrix's second moment as a row and a column factor, by its shape; "
                 "zerotrace knows parameter sizes, not shapes: use stage 1-3, where DeepSpeed hands it flat "
                 "partitions (one dimension: the second moment kept whole)";
  if (c.save_every > 0 && !c.save_only_model)
    return who + ": a checkpoint of its state is not modeled (save_only_model, or AdamW)";
  return "";
}

std::vector<MemoryTerm> optimizer_state_terms(const OptimizerSpec& o, const std::string& m, int64_t n, int64_t tensor) {
  if (tensor <= 0) tensor = n;
  if (n <= 0) return {};
  auto at = [&](const char* what) { return std::string(what) + "[" + m + "]"; };
  switch (o.impl) {
    case OptimizerImpl::FusedAdam:
    case OptimizerImpl::CpuAdam:
    case OptimizerImpl::TorchAdamWForeach:
    case OptimizerImpl::TorchAdamWFused:
    case OptimizerImpl::TorchAdamWForLoop:
    case OptimizerImpl::HfAdamW:
      return {{at("adam.m"), DType::F32, n}, {at("adam.v"), DType::F32, n}};
    case OptimizerImpl::Bnb8bitAdam: {
      if (tensor < kBnbMin8bit) return {{at("bnb.state1"), DType::F32, n}, {at("bnb.state2"), DType::F32, n}};
      const int64_t blocks = (n + kBnbBlock - 1) / kBnbBlock;
      return {{at("bnb.state1"), DType::U8, n},
              {at("bnb.state2"), DType::U8, n},
              {at("bnb.absmax1"), DType::F32, blocks},
              {at("bnb.absmax2"), DType::F32, blocks}};
    }
    case OptimizerImpl::Adafactor: return {{at("adafactor.exp_avg_sq"), DType::F32, n}};
    case OptimizerImpl::Sgd:
      if (o.momentum) return {{at("sgd.momentum_buffer"), DType::F32, n}};
      return {};
  }
  return {};
}

int64_t optimizer_state_bytes(const OptimizerSpec& o, int64_t numel) {
  int64_t b = 0;
  for (const MemoryTerm& t : optimizer_state_terms(o, "x", numel)) b += t.bytes();
  return b;
}

std::vector<MemoryTerm> optimizer_step_temporaries(const OptimizerSpec& o, const std::vector<int64_t>& tensors,
                                                   double weight_decay) {
  const int64_t L = largest(tensors), all = total(tensors);
  if (all <= 0) return {};
  switch (o.impl) {
    case OptimizerImpl::FusedAdam:
    case OptimizerImpl::CpuAdam:
    case OptimizerImpl::TorchAdamWFused:
    case OptimizerImpl::Bnb8bitAdam:
      return {};
    case OptimizerImpl::TorchAdamWForeach:  // _multi_tensor_adam: torch._foreach_sqrt(device_exp_avg_sqs)
      return {{"adamw.exp_avg_sq_sqrt", DType::F32, all}};
    case OptimizerImpl::TorchAdamWForLoop:  // _single_tensor_adam: (exp_avg_sq.sqrt() / bias_correction2_sqrt)
      return {{"adamw.exp_avg_sq.sqrt", DType::F32, L}, {"adamw.denom", DType::F32, L}};
    case OptimizerImpl::HfAdamW:  // AdamW.step: exp_avg_sq.sqrt().add_(eps)
      return {{"adamw.denom", DType::F32, L}};
    case OptimizerImpl::Adafactor:  // Adafactor.step, one dimension: update and exp_avg_sq.rsqrt().mul_(grad)
      return {{"adafactor.update", DType::F32, L}, {"adafactor.update.next", DType::F32, L}};
    case OptimizerImpl::Sgd:  // _multi_tensor_sgd: torch._foreach_add(device_grads, device_params)
      if (weight_decay != 0) return {{"sgd.grads_with_decay", DType::F32, all}};
      return {};
  }
  return {};
}

int64_t optimizer_step_temporary_bytes(const OptimizerSpec& o, const std::vector<int64_t>& tensors, double weight_decay) {
  int64_t b = 0;
  for (const MemoryTerm& t : optimizer_step_temporaries(o, tensors, weight_decay)) b += t.bytes();
  return b;
}

}  // namespace zt::trainer
