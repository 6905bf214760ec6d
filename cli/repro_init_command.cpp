// zt repro init: a scenario skeleton from the user's own files (their DeepSpeed config and their
// model's Hugging Face config.json), every field the user must still fill marked TODO.
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "output_paths.h"
#include "train/deepspeed_keys.h"
#include "train/hf_config.h"
#include "train/json_text.h"
#include "train/run_args.h"
#include "train/model_shape.h"
#include "train/train_config.h"
#include "zt/common/files.h"
#include "zt/common/units.h"

namespace zt::cli {

namespace {

struct InitOptions {
  std::string ds_config, hf_config, hf_args, out, name = "my-report";
  int64_t gpus = 8, nodes = 1;
  std::string gpu_memory = "80GiB", host_memory;
};

// The skeleton's text. Values read from the files are written as they are; what only the report can
// say is TODO (the scenario loader refuses a TODO, so nothing runs until it is filled).
Status skeleton(const InitOptions& o, std::string* out) {
  std::ostringstream y;
  std::vector<std::string> notes;
  trainer::HfModel hf;
  if (!o.hf_config.empty())
    if (Status s = trainer::read_hf_config(o.hf_config, &hf); !s) return s;
  nlohmann::json ds;
  trainer::TrainConfig c;
  c.world_size = o.gpus * o.nodes;
  if (!o.ds_config.empty()) {
    std::string text;
    if (Status s = read_text_file(o.ds_config, "DeepSpeed config", &text); !s) return s;
    if (Status s = trainer::parse_config_text(text, o.ds_config, &ds); !s) return s;
    trainer::RunArgs args;
    if (!o.hf_args.empty())
      if (Status s = trainer::parse_hf_args(o.hf_args, "--hf-args", &args); !s) return s;
    if (Status s = trainer::load_deepspeed_config_text(text, o.ds_config, &c, &notes, args, /*allow_todo=*/true); !s)
      return s;
    for (auto& n : trainer::deepspeed_version_notes(ds, o.ds_config)) notes.push_back(n + "  TODO: which release?");
  }
  std::string why;
  if (!parse_bytes(o.gpu_memory, &why)) return Status::Error("--gpu-memory '" + o.gpu_memory + "' " + why);
  if (!o.host_memory.empty() && !parse_bytes(o.host_memory, &why))
    return Status::Error("--host-memory '" + o.host_memory + "' " + why);
  const std::string todo = "  # TODO";
  y << "# A scenario skeleton written by `zt repro init`. Fill every line marked TODO from the report;\n"
       "# the scenario format, key by key: docs/scenario-format.md. zt repro refuses the file while a TODO is left.\n";
  if (!o.ds_config.empty()) y << "# DeepSpeed config: " << o.ds_config << "\n";
  if (!o.hf_config.empty()) y << "# model config: " << o.hf_config << "\n";
  for (const auto& n : notes) y << "# note: " << n << "\n";
  for (const auto& n : hf.notes) y << "# note: " << n << "\n";
  y << "scenario: " << o.name << "\n"
    << "report:\n"
    << "  id: TODO" << todo << ": a short name of the report (DS-2946, my-oom)\n"
    << "  sources: [TODO]" << todo << ": where the report came from (its URLs, or files)\n"
    << "  title: \"TODO: one line: framework, model, cluster, what failed\"\n"
    << "  summary: >-\n    TODO: the report's facts: the error text, its numbers, what fixed it.\n";
  y << "model:\n";
  if (!o.hf_config.empty()) {
    const std::filesystem::path out_dir = o.out.empty() ? std::filesystem::current_path()
                                                        : std::filesystem::absolute(o.out).parent_path();
    std::error_code ec;
    std::filesystem::path rel = std::filesystem::relative(std::filesystem::absolute(o.hf_config), out_dir, ec);
    if (ec || rel.empty()) rel = std::filesystem::absolute(o.hf_config);
    y << "  hf_config: " << rel.string() << "   # " << hf.family << ": "
      << format_count(double(hf.formula_params)) << " parameters (" << hf.formula_params << ", the " << hf.family
      << " formula)\n"
      << "  # read: " << trainer::describe_shape(hf.shape, false) << "\n"
      << "  note: \"TODO: what the shape approximates, if anything\"" << todo << "\n";
  } else {
    y << "  name: TODO" << todo << ": the model's name\n"
      << "  hf_config: TODO" << todo << ": its config.json (or width, layers, heads, kv_heads, ffn, vocab, context: "
      << trainer::shape_field_list() << ")\n";
  }
  y << "cluster:\n"
    << "  nodes: " << o.nodes << "\n"
    << "  gpus_per_node: " << o.gpus << "\n"
    << "  gpu: \"TODO: the GPU's name\"" << todo << "\n"
    << "  gpu_memory: " << o.gpu_memory << "\n"
    << "  host_memory: " << (o.host_memory.empty() ? "TODO" + todo + ": per node (free -g on a node)" : o.host_memory) << "\n"
    << "  # memory_watchdog: {tool: ray, kill_at: 0.95}   # a job killed at a share of the node's memory (ray, kubernetes, "
       "systemd-oomd, slurm)\n";
  // A value the config resolved, with its source; TODO where the config says "auto" and nothing
  // gave the run's arguments (the scenario loader refuses a TODO, so the skeleton cannot run).
  auto resolved = [&](const std::string& key, const std::string& arg) {
    for (const auto& r : c.ds_resolution)
      if (r.key == key) {
        if (r.value == "TODO") return "TODO" + todo + ": " + key + " is \"auto\": the run's " + arg;
        return r.value + "   # " + key + ": " + r.source;
      }
    return "TODO" + todo + ": the run's " + arg;
  };
  std::string precision = "TODO" + todo + ": bf16, fp16 or fp32 (the run's --bf16 / --fp16)";
  for (const auto& r : c.ds_resolution)
    if (r.key == "precision") precision = r.value + "   # " + r.source;
  for (const auto& r : c.ds_resolution)
    if ((r.key == "bf16.enabled" || r.key == "fp16.enabled") && r.value == "TODO")
      precision = "TODO" + todo + ": " + r.key + " is \"auto\": the run's --bf16 / --fp16 decide (bf16, fp16 or fp32)";
  y << "train:\n"
    << "  precision: " << precision << "\n"
    << "  micro_batch: " << resolved("train_micro_batch_size_per_gpu", "per_device_train_batch_size") << "\n"
    << "  grad_accum: " << resolved("gradient_accumulation_steps", "gradient_accumulation_steps") << "\n";
  if (!o.ds_config.empty()) y << "  grad_clip: " << resolved("gradient_clipping", "max_grad_norm") << "\n";
  y
    << "  seq_len: TODO" << todo << ": the run's sequence length (cutoff_len, max_seq_length)\n"
    << "  activation_checkpointing: TODO" << todo << ": gradient_checkpointing of the run (true or false)\n"
    << "  steps: 2   # enough to reach the failure (epochs: N to train by epochs)\n"
    << "  data_samples: 10000   # virtual mode: the data set's size in samples\n"
    << "  # from_pretrained: true   # the model loaded from its checkpoint (zero_init: true for zero.Init / zero3_init_flag)\n"
    << "  # finetuning: lora        # lora (lora_rank, lora_targets), freeze (trainable_layers), full\n"
    << "  # eval_steps: 100         # an evaluation every N steps (eval_samples, eval_batch, eval_accumulation_steps, eval_keep_logits)\n"
    << "  # save_every: 100         # a checkpoint every N steps (save_only_model)\n";
  if (!o.ds_config.empty()) y << "deepspeed:   # " << o.ds_config << ", as it is\n  " << ds.dump() << "\n";
  else y << "deepspeed: {}   # TODO: the run's DeepSpeed config (JSON, as it is)\n";
  y << "expect:\n"
    << "  error: TODO" << todo << ": oom, host_oom, device_mismatch, watchdog_timeout or memory_watchdog\n"
    << "  message: 'TODO'" << todo << ": a regular expression of the report's error text\n"
    << "  mechanism:   # what must have caused it: else DIFFERENT FAILURE, never REPRODUCED\n"
    << "    phase: 'TODO'" << todo << ": the phase it failed in (a regex: checkpoint, evaluation, model load, backward)\n"
    << "    # alive: ['TODO']   # tensors alive at the failure (regexes over name@device:kind)\n"
    << "fix:\n"
    << "  description: \"TODO: the report's fix, in its words\"" << todo << "\n"
    << "  train: {}   # TODO: what the fix changes (train settings; or deepspeed: a merge patch; cluster: ...)\n"
    << "small:\n"
    << "  description: \"TODO: the same mechanism at a size that runs in seconds\"" << todo << "\n"
    << "  model: {name: \"GPT-2 4 x 64\", width: 64, layers: 4, heads: 4, vocab: 256, context: 64}\n"
    << "  world_size: 2\n"
    << "  gpu_memory: TODO" << todo << ": small enough that the mechanism bites (4MiB)\n"
    << "  train: {micro_batch: 1, seq_len: 16, steps: 2, activation_checkpointing: false}\n";
  *out = y.str();
  return Status::Ok();
}

}  // namespace

void add_repro_init_command(CLI::App& repro, Action& action) {
  auto* sub = repro.add_subcommand(
      "init",
      "Write a scenario skeleton from your own files: the DeepSpeed config and the model's Hugging Face config.json\n"
      "Both are read as they are (the shape and its parameter count checked, DeepSpeed's older key names resolved); "
      "every field only the report can fill is marked TODO.\n"
      "Example: zt repro init --ds-config ds.json --hf-config config.json --gpus 8 --gpu-memory 80GiB -o my.yaml");
  auto o = std::make_shared<InitOptions>();
  sub->add_option("--ds-config", o->ds_config, "the run's DeepSpeed JSON config");
  sub->add_option("--hf-args", o->hf_args,
                  "the run's TrainingArguments, which fill the config's \"auto\": a JSON file, 'defaults', or "
                  "name=value,... (without them each \"auto\" is a TODO)");
  sub->add_option("--hf-config", o->hf_config, "the model's Hugging Face config.json (families: " + trainer::hf_families() + ")");
  sub->add_option("--gpus", o->gpus, "GPUs per node (default 8)")->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  sub->add_option("--nodes", o->nodes, "nodes (default 1)")->check(CLI::Range(int64_t(1), int64_t(1) << 16));
  sub->add_option("--gpu-memory", o->gpu_memory, "each GPU's memory (default 80GiB)");
  sub->add_option("--host-memory", o->host_memory, "each node's memory (default: a TODO)");
  sub->add_option("--name", o->name, "the scenario's name (default my-report)");
  sub->add_option("-o,--out", o->out, "the file to write (default: print it)");
  sub->callback([&action, o] {
    action = [o]() -> int {
      std::string text;
      if (Status s = skeleton(*o, &text); !s) return fail(s.message());
      if (o->out.empty()) {
        std::cout << text;
        return kExitOk;
      }
      if (Status s = check_output_path(o->out, {o->ds_config, o->hf_config}, "input"); !s) return fail(s.message());
      std::error_code ec;
      if (std::filesystem::exists(o->out, ec))
        return fail(o->out + ": exists; zt repro init does not replace a file (remove it or choose another)");
      std::ofstream f(o->out);
      f << text;
      f.close();
      if (!f) return fail(o->out + ": cannot write");
      std::cout << "wrote " << o->out << ": fill every TODO, then zt repro " << o->out << "\n";
      return kExitOk;
    };
  });
}

}  // namespace zt::cli
