#include "train_config.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/layout.h"
#include "train/model_shape.h"
#include "train/outside_memory.h"
#include "zero/optimizer_memory.h"
#include "zt/common/files.h"
#include "zt/common/units.h"
#include "zt/common/yaml_keys.h"
#include "zt/memory/numa.h"

namespace zt::trainer {

namespace {
std::string normalize(std::string key) {
  for (auto& c : key)
    if (c == '-') c = '_';
  return key;
}
}  // namespace

Status load_train_config(const std::string& path, TrainConfig* cfg, std::vector<std::string>* keys) {
  std::string text;
  if (Status s = read_text_file(path, "config file", &text); !s) return s;
  return load_train_config_text(text, path, cfg, keys);
}

Status load_train_config_text(const std::string& text, const std::string& path, TrainConfig* cfg,
                              std::vector<std::string>* keys) {
  if (Status s = check_yaml_text(text, path); !s) return s;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return Status::Error(path + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) return Status::Error(path + ": a config file is a mapping of settings (key: value)");
  if (Status s = check_unique_keys(root, path, normalize); !s) return s;
  using Setter = std::function<void(const YAML::Node&)>;
  auto size = [](uint64_t& dst) {
    return [&dst](const YAML::Node& n) {
      std::string why;
      auto v = parse_bytes(n.as<std::string>(), &why);
      if (!v) throw YAML::Exception(n.Mark(), "'" + n.as<std::string>() + "' " + why + " (try 80GiB)");
      dst = *v;
    };
  };
  TrainConfig& c = *cfg;
  auto add_faults = [&](const YAML::Node& n) {  // one spec or a list of them
    if (n.IsSequence())
      for (const auto& f : n) c.faults.push_back(f.as<std::string>());
    else
      c.faults.push_back(n.as<std::string>());
  };
  std::map<std::string, Setter> setters = {
      {"device", [&](const YAML::Node& n) { c.device = n.as<std::string>(); }},
      {"model", [&](const YAML::Node& n) { c.model = n.as<std::string>(); }},
      {"steps", [&](const YAML::Node& n) { c.steps = n.as<int64_t>(); }},
      {"epochs", [&](const YAML::Node& n) { c.epochs = n.as<int64_t>(); }},
      {"micro_batch", [&](const YAML::Node& n) { c.micro_batch = n.as<int64_t>(); }},
      {"grad_accum", [&](const YAML::Node& n) { c.grad_accum = n.as<int64_t>(); }},
      {"world_size", [&](const YAML::Node& n) { c.world_size = n.as<int64_t>(); }},
      {"seq_len", [&](const YAML::Node& n) { c.seq_len = n.as<int64_t>(); }},
      {"seed", [&](const YAML::Node& n) { c.seed = n.as<uint64_t>(); }},
      {"precision", [&](const YAML::Node& n) { c.precision = n.as<std::string>(); }},
      {"device_memory", size(c.device_memory)},
      {"host_memory", size(c.host_memory)},
      {"cuda_context", [&](const YAML::Node& n) { c.cuda_context = n.as<std::string>(); }},
      {"nccl_channels", [&](const YAML::Node& n) { c.nccl_channels = n.as<int64_t>(); }},
      {"data", [&](const YAML::Node& n) { c.data = n.as<std::string>(); }},
      {"max_doc_tokens", [&](const YAML::Node& n) { c.max_doc_tokens = n.as<int64_t>(); }},
      {"trace", [&](const YAML::Node& n) { c.trace = n.as<std::string>(); }},
      {"lr", [&](const YAML::Node& n) { c.lr = n.as<double>(); }},
      {"weight_decay", [&](const YAML::Node& n) { c.weight_decay = n.as<double>(); }},
      {"beta1", [&](const YAML::Node& n) { c.beta1 = n.as<double>(); }},
      {"beta2", [&](const YAML::Node& n) { c.beta2 = n.as<double>(); }},
      {"eps", [&](const YAML::Node& n) { c.eps = n.as<double>(); }},
      {"grad_clip", [&](const YAML::Node& n) { c.grad_clip = n.as<double>(); }},
      {"activation_checkpointing", [&](const YAML::Node& n) { c.activation_checkpointing = n.as<bool>(); }},
      {"tf32", [&](const YAML::Node& n) { c.tf32 = n.as<bool>(); }},
      {"delayed_update", [&](const YAML::Node& n) { c.delayed_update = n.as<int64_t>(); }},
      {"overlap_update", [&](const YAML::Node& n) { c.overlap_update = n.as<bool>(); }},
      {"adam_in_backward", [&](const YAML::Node& n) { c.adam_in_backward = n.as<bool>(); }},
      {"grad_partition_dtype", [&](const YAML::Node& n) { c.grad_partition_dtype = n.as<std::string>(); }},
      {"pinned_numa", [&](const YAML::Node& n) { c.pinned_numa = n.as<std::string>(); }},
      {"matmul_precision", [&](const YAML::Node& n) { c.matmul_precision = n.as<std::string>(); }},
      {"matmul_dtype", [&](const YAML::Node& n) { c.matmul_dtype = n.as<std::string>(); }},
      {"attention", [&](const YAML::Node& n) { c.attention = n.as<std::string>(); }},
      {"attn_implementation", [&](const YAML::Node& n) { c.attention = n.as<std::string>(); }},  // HF's name
      {"optimizer", [&](const YAML::Node& n) { c.optimizer = n.as<std::string>(); }},
      {"attention_dropout", [&](const YAML::Node& n) { c.attention_dropout = n.as<double>(); }},
      {"checkpoint_dir", [&](const YAML::Node& n) { c.checkpoint_dir = n.as<std::string>(); }},
      {"save_every", [&](const YAML::Node& n) { c.save_every = n.as<int64_t>(); }},
      {"resume", [&](const YAML::Node& n) { c.resume = n.as<bool>(); }},
      {"checkpoint_gather", [&](const YAML::Node& n) { c.checkpoint_gather = n.as<std::string>(); }},
      {"save_safetensors", [&](const YAML::Node& n) { c.save_safetensors = n.as<bool>(); }},
      {"save_only_model", [&](const YAML::Node& n) { c.save_only_model = n.as<bool>(); }},
      {"faults", add_faults},
      // The flags' own names too, where the key differs (--fault, --comm-timeout MS), and -q.
      {"fault", add_faults},
      {"comm_timeout", [&](const YAML::Node& n) { c.comm_timeout_ms = n.as<int64_t>(); }},
      {"quiet", [&](const YAML::Node& n) { c.quiet = n.as<bool>(); }},
      {"zero_stage", [&](const YAML::Node& n) { c.zero.stage = n.as<int>(); }},
      {"offload_optimizer", [&](const YAML::Node& n) { c.zero.offload_optimizer = n.as<bool>(); }},
      {"offload_param", [&](const YAML::Node& n) { c.zero.offload_param = n.as<bool>(); }},
      {"offload_ratio", [&](const YAML::Node& n) { c.zero.offload_ratio = n.as<double>(); }},
      {"param_persistence_threshold", [&](const YAML::Node& n) { c.zero.param_persistence_threshold = n.as<int64_t>(); }},
      {"fault_seed", [&](const YAML::Node& n) { c.fault_seed = n.as<uint64_t>(); }},
      {"comm_timeout_ms", [&](const YAML::Node& n) { c.comm_timeout_ms = n.as<int64_t>(); }},
      {"virtual", [&](const YAML::Node& n) { c.virtual_mode = n.as<bool>(); }},
      {"virtual_fast_forward", [&](const YAML::Node& n) { c.virtual_fast_forward = n.as<bool>(); }},
      {"data_samples", [&](const YAML::Node& n) { c.data_samples = n.as<int64_t>(); }},
      {"ranks_per_node", [&](const YAML::Node& n) { c.ranks_per_node = n.as<int64_t>(); }},
      {"virtual_grad_norm", [&](const YAML::Node& n) { c.virtual_grad_norm = n.as<double>(); }},
      {"from_pretrained", [&](const YAML::Node& n) { c.from_pretrained = n.as<bool>(); }},
      {"load_dtype", [&](const YAML::Node& n) { c.load_dtype = n.as<std::string>(); }},
      {"load_copies", [&](const YAML::Node& n) { c.load_copies = n.as<int64_t>(); }},
      {"zero_init", [&](const YAML::Node& n) { c.zero_init = n.as<bool>(); }},
      {"zero3_init_flag", [&](const YAML::Node& n) { c.zero_init = n.as<bool>(); }},  // accelerate's name
      {"finetuning", [&](const YAML::Node& n) { c.finetuning = n.as<std::string>(); }},
      {"lora_rank", [&](const YAML::Node& n) { c.lora_rank = n.as<int64_t>(); }},
      {"lora_targets", [&](const YAML::Node& n) { c.lora_targets = n.as<std::string>(); }},
      {"trainable_layers", [&](const YAML::Node& n) { c.trainable_layers = n.as<int64_t>(); }},
      {"eval_steps", [&](const YAML::Node& n) { c.eval_steps = n.as<int64_t>(); }},
      {"eval_samples", [&](const YAML::Node& n) { c.eval_samples = n.as<int64_t>(); }},
      {"eval_batch", [&](const YAML::Node& n) { c.eval_batch = n.as<int64_t>(); }},
      {"eval_accumulation_steps", [&](const YAML::Node& n) { c.eval_accumulation_steps = n.as<int64_t>(); }},
      {"eval_keep_logits", [&](const YAML::Node& n) { c.eval_keep_logits = n.as<bool>(); }},
      {"watchdog_kill_at", [&](const YAML::Node& n) { c.watchdog_kill_at = n.as<double>(); }},
      {"watchdog", [&](const YAML::Node& n) { c.watchdog = n.as<std::string>(); }},
      {"shape", [&](const YAML::Node& n) {
         // A transformer layout (model: custom): the fields of shape_fields() (model_shape.h).
         if (!n.IsMap()) throw YAML::Exception(n.Mark(), "shape is a mapping (width: 7168, layers: 60, ...)");
         for (const auto& kv : n) {
           const std::string k = normalize(kv.first.as<std::string>());
           const YAML::Node& v = kv.second;
           const ShapeField* f = nullptr;
           for (const auto& field : shape_fields())
             if (k == field.name) f = &field;
           if (!f) throw YAML::Exception(kv.first.Mark(), "unknown shape key '" + k + "' (" + shape_field_list() + ")");
           if (f->integer) c.shape.*(f->integer) = v.as<int64_t>();
           else if (f->flag) c.shape.*(f->flag) = v.as<bool>();
           else c.shape.*(f->text) = v.as<std::string>();
         }
       }},
  };
  for (const auto& kv : root) {
    std::string key = normalize(kv.first.as<std::string>());
    auto it = setters.find(key);
    if (it == setters.end()) {
      std::string known;
      for (auto& [k, _] : setters) known += (known.empty() ? "" : ", ") + k;
      return Status::Error(path + ":" + std::to_string(kv.first.Mark().line + 1) + ": unknown setting '" +
                           kv.first.as<std::string>() + "' (known: " + known + ")");
    }
    try {
      it->second(kv.second);
      if (keys) keys->push_back(key);
    } catch (const YAML::Exception& e) {
      // The value too, escaped: "run.yaml:3: bad value for 'steps': '1e18' (bad conversion)".
      const YAML::Node& v = kv.second;
      const std::string value = v.IsScalar() ? "'" + printable(v.Scalar()) + "'" : v.IsSequence() ? "a list" : v.IsMap() ? "a mapping" : "nothing";
      return Status::Error(path + ":" + std::to_string(v.Mark().line + 1) + ": bad value for '" + key + "': " + value +
                           " (" + (e.msg.empty() ? "wrong type" : e.msg) + ")");
    }
  }
  c.config_file = path;
  return Status::Ok();
}

std::string grad_partition_dtype_problem(const TrainConfig& c) {
  if (c.grad_partition_dtype != "fp32" && c.grad_partition_dtype != "compute")
    return "grad_partition_dtype '" + c.grad_partition_dtype +
           "': use fp32 (DeepSpeed's fp32 gradient partitions) or compute (kept in bf16/fp16, widened by AdamW)";
  if (c.grad_partition_dtype == "compute" && (!c.zero.offload_optimizer || c.zero.stage < 2 || c.precision == "fp32"))
    return "grad_partition_dtype compute keeps the host gradient partitions in the compute dtype: it needs "
           "offload_optimizer, ZeRO stage 2 or 3 and precision bf16 or fp16";
  return "";
}

std::string watchdog_tools() { return "ray, kubernetes, systemd-oomd, slurm"; }

// Model loading, frozen parameters, evaluation and the node watchdog, against the rest.
std::string job_settings_problem(const TrainConfig& c) {
  const bool real = !c.virtual_mode;
  if (!c.load_dtype.empty() && c.load_dtype != "fp32" && c.load_dtype != "bf16" && c.load_dtype != "fp16")
    return "load_dtype '" + c.load_dtype + "': the checkpoint's dtype is fp32, bf16 or fp16";
  if (c.load_copies < 1 || c.load_copies > 4) return "load_copies must lie between 1 and 4 (copies of the weights held while loading)";
  if (c.zero_init && c.zero.stage != 3)
    return "zero_init (zero.Init, zero3_init_flag) partitions the parameters as they are made: it needs ZeRO stage 3";
  if (c.finetuning != "full" && c.finetuning != "lora" && c.finetuning != "freeze")
    return "finetuning '" + c.finetuning + "': use full, lora (adapters on a frozen model) or freeze (the last blocks trained)";
  if (c.finetuning == "lora" && real)
    return "finetuning lora runs in virtual mode only (sizes: the reference passes have no adapters); "
           "finetuning freeze trains part of a real model";
  if (c.finetuning == "lora" && (c.lora_rank < 1 || c.lora_rank > (1 << 16)))
    return "lora_rank must lie between 1 and 65536";
  if (c.lora_targets != "qv" && c.lora_targets != "attention" && c.lora_targets != "all")
    return "lora_targets '" + c.lora_targets + "': use qv (q and v), attention (every attention projection) or all (every linear)";
  if (c.finetuning == "freeze" && c.trainable_layers < 1) return "trainable_layers must be at least 1 (the blocks trained)";
  if (c.finetuning != "full" && c.device == "cuda")
    return "finetuning " + c.finetuning + " runs on the simulated GPU and the CPU (the CUDA passes compute every gradient)";
  if (c.finetuning != "full" && (c.delayed_update >= 0 || c.overlap_update))
    return "finetuning " + c.finetuning + " with the delayed or overlapped update is not implemented";
  if (c.eval_steps < 0 || c.eval_samples < 0 || c.eval_batch < 0 || c.eval_accumulation_steps < 0)
    return "eval_steps, eval_samples, eval_batch and eval_accumulation_steps must not be negative";
  if (c.eval_steps > 0 && c.eval_samples < 1) return "eval_steps needs eval_samples (the evaluation set's size, in samples)";
  if (c.eval_steps > 0 && real && c.eval_batch != 0 && c.eval_batch != c.micro_batch)
    return "eval_batch differs from micro_batch: a real run evaluates in its training micro-batches (virtual mode takes any)";
  if (c.eval_steps > 0 && c.device == "cuda") return "eval_steps runs on the simulated GPU and the CPU (the CUDA passes have no forward-only head)";
  if (c.eval_batch > (int64_t(1) << 24) || c.eval_samples > (int64_t(1) << 40)) return "eval_batch or eval_samples is too large";
  if (!(c.watchdog_kill_at >= 0 && c.watchdog_kill_at <= 1))
    return "watchdog_kill_at must lie in (0, 1] (the share of the node's memory at which the job is killed), or 0 for none";
  if (c.watchdog_kill_at > 0 && c.host_memory == 0) return "a memory watchdog needs host_memory (the node's memory it watches)";
  if (!c.watchdog.empty() && c.watchdog != "ray" && c.watchdog != "kubernetes" && c.watchdog != "systemd-oomd" &&
      c.watchdog != "slurm")
    return "watchdog '" + c.watchdog + "': use " + watchdog_tools();
  return "";
}

Status validate(const TrainConfig& c) {
  auto bad = [&](const std::string& what) {
    return Status::Error((c.config_file.empty() ? std::string() : c.config_file + ": ") + what);
  };
  if (c.device != "sim" && c.device != "cpu" && c.device != "cuda")
    return bad("device '" + c.device + "': use sim, cpu or cuda");
  if (c.device == "cuda" && c.virtual_mode)
    return bad("--virtual runs on the simulated GPU (--device sim): it keeps sizes only, no data");
  if (c.steps < 0) return bad("steps must be at least 1 (or 0 to train by epochs)");
  if (c.epochs < 0) return bad("epochs must be at least 1 (or 0 to train by steps)");
  if (c.steps > 0 && c.epochs > 0) return bad("give steps or epochs, not both");
  if (c.micro_batch < 1) return bad("micro_batch must be at least 1");
  if (c.grad_accum < 1) return bad("grad_accum must be at least 1");
  if (c.world_size < 1) return bad("world_size must be at least 1");
  if (c.seq_len < 0) return bad("seq_len must be positive (or 0 for the model's context)");
  // A custom shape is checked here, not only when the run starts: what reads a validated config
  // (to_json, optimizer_modules) divides by its heads.
  if (c.model == "custom")
    if (Status s = validate_shape(c.shape); !s) return bad(s.message());
  if (c.precision != "fp32" && c.precision != "bf16" && c.precision != "fp16")
    return bad("precision '" + c.precision + "': use fp32, bf16 or fp16");
  if (c.tf32 && c.device != "cuda")
    return bad("tf32 chooses how a real GPU multiplies matrices: it needs --device cuda (the CPU and the simulated GPU compute in fp32)");
  if (!parse_matmul_precision(c.matmul_precision))
    return bad("matmul_precision '" + c.matmul_precision + "': use highest (fp32), high (TF32) or medium (bf16)");
  if (c.matmul_precision != "highest" && c.device != "cuda")
    return bad("matmul_precision chooses how a real GPU multiplies matrices: it needs --device cuda (the CPU and the simulated GPU compute in fp32)");
  if (c.tf32 && c.matmul_precision == "medium")
    return bad("tf32 and matmul_precision medium ask for two precisions: give one (tf32 is matmul_precision high)");
  if (c.matmul_dtype != "fp32" && c.matmul_dtype != "bf16")
    return bad("matmul_dtype '" + c.matmul_dtype + "': use fp32 (default) or bf16 (bf16 GEMM inputs on a GPU)");
  if (c.matmul_dtype == "bf16" && (c.device != "cuda" || c.precision != "bf16"))
    return bad("matmul_dtype bf16 multiplies bf16 activations on a GPU's tensor cores: it needs --device cuda and "
               "--precision bf16 (the CPU and the simulated GPU compute in fp32)");
  if (std::string why; !cuda_context_bytes(c.cuda_context, &why)) return bad("cuda_context " + why);
  if (c.cuda_context != "none" && (c.device == "cuda" || c.device == "cpu"))
    return bad("cuda_context " + c.cuda_context + " charges the simulated GPU: a real GPU (--device cuda) has its own "
               "context, and the CPU none");
  if (c.nccl_channels < 0 || c.nccl_channels > kNcclMaxChannels)
    return bad("nccl_channels " + std::to_string(c.nccl_channels) + " must lie in 0 .. 64 (NCCL's MAXCHANNELS)");
  if (outside_allocator_bytes(c) > 0 && outside_allocator_bytes(c) >= c.device_memory)
    return bad("the memory outside PyTorch's allocator (" + describe_outside(c) + ") does not fit the GPU of " +
               format_bytes(double(c.device_memory)) + ": the CUDA context could not be made");
  if (c.device_memory == 0 && c.device != "cuda") return bad("device_memory must be positive (0: a real GPU's own size, with --device cuda)");
  if (!(c.lr > 0) || !std::isfinite(c.lr)) return bad("lr must be a positive number");
  if (c.beta1 < 0 || c.beta1 >= 1 || c.beta2 < 0 || c.beta2 >= 1) return bad("beta1 and beta2 must lie in [0, 1)");
  if (!(c.eps > 0) || !std::isfinite(c.eps)) return bad("eps must be a positive number");
  if (!(c.weight_decay >= 0) || !std::isfinite(c.weight_decay)) return bad("weight_decay must be a number, 0 or more");
  if (!(c.grad_clip >= 0) || !std::isfinite(c.grad_clip)) return bad("grad_clip must be a number, 0 or more (0 turns it off)");
  if (c.max_doc_tokens < 0) return bad("max_doc_tokens must not be negative");
  if (c.zero.stage < 0 || c.zero.stage > 3) return bad("zero stage must be 0, 1, 2 or 3");
  if (c.zero.offload_optimizer && c.zero.stage == 0)
    return bad("offload_optimizer needs ZeRO stage 1, 2 or 3 (it offloads the optimizer partition)");
  if (c.zero.offload_param && c.zero.stage != 3) return bad("offload_param needs ZeRO stage 3 (only stage 3 partitions parameters)");
  if (c.zero.param_persistence_threshold < -1)
    return bad("param_persistence_threshold must be 0 or more (-1: 10 x the model width, DeepSpeed's \"auto\")");
  if (!(c.zero.offload_ratio >= 0 && c.zero.offload_ratio <= 1))
    return bad("offload_ratio must lie in [0, 1] (the fraction of the modules whose optimizer state is offloaded)");
  if (c.zero.offload_ratio < 1 && !(c.zero.offload_optimizer && c.zero.stage == 3))
    return bad("offload_ratio below 1 (ZeRO-Offload++'s partial optimizer offload) needs offload_optimizer and ZeRO stage 3");
  if (model::Attention a; !model::parse_attention(c.attention, &a))
    return bad("attention '" + c.attention + "': use materialized or eager (the [B, H, T, T] probabilities kept), flash, "
               "sdpa or flash_attention_2 (one log-sum-exp a row kept)");
  if (c.attention == "flash_attention_2" && c.precision == "fp32")
    return bad("attention flash_attention_2 with precision fp32: FlashAttention-2 runs fp16 and bf16 only "
               "(transformers refuses it: \"Flash Attention 2 only supports torch.float16 and torch.bfloat16 dtypes\"); "
               "sdpa runs fp32");
  if (std::string p = optimizer_problem(c); !p.empty()) return bad(p);
  if (!(c.attention_dropout >= 0 && c.attention_dropout < 1))
    return bad("attention_dropout must lie in [0, 1) (the probability of dropping an attention weight)");
  if (c.attention_dropout > 0 && !c.virtual_mode)
    return bad("attention_dropout is charged in virtual mode only (--virtual): the reference passes have no dropout");
  if (c.delayed_update < -1) return bad("delayed_update must be a count of ordinary steps first (0 or more), or -1 for off");
  if (c.delayed_update >= 0 && !c.zero.offload_optimizer)
    return bad("delayed_update runs CPU AdamW beside the next step: it needs the optimizer on the host (offload_optimizer, ZeRO stage 1-3)");
  if (c.overlap_update && !c.zero.offload_optimizer)
    return bad("overlap_update runs CPU AdamW beside the next step's forward: it needs the optimizer on the host (offload_optimizer, ZeRO stage 1-3)");
  if (c.overlap_update && c.delayed_update >= 0)
    return bad("overlap_update and delayed_update are two ways of running AdamW beside the next step (exact, and one update stale): give one");
  if (c.adam_in_backward && !c.overlap_update)
    return bad("adam_in_backward starts the overlapped update's AdamW during backward: give overlap_update too");
  if (c.adam_in_backward && c.zero.stage < 2)
    return bad("adam_in_backward needs ZeRO stage 2 or 3: only there does a module's gradient partition reach the "
               "host during backward (stage 1 offloads them at the optimizer step)");
  if (std::string p = grad_partition_dtype_problem(c); !p.empty()) return bad(p);
  try {
    memory::parse_placement(c.pinned_numa);  // the one list of placements' names
  } catch (const std::invalid_argument&) {
    return bad("pinned_numa '" + c.pinned_numa +
               "': use local (pages on the node that pins them) or interleave (round robin over the NUMA nodes)");
  }
  if (c.checkpoint_gather != "streamed" && c.checkpoint_gather != "device")
    return bad("checkpoint_gather '" + c.checkpoint_gather + "': use streamed (one module at a time) or device (all at once)");
  if (c.world_size > 256 && !c.virtual_mode)
    return bad("world_size above 256 rank threads is not supported in one process (virtual mode simulates one rank for all)");
  if (c.comm_timeout_ms < 1 || c.comm_timeout_ms > int64_t(7) * 24 * 3600 * 1000)
    return bad("comm_timeout_ms must lie between 1 ms and 7 days");
  // Sizes the data plan multiplies together: each bounded, so no product overflows.
  constexpr int64_t kMaxCount = int64_t(1) << 24;
  if (c.micro_batch > kMaxCount) return bad("micro_batch " + std::to_string(c.micro_batch) + " is above the limit of 16777216");
  if (c.grad_accum > kMaxCount) return bad("grad_accum " + std::to_string(c.grad_accum) + " is above the limit of 16777216");
  if (c.world_size > kMaxCount) return bad("world_size " + std::to_string(c.world_size) + " is above the limit of 16777216");
  if (c.seq_len > kMaxCount) return bad("seq_len " + std::to_string(c.seq_len) + " is above the limit of 16777216");
  // The global batch (micro_batch x grad_accum x world_size samples a step), counted in int64.
  constexpr int64_t kMaxGlobalBatch = int64_t(1) << 40;
  if (c.micro_batch * c.grad_accum > kMaxGlobalBatch / c.world_size)
    return bad("micro_batch " + std::to_string(c.micro_batch) + " x grad_accum " + std::to_string(c.grad_accum) +
               " x world_size " + std::to_string(c.world_size) + " is above the limit of 2^40 samples a step");
  // Step and epoch numbers go into the trace, which holds them below 2^31 (db/SCHEMA.md).
  constexpr int64_t kMaxSteps = (int64_t(1) << 31) - 1;
  if (c.steps > kMaxSteps) return bad("steps " + std::to_string(c.steps) + " is above the limit of 2147483647");
  if (c.epochs > kMaxSteps) return bad("epochs " + std::to_string(c.epochs) + " is above the limit of 2147483647");
  if (c.delayed_update > kMaxSteps)
    return bad("delayed_update " + std::to_string(c.delayed_update) + " is above the limit of 2147483647");
  if (c.save_every > kMaxSteps) return bad("save_every " + std::to_string(c.save_every) + " is above the limit of 2147483647");
  // Memory sizes are exact in a double up to 2^53 bytes (8 PiB), far above any machine's.
  constexpr uint64_t kMaxMemory = uint64_t(1) << 53;
  if (c.device_memory > kMaxMemory) return bad("device_memory " + format_bytes(double(c.device_memory)) + " is above the limit of 8 PiB");
  if (c.host_memory > kMaxMemory) return bad("host_memory " + format_bytes(double(c.host_memory)) + " is above the limit of 8 PiB");
  if (c.data_samples < 0 || c.data_samples > (int64_t(1) << 53))
    return bad("data_samples " + std::to_string(c.data_samples) + " must lie in 0 .. 2^53");
  if (c.max_doc_tokens > (int64_t(1) << 53))
    return bad("max_doc_tokens " + std::to_string(c.max_doc_tokens) + " is above the limit of 2^53");
  if (!std::isfinite(c.virtual_grad_norm) || c.virtual_grad_norm < 0)
    return bad("virtual_grad_norm must be a number, 0 or more");
  // zero_optimization's sizes: -1 is "auto" (the model's width squared, as Hugging Face's
  // integration sets them); no other negative means anything.
  const ZeroSettings& zs = c.zero;
  for (auto [key, v] : {std::pair{"reduce_bucket_size", zs.reduce_bucket_size},
                        std::pair{"stage3_prefetch_bucket_size", zs.prefetch_bucket_size},
                        std::pair{"stage3_param_persistence_threshold", zs.param_persistence_threshold}})
    if (v < -1) return bad(std::string("zero_optimization.") + key + " " + std::to_string(v) + " must not be negative");
  // fp16's dynamic loss scale (DeepSpeed's names).
  const ZeroSettings& z = c.zero;
  if (z.loss_scale_window < 1) return bad("fp16.loss_scale_window must be at least 1 (steps without overflow before the scale grows)");
  if (z.hysteresis < 1) return bad("fp16.hysteresis must be at least 1 (overflows before the scale drops)");
  // DeepSpeed checks the floor of a dynamic scale only where there is one (fp16, loss_scale 0).
  if (c.precision == "fp16" && z.static_loss_scale == 0 && (!(z.min_loss_scale > 0) || !std::isfinite(z.min_loss_scale)))
    return bad("fp16.min_loss_scale must be a positive number");
  if (!(z.initial_scale_power >= 0 && z.initial_scale_power <= 64))
    return bad("fp16.initial_scale_power must lie in [0, 64] (the first scale is 2^power)");
  if (!(z.static_loss_scale >= 0) || !std::isfinite(z.static_loss_scale))
    return bad("fp16.loss_scale must be 0 (dynamic) or a positive number");
  if (std::string p = job_settings_problem(c); !p.empty()) return bad(p);
  if (z.max_live_parameters < 0) return bad("zero_optimization.stage3_max_live_parameters must not be negative");
  if (z.max_reuse_distance < 0) return bad("zero_optimization.stage3_max_reuse_distance must not be negative");
  return Status::Ok();
}

model::Attention attention_of(const TrainConfig& c) {
  model::Attention a = model::Attention::Materialized;
  model::parse_attention(c.attention, &a);
  return a;
}

MatmulPrecision matmul_precision_of(const TrainConfig& c) {
  return c.tf32 ? MatmulPrecision::High : parse_matmul_precision(c.matmul_precision).value_or(MatmulPrecision::Highest);
}

int64_t optimizer_modules(const TrainConfig& c) {
  if (c.model == "custom") return int64_t(shape_modules(c.shape, false).size());
  const auto mc = model::preset(c.model);
  return mc ? int64_t(model::module_table(*mc).size()) : -1;
}

int64_t first_offloaded_module(const ZeroSettings& z, int64_t modules) {
  // DeepSpeed's rule over its sub-groups (stage3.py in its SuperOffload-era releases; earlier ones
  // offloaded the first sub-groups).
  return z.offload_optimizer ? int64_t((1.0 - z.offload_ratio) * double(modules)) : modules;
}

std::string stays_on_device_module_problem(const std::string& arg, const ZeroSettings& z, int64_t modules) {
  char* end = nullptr;
  const int64_t idx = std::strtoll(arg.c_str(), &end, 10);
  if (arg.empty() || *end || idx < 0 || idx >= modules)
    return "module index '" + arg + "': the model has modules 0.." + std::to_string(modules - 1);
  const int64_t first = first_offloaded_module(z, modules);
  if (z.offload_optimizer && idx < first) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%g", z.offload_ratio);
    return "module " + arg + " keeps its optimizer state on the accelerator (offload_ratio " + ratio +
           "): its partition is never offloaded; the offloaded modules are " + std::to_string(first) + ".." +
           std::to_string(modules - 1);
  }
  return "";
}

std::string to_json(const TrainConfig& c) {
  nlohmann::json j = {{"device", c.device},
                      {"model", c.model},
                      {"steps", c.steps},
                      {"epochs", c.epochs},
                      {"micro_batch", c.micro_batch},
                      {"grad_accum", c.grad_accum},
                      {"world_size", c.world_size},
                      {"seq_len", c.seq_len},
                      {"seed", c.seed},
                      {"precision", c.precision},
                      {"device_memory", c.device_memory},
                      {"host_memory", c.host_memory},
                      {"cuda_context", c.cuda_context},
                      {"nccl_channels", c.nccl_channels},
                      {"data", c.data.empty() ? "synthetic" : c.data},
                      {"max_doc_tokens", c.max_doc_tokens},
                      {"lr", c.lr},
                      {"weight_decay", c.weight_decay},
                      {"beta1", c.beta1},
                      {"beta2", c.beta2},
                      {"eps", c.eps},
                      {"grad_clip", c.grad_clip},
                      {"activation_checkpointing", c.activation_checkpointing},
                      {"tf32", c.tf32},
                      {"matmul_precision", std::string(matmul_precision_name(matmul_precision_of(c)))},
                      {"matmul_dtype", c.matmul_dtype},
                      {"delayed_update", c.delayed_update},
                      {"overlap_update", c.overlap_update},
                      {"adam_in_backward", c.adam_in_backward},
                      {"grad_partition_dtype", c.grad_partition_dtype},
                      {"pinned_numa", c.pinned_numa},
                      {"attention", c.attention},
                      {"zero_optimization", {{"stage", c.zero.stage},
                                             {"offload_optimizer", c.zero.offload_optimizer},
                                             {"offload_param", c.zero.offload_param},
                                             {"offload_ratio", c.zero.offload_ratio},
                                             {"reduce_bucket_size", c.zero.reduce_bucket_size},
                                             {"overlap_comm", c.zero.overlap_comm},
                                             {"legacy_stage1", c.zero.legacy_stage1},
                                             {"stage3_prefetch_bucket_size", c.zero.prefetch_bucket_size},
                                             {"stage3_param_persistence_threshold", c.zero.param_persistence_threshold},
                                             {"stage3_max_live_parameters", c.zero.max_live_parameters},
                                             {"stage3_max_reuse_distance", c.zero.max_reuse_distance},
                                             {"stage3_gather_16bit_weights_on_model_save", c.zero.gather_16bit_weights_on_model_save}}},
                      {"checkpoint_dir", c.checkpoint_dir},
                      {"save_every", c.save_every},
                      {"resume", c.resume},
                      {"checkpoint_gather", c.checkpoint_gather},
                      {"save_safetensors", c.save_safetensors},
                      {"save_only_model", c.save_only_model},
                      {"ds_config", c.ds_config},
                      {"unmodeled_memory_keys", c.unmodeled_memory_keys},
                      {"faults", c.faults},
                      {"fault_seed", c.fault_seed ? c.fault_seed : c.seed},
                      {"comm_timeout_ms", c.comm_timeout_ms},
                      {"virtual", c.virtual_mode},
                      {"virtual_fast_forward", c.virtual_fast_forward},
                      {"data_samples", c.data_samples},
                      {"ranks_per_node", c.ranks_per_node},
                      {"from_pretrained", c.from_pretrained},
                      {"load_dtype", c.load_dtype.empty() ? c.precision : c.load_dtype},
                      {"zero_init", c.zero_init},
                      {"load_copies", c.load_copies},
                      {"finetuning", c.finetuning},
                      {"eval_steps", c.eval_steps}};
  if (c.finetuning == "lora") j["lora"] = {{"rank", c.lora_rank}, {"targets", c.lora_targets}};
  if (c.finetuning == "freeze") j["trainable_layers"] = c.trainable_layers;
  if (c.eval_steps > 0)
    j["eval"] = {{"samples", c.eval_samples}, {"batch", c.eval_batch ? c.eval_batch : c.micro_batch},
                 {"accumulation_steps", c.eval_accumulation_steps}, {"keep_logits", c.eval_keep_logits}};
  if (c.attention_dropout > 0) j["attention_dropout"] = c.attention_dropout;
  // The optimizer the memory model charges, when the run or its DeepSpeed config names one.
  if (const OptimizerSpec o = optimizer_of(c); o.given) j["optimizer"] = {{"name", o.name}, {"library", optimizer_library(o)}};
  if (c.watchdog_kill_at > 0) j["memory_watchdog"] = {{"tool", c.watchdog}, {"kill_at", c.watchdog_kill_at}};
  // A partial offload's split, for readers of the trace without the trainer (zt check --placement):
  // the modules counted, so the ones kept on the accelerator are known even where the trace is cut short.
  if (c.zero.offload_ratio < 1)
    if (const int64_t n = optimizer_modules(c); n > 0) j["zero_optimization"]["sub_groups"] = n;
  if (c.model == "custom") {
    nlohmann::json shape = nlohmann::json::object();
    for (const auto& f : shape_fields()) {
      if (f.integer) shape[f.name] = c.shape.*(f.integer);
      else if (f.flag) shape[f.name] = c.shape.*(f.flag);
      else shape[f.name] = c.shape.*(f.text);
    }
    j["shape"] = shape;
  }
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // a flag's path need not be UTF-8
}

}  // namespace zt::trainer
