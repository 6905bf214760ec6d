// zt/db/derive_steps.h: the steps, epochs and phases of a program that says them only as
// ranges (NVTX ranges recorded through CUPTI, the zerotrace Python module's markers), turned
// into marker rows of kind step / epoch / phase, so that every reader (zt db info, zt check,
// zt export, the viewer) sees a probed program's training loop as it sees zt train's.
//
// When: once a trace is finished, never on the hot path: `zt probe` derives them in each trace
// of its run after the program has ended (a killed program too), `zt db steps` again on any
// trace. The range rows stay as they were; the derived rows are added beside them.
// derive_steps_in_memory() decides the same rows and writes nothing: `zt check` uses it on a
// trace whose probe could not derive them (killed together with its job).
//
// Sources, in order of precedence; steps and epochs each come from the first source that has
// any (so `--step-range` can give the steps and the zerotrace module the epochs):
//   1. the user's words: --step-range / --epoch-range, a range name or an ECMAScript regex,
//      matched against the whole name, with or without its NVTX domain ("domain::name").
//   2. the NVTX convention: ranges named "epoch N" / "step N" (any case; a space, '_', ':',
//      '#' or nothing before N) in the default domain or any domain but zerotrace's own.
//   3. the frameworks: DeepSpeed's own ranges (an optimizer's `step`, such as
//      DeepSpeedZeroOptimizer_Stage3.step, ends a step, which begins at the first
//      DeepSpeedEngine.forward or .backward after the previous step ended); HF
//      transformers.Trainer and PyTorch Lightning epochs and steps, which zt probe's Python
//      bootstrap writes in the domains "zerotrace.transformers" and "zerotrace.lightning".
//   4. the zerotrace module: "epoch N" / "step N" in the domain "zerotrace".
//   5. steps only: PyTorch's optimizer steps, "optimizer step" in the domain "zerotrace.torch" (zt
//      probe's bootstrap writes one around each outermost torch.optim optimizer's step; numbered in
//      time order): a plain loop's.
// Numbers: N of the name (the last number in it); where a source's names carry none, the
// ranges are numbered 0, 1, ... in time order per rank. A step gets the epoch whose span holds
// its start.
// Phases (always, where present), with the step and epoch around them: DeepSpeed's
// DeepSpeedEngine.forward / .backward / .allreduce_gradients, its optimizer's step (phase
// "optimizer") and unscale_and_clip_grads, named as zt train names its own; any other range
// of the zerotrace domain (zerotrace.phase("loss")).
//
// Invariants:
//  - Idempotent: meta `derived_markers` holds the first and last id of the derived rows, and
//    deriving again deletes them first.
//  - A trace whose program wrote step (epoch) markers itself (zt train) gets no derived steps
//    (epochs): its own markers stand.
//  - meta `steps_from` / `epochs_from` say which source gave them; `step_range` /
//    `epoch_range` keep the user's patterns (zt db steps reuses them when given none).
//  - A range name over 1 KiB serves no source (std::regex matches by recursion, a frame per
//    character: a hostile name would overflow the stack).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <optional>

#include "zt/common/status.h"
#include "zt/db/rows.h"

namespace zt::db {

class TraceReader;

struct StepRules {
  std::string step_range;   // "" = none
  std::string epoch_range;  // "" = none
};

// Ok when `pattern` is a usable range pattern; else one line naming the flag and the problem:
// "--step-range '([': not a regular expression (...)".
Status check_range_pattern(const std::string& pattern, const std::string& flag);

struct DerivedMarkers {
  int64_t steps = 0, epochs = 0, phases = 0;  // rows written
  std::string steps_from, epochs_from;        // the source, in words; "" when none
  bool own_steps = false, own_epochs = false;  // the program wrote its own: nothing derived
  // What the user should know: a pattern that matched no range (with the names the trace has),
  // a pattern that lost to the program's own markers.
  std::vector<std::string> notes;
};

// Derives the markers of the trace at `path` (a finished trace, or one whose process died:
// any readable trace), replacing those derived before. Patterns are checked first (bad ones
// fail, nothing written); empty rules reuse the patterns recorded in the trace, if any.
Status derive_steps(const std::string& path, const StepRules& rules, DerivedMarkers* out);

// One derived marker row, its name as text.
struct DerivedMarker {
  int64_t rank = 0;
  MarkerKind kind = MarkerKind::Step;
  std::string name;  // "step 3", "epoch 0", a phase's name
  int64_t t_start = 0;
  std::optional<int64_t> t_end, step, epoch;
};

// The rows derive_steps() would write, returned and not written (the trace opened read-only
// stays as it is). Rows derived earlier (meta derived_markers) are not taken for the program's
// own; `rows` holds the epochs, then the steps, then the phases. Only the rules given are used,
// never the patterns recorded in the trace: a reader of a trace it did not make does not compile
// the regular expressions in it (a deep one overflows std::regex's stack).
Status derive_steps_in_memory(const TraceReader& reader, const StepRules& rules, DerivedMarkers* out,
                              std::vector<DerivedMarker>* rows);

// The name a reader shows for a range. The bootstrap's framework hooks write theirs in a domain
// of zerotrace's ("zerotrace.transformers::step 3"), though the job never imported zerotrace:
// they are the framework's own epochs and steps, "Trainer step 3", "Lightning epoch 0". Any
// other name as it is.
std::string range_label(std::string_view name);

// "4 steps (from DeepSpeed's ranges), 0 epochs": one line for summaries.
std::string describe(const DerivedMarkers& d);

}  // namespace zt::db
