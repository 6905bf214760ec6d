// inject/check/src/trace_data.h: what the checks read from a trace, loaded once in compact
// columns (a trace may hold millions of allocations), and the helpers they share.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "zt/check/check.h"
#include "zt/db/rows.h"
#include "zt/db/sites.h"
#include "zt/db/trace_reader.h"

namespace zt::check::detail {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();  // t_free of an allocation never freed

struct Alloc {
  int64_t id = 0;
  int64_t rank = 0;
  int64_t device_id = 0;
  db::MemoryKind kind = db::MemoryKind::Unknown;
  db::AllocLevel level = db::AllocLevel::Block;
  int64_t bytes = 0;
  int64_t t_alloc = 0;
  int64_t t_free = kNever;
  int64_t name_id = 0;
  int64_t stack_id = 0;
  int64_t weight = 0;  // a sampled row (TraceData::sampled): the bytes it stands for; else `bytes`
  bool alive_at(int64_t t) const { return t_alloc <= t && t < t_free; }
};

struct Span {
  int64_t t_start = 0;
  int64_t t_end = kNever;  // never ended
  bool ended = false;
  int64_t index = 0;        // the step or epoch number
};

struct CounterSample {
  int64_t rank = 0;
  int64_t device_id = 0;
  std::string name;
  int64_t t = 0;
  double value = 0;
};

class TraceData {
 public:
  static Status load(const std::string& path, std::unique_ptr<TraceData>* out);

  db::TraceReader& reader() { return *reader_; }
  const std::string& path() const { return path_; }

  std::vector<db::RunRow> runs;
  std::vector<db::RankRow> ranks;
  std::map<int64_t, db::DeviceRow> devices;  // by id
  std::unordered_map<int64_t, std::string> strings;
  std::vector<Alloc> allocs;   // rows recorded one by one: exact sums (budgets, what was alive at an error)
  std::vector<Alloc> sampled;  // the probe's sampled rows (allocations under its threshold): estimates by weight (leaks)
  std::map<int64_t, std::vector<Span>> steps;   // per rank, completed or not, by t_start
  std::map<int64_t, std::vector<Span>> epochs;  // per rank, by epoch (from epoch markers, else from steps)
  std::vector<CounterSample> counters;          // only allocated, reserved and data.*
  std::vector<db::ErrorRow> errors;
  // Host RSS samples per rank (counter host_rss), by time; values that are not a size left out.
  std::map<int64_t, std::vector<std::pair<int64_t, int64_t>>> rss;
  // Runs recorded by zt probe (run.config_json has "probe"), with the probe's host threshold.
  std::map<int64_t, std::optional<int64_t>> probed_runs;
  // Of those, the mean interval of the probe's byte sampler where the run says it (0: off; a
  // run from before the sampler says nothing: its small allocations were not sampled).
  std::map<int64_t, int64_t> sample_intervals;
  // Set when the trace had no step or epoch markers and zt check derived them from its ranges
  // (zt/db/derive_steps.h, in memory: the file is not written); what it did, in words.
  std::string derived_markers;
  // The aggregates (schema version 3: db/SCHEMA.md "Aggregates"): the live set at each epoch's
  // start (at 0) and end (at 1), per rank; and where the detail stopped (nullopt: it covers the run).
  std::map<std::tuple<int64_t, int64_t, int>, std::vector<db::EpochLiveRow>> epoch_live;  // (rank, epoch, at)
  std::optional<int64_t> detail_end;
  std::string detail_end_reason;
  // The stretches of full detail (detail_span rows, by start; empty: the whole run has detail). More than
  // one where zt probe --detail opened windows or the flight recorder wrote its ring: the allocation
  // rows are whole only inside a stretch.
  std::vector<db::DetailSpanRow> detail_spans;
  std::vector<db::StepMemoryRow> step_memory;  // loaded only where the detail ended (a capped trace)
  // The other traces of this one's run: zt probe's per-process files beside it ("<stem>.pidPID[-N].db"
  // whose run row carries this trace's run_id: its forked workers, helpers, other ranks), by path.
  // Empty for a trace of several runs (merged) or one zt probe did not write. A file beside it that
  // cannot be read is not counted: it cannot be shown to be of this run.
  std::vector<std::string> run_others;

  const std::string& str(int64_t id) const;
  bool is_accelerator(int64_t device_id) const;  // cuda or simulated GPU
  std::string device_label(int64_t device_id) const;
  std::string hostname_of(int64_t rank) const;
  // A launcher's or helper's key (rank.role): a process of the run, not a rank of the job.
  bool is_process(int64_t rank) const;
  // "rank 1", or "launcher process 4240" / "helper process 4250 of rank 1" for such a key.
  std::string who(int64_t rank) const;
  // The step running on `rank` at time t (the last step marker begun at or before t), if any.
  std::optional<int64_t> step_at(int64_t rank, int64_t t) const;
  // "f < g < h": the innermost frames of a stack worth showing, empty when none was captured.
  std::string stack_brief(int64_t stack_id, int frames = 3);
  // Where an allocation was made, as evidence shows it: its Python line ("grow (/x/leak.py:12)")
  // when its stack has Python frames, else stack_brief(); empty without a stack.
  std::string where(int64_t stack_id);
  // Whether a stack runs Python's import machinery (a frame of <frozen importlib._bootstrap...>):
  // an allocation made while a module is imported, start-up by nature.
  bool importing(int64_t stack_id);
  // What evidence groups an allocation under: its tensor name's group, or, for an allocation
  // without a name (a probed program's) that has a stack, its site (zt/db/sites.h: the Python
  // line, else the innermost native frame that is not the allocator's).
  std::string group_of(const Alloc& a);
  // The run row that recorded `rank` (the first run when the rank table does not say).
  const db::RunRow* run_of(int64_t rank) const;
  // Whether `rank` was recorded by zt probe, and its host threshold when the run says it.
  bool probed(int64_t rank, std::optional<int64_t>* host_threshold = nullptr) const;
  // The probe's sample interval for `rank` (0: its small allocations were not sampled).
  int64_t sample_interval(int64_t rank) const;

 private:
  Status load_allocations();
  Status load_markers();
  Status load_counters();
  Status load_probed_runs();
  Status load_aggregates();
  void find_run_others();
  std::string path_;
  std::unique_ptr<db::TraceReader> reader_;
  std::unordered_map<int64_t, std::string> stack_cache_;
  std::unordered_map<int64_t, bool> importing_cache_;
  std::unique_ptr<db::StackSites> sites_;  // loaded at first need
  db::StackSites* sites();
};

// Tensor names grouped as people read them: digits inside brackets become '*'
// ("adam.m[3]" -> "adam.m[*]", "offload.buffer[epoch 2]" -> "offload.buffer[epoch *]").
std::string group_name(const std::string& name);

// Memory by name at one moment: the largest groups first.
struct NamedBytes {
  std::string name;  // group_name()
  int64_t bytes = 0;
  int64_t count = 0;
  int64_t sampled = 0;        // of count, sampled rows: bytes is then an estimate
  int64_t largest_stack = 0;  // stack of the largest allocation in the group
  int64_t largest_bytes = 0;
};
std::vector<NamedBytes> sort_groups(std::map<std::string, NamedBytes>& groups, size_t top);

// "a +2.00 MiB in 2 allocations (at f < g), b +1.00 MiB ..."
std::string describe_groups(TraceData& d, const std::vector<NamedBytes>& groups, const char* sign);

std::string memory_kind_words(db::MemoryKind k);

// "run 1 ended with status failed, exit code 1: ..." (or "ended without closing the trace ...").
std::string run_end_line(const db::RunRow& run);
// The first `most` error rows as lines ("error on rank 0 at step 3 in site: kind: message"), then
// a line counting the rest.
std::vector<std::string> error_lines(const TraceData& d, size_t most);

// Each check fills *r; a failed Status means the trace could not be read (bad input).
Status check_leaks(TraceData& d, const Options& o, CheckResult* r);
Status check_placement(TraceData& d, const Options& o, CheckResult* r);
Status check_budget(TraceData& d, const Budget& b, CheckResult* r);
Status check_steps(TraceData& d, const Options& o, CheckResult* r);
Status check_run(TraceData& d, CheckResult* r);

}  // namespace zt::check::detail
