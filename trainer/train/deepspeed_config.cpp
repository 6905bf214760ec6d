// DeepSpeed JSON configs, read as users write them for DeepSpeed and Hugging Face.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <nlohmann/json.hpp>

#include "train/deepspeed_keys.h"
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
    error = path + ": " + name + " must be an object ({...}), not " + v.dump();
    return false;
  }
  // A string member (absent: `fallback`); false with `error` set on a wrong type.
  bool string(const json& obj, const char* key, const std::string& where, std::string& dst, const char* fallback) {
    if (!obj.contains(key)) {
      dst = fallback;
      return true;
    }
    if (!obj[key].is_string()) {
      error = path + ": " + where + key + " must be a string, not " + obj[key].dump();
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
      error = path + ": " + where + key + " must be a number or \"auto\", not " + v.dump();
      return false;
    }
    if (v.get<double>() < 0) {
      error = path + ": " + where + key + " " + v.dump() + " must not be negative";
      return false;
    }
    if constexpr (std::is_integral_v<T>) {
      // 1.9 read as 1, or 4294967299 wrapped to 3, would be a silent change of the user's setting.
      const double d = v.get<double>();
      if (!v.is_number_integer() && d != std::floor(d)) {
        error = path + ": " + where + key + " must be a whole number, not " + v.dump();
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
        error = path + ": " + where + key + " " + v.dump() + " is out of range";
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
      error = path + ": " + where + key + " must be true, false or \"auto\", not " + v.dump();
      return false;
    }
    dst = v.get<bool>();
    return true;
  }
};

// Reads the DeepSpeed settings of `j` into *cfg (which may be left half-changed on an error).
Status read_config(const json& j, const std::string& path, TrainConfig* cfg, std::vector<std::string>* warnings);
}  // namespace

Status load_deepspeed_config(const std::string& path, TrainConfig* cfg, std::vector<std::string>* warnings) {
  std::string text;
  if (Status s = read_text_file(path, "DeepSpeed config", &text); !s) return s;
  return load_deepspeed_config_text(text, path, cfg, warnings);
}

Status load_deepspeed_config_text(const std::string& text, const std::string& path, TrainConfig* cfg,
                                  std::vector<std::string>* warnings) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // a syntax error, or a number out of range (1e400)
    return Status::Error(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  TrainConfig c = *cfg;  // *cfg changes only when the whole file is good
  const bool valid_before = validate(c).ok();
  // DeepSpeed's other names for its keys (bfloat16, cpu_offload, stage3_gather_fp16_..., ...) read
  // as the settings they name, as DeepSpeed reads them.
  if (Status s = resolve_deepspeed_aliases(j, path, warnings); !s) return s;
  try {
    if (Status s = read_config(j, path, &c, warnings); !s) return s;
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

Status read_config(const json& j, const std::string& path, TrainConfig* cfg, std::vector<std::string>* warnings) {
  if (!j.is_object()) return Status::Error(path + ": a DeepSpeed config is a JSON object");
  TrainConfig& c = *cfg;
  c.unmodeled_memory_keys.clear();
  Reader r{path, warnings, {}, &c.unmodeled_memory_keys};
  ZeroSettings& z = c.zero;
  r.unknown("", j,
            {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
             "bf16", "fp16", "optimizer", "zero_optimization", "steps_per_print", "wall_clock_breakdown"});

  int64_t micro = c.micro_batch, accum = c.grad_accum, global = -1;
  if (!r.number(j, "train_micro_batch_size_per_gpu", "", micro, c.micro_batch) ||
      !r.number(j, "gradient_accumulation_steps", "", accum, c.grad_accum) ||
      !r.number(j, "train_batch_size", "", global, int64_t(-1)) ||
      !r.number(j, "gradient_clipping", "", c.grad_clip, c.grad_clip))
    return Status::Error(r.error);
  if (micro < 1 || accum < 1) return Status::Error(path + ": batch sizes and accumulation steps must be at least 1");
  if (micro > (int64_t(1) << 24) || accum > (int64_t(1) << 24))  // validate()'s limit, before multiplying them
    return Status::Error(path + ": batch sizes and accumulation steps must be at most 16777216");
  if (global != -1 && global != micro * accum * c.world_size) {
    // DeepSpeed asserts the same identity.
    return Status::Error(path + ": train_batch_size " + std::to_string(global) +
                         " != train_micro_batch_size_per_gpu " + std::to_string(micro) + " x gradient_accumulation_steps " +
                         std::to_string(accum) + " x world size " + std::to_string(c.world_size));
  }
  c.micro_batch = micro;
  c.grad_accum = accum;

  bool bf16 = c.precision == "bf16", fp16 = c.precision == "fp16";
  if (j.contains("bf16")) {
    if (!r.object(j["bf16"], "bf16")) return Status::Error(r.error);
    r.unknown("bf16.", j["bf16"], {"enabled"});
    if (!r.boolean(j["bf16"], "enabled", "bf16.", bf16)) return Status::Error(r.error);
  }
  if (j.contains("fp16")) {
    const json& f16 = j["fp16"];
    if (!r.object(f16, "fp16")) return Status::Error(r.error);
    r.unknown("fp16.", f16, {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                             "min_loss_scale"});
    if (!r.boolean(f16, "enabled", "fp16.", fp16) ||
        !r.number(f16, "loss_scale", "fp16.", z.static_loss_scale, z.static_loss_scale) ||
        !r.number(f16, "initial_scale_power", "fp16.", z.initial_scale_power, z.initial_scale_power) ||
        !r.number(f16, "loss_scale_window", "fp16.", z.loss_scale_window, z.loss_scale_window) ||
        !r.number(f16, "hysteresis", "fp16.", z.hysteresis, z.hysteresis) ||
        !r.number(f16, "min_loss_scale", "fp16.", z.min_loss_scale, z.min_loss_scale))
      return Status::Error(r.error);
  }
  if (bf16 && fp16) return Status::Error(path + ": bf16.enabled and fp16.enabled are both true; choose one");
  c.precision = bf16 ? "bf16" : fp16 ? "fp16" : (j.contains("bf16") || j.contains("fp16") ? "fp32" : c.precision);

  if (j.contains("optimizer")) {
    const json& o = j["optimizer"];
    if (!r.object(o, "optimizer")) return Status::Error(r.error);
    r.unknown("optimizer.", o, {"type", "params"});
    std::string type;
    if (!r.string(o, "type", "optimizer.", type, "AdamW")) return Status::Error(r.error);
    if (type != "AdamW" && type != "Adam" && type != "adamw")
      return Status::Error(path + ": optimizer.type " + type + ": only AdamW is implemented");
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
  }

  if (j.contains("zero_optimization")) {
    const json& zo = j["zero_optimization"];
    if (!r.object(zo, "zero_optimization")) return Status::Error(r.error);
    r.unknown("zero_optimization.", zo,
              {"stage", "offload_optimizer", "offload_param", "reduce_bucket_size", "stage3_prefetch_bucket_size",
               "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
               "stage3_gather_16bit_weights_on_model_save"},
              zo);
    const std::string w = "zero_optimization.";
    if (!r.number(zo, "stage", w, z.stage, z.stage) ||
        !r.number(zo, "reduce_bucket_size", w, z.reduce_bucket_size, int64_t(-1)) ||
        !r.number(zo, "stage3_prefetch_bucket_size", w, z.prefetch_bucket_size, int64_t(-1)) ||
        !r.number(zo, "stage3_param_persistence_threshold", w, z.param_persistence_threshold, int64_t(-1)) ||
        !r.number(zo, "stage3_max_live_parameters", w, z.max_live_parameters, z.max_live_parameters) ||
        !r.number(zo, "stage3_max_reuse_distance", w, z.max_reuse_distance, z.max_reuse_distance) ||
        !r.boolean(zo, "stage3_gather_16bit_weights_on_model_save", w, z.gather_16bit_weights_on_model_save))
      return Status::Error(r.error);
    auto offload = [&](const char* key, bool& on) -> bool {
      if (!zo.contains(key)) return true;
      const json& o = zo[key];
      if (!r.object(o, w + key)) return false;
      const bool optimizer = std::string(key) == "offload_optimizer";
      if (optimizer)
        r.unknown(w + key + ".", o, {"device", "pin_memory", "ratio"}, o);
      else
        r.unknown(w + key + ".", o, {"device", "pin_memory"}, o);
      std::string dev;
      if (!r.string(o, "device", w + key + ".", dev, "none")) return false;
      if (dev != "cpu" && dev != "none") {
        r.error = path + ": " + w + key + ".device " + dev + ": use cpu or none (nvme is not implemented)";
        return false;
      }
      on = dev == "cpu";
      if (optimizer) {
        // ZeRO-Offload++'s partial offload: the fraction of sub-groups (modules here) offloaded.
        if (!r.number(o, "ratio", w + key + ".", z.offload_ratio, 1.0)) return false;
        if (!(z.offload_ratio >= 0 && z.offload_ratio <= 1)) {
          r.error = path + ": " + w + key + ".ratio " + o["ratio"].dump() + " must lie in [0, 1]";
          return false;
        }
      }
      // Each offload block pins its own buffers (DeepSpeed's pin_memory of each, true by default).
      return r.boolean(o, "pin_memory", w + key + ".", optimizer ? z.pin_memory : z.param_pin_memory);
    };
    if (!offload("offload_optimizer", z.offload_optimizer) || !offload("offload_param", z.offload_param))
      return Status::Error(r.error);
    // DeepSpeed applies the ratio only to a CPU offload at stage 3 and ignores it elsewhere: so do we, saying so.
    if (z.offload_ratio < 1 && !(z.offload_optimizer && z.stage == 3)) {
      warnings->push_back(path + ": " + w + "offload_optimizer.ratio has no effect without a cpu offload_optimizer at "
                                 "stage 3 (DeepSpeed ignores it there too); ignored");
      z.offload_ratio = 1.0;
    }
  }
  if (z.stage < 0 || z.stage > 3) return Status::Error(path + ": zero_optimization.stage must be 0, 1, 2 or 3");
  c.ds_config = path;
  return Status::Ok();
}

}  // namespace
}  // namespace zt::trainer
