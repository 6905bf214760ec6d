#include "train_config.h"

#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "zt/common/units.h"

namespace zt::trainer {

namespace {
std::string normalize(std::string key) {
  for (auto& c : key)
    if (c == '-') c = '_';
  return key;
}
}  // namespace

Status load_train_config(const std::string& path, TrainConfig* cfg) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return Status::Error(path + ": cannot open the config file");
  } catch (const YAML::Exception& e) {
    return Status::Error(path + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) return Status::Error(path + ": a config file is a mapping of settings (key: value)");
  using Setter = std::function<void(const YAML::Node&)>;
  auto size = [](uint64_t& dst) {
    return [&dst](const YAML::Node& n) {
      auto v = parse_bytes(n.as<std::string>());
      if (!v) throw YAML::Exception(n.Mark(), "'" + n.as<std::string>() + "' is not a size (try 80GiB)");
      dst = *v;
    };
  };
  TrainConfig& c = *cfg;
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
    } catch (const YAML::Exception& e) {
      return Status::Error(path + ":" + std::to_string(kv.second.Mark().line + 1) + ": bad value for '" + key +
                           "': " + (e.msg.empty() ? "wrong type" : e.msg));
    }
  }
  c.config_file = path;
  return Status::Ok();
}

Status validate(const TrainConfig& c) {
  auto bad = [&](const std::string& what) {
    return Status::Error((c.config_file.empty() ? std::string() : c.config_file + ": ") + what);
  };
  if (c.device != "sim" && c.device != "cpu" && c.device != "cuda")
    return bad("device '" + c.device + "': use sim, cpu or cuda");
  if (c.steps < 0) return bad("steps must be at least 1 (or 0 to train by epochs)");
  if (c.epochs < 0) return bad("epochs must be at least 1 (or 0 to train by steps)");
  if (c.steps > 0 && c.epochs > 0) return bad("give steps or epochs, not both");
  if (c.micro_batch < 1) return bad("micro_batch must be at least 1");
  if (c.grad_accum < 1) return bad("grad_accum must be at least 1");
  if (c.world_size < 1) return bad("world_size must be at least 1");
  if (c.seq_len < 0) return bad("seq_len must be positive (or 0 for the model's context)");
  if (c.precision != "fp32" && c.precision != "bf16" && c.precision != "fp16")
    return bad("precision '" + c.precision + "': use fp32, bf16 or fp16");
  if (c.device_memory == 0) return bad("device_memory must be positive");
  if (!(c.lr > 0)) return bad("lr must be positive");
  if (c.beta1 < 0 || c.beta1 >= 1 || c.beta2 < 0 || c.beta2 >= 1) return bad("beta1 and beta2 must lie in [0, 1)");
  if (!(c.eps > 0)) return bad("eps must be positive");
  if (c.weight_decay < 0) return bad("weight_decay must not be negative");
  if (c.grad_clip < 0) return bad("grad_clip must not be negative (0 turns it off)");
  if (c.max_doc_tokens < 0) return bad("max_doc_tokens must not be negative");
  if (c.zero.stage < 0 || c.zero.stage > 3) return bad("zero stage must be 0, 1, 2 or 3");
  if (c.zero.offload_optimizer && c.zero.stage == 0)
    return bad("offload_optimizer needs ZeRO stage 1, 2 or 3 (it offloads the optimizer partition)");
  if (c.zero.offload_param && c.zero.stage != 3) return bad("offload_param needs ZeRO stage 3 (only stage 3 partitions parameters)");
  if (c.world_size > 256) return bad("world_size above 256 rank threads is not supported in one process");
  return Status::Ok();
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
                      {"data", c.data.empty() ? "synthetic" : c.data},
                      {"max_doc_tokens", c.max_doc_tokens},
                      {"lr", c.lr},
                      {"weight_decay", c.weight_decay},
                      {"beta1", c.beta1},
                      {"beta2", c.beta2},
                      {"eps", c.eps},
                      {"grad_clip", c.grad_clip},
                      {"activation_checkpointing", c.activation_checkpointing},
                      {"zero_optimization", {{"stage", c.zero.stage},
                                             {"offload_optimizer", c.zero.offload_optimizer},
                                             {"offload_param", c.zero.offload_param},
                                             {"reduce_bucket_size", c.zero.reduce_bucket_size},
                                             {"stage3_prefetch_bucket_size", c.zero.prefetch_bucket_size},
                                             {"stage3_param_persistence_threshold", c.zero.param_persistence_threshold},
                                             {"stage3_max_live_parameters", c.zero.max_live_parameters},
                                             {"stage3_max_reuse_distance", c.zero.max_reuse_distance}}},
                      {"ds_config", c.ds_config}};
  return j.dump();
}

}  // namespace zt::trainer
