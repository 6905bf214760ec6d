// The run's arguments by the HF Trainer's names (run_args.h).
#include "train/run_args.h"

#include <cmath>
#include <filesystem>
#include <sstream>

#include "train/json_text.h"
#include "train/train_config.h"
#include "zt/common/files.h"

namespace zt::trainer {

const std::vector<HfArgDefault>& hf_arg_defaults() {
  // transformers/training_args.py, TrainingArguments' fields (unchanged from 4.30 to 4.5x).
  static const std::vector<HfArgDefault> table = {
      {"per_device_train_batch_size", "int", 8},
      {"gradient_accumulation_steps", "int", 1},
      {"max_grad_norm", "float", 1.0},
      {"learning_rate", "float", 5e-5},
      {"adam_beta1", "float", 0.9},
      {"adam_beta2", "float", 0.999},
      {"adam_epsilon", "float", 1e-8},
      {"weight_decay", "float", 0.0},
      {"fp16", "bool", 0},
      {"bf16", "bool", 0},
  };
  return table;
}

namespace {
const HfArgDefault* find_arg(const std::string& name) {
  for (const HfArgDefault& d : hf_arg_defaults())
    if (name == d.name) return &d;
  return nullptr;
}
std::string names() {
  std::string s;
  for (const HfArgDefault& d : hf_arg_defaults()) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}
}  // namespace

std::optional<RunArgs::Value> RunArgs::get(const std::string& name) const {
  if (auto it = given.find(name); it != given.end()) return it->second;
  if (whole)
    if (const HfArgDefault* d = find_arg(name)) return Value{d->value, "TrainingArguments' default"};
  return std::nullopt;
}

Status set_hf_arg(const std::string& name, const nlohmann::json& v, const std::string& source, RunArgs* out) {
  const HfArgDefault* d = find_arg(name);
  if (!d) return Status::Error(source + ": " + name + " is not a TrainingArguments name zerotrace reads (" + names() + ")");
  double x = 0;
  const std::string type = d->type;
  if (type == "bool") {
    if (!v.is_boolean()) return Status::Error(source + ": " + name + " must be true or false, not " + quote_value(v));
    x = v.get<bool>() ? 1 : 0;
  } else {
    if (!v.is_number()) return Status::Error(source + ": " + name + " must be a number, not " + quote_value(v));
    x = v.get<double>();
    if (!std::isfinite(x) || x < 0) return Status::Error(source + ": " + name + " " + quote_value(v) + " must not be negative");
    if (type == "int" && (x != std::floor(x) || x < 1 || x > double(int64_t(1) << 24)))
      return Status::Error(source + ": " + name + " " + quote_value(v) + " must be a whole number from 1 to 16777216");
  }
  out->given[name] = RunArgs::Value{x, source};
  return Status::Ok();
}

void add_settings_as_args(const TrainConfig& c,
                          const std::function<std::optional<std::string>(const std::string& setting)>& source,
                          RunArgs* out) {
  const std::pair<const char*, std::pair<const char*, double>> map[] = {
      {"micro_batch", {"per_device_train_batch_size", double(c.micro_batch)}},
      {"grad_accum", {"gradient_accumulation_steps", double(c.grad_accum)}},
      {"grad_clip", {"max_grad_norm", c.grad_clip}},
      {"lr", {"learning_rate", c.lr}},
      {"weight_decay", {"weight_decay", c.weight_decay}},
      {"precision", {"bf16", c.precision == "bf16" ? 1.0 : 0.0}},
      {"precision", {"fp16", c.precision == "fp16" ? 1.0 : 0.0}},
  };
  for (const auto& [setting, arg] : map)
    if (auto src = source(setting); src && !out->given.count(arg.first)) out->given[arg.first] = {arg.second, *src};
}

Status parse_hf_args(const std::string& text, const std::string& flag, RunArgs* out) {
  if (text == "defaults") {
    out->whole = true;
    return Status::Ok();
  }
  std::error_code ec;
  if (text.find('=') == std::string::npos && std::filesystem::exists(text, ec)) {
    std::string body;
    if (Status s = read_text_file(text, "TrainingArguments JSON", &body); !s) return s;
    nlohmann::json j;
    if (Status s = parse_config_text(body, text, &j); !s) return s;
    if (!j.is_object()) return Status::Error(text + ": TrainingArguments are a JSON object");
    for (auto it = j.begin(); it != j.end(); ++it)
      if (find_arg(it.key()))
        if (Status s = set_hf_arg(it.key(), it.value(), text, out); !s) return s;
    out->whole = true;  // TrainingArguments as a whole: what it leaves out is its default
    return Status::Ok();
  }
  std::stringstream in(text);
  std::string pair;
  while (std::getline(in, pair, ',')) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos)
      return Status::Error(flag + " '" + text + "': give a TrainingArguments JSON file, 'defaults', or name=value,...");
    const std::string name = pair.substr(0, eq), value = pair.substr(eq + 1);
    nlohmann::json v;
    if (value == "true" || value == "True") v = true;
    else if (value == "false" || value == "False") v = false;
    else {
      try {
        size_t used = 0;
        const double d = std::stod(value, &used);
        if (used != value.size()) throw std::invalid_argument(value);
        v = d;
      } catch (const std::exception&) {
        return Status::Error(flag + ": " + name + "=" + value + ": not a number or true/false");
      }
    }
    if (Status s = set_hf_arg(name, v, flag, out); !s) return s;
  }
  out->whole = true;  // TrainingArguments(name=value, ...): the others are its defaults
  return Status::Ok();
}

}  // namespace zt::trainer
