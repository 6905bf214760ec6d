// zt/repro/scenario.h: a bug report as a scenario file (inject/scenarios/*.yaml), read and
// turned into the training runs that replay it.
//
// Owns: the scenario format (documented key by key in inject/repro/README.md), its checks
// (every error names the file and the line: unknown keys, unknown faults, bad failpoint
// syntax, impossible sizes, DeepSpeed blocks the loader refuses), and the resolution of a
// scenario into a TrainConfig for one of four runs: {small, full} x {bug, fix}.
// The small variant is real compute (a GPT-2 preset on simulated GPUs, a few rank threads);
// the full variant is the report's model and cluster in virtual mode (sizes only, one
// representative rank standing for all).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/train_config.h"
#include "zt/common/status.h"

namespace zt::repro {

// One `key: value` of a `train:` block, kept with its line so a value that only fails when
// applied (in a later variant) still names where it was written.
struct Setting {
  std::string key;    // normalized: '-' read as '_'
  std::string value;  // the scalar as written
  int line = 0;       // 1-based
};

// expect.figures: one number the report gives, checked against the bug run's trace (full size
// only: the small variant is another model). A figure off by more than its tolerance fails the
// reproduction (NOT REPRODUCED, naming it); one the trace cannot give is unknown (INCONCLUSIVE).
struct Figure {
  std::string name;         // one of figure_names()
  uint64_t bytes = 0;       // the report's value
  std::string text;         // as written ("7.32GiB")
  double tolerance = 0.10;  // relative: |predicted - reported| / reported
  // `free` only: what the figure depends on that no source gives (the CUDA context of the report's stack,
  // another process on the card). Such a figure is printed, predicted against reported with the band of
  // outside memory it holds for, but not judged: the verdict says so and names it.
  int line = 0;
  std::string depends_on;  // (after `line`: tests list the fields above in order)
};
// The figures a report can give, in the order they are checked and printed: tried_to_allocate,
// already_allocated, reserved, capacity, free (PyTorch's OOM message), host_rss (the host memory a
// rank holds at the failure).
const std::vector<std::string>& figure_names();

// What the trace must show. Either an error (`error:` kind plus optional site, message,
// tensors, when) or lost steps (`steps_lost: true`: the run ends cleanly with fewer
// optimizer steps than max_epochs over the full data would give).
struct Expectation {
  std::string error;                 // error row kind: "oom", "host_oom", "device_mismatch", ...
  std::string site;                  // regex searched in the error row's site or enclosing phases
  std::string message;               // regex searched in the error text
  std::vector<std::string> tensors;  // regexes; each must match a tensor named by the error row
  bool steps_lost = false;
  // When (any left unset is not checked). micro_step: -2 = "last" (grad_accum - 1).
  std::optional<int64_t> epoch, step, step_in_epoch, micro_step;
  std::string phase;                       // regex: a phase marker around the error matches it
  std::vector<std::string> faults_fired;   // catalog names that must have fault rows
  // The mechanism (`mechanism:`): what must have caused the error, beyond its kind and text. A run
  // that fails with the expected kind where one of these does not hold failed through another
  // mechanism: DIFFERENT FAILURE, never REPRODUCED. faults_fired (here or in `mechanism:`) is one too.
  std::string mechanism_phase;               // regex over the phases around the error and its site
  std::vector<std::string> mechanism_alive;  // regexes, each matching a tensor alive at the error ("name@device")
  std::vector<Figure> figures;               // the report's numbers, in figure_names() order
  int line = 0;
};

// The changes that make the run a fix run.
struct FixSpec {
  std::string description;  // what the fix is, quoting the report
  std::string quote;        // the report's own words, when it has them
  std::vector<Setting> train;
  nlohmann::json deepspeed = nlohmann::json::object();  // JSON merge patch (RFC 7386) over the bug run's
  std::optional<std::vector<std::string>> faults;       // replaces the bug run's faults
  std::vector<std::string> remove_faults;               // or: drop the specs naming these sites
  // The cluster changed (R1's "more nodes"): full size `cluster:` keys, small `world_size`/`nodes`
  // and the memories.
  std::optional<int64_t> nodes, gpus_per_node, world_size;
  std::optional<uint64_t> gpu_memory, host_memory;
  std::optional<std::pair<std::string, double>> watchdog;  // memory_watchdog: tool and kill_at (0: none)
  int line = 0;
};

struct SmallVariant {
  std::string description;
  std::string model = "tiny";  // a GPT-2 preset, or "custom" with `shape` (GPT-2's layout, any size)
  trainer::ModelShape shape;
  int64_t world_size = 2;
  int64_t nodes = 1;
  uint64_t gpu_memory = 80ull << 30;
  uint64_t host_memory = 0;  // per node; 0 = no cap
  std::vector<Setting> train;
  nlohmann::json deepspeed = nlohmann::json::object();  // merge patch over the scenario's
  std::optional<std::vector<std::string>> faults;       // replaces the scenario's
  std::optional<Expectation> expect;                    // replaces the keys it names
  std::optional<FixSpec> fix;                           // applied after the scenario's fix
  int line = 0;
};

struct Scenario {
  std::string path;  // the file it came from
  std::string name;  // `scenario:`, also the default --keep directory zt-repro-<name>
  // The report it replays.
  std::string report_id, report_title, report_summary;
  // Where the report came from (`report.sources`; `report.seed` is the older name of one): the seed
  // article's file of docs/bug-reports.md, or the public threads' URLs.
  std::vector<std::string> report_sources;
  // The real model and cluster.
  trainer::ModelShape shape;
  std::string shape_note;  // what is approximated (MoE, MLA), said plainly
  // model: {hf_config: FILE}: the Hugging Face config the shape was read from (its path beside the
  // scenario), its family, the family formula's parameter count, the checkpoint's dtype ("" unknown).
  std::string hf_config, hf_family, checkpoint_dtype;
  // Its attn_implementation (eager, sdpa, flash_attention_2), the runs' attention unless train: names one.
  std::string hf_attention;
  double hf_attention_dropout = 0;  // its attention dropout (attention_dropout, attn_pdrop, T5's dropout_rate)
  int64_t hf_params = 0;
  std::vector<std::string> hf_notes;
  int shape_line = 0;      // the `model:` section's line (a limit on the shape and the batch together names it)
  int64_t nodes = 1, gpus_per_node = 1;
  std::string gpu;  // "A100 80GB", for messages
  uint64_t gpu_memory = 80ull << 30;
  uint64_t host_memory = 0;  // per node; 0 = no cap
  // cluster.cuda_context and cluster.nccl_channels: the full-size run's device memory outside PyTorch's
  // allocator (train/outside_memory.h). Not given: the smallest documented context (lazy loading), and
  // NCCL's ring over 2 channels where there is more than one GPU (each an assumption the run prints).
  // The small variant charges none (its GPUs are a few MiB).
  std::string cuda_context = "lazy";
  int64_t nccl_channels = 2;
  bool cuda_context_given = false, nccl_channels_given = false;
  // cluster.memory_watchdog: a job killed when its node's memory in use reaches kill_at of it (Ray,
  // Kubernetes, systemd-oomd, Slurm); both variants run under it. kill_at 0: none.
  std::string watchdog;
  double watchdog_kill_at = 0;
  std::vector<Setting> train;
  // train_args: the run's TrainingArguments by their HF names (per_device_train_batch_size,
  // max_grad_norm, bf16, ...): they fill the DeepSpeed config's "auto" (train/run_args.h).
  nlohmann::json train_args = nlohmann::json::object();
  int train_args_line = 0;
  nlohmann::json deepspeed = nlohmann::json::object();
  int deepspeed_line = 0;
  std::vector<std::string> faults;
  Expectation expect;
  FixSpec fix;
  SmallVariant small;
};

// Reads and checks a scenario file: every error is "FILE:LINE: what, and what to do".
// Both variants' bug and fix configurations are resolved once here, so a bad value in any
// of them is refused before anything runs.
Status load_scenario(const std::string& path, Scenario* out);

enum class Variant { Small, Full };
const char* variant_name(Variant v);

// The TrainConfig of one run. `seed` (when set) replaces the scenario's seed (the faults'
// probability draws follow it). `warnings` gets the DeepSpeed loader's notes on keys it
// does not implement.
Status resolve_config(const Scenario& s, Variant v, bool fix, std::optional<uint64_t> seed,
                      trainer::TrainConfig* out, std::vector<std::string>* warnings = nullptr);

// The expectation of a variant (small may override the scenario's keys).
Expectation expectation(const Scenario& s, Variant v);
// The fix, as described for a variant (description and quote of the small one's when it has them).
FixSpec fix_of(const Scenario& s, Variant v);

}  // namespace zt::repro
