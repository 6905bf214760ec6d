// DeepSpeed JSON configs, read as users write them for DeepSpeed and Hugging Face.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "train/deepspeed_keys.h"
#include "train/json_text.h"
#include "train/run_args.h"
#include "train/train_config.h"
#include "zt/common/files.h"

namespace zt::trainer {

namespace {
using nlohmann::json;

struct Reader {
  std::string path;
  std::vector<std::string>* warnings;
  std::string error;
  std::vector<std::string>* unmodeled = nullptr;  // keys that change memory zerotrace does not model

  bool is_auto(const json& v) const { return v.is_string() && v.get<std::string>() == "auto"; }
  // A block such as "fp16" or "zero_optimization.offload_param" must be a JSON object.
  bool object(const json& v, const std::string& name) {
    if (v.is_object()) return true;
    error = path + ": " + name + " must be an object ({...}), not " + quote_value(v);
    return false;
  }
  // A string member (absent: `fallback`); false with `error` set on a wrong type.
  bool string(const json& obj, const char* key, const std::string& where, std::string& dst, const char* fallback) {
    if (!obj.contains(key)) {
      dst = fallback;
      return true;
    }
    if (!obj[key].is_string()) {
      error = path + ": " + where + key + " must be a string, not " + quote_value(obj[key]);
      return false;
    }
    dst = obj[key].get<std::string>();
    return true;
  }
  // The keys of `obj` the reader does not read (`known`): each named with its effect (deepspeed_keys.h).
  void unknown(const std::string& where, const json& obj, std::initializer_list<const char*> known,
               const json& block = json()) {
    classify_deepspeed_keys(where, obj, std::vector<std::string>(known.begin(), known.end()), block, path, warnings,
                            unmodeled);
  }
  // A number (or "auto" -> keep `dst`); false with `error` set on a wrong type. No number a
  // DeepSpeed config gives us may be negative (sizes, counts, thresholds, scales, rates): a
  // negative reduce_bucket_size was taken as "auto" without a word.
  template <typename T>
  bool number(const json& obj, const char* key, const std::string& where, T& dst, T auto_value) {
    if (!obj.contains(key)) return true;
    const json& v = obj[key];
    if (is_auto(v)) {
      dst = auto_value;
      return true;
    }
    if (!v.is_number()) {
      error = path + ": " + where + key + " must be a number or \"auto\", not " + quote_value(v);
      return false;
    }
    if (v.get<double>() < 0) {
      error = path + ": " + where + key + " " + quote_value(v) + " must not be negative";
      return false;
    }
    if constexpr (std::is_integral_v<T>) {
      // 1.9 read as 1, or 4294967299 wrapped to 3, would be a silent change of the user's setting.
      const double d = v.get<double>();
      if (!v.is_number_integer() && d != std::floor(d)) {
        error = path + ": " + where + key + " must be a whole number, not " + quote_value(v);
        return false;
      }
      const bool fits = v.is_number_unsigned()
                            ? v.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max())
                        : v.is_number_integer()
                            ? v.get<int64_t>() >= int64_t(std::numeric_limits<T>::min()) &&
                                  v.get<int64_t>() <= int64_t(std::numeric_limits<T>::max())
                            : d >= double(std::numeric_limits<T>::min()) &&
                                  d < std::ldexp(1.0, std::numeric_limits<T>::digits);  // below max + 1
      if (!fits) {
        error = path + ": " + where + key + " " + quote_value(v) + " is out of range";
        return false;
      }
      if (v.is_number_float()) {
        dst = T(d);
        return true;
      }
    }
    dst = v.get<T>();
    return true;
  }
  bool boolean(const json& obj, const char* key, const std::string& where, bool& dst) {
    if (!obj.contains(key)) return true;
    const json& v = obj[key];
    if (is_auto(v)) return true;
    if (!v.is_boolean()) {
      error = path + ": " + where + key + " must be true, false or \"auto\", not " + quote_value(v);
      return false;
    }
    dst = v.get<bool>();
    return true;
  }
};

}  // namespace

// Reads the DeepSpeed settings of `j` into *cfg (which may be left half-changed on an error).
static Status read_config(const json& j, const std::string& path, TrainConfig* cfg, std::vector<std::string>* warnings,
                   const RunArgs& args, bool allow_todo);

Status load_deepspeed_config(const std::string& path, TrainConfig* cfg, std::vector<std::string>* warnings) {
  return load_deepspeed_config(path, cfg, warnings, RunArgs{}, false);
}

Status load_deepspeed_config(const std::string& path, TrainConfig* cfg, std::vector<std::string>* warnings,
                             const RunArgs& args, bool allow_todo) {
  std::string text;
  if (Status s = read_text_file(path, "DeepSpeed config", &text); !s) return s;
  return load_deepspeed_config_text(text, path, cfg, warnings, args, allow_todo);
}

Status load_deepspeed_config_text(const std::string& text, const std::string& path, TrainConfig* cfg,
                                  std::vector<std::string>* warnings) {
  return load_deepspeed_config_text(text, path, cfg, warnings, RunArgs{}, false);
}

Status load_deepspeed_config_text(const std::string& text, const std::string& path, TrainConfig* cfg,
                                  std::vector<std::string>* warnings, const RunArgs& args, bool allow_todo) {
  json j;
  if (Status s = parse_config_text(text, path, &j); !s) return s;
  TrainConfig c = *cfg;  // *cfg changes only when the whole file is good
  const bool valid_before = validate(c).ok();
  // DeepSpeed's other names for its keys (bfloat16, cpu_offload, stage3_gather_fp16_..., ...) read
  // as the settings they name, as DeepSpeed reads them.
  if (Status s = resolve_deepspeed_aliases(j, path, warnings); !s) return s;
  try {
    if (Status s = read_config(j, path, &c, warnings, args, allow_todo); !s) return s;
  } catch (const json::exception& e) {  // a shape the reader did not foresee: still the file's fault
    return Status::Error(path + ": " + e.what());
  }
  // The settings as a whole (lr > 0, fp16's loss scale window, ...): what was valid before this
  // file and is not after it is this file's doing, and the error names it.
  if (valid_before) {
    TrainConfig named = c;
    named.config_file = path;
    if (Status s = validate(named); !s) return s;
  }
  *cfg = c;
  return Status::Ok();
}

namespace {

// DeepSpeed's own optimizers (runtime/config.py DEEPSPEED_OPTIMIZERS, 0.19): a type that is one of
// them in any case is lower-cased; any other must be a torch.optim class (engine.py
// _is_supported_optimizer: getattr(torch.optim, name)).
const char* const kDeepSpeedOptimizers[] = {"adagrad",     "adam",   "adamw",   "lamb",  "onebitadam", "onebitlamb",
                                            "zerooneadam", "muadam", "muadamw", "musgd", "lion",       "muon"};
const char* const kTorchOptimizers[] = {"Adadelta", "Adafactor", "Adagrad", "Adam",  "AdamW",   "SparseAdam", "Adamax",
                                        "ASGD",     "LBFGS",     "NAdam",   "RAdam", "RMSprop", "Rprop",      "SGD",
                                        "Muon"};
// Optimizers whose per-parameter state is AdamW's (two fp32 moments): trained here as AdamW.
const char* const kAdamLike[] = {"adam", "adamw", "lamb", "Adam", "AdamW"};

// The fields of DeepSpeed 0.19's pydantic models, which forbid other keys (extra="forbid",
// runtime/config_utils.py DeepSpeedConfigModel), after the aliases are resolved to one name.
const std::vector<std::string>& zero_fields() {
  static const std::vector<std::string> f = {
      "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
      "allgather_partitions", "allgather_bucket_size", "overlap_comm", "load_from_fp32_weights", "elastic_checkpoint",
      "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param", "cpu_offload_use_pin_memory",
      "cpu_offload", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
      "stage3_model_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
      "stage3_gather_16bit_weights_on_model_save", "stage3_module_granularity_threshold",
      "stage3_use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "stage3_gather_fp16_weights_on_model_save",
      "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients", "zero_hpz_partition_size",
      "zero_quantized_weights", "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "zeropp_loco_param",
      "mics_shard_size", "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
      "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks", "save_muon_momentum_buffer_in_memory",
      "leaf_module"};
  return f;
}
const std::vector<std::string> kOffloadParamFields = {"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu",
                                                      "pin_memory"};
const std::vector<std::string> kOffloadOptimizerFields = {"device",        "nvme_path",      "buffer_count", "pin_memory",
                                                          "pipeline_read", "pipeline_write", "fast_init",    "ratio",
                                                          "super_offload", "cpuadam_cores_perc"};
const std::vector<std::string> kBf16Fields = {"enabled", "immediate_grad_update", "check_grad_overflow",
                                              "bf16_master_weights_and_grads", "bf16_optimizer_states"};
const std::vector<std::string> kFp16Fields = {"enabled",           "auto_cast",  "loss_scale",
                                              "initial_scale_power", "loss_scale_window", "hysteresis",
                                              "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"};

// A block DeepSpeed reads through a pydantic model that forbids other keys: a key it does not know
// is refused, as pydantic refuses it ("Extra inputs are not permitted").
Status forbid_extra(const json& obj, const std::string& where, const std::vector<std::string>& fields,
                    const std::string& path, const char* since) {
  for (auto it = obj.begin(); it != obj.end(); ++it)
    if (std::find(fields.begin(), fields.end(), it.key()) == fields.end())
      return Status::Error(path + ": " + where + it.key() + " is not a key of " + where.substr(0, where.size() - 1) +
                           ": DeepSpeed " + since + " refuses it (pydantic: \"Extra inputs are not permitted\")");
  return Status::Ok();
}

std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(int64_t(v));
  std::ostringstream o;
  o << v;
  return o.str();
}

}  // namespace

static Status read_config(const json& j_in, const std::string& path, TrainConfig* cfg,
                          std::vector<std::string>* warnings, const RunArgs& args, bool allow_todo) {
  if (!j_in.is_object()) return Status::Error(path + ": a DeepSpeed config is a JSON object");
  json j = j_in;
  TrainConfig& c = *cfg;
  c.unmodeled_memory_keys.clear();
  c.ds_resolution.clear();
  Reader r{path, warnings, {}, &c.unmodeled_memory_keys};
  ZeroSettings& z = c.zero;
  auto resolved = [&](const std::string& key, const std::string& value, const std::string& source) {
    c.ds_resolution.push_back({key, value, source});
  };
  std::vector<std::string> todo;  // "auto" keys nothing fills
  // ---- "auto", as the HF integration fills it (transformers' HfTrainerDeepSpeedConfig
  // .trainer_config_process): each from one TrainingArguments value. A key that is not "auto"
  // is left as written (the HF Trainer also checks that it matches its arguments).
  std::map<std::string, std::string> filled;  // key -> source
  auto fill = [&](json& obj, const char* key, const std::string& long_key, const char* arg, auto convert) {
    if (!obj.is_object() || !obj.contains(key) || !r.is_auto(obj[key])) return;
    if (auto v = args.get(arg)) {
      obj[key] = convert(v->value);
      const bool flag = std::string(arg) == "bf16" || std::string(arg) == "fp16";
      filled[long_key] = std::string("\"auto\": ") + arg + " " +
                         (flag ? std::string(v->value ? "true" : "false") : number_text(v->value)) + " (" + v->source + ")";
    } else {
      todo.push_back(long_key);
    }
  };
  auto as_int = [](double v) { return json(int64_t(v)); };
  auto as_float = [](double v) { return json(v); };
  auto as_bool = [](double v) { return json(v != 0); };
  const int64_t gpus = c.world_size;
  fill(j, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu", "per_device_train_batch_size", as_int);
  fill(j, "gradient_accumulation_steps", "gradient_accumulation_steps", "gradient_accumulation_steps", as_int);
  if (j.contains("train_batch_size") && r.is_auto(j["train_batch_size"])) {
    // HF: world size x per_device_train_batch_size x gradient_accumulation_steps (its arguments').
    auto m = args.get("per_device_train_batch_size"), a = args.get("gradient_accumulation_steps");
    if (m && a) {
      j["train_batch_size"] = int64_t(m->value) * int64_t(a->value) * gpus;
      filled["train_batch_size"] = "\"auto\": " + std::to_string(gpus) + " GPUs x per_device_train_batch_size " +
                                   number_text(m->value) + " x gradient_accumulation_steps " + number_text(a->value);
    } else {
      todo.push_back("train_batch_size");
    }
  }
  fill(j, "gradient_clipping", "gradient_clipping", "max_grad_norm", as_float);
  if (j.contains("optimizer") && j["optimizer"].is_object() && j["optimizer"].contains("params")) {
    json& p = j["optimizer"]["params"];
    fill(p, "lr", "optimizer.params.lr", "learning_rate", as_float);
    fill(p, "eps", "optimizer.params.eps", "adam_epsilon", as_float);
    fill(p, "weight_decay", "optimizer.params.weight_decay", "weight_decay", as_float);
    if (p.is_object() && p.contains("betas") && r.is_auto(p["betas"])) {
      auto b1 = args.get("adam_beta1"), b2 = args.get("adam_beta2");
      if (b1 && b2) {
        p["betas"] = json::array({b1->value, b2->value});
        filled["optimizer.params.betas"] = "\"auto\": adam_beta1, adam_beta2 (" + b1->source + ")";
      } else {
        todo.push_back("optimizer.params.betas");
      }
    }
  }
  if (j.contains("fp16") && j["fp16"].is_object()) fill(j["fp16"], "enabled", "fp16.enabled", "fp16", as_bool);
  if (j.contains("bf16") && j["bf16"].is_object()) fill(j["bf16"], "enabled", "bf16.enabled", "bf16", as_bool);
  auto source_of = [&](const std::string& key, const std::string& plain) {
    auto it = filled.find(key);
    return it != filled.end() ? it->second : plain;
  };

  r.unknown("", j,
            {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
             "bf16", "fp16", "optimizer", "zero_optimization", "steps_per_print", "wall_clock_breakdown"});

  // ---- the batch (runtime/config.py _set_batch_related_parameters and _batch_assertion, 0.19).
  // The data-parallel world: the GPUs over sequence_parallel_size (DeepSpeedConfig.__init__).
  double world = double(gpus);
  std::string world_text = std::to_string(gpus) + " GPUs";
  if (j.contains("sequence_parallel_size") && j["sequence_parallel_size"].is_number() &&
      j["sequence_parallel_size"].get<double>() > 1) {
    const double sp = j["sequence_parallel_size"].get<double>();
    world = double(gpus) / sp;  // DeepSpeed's true division: a float world size
    world_text = std::to_string(gpus) + " GPUs / sequence_parallel_size " + number_text(sp);
  }
  auto batch_key = [&](const char* key, const char* arg, std::optional<double>* out, std::string* src) -> bool {
    if (!j.contains(key)) {
      if (args.fill_absent && *arg)
        if (auto v = args.get(arg)) {
          *out = v->value;
          *src = std::string("not in the config: ") + arg + " " + number_text(v->value) + " (" + v->source + ")";
        }
      return true;
    }
    if (r.is_auto(j[key])) return true;  // a TODO: listed above
    int64_t v = 0;
    if (!r.number(j, key, "", v, int64_t(0))) return false;
    *out = double(v);
    *src = source_of(key, "config");
    return true;
  };
  std::optional<double> tb, mb, ga;
  std::string tb_src, mb_src, ga_src;
  if (!batch_key("train_batch_size", "", &tb, &tb_src) ||
      !batch_key("train_micro_batch_size_per_gpu", "per_device_train_batch_size", &mb, &mb_src) ||
      !batch_key("gradient_accumulation_steps", "gradient_accumulation_steps", &ga, &ga_src))
    return Status::Error(r.error);
  const bool batch_todo = std::any_of(todo.begin(), todo.end(), [](const std::string& k) {
    return k == "train_batch_size" || k == "train_micro_batch_size_per_gpu" || k == "gradient_accumulation_steps";
  });
  if (!batch_todo) {
    auto floordiv = [](double a, double b) { return std::floor(a / b); };
    if (tb && mb && ga) {
      // all three given: nothing to derive
    } else if (tb && mb) {
      ga = floordiv(floordiv(*tb, *mb), world);
      ga_src = "derived: train_batch_size " + number_text(*tb) + " // micro-batch " + number_text(*mb) + " // " + world_text;
    } else if (tb && ga) {
      mb = floordiv(floordiv(*tb, world), *ga);
      mb_src = "derived: train_batch_size " + number_text(*tb) + " // " + world_text + " // accumulation " + number_text(*ga);
    } else if (mb && ga) {
      tb = *mb * *ga * world;
      tb_src = "derived: micro-batch x accumulation x " + world_text;
    } else if (tb) {
      ga = 1;
      ga_src = "DeepSpeed's default with train_batch_size alone";
      mb = floordiv(*tb, world);
      mb_src = "derived: train_batch_size " + number_text(*tb) + " // " + world_text;
    } else if (mb) {
      tb = *mb * world;
      tb_src = "derived: micro-batch x " + world_text;
      ga = 1;
      ga_src = "DeepSpeed's default with the micro-batch alone";
    } else {
      return Status::Error(path + ": neither train_batch_size nor train_micro_batch_size_per_gpu is given: DeepSpeed "
                                  "refuses the config (\"Either train_batch_size or train_micro_batch_size_per_gpu needs "
                                  "to be provided\"); give one, or \"auto\" with the run's arguments");
    }
    if (!(*tb > 0) || !(*mb > 0) || !(*ga > 0))
      return Status::Error(path + ": train_batch_size " + number_text(*tb) + ", micro-batch " + number_text(*mb) +
                           ", accumulation " + number_text(*ga) + " at " + world_text +
                           ": DeepSpeed refuses a batch value that is not above 0 (runtime/config.py _batch_assertion)");
    if (*tb != *mb * *ga * world)
      return Status::Error(path + ": train_batch_size " + number_text(*tb) + " != train_micro_batch_size_per_gpu " +
                           number_text(*mb) + " x gradient_accumulation_steps " + number_text(*ga) + " x " + world_text +
                           ": DeepSpeed refuses it (\"Check batch related parameters. train_batch_size is not equal to "
                           "micro_batch_per_gpu * gradient_acc_step * world_size\")");
    if (*mb > double(int64_t(1) << 24) || *ga > double(int64_t(1) << 24))
      return Status::Error(path + ": batch sizes and accumulation steps must be at most 16777216");
    c.micro_batch = int64_t(*mb);
    c.grad_accum = int64_t(*ga);
    resolved("train_micro_batch_size_per_gpu", number_text(*mb), mb_src);
    resolved("gradient_accumulation_steps", number_text(*ga), ga_src);
    resolved("train_batch_size", number_text(*tb), tb_src);
  }

  // ---- clipping: DeepSpeed's default is 0.0, off (runtime/constants.py GRADIENT_CLIPPING_DEFAULT).
  if (j.contains("gradient_clipping") && !r.is_auto(j["gradient_clipping"])) {
    if (!r.number(j, "gradient_clipping", "", c.grad_clip, c.grad_clip)) return Status::Error(r.error);
    resolved("gradient_clipping", number_text(c.grad_clip), source_of("gradient_clipping", "config"));
  } else if (!j.contains("gradient_clipping")) {
    // GRADIENT_CLIPPING_DEFAULT is 1.0 since DeepSpeed 0.19.3 (0.0, off, from 0.3 to 0.19.2):
    // deepspeed_version_notes says so for a report on an older release.
    auto v = args.fill_absent ? args.get("max_grad_norm") : std::nullopt;
    c.grad_clip = v ? v->value : 1.0;
    resolved("gradient_clipping", number_text(c.grad_clip),
             v ? "not in the config: max_grad_norm (" + v->source + ")"
               : "DeepSpeed's default (1.0 since 0.19.3; 0, off, before)");
  }

  // ---- precision (runtime/precision_config.py): a block without "enabled" is off; bf16 is read
  // first, its older name bfloat16 only without it (resolved with the aliases).
  bool bf16 = false, fp16 = false;
  bool bf16_todo = false, fp16_todo = false;
  if (j.contains("bf16")) {
    if (!r.object(j["bf16"], "bf16")) return Status::Error(r.error);
    if (Status s = forbid_extra(j["bf16"], "bf16.", kBf16Fields, path, "0.17.1 and later"); !s) return s;
    r.unknown("bf16.", j["bf16"], {"enabled"});
    bf16_todo = j["bf16"].contains("enabled") && r.is_auto(j["bf16"]["enabled"]);
    if (!r.boolean(j["bf16"], "enabled", "bf16.", bf16)) return Status::Error(r.error);
  }
  if (j.contains("fp16")) {
    const json& f16 = j["fp16"];
    if (!r.object(f16, "fp16")) return Status::Error(r.error);
    if (Status s = forbid_extra(f16, "fp16.", kFp16Fields, path, "0.17.1 and later"); !s) return s;
    r.unknown("fp16.", f16, {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                             "min_loss_scale"});
    fp16_todo = f16.contains("enabled") && r.is_auto(f16["enabled"]);
    // precision_config.py (0.17.1 and later): loss_scale_window and min_loss_scale are ints, whether
    // fp16 is enabled or not.
    for (const char* key : {"loss_scale_window", "min_loss_scale", "initial_scale_power", "hysteresis"})
      if (f16.contains(key) && f16[key].is_number_float() && f16[key].get<double>() != std::floor(f16[key].get<double>()))
        return Status::Error(path + ": fp16." + key + " " + quote_value(f16[key]) + ": DeepSpeed 0.17.1 and later " +
                             "refuse it (pydantic: \"Input should be a valid integer\")");
    if (!r.boolean(f16, "enabled", "fp16.", fp16) ||
        !r.number(f16, "loss_scale", "fp16.", z.static_loss_scale, z.static_loss_scale) ||
        !r.number(f16, "initial_scale_power", "fp16.", z.initial_scale_power, z.initial_scale_power) ||
        !r.number(f16, "loss_scale_window", "fp16.", z.loss_scale_window, z.loss_scale_window) ||
        !r.number(f16, "hysteresis", "fp16.", z.hysteresis, z.hysteresis) ||
        !r.number(f16, "min_loss_scale", "fp16.", z.min_loss_scale, z.min_loss_scale))
      return Status::Error(r.error);
  }
  if (bf16 && fp16)
    return Status::Error(path + ": bf16.enabled and fp16.enabled are both true: DeepSpeed refuses it (\"bfloat16 and "
                                "fp16 modes cannot be simultaneously enabled\"); choose one");
  if (!j.contains("bf16") && !j.contains("fp16") && args.fill_absent && (args.get("bf16") || args.get("fp16"))) {
    auto b = args.get("bf16"), f = args.get("fp16");
    c.precision = b && b->value ? "bf16" : f && f->value ? "fp16" : "fp32";
    resolved("precision", c.precision, "not in the config: " + (b ? b->source : f->source));
  } else if (!(bf16_todo && !fp16) && !(fp16_todo && !bf16)) {
    c.precision = bf16 ? "bf16" : fp16 ? "fp16" : "fp32";
    const std::string src = bf16   ? source_of("bf16.enabled", "config: bf16.enabled")
                            : fp16 ? source_of("fp16.enabled", "config: fp16.enabled")
                            : filled.count("bf16.enabled") ? filled["bf16.enabled"]
                            : filled.count("fp16.enabled") ? filled["fp16.enabled"]
                            : j.contains("bf16") || j.contains("fp16")
                                ? "neither bf16 nor fp16 enabled (a block without \"enabled\" is off)"
                                : "DeepSpeed's default: no bf16 or fp16 block";
    resolved("precision", c.precision, src);
  }

  // ---- the optimizer (runtime/config.py get_optimizer_name; engine.py _is_supported_optimizer)
  c.optimizer_name.clear();
  if (j.contains("optimizer")) {
    const json& o = j["optimizer"];
    if (!r.object(o, "optimizer")) return Status::Error(r.error);
    r.unknown("optimizer.", o, {"type", "params"});
    std::string type;
    if (!r.string(o, "type", "optimizer.", type, "")) return Status::Error(r.error);
    // No type: DeepSpeed's optimizer name is None (get_optimizer_name): the client's optimizer.
    std::string lower = type;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return char(std::tolower(ch)); });
    const bool ds_own = std::find(std::begin(kDeepSpeedOptimizers), std::end(kDeepSpeedOptimizers), lower) !=
                        std::end(kDeepSpeedOptimizers);
    const bool torch_own =
        std::find(std::begin(kTorchOptimizers), std::end(kTorchOptimizers), type) != std::end(kTorchOptimizers);
    if (!type.empty() && !ds_own && !torch_own)
      return Status::Error(path + ": optimizer.type " + type + ": DeepSpeed refuses it (\"" + type +
                           " is not a supported DeepSpeed Optimizer\"): it is neither one of DeepSpeed's optimizers (adam, adamw, lamb, onebitadam, onebitlamb, "
                           "zerooneadam, adagrad, lion, muon, muadam, muadamw, musgd; any case) nor a torch.optim "
                           "class: DeepSpeed refuses it at initialize");
    c.optimizer_name = ds_own ? lower : type;
    if (type.empty())
      resolved("optimizer", "none in the config", "an optimizer block without a type: the training script's own");
    else
      resolved("optimizer", c.optimizer_name,
               ds_own && lower != type ? "config: " + type + ", as DeepSpeed lower-cases it" : "config");
    // engine.py, at initialize: what DeepSpeed refuses of the optimizer it builds from the config.
    const json params = o.contains("params") && o["params"].is_object() ? o["params"] : json::object();
    if (!type.empty() && params.contains("max_grad_norm"))
      return Status::Error(path + ": optimizer.params.max_grad_norm: DeepSpeed refuses it (\"'max_grad_norm' is not "
                                  "supported as an optimizer parameter, please switch to using the deepspeed parameter "
                                  "'gradient_clipping'\")");
    const int stage = j.contains("zero_optimization") && j["zero_optimization"].is_object() &&
                              j["zero_optimization"].contains("stage") && j["zero_optimization"]["stage"].is_number()
                          ? j["zero_optimization"]["stage"].get<int>()
                          : 0;
    const std::map<std::string, std::string> not_with_zero = {{"onebitadam", "1bit-Adam is not compatible with ZeRO"},
                                                              {"zerooneadam", "0/1 Adam is not compatible with ZeRO"},
                                                              {"onebitlamb", "1bit-Lamb is not compatible with ZeRO"}};
    if (type.empty()) {
      // nothing of engine.py's checks: DeepSpeed builds no optimizer
    } else if (stage > 0 && not_with_zero.count(c.optimizer_name))
      return Status::Error(path + ": optimizer.type " + type + " at ZeRO stage " + std::to_string(stage) +
                           ": DeepSpeed refuses it (\"" + not_with_zero.at(c.optimizer_name) + "\")");
    // ZERO_SUPPORTED_OPTIMIZERS: FusedAdam / DeepSpeedCPUAdam, Adagrad, Lion, Muon, torch's Adam and AdamW.
    const bool zero_tested = c.optimizer_name == "adam" || c.optimizer_name == "adamw" ||
                             c.optimizer_name == "adagrad" || c.optimizer_name == "lion" ||
                             c.optimizer_name == "muon" || c.optimizer_name == "Adam" || c.optimizer_name == "AdamW" ||
                             c.optimizer_name == "Adagrad";
    const bool untested_ok = j.contains("zero_allow_untested_optimizer") && j["zero_allow_untested_optimizer"].is_boolean() &&
                             j["zero_allow_untested_optimizer"].get<bool>();
    if (!type.empty() && stage > 0 && !zero_tested && !untested_ok)
      return Status::Error(path + ": optimizer.type " + type + " at ZeRO stage " + std::to_string(stage) +
                           ": DeepSpeed refuses it (\"You are using an untested ZeRO Optimizer. Please add "
                           "<\"zero_allow_untested_optimizer\": true> in the configuration file to use it.\")");
    const bool adam_like =
        std::find(std::begin(kAdamLike), std::end(kAdamLike), c.optimizer_name) != std::end(kAdamLike);
    if (!type.empty() && !adam_like) {
      c.unmodeled_memory_keys.push_back("optimizer.type " + type + " (zerotrace trains AdamW: two fp32 states a "
                                        "parameter; " + type + "'s state differs)");
      warnings->push_back(path + ": optimizer.type " + type + " is accepted, as DeepSpeed accepts it; zerotrace trains "
                                 "AdamW, whose state is not " + type + "'s: a zt repro verdict from this config is "
                                 "INCONCLUSIVE");
    } else if (!type.empty() && c.optimizer_name != "adamw" && c.optimizer_name != "AdamW") {
      warnings->push_back(path + ": optimizer.type " + type + " is trained as AdamW here: the same two fp32 states a "
                                 "parameter (the update differs, the memory does not)");
    }
    if (o.contains("params")) {
      const json& p = o["params"];
      if (!r.object(p, "optimizer.params")) return Status::Error(r.error);
      r.unknown("optimizer.params.", p, {"lr", "betas", "eps", "weight_decay"}, p);
      if (!r.number(p, "lr", "optimizer.params.", c.lr, c.lr) || !r.number(p, "eps", "optimizer.params.", c.eps, c.eps) ||
          !r.number(p, "weight_decay", "optimizer.params.", c.weight_decay, c.weight_decay))
        return Status::Error(r.error);
      if (p.contains("betas") && !r.is_auto(p["betas"])) {
        if (!p["betas"].is_array() || p["betas"].size() != 2 || !p["betas"][0].is_number() || !p["betas"][1].is_number())
          return Status::Error(path + ": optimizer.params.betas must be [beta1, beta2]");
        c.beta1 = p["betas"][0].get<double>();
        c.beta2 = p["betas"][1].get<double>();
      }
    }
  } else {
    resolved("optimizer", "none in the config", "the training script's own (the HF Trainer's: AdamW)");
  }

  // ---- zero_optimization (runtime/zero/config.py, offload_config.py): pydantic models that drop
  // "auto" (DeepSpeedConfigModel, not strict) and refuse keys they do not have.
  z.stage = 0;
  std::string offload_opt = "none", offload_par = "none";
  if (args.whole && !j.contains("zero_optimization"))
    return Status::Error(path + ": no zero_optimization block: under the HF Trainer or accelerate (the run's "
                                "TrainingArguments are given) accelerate refuses it (\"Please specify the ZeRO "
                                "optimization config in the DeepSpeed config.\")");
  if (j.contains("zero_optimization")) {
    json zo = j["zero_optimization"];
    if (!r.object(zo, "zero_optimization")) return Status::Error(r.error);
    if (Status s = forbid_extra(zo, "zero_optimization.", zero_fields(), path, "0.19"); !s) return s;
    // A field given as "auto" that the HF integration does not fill: DeepSpeed drops it and takes its default.
    for (auto it = zo.begin(); it != zo.end();) {
      if (r.is_auto(it.value()) && it.key() != "reduce_bucket_size" && it.key() != "stage3_prefetch_bucket_size" &&
          it.key() != "stage3_param_persistence_threshold") {
        warnings->push_back(path + ": zero_optimization." + it.key() + " \"auto\": DeepSpeed drops it and takes its "
                                   "default (the HF integration fills only the bucket sizes and the persistence "
                                   "threshold, from the model's width)");
        it = zo.erase(it);
      } else {
        ++it;
      }
    }
    r.unknown("zero_optimization.", zo,
              {"stage", "offload_optimizer", "offload_param", "reduce_bucket_size", "overlap_comm", "legacy_stage1", "stage3_prefetch_bucket_size",
               "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
               "stage3_gather_16bit_weights_on_model_save", "sub_group_size"},
              zo);
    const std::string w = "zero_optimization.";
    if (!r.number(zo, "stage", w, z.stage, z.stage) ||
        !r.number(zo, "reduce_bucket_size", w, z.reduce_bucket_size, int64_t(-1)) ||
        !r.number(zo, "stage3_prefetch_bucket_size", w, z.prefetch_bucket_size, int64_t(-1)) ||
        !r.number(zo, "stage3_param_persistence_threshold", w, z.param_persistence_threshold, int64_t(-1)) ||
        !r.number(zo, "stage3_max_live_parameters", w, z.max_live_parameters, z.max_live_parameters) ||
        !r.number(zo, "stage3_max_reuse_distance", w, z.max_reuse_distance, z.max_reuse_distance) ||
        !r.number(zo, "sub_group_size", w, z.sub_group_size, z.sub_group_size) ||
        !r.boolean(zo, "stage3_gather_16bit_weights_on_model_save", w, z.gather_16bit_weights_on_model_save) ||
        !r.boolean(zo, "overlap_comm", w, z.overlap_comm) || !r.boolean(zo, "legacy_stage1", w, z.legacy_stage1))
      return Status::Error(r.error);
    if (z.stage < 0 || z.stage > 3)
      return Status::Error(path + ": zero_optimization.stage must be 0, 1, 2 or 3 (DeepSpeed: \"Maximum supported ZeRO "
                                  "stage is 3\")");
    double ratio = 1.0;
    auto offload = [&](const char* key, std::string& device) -> bool {
      if (!zo.contains(key) || zo[key].is_null()) return true;
      const json& o = zo[key];
      if (!r.object(o, w + key)) return false;
      const bool optimizer = std::string(key) == "offload_optimizer";
      if (Status s = forbid_extra(o, w + key + ".", optimizer ? kOffloadOptimizerFields : kOffloadParamFields, path,
                                  "0.19");
          !s) {
        r.error = s.message();
        return false;
      }
      r.unknown(w + key + ".", o, {"device", "pin_memory", "ratio"}, o);
      if (o.contains("device") && r.is_auto(o["device"])) {
        device = "none";  // DeepSpeed drops "auto": its default
      } else if (!r.string(o, "device", w + key + ".", device, "none")) {
        return false;
      }
      if (device != "cpu" && device != "none" && device != "nvme") {
        r.error = path + ": " + w + key + ".device " + device + ": DeepSpeed takes none, cpu or nvme";
        return false;
      }
      if (optimizer) {
        if (!r.number(o, "ratio", w + key + ".", ratio, 1.0)) return false;
        if (!(ratio >= 0 && ratio <= 1)) {
          r.error = path + ": " + w + key + ".ratio " + quote_value(o["ratio"]) + " must lie in [0, 1]";
          return false;
        }
      }
      // Each offload block pins its own buffers (DeepSpeed's pin_memory of each, true by default).
      return r.boolean(o, "pin_memory", w + key + ".", optimizer ? z.pin_memory : z.param_pin_memory);
    };
    if (!offload("offload_optimizer", offload_opt) || !offload("offload_param", offload_par))
      return Status::Error(r.error);
    // zero/config.py offload_ratio_check: a partial offload below 1 only at stage 3.
    if (zo.contains("offload_optimizer") && zo["offload_optimizer"].is_object() && ratio < 1 && z.stage != 3)
      return Status::Error(path + ": " + w + "offload_optimizer.ratio " + number_text(ratio) + " at stage " +
                           std::to_string(z.stage) + ": DeepSpeed refuses it (\"Partial offloading only supported for "
                           "ZeRO Stage 3.\")");
    z.offload_ratio = offload_opt == "cpu" && z.stage == 3 ? ratio : 1.0;
    if (ratio < 1 && offload_opt != "cpu")
      warnings->push_back(path + ": " + w + "offload_optimizer.ratio has no effect without a cpu offload_optimizer");
  }
  resolved("zero_optimization.stage", std::to_string(z.stage),
           j.contains("zero_optimization") && j["zero_optimization"].contains("stage") ? "config"
                                                                                        : "DeepSpeed's default (0)");
  // Where each offload takes effect: the optimizer's at stages 1-3 (stage 0 has no ZeRO optimizer),
  // the parameters' at stage 3 only (stage_1_and_2.py never reads offload_param).
  z.offload_optimizer = false;
  z.offload_param = false;
  std::string opt_src = "config", par_src = "config";
  if (offload_opt == "nvme" && (z.stage == 1 || z.stage == 2)) {
    // stage_1_and_2.py: any device but none is cpu_offload; the NVMe swapper is stage 3's.
    warnings->push_back(path + ": zero_optimization.offload_optimizer.device nvme at stage " + std::to_string(z.stage) +
                        " is a cpu offload: stages 1 and 2 have no NVMe swapper (DeepSpeed sets cpu_offload)");
    offload_opt = "cpu";
    opt_src = "config: nvme, a cpu offload at stages 1-2 (stage_1_and_2.py)";
  }
  if (offload_opt != "none") {
    if (z.stage == 0) {
      warnings->push_back(path + ": zero_optimization.offload_optimizer is ignored at stage 0 (no ZeRO optimizer), as "
                                 "DeepSpeed ignores it");
      opt_src = "config: " + offload_opt + ", ignored at stage 0 (as DeepSpeed ignores it)";
      offload_opt = "none";
    } else {
      z.offload_optimizer = true;
    }
  }
  if (offload_par != "none") {
    if (z.stage != 3) {
      warnings->push_back(path + ": zero_optimization.offload_param is ignored at stage " + std::to_string(z.stage) +
                          ": only stage 3 partitions the parameters (DeepSpeed ignores it too)");
      par_src = "config: " + offload_par + ", ignored below stage 3 (as DeepSpeed ignores it)";
      offload_par = "none";
    } else {
      z.offload_param = true;
    }
  }
  for (const auto& [key, dev, src] :
       {std::tuple<const char*, std::string*, std::string*>{"offload_optimizer", &offload_opt, &opt_src},
        {"offload_param", &offload_par, &par_src}}) {
    const bool given = j.contains("zero_optimization") && j["zero_optimization"].contains(key);
    resolved(std::string("zero_optimization.") + key + ".device", *dev, given ? *src : "DeepSpeed's default (none)");
    if (*dev == "nvme") {
      c.unmodeled_memory_keys.push_back(std::string("zero_optimization.") + key + ".device nvme (NVMe offload: "
                                        "modeled as a cpu offload; the pinned swap buffers and the NVMe bytes are not)");
      warnings->push_back(path + ": zero_optimization." + key + ".device nvme is read as a cpu offload: the swap "
                                 "buffers are not modeled, so a zt repro verdict from this config is INCONCLUSIVE");
    }
  }

  // ---- what nothing filled
  if (!todo.empty()) {
    std::string keys;
    for (const auto& k : todo) keys += (keys.empty() ? "" : ", ") + k;
    if (!allow_todo) {
      const std::string& k = todo[0];
      const char* hint = k == "train_micro_batch_size_per_gpu" || k == "train_batch_size" ? "per_device_train_batch_size=N"
                         : k == "gradient_accumulation_steps"                             ? "gradient_accumulation_steps=N"
                         : k == "gradient_clipping"                                       ? "max_grad_norm=X"
                         : k == "fp16.enabled"                                            ? "fp16=true|false"
                         : k == "bf16.enabled"                                            ? "bf16=true|false"
                                                                                          : "NAME=VALUE";
      return Status::Error(path + ": " + keys + (todo.size() > 1 ? " are" : " is") +
                           " \"auto\" and nothing gives the run's value: the HF Trainer fills it from its "
                           "TrainingArguments; give them (--hf-args " + hint + ", a TrainingArguments JSON, or "
                           "--hf-args defaults for TrainingArguments' defaults)");
    }
    for (const auto& k : todo) resolved(k, "TODO", "\"auto\": the run's TrainingArguments decide");
  }
  c.ds_config = path;
  return Status::Ok();
}

}  // namespace zt::trainer
