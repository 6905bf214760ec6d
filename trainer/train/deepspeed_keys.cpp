// DeepSpeed's key table: aliases and each key's effect here (see deepspeed_keys.h).
#include "train/deepspeed_keys.h"

#include <algorithm>
#include <cstdint>
#include <functional>

namespace zt::trainer {

namespace {

using nlohmann::json;

// The zero_optimization fields DeepSpeed also accepts by their field name (pydantic's
// populate_by_name beside Field(alias="stage3_...")): the alias is the name the reader reads.
const std::pair<const char*, const char*> kZeroFieldNames[] = {
    {"prefetch_bucket_size", "stage3_prefetch_bucket_size"},
    {"param_persistence_threshold", "stage3_param_persistence_threshold"},
    {"model_persistence_threshold", "stage3_model_persistence_threshold"},
    {"max_live_parameters", "stage3_max_live_parameters"},
    {"max_reuse_distance", "stage3_max_reuse_distance"},
    {"gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"},
    {"module_granularity_threshold", "stage3_module_granularity_threshold"},
    {"use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params"},
    {"allgather_sequential", "stage3_allgather_sequential"},
};

bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_set(const json& v) { return !v.is_null() && !(v.is_string() && v.get<std::string>() == "auto"); }
// A block such as {"enabled": true, ...}.
bool enabled(const json& v) { return v.is_object() && v.contains("enabled") && is_true(v["enabled"]); }
bool above(const json& v, double limit) { return v.is_number() && v.get<double>() > limit; }

enum class Effect { None, Memory };

struct Key {
  const char* where;  // "" (top level), "zero_optimization.", ...
  const char* name;
  Effect effect;
  const char* what;  // what it does (None), or how it changes memory (Memory)
  // Memory: whether the value here changes memory (the block is the enclosing object); null: always.
  std::function<bool(const json& value, const json& block)> changes = nullptr;
};

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      // ---- top level (deepspeed/runtime/config.py, constants.py)
      {"", "steps_per_print", Effect::None, "how often DeepSpeed logs"},
      {"", "wall_clock_breakdown", Effect::None, "timing logs"},
      {"", "memory_breakdown", Effect::None, "memory logs"},
      {"", "dump_state", Effect::None, "logs the engine's state"},
      {"", "flops_profiler", Effect::None, "the FLOPs profiler"},
      {"", "tensorboard", Effect::None, "a monitor"},
      {"", "wandb", Effect::None, "a monitor"},
      {"", "csv_monitor", Effect::None, "a monitor"},
      {"", "comet", Effect::None, "a monitor"},
      {"", "comms_logger", Effect::None, "communication logs"},
      {"", "timers", Effect::None, "timers"},
      {"", "log_level", Effect::None, "logging"},
      {"", "prescale_gradients", Effect::None, "when gradients are divided by the world size (numerics)"},
      {"", "gradient_predivide_factor", Effect::None, "a division before the all-reduce (numerics)"},
      {"", "gradient_allreduce_op", Effect::None, "mean or sum in the all-reduce (numerics)"},
      {"", "disable_allgather", Effect::None, "communication"},
      {"", "zero_allow_untested_optimizer", Effect::None, "a check at start-up"},
      {"", "zero_force_ds_cpu_optimizer", Effect::None, "a check at start-up"},
      {"", "scheduler", Effect::None, "the learning-rate schedule"},
      {"", "checkpoint", Effect::None, "the checkpoint engine's options (tag validation, universal loading, storage)"},
      {"", "aio", Effect::None, "NVMe I/O"},
      {"", "dataloader_drop_last", Effect::None, "DeepSpeed's own data loader"},
      {"", "autotuning", Effect::None, "the autotuner's own runs"},
      {"", "use_data_before_expert_parallelism", Effect::None, "process groups"},
      {"", "managed_gradient_accumulation", Effect::None, "who calls the accumulation boundary"},
      {"", "amp", Effect::Memory, "Apex AMP keeps its own master weights and casts", [](const json& v, const json&) { return enabled(v); }},
      {"", "torch_autocast", Effect::Memory, "autocast keeps fp32 weights and casts them per use",
       [](const json& v, const json&) { return enabled(v); }},
      {"", "activation_checkpointing", Effect::Memory,
       "partitioned or CPU-checkpointed activations (DeepSpeed's checkpointing API)",
       [](const json& v, const json&) {
         return v.is_object() && ((v.contains("partition_activations") && is_true(v["partition_activations"])) ||
                                  (v.contains("cpu_checkpointing") && is_true(v["cpu_checkpointing"])) ||
                                  (v.contains("contiguous_memory_optimization") && is_true(v["contiguous_memory_optimization"])));
       }},
      {"", "sparse_attention", Effect::Memory, "sparse attention's layouts and activations"},
      {"", "pipeline", Effect::Memory, "pipeline parallelism splits the model's layers", [](const json& v, const json&) {
         return v.is_object() && !v.empty();
       }},
      {"", "progressive_layer_drop", Effect::Memory, "skipped layers keep no activations",
       [](const json& v, const json&) { return enabled(v); }},
      {"", "curriculum_learning", Effect::Memory, "the sequence length changes during training",
       [](const json& v, const json&) { return enabled(v); }},
      {"", "data_efficiency", Effect::Memory, "data routing and curriculum change the tokens per step",
       [](const json& v, const json&) { return enabled(v); }},
      {"", "eigenvalue", Effect::Memory, "the Hessian eigenvalue's extra passes", [](const json& v, const json&) { return enabled(v); }},
      {"", "compression_training", Effect::Memory, "quantized or pruned weights"},
      {"", "data_types", Effect::Memory, "gradients accumulated in another dtype",
       [](const json& v, const json&) { return v.is_object() && v.contains("grad_accum_dtype") && is_set(v["grad_accum_dtype"]); }},
      {"", "communication_data_type", Effect::Memory, "communication buffers in another dtype",
       [](const json& v, const json&) { return is_set(v); }},
      {"", "seq_parallel_communication_data_type", Effect::Memory, "sequence-parallel buffers in another dtype",
       [](const json& v, const json&) { return is_set(v); }},
      {"", "sequence_parallel_size", Effect::Memory, "sequence parallelism splits the activations",
       [](const json& v, const json&) { return above(v, 1); }},
      {"", "data_parallel_size", Effect::None, "the data-parallel degree beside sequence parallelism"},
      {"", "tensor_parallel", Effect::Memory, "tensor parallelism (AutoTP) splits the weights",
       [](const json& v, const json&) { return v.is_object() && v.contains("autotp_size") && above(v["autotp_size"], 1); }},
      {"", "expert_parallel", Effect::Memory, "expert parallelism places the experts", [](const json& v, const json&) {
         return v.is_object() && !v.empty();
       }},
      {"", "hybrid_engine", Effect::Memory, "the RLHF inference engine's buffers", [](const json& v, const json&) { return enabled(v); }},
      {"", "weight_quantization", Effect::Memory, "quantized weights"},
      {"", "compile", Effect::Memory, "torch.compile / DeepCompile (its passes offload and free differently)",
       [](const json& v, const json&) {
         if (!v.is_object()) return false;
         for (auto it = v.begin(); it != v.end(); ++it)
           if (is_true(it.value())) return true;
         return false;
       }},
      {"", "elasticity", Effect::Memory, "elastic training chooses the batch sizes", [](const json& v, const json&) { return enabled(v); }},
      {"", "nebula", Effect::Memory, "asynchronous checkpoints keep host copies", [](const json& v, const json&) { return enabled(v); }},
      {"", "datastates_ckpt", Effect::Memory, "asynchronous checkpoints keep host copies", [](const json& v, const json&) {
         return v.is_object() && !v.empty();
       }},
      {"", "sparse_gradients", Effect::Memory, "sparse embedding gradients", [](const json& v, const json&) { return is_true(v); }},
      {"", "quantize_training", Effect::Memory, "MoQ quantizes the weights as it trains (compression/, quantize_training)",
       [](const json& v, const json&) { return enabled(v); }},
      {"", "graph_harvesting", Effect::Memory, "CUDA graphs keep their own pools", [](const json& v, const json&) { return is_true(v); }},
      // ---- fp16 and bf16 (precision_config.py)
      {"fp16.", "auto_cast", Effect::None, "casts the inputs to fp16"},
      {"fp16.", "consecutive_hysteresis", Effect::None, "the loss scale's schedule"},
      {"fp16.", "fp16_master_weights_and_grads", Effect::Memory, "fp16 master weights and gradients instead of fp32",
       [](const json& v, const json&) { return is_true(v); }},
      {"bf16.", "check_grad_overflow", Effect::None, "an overflow check"},
      {"bf16.", "immediate_grad_update", Effect::Memory, "gradients applied and freed as they come (the bf16 optimizer)",
       [](const json& v, const json&) { return is_true(v); }},
      {"bf16.", "bf16_master_weights_and_grads", Effect::Memory, "bf16 master weights and gradients instead of fp32",
       [](const json& v, const json&) { return is_true(v); }},
      {"bf16.", "bf16_optimizer_states", Effect::Memory, "bf16 optimizer states instead of fp32",
       [](const json& v, const json&) { return is_true(v); }},
      // ---- optimizer
      {"optimizer.", "legacy_fusion", Effect::None, "a kernel choice"},
      {"optimizer.params.", "adam_w_mode", Effect::None, "the form of the weight decay"},
      {"optimizer.params.", "torch_adam", Effect::None, "which Adam kernel"},
      {"optimizer.params.", "bias_correction", Effect::None, "numerics"},
      {"optimizer.params.", "amsgrad", Effect::Memory, "AMSGrad keeps a third state per parameter",
       [](const json& v, const json&) { return is_true(v); }},
      // ---- zero_optimization (zero/config.py)
      {"zero_optimization.", "contiguous_gradients", Effect::None, "gradients copied into one buffer as they come"},
      {"zero_optimization.", "reduce_scatter", Effect::None, "reduce-scatter instead of all-reduce"},
      {"zero_optimization.", "allgather_partitions", Effect::None, "all-gather instead of broadcasts"},
      {"zero_optimization.", "allgather_bucket_size", Effect::None, "the all-gather's bucket (stages 1-2)"},
      // overlap_comm is read (ZeroSettings::overlap_comm: the second IPG buffer at stages 1-2).
      // sub_group_size is read (ZeroSettings::sub_group_size: stage 3's optimizer sub-groups, virtual mode).
      {"zero_optimization.", "round_robin_gradients", Effect::None, "gradient copies spread over ranks"},
      {"zero_optimization.", "use_multi_rank_bucket_allreduce", Effect::None, "communication"},
      {"zero_optimization.", "load_from_fp32_weights", Effect::None, "where a resumed run takes its master weights"},
      {"zero_optimization.", "elastic_checkpoint", Effect::None, "the checkpoint's layout"},
      {"zero_optimization.", "ignore_unused_parameters", Effect::None, "a check"},
      // legacy_stage1 is read (ZeroSettings::legacy_stage1: stage1.py's set-up).
      {"zero_optimization.", "stage3_use_all_reduce_for_fetch_params", Effect::None, "communication"},
      {"zero_optimization.", "stage3_module_granularity_threshold", Effect::None, "which modules fetch together"},
      {"zero_optimization.", "log_trace_cache_warnings", Effect::None, "logging"},
      {"zero_optimization.", "enable_sanity_checks", Effect::None, "checks"},
      {"zero_optimization.", "override_module_apply", Effect::None, "nn.Module.apply under stage 3"},
      {"zero_optimization.", "pipeline_loading_checkpoint", Effect::None, "checkpoint loading"},
      {"zero_optimization.", "zero_quantized_weights", Effect::None, "quantized all-gathers (communication only)"},
      {"zero_optimization.", "zero_quantized_gradients", Effect::None, "quantized reduce-scatters (communication only)"},
      {"zero_optimization.", "save_muon_momentum_buffer_in_memory", Effect::None, "NVMe offload only"},
      {"zero_optimization.", "leaf_module", Effect::None, "which modules fetch as one"},
      {"zero_optimization.", "mics_hierarchical_params_gather", Effect::None, "MiCS communication"},
      {"zero_optimization.", "zero_hpz_partition_size", Effect::Memory, "hpZ keeps a second, node-local partition of the weights",
       [](const json& v, const json&) { return above(v, 1); }},
      {"zero_optimization.", "mics_shard_size", Effect::Memory, "MiCS shards the states over a subgroup, not all ranks",
       [](const json& v, const json&) { return above(v, 0); }},
      {"zero_optimization.", "zero_quantized_nontrainable_weights", Effect::Memory, "frozen weights stored quantized",
       [](const json& v, const json&) { return is_true(v); }},
      {"zero_optimization.", "zeropp_loco_param", Effect::Memory, "LoCo keeps error-feedback buffers",
       [](const json& v, const json&) { return v.is_object() && !v.empty(); }},
      {"zero_optimization.", "memory_efficient_linear", Effect::Memory, "off, linear layers keep their gathered weights for backward",
       [](const json& v, const json&) { return is_false(v); }},
      {"zero_optimization.", "stage3_allgather_sequential", Effect::Memory, "no flattened all-gather buffers",
       [](const json& v, const json&) { return is_true(v); }},
      {"zero_optimization.", "stage3_model_persistence_threshold", Effect::Memory, "a bound on the parameters kept whole",
       [](const json& v, const json&) { return v.is_number() && v.get<double>() < 9.2e18; }},
      {"zero_optimization.", "zenflow", Effect::Memory, "ZenFlow's CPU-side updates and buffers",
       [](const json& v, const json&) { return v.is_object(); }},
      // ---- offload_param and offload_optimizer (zero/offload_config.py)
      {"zero_optimization.offload_param.", "nvme_path", Effect::None, "NVMe offload only"},
      {"zero_optimization.offload_param.", "buffer_count", Effect::None, "NVMe offload only"},
      {"zero_optimization.offload_param.", "buffer_size", Effect::None, "NVMe offload only"},
      {"zero_optimization.offload_param.", "max_in_cpu", Effect::None, "NVMe offload only"},
      {"zero_optimization.offload_optimizer.", "nvme_path", Effect::None, "NVMe offload only"},
      {"zero_optimization.offload_optimizer.", "buffer_count", Effect::None, "NVMe offload only"},
      {"zero_optimization.offload_optimizer.", "pipeline_read", Effect::None, "NVMe offload only"},
      {"zero_optimization.offload_optimizer.", "pipeline_write", Effect::None, "NVMe offload only"},
      {"zero_optimization.offload_optimizer.", "fast_init", Effect::None, "NVMe offload only"},
      {"zero_optimization.offload_optimizer.", "cpuadam_cores_perc", Effect::None, "CPU Adam's threads"},
      {"zero_optimization.offload_optimizer.", "super_offload", Effect::Memory, "SuperOffload's buffers on superchips",
       [](const json& v, const json&) { return is_true(v); }},
  };
  return table;
}

// Moves obj[from] to obj[to] with a note; false with `error` when both are there.
bool rename(json& obj, const std::string& where, const char* from, const char* to, const std::string& path,
            std::vector<std::string>* notes, std::string* error, const char* why) {
  if (!obj.contains(from)) return true;
  if (obj.contains(to)) {
    *error = path + ": " + where + from + " and " + where + to + " are the same setting (" + why + "): give one";
    return false;
  }
  obj[to] = obj[from];
  obj.erase(from);
  notes->push_back(path + ": " + where + from + " is " + why + ": read as " + where + to);
  return true;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> deepspeed_aliases() {
  std::vector<std::pair<std::string, std::string>> out = {{"bfloat16", "bf16"},
                                                          {"zero_optimization: true|false", "zero_optimization.stage 1|0"}};
  for (const auto& [from, to] : kZeroFieldNames)
    out.emplace_back(std::string("zero_optimization.") + from, std::string("zero_optimization.") + to);
  out.emplace_back("zero_optimization.stage3_gather_fp16_weights_on_model_save",
                   "zero_optimization.stage3_gather_16bit_weights_on_model_save");
  out.emplace_back("zero_optimization.cpu_offload: true", "zero_optimization.offload_optimizer.device cpu");
  out.emplace_back("zero_optimization.cpu_offload_param: true", "zero_optimization.offload_param.device cpu");
  out.emplace_back("zero_optimization.cpu_offload_params: true", "zero_optimization.offload_param.device cpu");
  out.emplace_back("zero_optimization.cpu_offload_use_pin_memory", "(ignored by DeepSpeed)");
  return out;
}

Status resolve_deepspeed_aliases(json& j, const std::string& path, std::vector<std::string>* notes) {
  if (!j.is_object()) return Status::Ok();  // the reader refuses it
  std::string error;
  // bf16's older name: DeepSpeed reads bf16 and falls back to bfloat16 only when bf16 is absent.
  if (j.contains("bfloat16")) {
    if (j.contains("bf16")) {
      notes->push_back(path + ": bfloat16 (bf16's older name) is ignored: bf16 is given, and DeepSpeed reads bf16 first");
      j.erase("bfloat16");
    } else if (!rename(j, "", "bfloat16", "bf16", path, notes, &error, "DeepSpeed's older name of bf16")) {
      return Status::Error(error);
    }
  }
  // The deprecated boolean form: ZeRO stage 1 (true) or off (false), its bucket from allgather_size.
  if (j.contains("zero_optimization") && j["zero_optimization"].is_boolean()) {
    const bool on = j["zero_optimization"].get<bool>();
    json zo = {{"stage", on ? 1 : 0}};
    if (on) zo["allgather_bucket_size"] = j.contains("allgather_size") ? j["allgather_size"] : json(500000000);
    j["zero_optimization"] = zo;
    j.erase("allgather_size");
    notes->push_back(path + ": zero_optimization: " + std::string(on ? "true" : "false") +
                     " is DeepSpeed's deprecated form: read as zero_optimization.stage " + (on ? "1" : "0"));
  }
  if (!j.contains("zero_optimization") || !j["zero_optimization"].is_object()) return Status::Ok();
  json& zo = j["zero_optimization"];
  const std::string w = "zero_optimization.";
  for (const auto& [from, to] : kZeroFieldNames)
    if (!rename(zo, w, from, to, path, notes, &error, "DeepSpeed's field name of the same setting"))
      return Status::Error(error);
  // Deprecated fields (DeepSpeedConfigModel._process_deprecated_field): given with their
  // replacement, DeepSpeed asserts; otherwise it sets the replacement from the old value.
  auto together = [&](const char* old_key, const std::string& new_key) {
    return Status::Error(path + ": " + w + old_key + " and " + w + new_key +
                         " together: DeepSpeed refuses them (\"Cannot provide deprecated parameter '" + old_key +
                         "' and replacing parameter '" + new_key + "' together\"); give " + w + new_key);
  };
  if (zo.contains("stage3_gather_fp16_weights_on_model_save")) {
    if (zo.contains("stage3_gather_16bit_weights_on_model_save"))
      return together("stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save");
    zo["stage3_gather_16bit_weights_on_model_save"] = zo["stage3_gather_fp16_weights_on_model_save"];
    zo.erase("stage3_gather_fp16_weights_on_model_save");
    notes->push_back(path + ": " + w +
                     "stage3_gather_fp16_weights_on_model_save is DeepSpeed's deprecated name: read as " + w +
                     "stage3_gather_16bit_weights_on_model_save");
  }
  for (const auto& [old_key, new_key] : {std::pair<const char*, const char*>{"cpu_offload", "offload_optimizer"},
                                         {"cpu_offload_param", "offload_param"}}) {
    if (!zo.contains(old_key)) continue;
    const json v = zo[old_key];
    if (v.is_string() && v.get<std::string>() == "auto") {  // DeepSpeed drops "auto" before reading
      zo.erase(old_key);
      continue;
    }
    if (!v.is_boolean())
      return Status::Error(path + ": " + w + old_key + " must be true or false, not " + v.dump());
    if (zo.contains(new_key)) return together(old_key, new_key);
    zo.erase(old_key);
    if (v.get<bool>()) zo[new_key] = {{"device", "cpu"}};
    notes->push_back(path + ": " + w + old_key + ": " + (v.get<bool>() ? "true" : "false") +
                     " is DeepSpeed's deprecated form: read as " + w + new_key +
                     (v.get<bool>() ? ".device cpu" : " off"));
  }
  // DeepSpeed 0.3 to 0.6's name of cpu_offload_param (zero/constants.py); those releases read it and
  // left offload_param unread when it was there; from 0.7 an unknown field, refused.
  if (zo.contains("cpu_offload_params")) {
    const json v = zo["cpu_offload_params"];
    if (!v.is_boolean())
      return Status::Error(path + ": " + w + "cpu_offload_params must be true or false, not " + v.dump());
    zo.erase("cpu_offload_params");
    if (zo.contains("offload_param")) {
      zo.erase("offload_param");
      notes->push_back(path + ": " + w + "offload_param is ignored: DeepSpeed 0.3 to 0.6 read cpu_offload_params instead");
    }
    if (v.get<bool>()) zo["offload_param"] = {{"device", "cpu"}};
    notes->push_back(path + ": " + w + "cpu_offload_params: " + (v.get<bool>() ? "true" : "false") +
                     " is the name of DeepSpeed 0.3 to 0.6 (later releases refuse it): read as " + w + "offload_param" +
                     (v.get<bool>() ? ".device cpu" : " off"));
  }
  if (zo.contains("cpu_offload_use_pin_memory")) {
    zo.erase("cpu_offload_use_pin_memory");
    notes->push_back(path + ": " + w +
                     "cpu_offload_use_pin_memory is deprecated and DeepSpeed ignores it (the offload blocks' pin_memory "
                     "decides, true by default): ignored here too");
  }
  return Status::Ok();
}

std::vector<std::string> deepspeed_version_notes(json j, const std::string& path) {
  std::vector<std::string> out, ignored;
  // GRADIENT_CLIPPING_DEFAULT (runtime/constants.py): 1.0 since 0.19.3, 0.0 (off) before.
  if (j.is_object() && !j.contains("gradient_clipping"))
    out.push_back(path + ": gradient_clipping is not given: 1.0, as DeepSpeed 0.19.3 and later default; DeepSpeed 0.3 "
                         "to 0.19.2 did not clip: for a report on one of those, write gradient_clipping: 0");
  if (!resolve_deepspeed_aliases(j, path, &ignored) || !j.contains("zero_optimization") ||
      !j["zero_optimization"].is_object())
    return out;
  const json& zo = j["zero_optimization"];
  // pin_memory's default (offload_config.py): false from 0.3 to 0.19.4, true since 0.19.5. Pinned
  // buffers round up to powers of two, as PyTorch's caching host allocator does.
  for (const char* block : {"offload_optimizer", "offload_param"})
    if (zo.contains(block) && zo[block].is_object() && zo[block].value("device", json("none")) == "cpu" &&
        !zo[block].contains("pin_memory"))
      out.push_back(path + ": zero_optimization." + block + ".pin_memory is not given: pinned, as DeepSpeed 0.19.5 " +
                    "and later default; DeepSpeed 0.3 to 0.19.4 kept these buffers pageable: for a report on one of " +
                    "those, write pin_memory: false");
  return out;
}

void classify_deepspeed_keys(const std::string& where, const json& obj, const std::vector<std::string>& read,
                             const json& block, const std::string& path, std::vector<std::string>* notes,
                             std::vector<std::string>* unmodeled) {
  if (!obj.is_object()) return;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(read.begin(), read.end(), k) != read.end()) continue;
    const Key* found = nullptr;
    for (const Key& key : keys())
      if (where == key.where && k == key.name) found = &key;
    const std::string name = where + k;
    if (!found) {
      notes->push_back(path + ": " + name + " is not a key DeepSpeed 0.19 reads; ignored, as DeepSpeed ignores it");
    } else if (found->effect == Effect::None) {
      notes->push_back(path + ": " + name + " is accepted; it changes no memory (" + found->what + ")");
    } else if (found->changes && !found->changes(it.value(), block)) {
      notes->push_back(path + ": " + name + " " + it.value().dump() + " is accepted; at this value it changes no memory");
    } else {
      const std::string entry = name + " " + it.value().dump() + " (" + found->what + ")";
      if (unmodeled) unmodeled->push_back(entry);
      notes->push_back(path + ": " + name + " changes memory and zerotrace does not model it (" + found->what +
                       "): a zt repro verdict from this config is INCONCLUSIVE");
    }
  }
}

}  // namespace zt::trainer
