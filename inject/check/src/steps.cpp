// --steps [N]: steps run (completed step markers) against N, or against the plan the trace
// records (counter data.steps_planned). The rules are in inject/check/README.md.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "trace_data.h"
#include "zt/common/units.h"
#include "zt/db/trace_values.h"

namespace zt::check::detail {

namespace {
std::string num(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9e15) return std::to_string(int64_t(v));
  return format_count(v);
}
}  // namespace

Status check_steps(TraceData& d, const Options& o, CheckResult* out) {
  CheckResult& r = *out;
  r.name = "steps";
  // The plan: --steps N, else the trainer's data.steps_planned (written once, by rank 0).
  std::optional<int64_t> expected = o.expected_steps;
  std::string what = "expected", source = "--steps";
  std::map<std::string, double> data;  // data.* counters: the first value of each
  std::vector<double> samples_used;    // data.samples_used, a running total at each epoch's end (rank 0's, else the lowest rank's)
  int64_t samples_rank = -1;
  for (auto& c : d.counters) {
    if (c.name.rfind("data.", 0) != 0) continue;
    if (c.name == "data.samples_used") {
      if (samples_rank < 0 || c.rank < samples_rank) {
        samples_rank = c.rank;
        samples_used.clear();
      }
      if (c.rank == samples_rank) samples_used.push_back(c.value);
      continue;
    }
    data.emplace(c.name, c.value);
  }
  if (!expected) {
    auto it = data.find("data.steps_planned");
    if (it == data.end()) {
      r.outcome = Outcome::Skip;
      r.summary = "the trace records no plan (no data.steps_planned counter); give --steps N";
      return Status::Ok();
    }
    // A counter is any number in a trace: a plan must be a whole count of steps.
    const double planned = it->second;
    if (!(planned >= 0 && planned <= double(db::kMaxTraceCount) && planned == std::floor(planned))) {
      r.outcome = Outcome::Skip;
      r.summary = "the trace's data.steps_planned counter holds " + format_count(planned) +
                  ", not a count of steps; give --steps N";
      return Status::Ok();
    }
    expected = int64_t(planned);
    what = "planned";
    source = "data.steps_planned";
  }

  if (!d.derived_markers.empty()) r.context.push_back(d.derived_markers);
  if (d.steps.empty())
    r.context.push_back("the trace has no step markers: a Python program marks its steps with the zerotrace module "
                        "(with zerotrace.step(n):) or runs under the HF Trainer (docs/python-jobs.md); `zt db steps TRACE "
                        "--step-range NAME` takes them from a range of its own");

  // Per rank: completed steps (step markers that ended), the first and the last.
  struct RankSteps {
    std::set<int64_t> done;
    int64_t unfinished = -1;  // a step that began and never ended (the run died in it)
  };
  std::map<int64_t, RankSteps> per_rank;
  // Ranks only: a probed run's launcher and helpers (rank.role) run no steps of the job.
  for (auto& rk : d.ranks)
    if (rk.role == db::RankRole::Rank) per_rank[rk.rank];
  for (auto& [rank, spans] : d.steps) {
    if (d.is_process(rank)) continue;
    for (auto& s : spans) {
      if (s.ended) per_rank[rank].done.insert(s.index);
      else per_rank[rank].unfinished = s.index;
    }
  }
  if (per_rank.empty()) per_rank[0];

  int64_t reached_min = INT64_MAX, reached_max = 0;
  std::vector<std::string> problems;
  for (auto& [rank, rs] : per_rank) {
    int64_t reached = rs.done.empty() ? 0 : *rs.done.rbegin() + 1;
    int64_t first = rs.done.empty() ? 0 : *rs.done.begin();
    reached_min = std::min(reached_min, reached);
    reached_max = std::max(reached_max, reached);
    if (int64_t(rs.done.size()) != reached - first) {
      std::string gaps;
      int shown = 0;
      for (int64_t s = first; s < reached && shown < 5; ++s)
        if (!rs.done.count(s)) gaps += (shown++ ? ", " : "") + std::to_string(s);
      problems.push_back("rank " + std::to_string(rank) + " is missing steps between " + std::to_string(first) + " and " +
                         std::to_string(reached - 1) + " (" + gaps + (shown == 5 ? ", ..." : "") + ")");
    }
  }
  const int64_t n = *expected;
  const bool ok = problems.empty() && reached_min == n && reached_max == n;
  std::string run_text =
      reached_min == reached_max ? std::to_string(reached_min) : std::to_string(reached_min) + " to " + std::to_string(reached_max);
  if (ok) {
    r.summary = run_text + " of " + std::to_string(n) + " " + what + " steps run (" + source + ")";
    return Status::Ok();
  }
  r.outcome = Outcome::Fail;
  for (auto& [rank, rs] : per_rank) {
    int64_t reached = rs.done.empty() ? 0 : *rs.done.rbegin() + 1;
    if (reached == n) continue;
    std::string line = "rank " + std::to_string(rank) + ": " + std::to_string(reached) + " of " + std::to_string(n) +
                       " " + what + " steps run (" + source + "), " +
                       (reached < n ? std::to_string(n - reached) + " short" : std::to_string(reached - n) + " too many");
    if (rs.unfinished >= 0) line += "; step " + std::to_string(rs.unfinished) + " began and never ended";
    r.findings.push_back(std::move(line));
  }
  for (auto& p : problems) r.findings.push_back(p);
  // Evidence: how the run ended, its errors, and the data accounting.
  for (auto& run : d.runs)
    if (run.status != db::RunStatus::Ok) r.context.push_back(run_end_line(run));
  for (auto& line : error_lines(d, 3)) r.context.push_back(std::move(line));
  if (!data.empty() || !samples_used.empty()) {
    std::string line = "data accounting:";
    const char* keys[] = {"data.documents",          "data.documents_dropped",      "data.documents_truncated",
                          "data.tokens_truncated",   "data.samples_per_epoch",      "data.samples_per_step",
                          "data.steps_per_epoch",    "data.samples_dropped_per_epoch", "data.tail_tokens_dropped",
                          "data.steps_planned"};
    for (const char* k : keys)
      if (auto it = data.find(k); it != data.end()) line += std::string(" ") + (k + 5) + "=" + num(it->second);
    if (!samples_used.empty()) {
      line += " samples_used by each epoch's end (rank " + std::to_string(samples_rank) + ", running total)=";
      for (size_t i = 0; i < samples_used.size(); ++i) line += (i ? "," : "") + num(samples_used[i]);
    }
    r.context.push_back(std::move(line));
  }
  r.summary = run_text + " of " + std::to_string(n) + " " + what + " steps run (" + source + ")";
  return Status::Ok();
}

}  // namespace zt::check::detail
