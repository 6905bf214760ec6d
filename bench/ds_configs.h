// bench/ds_configs.h: the DeepSpeed config corpus (tests/data/ds_configs/) read by zt and judged
// against the resolution DeepSpeed 0.19 makes, written beside each file (NAME.expect.json).
// Used by bench/bench_ds_configs.cpp (a line a file and the tally) and by the corpus test.
// A file in context "hf" is read with the run's TrainingArguments: their defaults, except where
// the file gives a number for a value the arguments set (the user's arguments agree with their
// own config, as the HF Trainer requires); see tests/data/ds_configs/README.md.
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/json_text.h"
#include "train/run_args.h"
#include "train/train_config.h"

namespace zt::bench {

struct CorpusResult {
  std::string name;
  bool deepspeed_accepts = false, zt_accepts = false;
  bool same = false;   // zt resolved it as DeepSpeed does (or refused what DeepSpeed refuses)
  std::string diff;    // what differs, or zt's refusal
};

// The run's TrainingArguments for a file in context "hf": defaults, agreeing with the file's numbers.
inline trainer::RunArgs agreeing_args(const nlohmann::json& ds) {
  trainer::RunArgs a;
  a.whole = true;
  auto take = [&](const nlohmann::json& obj, const char* key, const char* arg) {
    if (obj.is_object() && obj.contains(key) && (obj[key].is_number() || obj[key].is_boolean()))
      (void)trainer::set_hf_arg(arg, obj[key], "the config's own value", &a);
  };
  take(ds, "train_micro_batch_size_per_gpu", "per_device_train_batch_size");
  take(ds, "gradient_accumulation_steps", "gradient_accumulation_steps");
  take(ds, "gradient_clipping", "max_grad_norm");
  if (ds.is_object() && ds.contains("bf16")) take(ds["bf16"], "enabled", "bf16");
  if (ds.is_object() && ds.contains("fp16")) take(ds["fp16"], "enabled", "fp16");
  // train_batch_size given with the micro-batch "auto": the arguments' micro-batch that agrees.
  if (ds.is_object() && ds.contains("train_batch_size") && ds["train_batch_size"].is_number_integer() &&
      !a.given.count("per_device_train_batch_size")) {
    const int64_t gas = a.get("gradient_accumulation_steps") ? int64_t(a.get("gradient_accumulation_steps")->value) : 1;
    const int64_t mb = ds["train_batch_size"].get<int64_t>() / (8 * gas);
    if (mb >= 1) (void)trainer::set_hf_arg("per_device_train_batch_size", mb, "the config's train_batch_size", &a);
  }
  return a;
}

inline CorpusResult judge_config(const std::string& json_path) {
  namespace fs = std::filesystem;
  CorpusResult r;
  r.name = fs::path(json_path).stem().string();
  const std::string expect_path = (fs::path(json_path).parent_path() / (r.name + ".expect.json")).string();
  std::ifstream ef(expect_path);
  const nlohmann::json e = nlohmann::json::parse(ef, nullptr, false);
  const nlohmann::json& x = e.value("expect", nlohmann::json::object());
  r.deepspeed_accepts = x.value("accepted", false);
  std::ifstream f(json_path);
  std::stringstream ss;
  ss << f.rdbuf();
  trainer::TrainConfig c;
  c.world_size = e.value("world_size", 8);
  std::vector<std::string> notes;
  trainer::RunArgs args;
  if (e.value("context", "") == "hf") {
    nlohmann::json ds;
    if (trainer::parse_config_text(ss.str(), json_path, &ds).ok()) args = agreeing_args(ds);
  }
  Status s = trainer::load_deepspeed_config_text(ss.str(), json_path, &c, &notes, args);
  r.zt_accepts = s.ok();
  if (!s.ok()) {
    r.same = !r.deepspeed_accepts;
    r.diff = r.deepspeed_accepts ? "refused: " + s.message() : "refused, as DeepSpeed";
    return r;
  }
  if (!r.deepspeed_accepts) {
    r.diff = "accepted; DeepSpeed refuses: " + x.value("refusal", std::string("?")).substr(0, 120);
    return r;
  }
  auto value = [&](const std::string& key) {
    for (const auto& v : c.ds_resolution)
      if (v.key == key) return v.value;
    return std::string("?");
  };
  auto num = [](const nlohmann::json& v) {
    std::ostringstream o;
    if (v.is_number()) {
      const double d = v.get<double>();
      if (d == std::floor(d)) o << int64_t(d);
      else o << d;
    }
    return o.str();
  };
  const std::pair<std::string, std::string> fields[] = {
      {"stage", std::to_string(c.zero.stage) + " vs " + num(x.value("stage", nlohmann::json()))},
      {"offload_optimizer", value("zero_optimization.offload_optimizer.device") + " vs " +
                                x.value("offload_optimizer", std::string("?"))},
      {"offload_param", value("zero_optimization.offload_param.device") + " vs " + x.value("offload_param", std::string("?"))},
      {"precision", c.precision + " vs " + x.value("precision", std::string("?"))},
      {"micro_batch", value("train_micro_batch_size_per_gpu") + " vs " + num(x.value("micro_batch", nlohmann::json()))},
      {"grad_accum", value("gradient_accumulation_steps") + " vs " + num(x.value("grad_accum", nlohmann::json()))},
      {"train_batch", value("train_batch_size") + " vs " + num(x.value("train_batch", nlohmann::json()))},
      {"gradient_clipping", value("gradient_clipping") + " vs " + num(x.value("gradient_clipping", nlohmann::json()))},
      {"optimizer", (c.optimizer_name.empty() ? std::string("null") : c.optimizer_name) + " vs " +
                        (x.contains("optimizer") && x["optimizer"].is_string() ? x["optimizer"].get<std::string>()
                                                                                : std::string("null"))},
  };
  for (const auto& [name, pair] : fields) {
    const size_t at = pair.find(" vs ");
    if (pair.substr(0, at) != pair.substr(at + 4)) r.diff += (r.diff.empty() ? "" : "; ") + name + " " + pair;
  }
  r.same = r.diff.empty();
  return r;
}

// Every NAME.json of `dir` that has a NAME.expect.json, sorted by name.
inline std::vector<std::string> corpus_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string p = entry.path().string();
    if (p.size() > 5 && p.substr(p.size() - 5) == ".json" && p.find(".expect.json") == std::string::npos &&
        std::filesystem::exists(p.substr(0, p.size() - 5) + ".expect.json"))
      out.push_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace zt::bench
