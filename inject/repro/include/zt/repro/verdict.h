// zt/repro/verdict.h: what a trace says about a scenario's symptom.
//
// Owns: reading the evidence back from a trace (TraceReader and SQL only: never the
// trainer's in-memory state) and judging it, Jepsen style. Each check of the expectation
// (error kind, site, message, tensors, when, faults fired, ...) is valid, invalid or unknown;
// the composition is invalid if any check is invalid, else unknown if any is unknown, else
// valid. For the bug run: valid = REPRODUCED, invalid = NOT REPRODUCED, unknown =
// INCONCLUSIVE. For the fix run: valid = CURED, invalid = NOT CURED, unknown = INCONCLUSIVE.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zt/common/status.h"
#include "zt/repro/scenario.h"

namespace zt::repro {

enum class Outcome { Valid, Invalid, Unknown };
const char* outcome_name(Outcome o);  // "valid", "invalid", "unknown"
// Invalid dominates unknown, unknown dominates valid.
Outcome compose(const std::vector<Outcome>& parts);

struct Check {
  std::string name;    // "error kind", "message", "when: micro_step", ...
  Outcome outcome = Outcome::Unknown;
  std::string detail;  // what was expected and what the trace shows
  bool mechanism = false;  // a check of the mechanism (expect.mechanism, faults_fired): see RunJudgement
};

struct FaultEvidence {
  std::string name;
  int64_t rank = 0;
  std::optional<int64_t> step;
  std::string trigger, details;
};

struct TensorAlive {
  std::string name;
  int64_t bytes = 0;
  std::string device;  // "cuda:0", "cpu"
  std::string kind;    // "device", "pinned_host", ...
};

// Everything read from one trace.
struct Evidence {
  std::string trace;
  bool readable = false;
  std::string read_error;
  std::string run_status;   // "ok", "failed", "running" (end unknown), ...
  std::string exit_detail;  // the run row's
  std::string command_line;
  int64_t world_size = 0;       // from the rank rows (a virtual run records its world size)
  int64_t ranks_recorded = 0;   // rank rows in the file
  // Progress: optimizer steps completed (step markers ended) and what was planned.
  int64_t steps_completed = 0;
  int64_t steps_fast_forwarded = 0;  // of them, counted without replay (virtual_fast_forward)
  int64_t last_epoch = -1;
  std::optional<int64_t> steps_planned, steps_per_epoch, samples_per_epoch, documents, documents_dropped;
  int64_t error_count = 0;
  // The primary error (the first of the expected kind, else the first), and where it was.
  bool has_error = false;
  int64_t error_rank = 0, error_t = 0;
  std::string error_kind, error_site, error_message;
  std::vector<std::string> error_tensors;
  std::string error_device;                       // label of the device the row names
  std::optional<int64_t> step, epoch, micro_step, step_in_epoch;
  // The error message's own figures: what it tried to allocate (PyTorch's "Tried to allocate", the
  // host allocator's "tried to pin/allocate") and PyTorch's "of which X is free".
  std::optional<int64_t> error_tried_bytes, error_free_bytes;
  std::vector<std::string> phases;                // enclosing phase markers, outermost first
  bool before_first_step = false;                 // the error came before any step began (setup)
  // Memory at the moment of failure (or at the end of the run when there was none).
  std::string device_label;                       // the rank's accelerator
  std::optional<int64_t> device_allocated, device_reserved, device_capacity;
  std::optional<int64_t> host_live, host_pinned, host_capacity;  // host segments alive, pinned reserved
  std::vector<TensorAlive> largest_alive;          // on the accelerator and the host, biggest first
  // Every tensor name alive then on the rank's devices, as "name@device:kind" (kind: device,
  // pinned_host, pageable_host; distinct): what expect.mechanism.alive is matched against.
  std::vector<std::string> alive_names;
  // Faults that fired.
  int64_t fault_count = 0;
  std::vector<FaultEvidence> faults;  // the first ones (up to 20), in time order
  std::vector<std::pair<std::string, int64_t>> faults_by_name;
};

// Reads the evidence of `trace`. `expected_kind` picks the primary error when several.
Evidence read_evidence(const std::string& trace, const std::string& expected_kind);

// One of expect.figures against the trace: predicted (the bug run's) and reported (the report's).
struct FigureCheck {
  std::string name;
  int64_t reported = 0;
  std::optional<int64_t> predicted;     // absent: the trace does not give it
  std::optional<double> relative_error;  // (predicted - reported) / reported
  double tolerance = 0.10;
  Outcome outcome = Outcome::Unknown;
  // `free` only: the band of memory outside PyTorch's allocator over which the figure holds, the run's
  // error kept (free moves byte for byte with it); lo > hi: none does (the reserved side is off).
  std::optional<std::pair<int64_t, int64_t>> outside_band;
  std::string depends_on;  // Figure::depends_on: printed, not judged (outcome Unknown, not among the checks)
  std::string detail;      // the check's sentence
};

// Where each figure's prediction comes from, read from the trace at the failure:
//   tried_to_allocate  the error message's "Tried to allocate" (host: "tried to pin/allocate")
//   already_allocated  the device's `allocated` counter (PyTorch's memory_allocated)
//   reserved           the device's `reserved` counter (PyTorch's memory_reserved)
//   capacity           the device's capacity
//   free               the error message's "of which X is free"
//   host_rss           the rank's host segments alive (pinned and pageable)
std::optional<int64_t> predicted_figure(const Evidence& e, const std::string& name);

struct RunJudgement {
  Outcome outcome = Outcome::Unknown;
  // The bug run failed with the expected kind of error, and the only checks that failed are checks
  // of the mechanism (the phase, a tensor alive, a fault fired): it failed through another
  // mechanism. Outcome Invalid; the verdict says DIFFERENT FAILURE, never REPRODUCED. When any other
  // check failed too (the right error at the wrong step, say) it is NOT REPRODUCED.
  bool different_failure = false;
  std::vector<Check> checks;
  std::vector<FigureCheck> figures;  // expect.figures, judged when the run failed with the expected error
  Evidence evidence;
};

// What a run needs for judging beyond its trace: the resolved expectation's numbers.
struct JudgeContext {
  int64_t grad_accum = 1;          // resolves micro_step: last
  int64_t expected_steps = -1;     // steps max_epochs over the full data gives (steps_lost); -1 unknown
  int64_t planned_steps = -1;      // steps the fix run must complete; -1: whatever the trace planned
  std::vector<std::string> faults; // the specs the run was given (for "faults fired")
  Status train_status;             // what train() returned
  // DeepSpeed keys of the run's config that change memory zerotrace does not model
  // (TrainConfig::unmodeled_memory_keys): any makes the judgement unknown (INCONCLUSIVE), naming them.
  std::vector<std::string> unmodeled_keys;
  // The device memory the run charged outside PyTorch's allocator (the CUDA context, NCCL's buffers:
  // train/outside_memory.h). The `free` figure is capacity - reserved - this: its check also says over
  // which band of this memory the report's free holds, the same error kept.
  int64_t outside_allocator_bytes = 0;
};

RunJudgement judge_bug(const Expectation& e, const JudgeContext& ctx, Evidence ev);
RunJudgement judge_fix(const Expectation& e, const JudgeContext& ctx, Evidence ev);

std::string verdict_word(Outcome bug);  // REPRODUCED / NOT REPRODUCED / INCONCLUSIVE
std::string verdict_word(const RunJudgement& bug);  // ... or DIFFERENT FAILURE
std::string cure_word(Outcome fix);     // CURED / NOT CURED / INCONCLUSIVE

nlohmann::json to_json(const Evidence& e);
nlohmann::json to_json(const RunJudgement& j);

}  // namespace zt::repro
