// zt db info|sql|kernels|top|merge, zt export, zt synth, zt demo.
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <map>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "output_paths.h"
#include "text_width.h"
#include "zt/common/units.h"
#include "zt/db/derive_steps.h"
#include "zt/db/export.h"
#include "zt/db/torch_snapshot.h"
#include "zt/db/kernel_summary.h"
#include "zt/db/sites.h"
#include "zt/db/trace_reader.h"
#include "zt/probe/probe_config.h"
#include "zt/probe/detail_policy.h"
#include "zt/probe/recorder.h"
#include "zt/probe/synthetic.h"

namespace zt::cli {
namespace {

std::string utc_time(int64_t unix_ns) {
  std::time_t secs = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace

void print_table(std::ostream& out, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right_align,
                 const std::string& indent) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = display_width(header[c]);
  for (auto& r : rows)
    for (size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], display_width(r[c]));
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = indent;
    for (size_t c = 0; c < width.size(); ++c) {
      const std::string& v = c < r.size() ? r[c] : std::string();
      const bool last = c + 1 == width.size();
      s += (c < right_align.size() && right_align[c]) ? pad_left(v, width[c]) : last ? v : pad_right(v, width[c]);
      if (!last) s += "  ";
    }
    out << s << "\n";
  };
  line(header);
  for (auto& r : rows) line(r);
}

namespace {

std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\n") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

namespace {

// A cell of a query over a trace: its number, or `otherwise` where it holds none (NULL, or text
// that an edited file put where a number belongs: never an exception).
double number(const std::string& cell, double otherwise = 0.0) {
  char* end = nullptr;
  const double v = std::strtod(cell.c_str(), &end);
  return !cell.empty() && end == cell.c_str() + cell.size() ? v : otherwise;
}

std::map<std::string, double> first_two_by_rank(const db::QueryResult& q) {
  std::map<std::string, double> m;
  for (auto& r : q.rows) m[r[0]] = number(r[1]);
  return m;
}

// CPU AdamW's rate: per rank, its optimizer parameters (its adam.m allocations on the host: the
// optimizer offloaded) over the time of one step's "adamw" phases; "-" in virtual mode (no AdamW
// math), and where the moments are on the accelerator (a GPU's phase times its kernels' queueing).
struct AdamRate {
  std::map<std::string, double> params;
  bool virt = false;
  bool on_host(const std::string& rank) const { return params.count(rank) && params.at(rank) > 0; }
  explicit AdamRate(db::TraceReader& reader) {
    db::QueryResult q, v;
    if (reader.query("SELECT rank, sum(requested_bytes) / 4 FROM allocation_v WHERE level = 'block' AND name LIKE "
                     "'adam.m[%' AND device = 'cpu' GROUP BY rank",
                     &q))
      params = first_two_by_rank(q);
    virt = reader.query("SELECT count(*) FROM counter_v WHERE name = 'virtual.ranks_represented'", &v) &&
           !v.rows.empty() && v.rows[0][0] != "0";
  }
  std::string text(const std::string& rank, double ns_a_step) const {
    const double n = params.count(rank) ? params.at(rank) : 0.0;
    if (virt || !(n > 0) || !(ns_a_step > 0)) return "-";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f Mparam/s", n / (ns_a_step / 1e9) / 1e6);
    return buf;
  }
};

// An ordinary optimizer step's CPU AdamW (its "adamw <module>" phases on the rank thread, nothing
// beside it; the optimizer offloaded): per rank, the steps, AdamW's time a step and its rate, to
// hold against bench_cpu_adam's or bench_gpu_limits' rate alone. Nothing when no rank has such
// phases with its moments on the host.
// Whether any interned string matches a LIKE pattern: the string table is small where the marker
// table may hold millions of rows (a day's trace), so a phase that was never named is not looked for
// in a scan of every marker.
bool any_string_like(db::TraceReader& reader, const char* pattern) {
  db::QueryResult q;
  return reader.query(std::string("SELECT 1 FROM string WHERE text LIKE '") + pattern + "' LIMIT 1", &q) &&
         !q.rows.empty();
}

void print_adamw(db::TraceReader& reader) {
  db::QueryResult q;
  if (!any_string_like(reader, "adamw %")) return;
  if (!reader.query("SELECT rank, count(DISTINCT step), sum(t_end - t_start) FROM marker_v WHERE kind = 'phase' AND "
                    "name LIKE 'adamw %' AND t_end IS NOT NULL GROUP BY rank ORDER BY rank",
                    &q) ||
      q.rows.empty())
    return;
  const AdamRate rate(reader);
  std::vector<std::vector<std::string>> rows;
  for (auto& r : q.rows) {
    const double steps = number(r[1]), ns = number(r[2]);
    if (!(steps > 0) || !rate.on_host(r[0])) continue;
    rows.push_back({r[0], r[1], format_duration_ns(ns / steps), rate.text(r[0], ns / steps)});
  }
  if (rows.empty()) return;
  std::cout << "CPU AdamW (the optimizer phase's adamw phases, on the rank thread):\n";
  print_table(std::cout, {"rank", "steps", "AdamW a step", "AdamW rate"}, rows, {true, true, true, true}, "  ");
}

// The delayed update's write-back into device parameter shards (a run without offload_param): per
// rank, its copies into "<module>.shard" after the first AdamW began, and how many began before the
// apply of their update (the early write-back: a module's k-th copy is update k's, applied by the
// k-th "apply delayed update"; a copy's row has its real times on the copy lane, so an apply's own
// copies never begin before it does). Nothing for host shards (their H2D copies into "<module>.shard"
// are the prefetch's) or where no copy was made.
void print_early_write_back(db::TraceReader& reader) {
  db::QueryResult q;
  if (!reader.query("SELECT 1 FROM run WHERE json_extract(config_json, '$.zero_optimization.offload_param') = 0", &q) ||
      q.rows.empty())
    return;
  if (!reader.query("WITH c AS (SELECT rank, t_start, row_number() OVER (PARTITION BY rank, name ORDER BY t_start) AS k "
                    "FROM transfer_v t WHERE kind = 'H2D' AND name LIKE '%.shard' AND t_start > (SELECT min(m.t_start) "
                    "FROM marker_v m WHERE m.rank = t.rank AND m.name LIKE 'adamw %')), a AS (SELECT rank, t_start, "
                    "row_number() OVER (PARTITION BY rank ORDER BY t_start) AS k FROM marker_v WHERE name LIKE 'apply "
                    "delayed update%') SELECT c.rank, count(*), coalesce(sum(c.t_start < a.t_start), 0) FROM c LEFT "
                    "JOIN a ON a.rank = c.rank AND a.k = c.k GROUP BY c.rank ORDER BY c.rank",
                    &q) ||
      q.rows.empty())
    return;
  std::cout << "  weights up to the device shards (early write-back: each module's as its AdamW ends; "
               "ZT_EARLY_WRITE_BACK=0: all after the pass):\n";
  for (auto& r : q.rows)
    std::cout << "    rank " << r[0] << ": " << r[2] << " of " << r[1]
              << " copies began before the apply of their update\n";
}

// A partial optimizer offload (offload_ratio < 1 in the run's config): per rank, how many modules
// keep their optimizer state on the host and how many on the accelerator (their adam.m allocations),
// and the device AdamW's time a step (its "device adamw <module>" phases; on a GPU the queueing of its
// kernels, which run on the device's stream). Nothing for any other run.
void print_partial_offload(db::TraceReader& reader) {
  db::QueryResult cfg, where, dev;
  // Only a numeric ratio (a query's NULL reads as "NULL": a config without one, a synthetic trace's).
  if (!reader.query("SELECT json_extract(config_json, '$.zero_optimization.offload_ratio') FROM run WHERE typeof(json_extract(config_json, '$.zero_optimization.offload_ratio')) IN ('real', 'integer')",
                    &cfg) ||
      cfg.rows.empty() || !(std::strtod(cfg.rows[0][0].c_str(), nullptr) < 1))
    return;
  if (!reader.query("SELECT rank, sum(device = 'cpu'), sum(device <> 'cpu') FROM allocation_v WHERE level = 'block' AND "
                    "name LIKE 'adam.m[%' GROUP BY rank ORDER BY rank",
                    &where) ||
      !reader.query("SELECT rank, count(DISTINCT step), sum(t_end - t_start) FROM marker_v WHERE kind = 'phase' AND name "
                    "LIKE 'device adamw %' AND t_end IS NOT NULL GROUP BY rank",
                    &dev))
    return;
  std::map<std::string, std::pair<double, double>> dev_by_rank;  // rank -> (steps, ns)
  for (auto& r : dev.rows) dev_by_rank[r[0]] = {std::strtod(r[1].c_str(), nullptr), std::strtod(r[2].c_str(), nullptr)};
  std::cout << "partial optimizer offload (offload_ratio " << cfg.rows[0][0] << "):\n";
  std::vector<std::vector<std::string>> rows;
  for (auto& r : where.rows) {
    auto it = dev_by_rank.find(r[0]);
    const bool timed = it != dev_by_rank.end() && it->second.first > 0;
    rows.push_back({r[0], r[1], r[2], timed ? format_duration_ns(it->second.second / it->second.first) : "-"});
  }
  print_table(std::cout, {"rank", "modules on the host", "on the accelerator", "device AdamW a step"}, rows,
              {true, true, true, true}, "  ");
}

// zt train --delayed-update / --overlap-update: per rank, how much of the background AdamW (its
// "adamw <module>" phases of step s) ran beside step s+1's forward, loss or backward, and what the
// rank thread waited for it ("apply delayed update of step N"; overlapped: the "await update
// <module>" phases of a step): the part of the update left on the step's critical path; and AdamW's
// rate beside the step (the rank's optimizer parameters, from its adam.m allocations, over AdamW's
// time a step), to hold against bench_cpu_adam's or bench_gpu_limits' rate alone (virtual mode runs
// no AdamW math: "-"). Nothing, and false, when the trace has no such phases.
bool print_background_update(db::TraceReader& reader) {
  db::QueryResult applied, total, hidden;
  const char* adam = "SELECT rank, step, t_start, t_end FROM marker_v WHERE kind = 'phase' AND name LIKE 'adamw %' "
                     "AND t_end IS NOT NULL";
  bool overlapped = false;
  if (!any_string_like(reader, "apply delayed update of step %") && !any_string_like(reader, "await update %"))
    return false;
  if (!reader.query("SELECT rank, count(*), sum(t_end - t_start) FROM marker_v WHERE kind = 'phase' AND name LIKE "
                    "'apply delayed update of step %' AND t_end IS NOT NULL GROUP BY rank ORDER BY rank",
                    &applied))
    return false;
  if (applied.rows.empty()) {
    // Overlapped: the updates are the steps that ran AdamW; the waits, every "await update".
    if (!reader.query("SELECT rank, (SELECT count(DISTINCT b.step) FROM marker_v b WHERE b.rank = m.rank AND b.kind = "
                      "'phase' AND b.name LIKE 'adamw %'), sum(t_end - t_start) FROM marker_v m WHERE kind = 'phase' AND "
                      "name LIKE 'await update %' AND t_end IS NOT NULL GROUP BY rank ORDER BY rank",
                      &applied) ||
        applied.rows.empty())
      return false;
    overlapped = true;
  }
  // Beside the next step: AdamW's overlap with step s+1's forward, loss and backward phases, less
  // its overlap with the rank thread's waits for it inside them (the overlapped update's "await
  // update" markers lie inside the forward and the loss): waiting is not computing beside it.
  if (!reader.query(std::string("SELECT rank, sum(t_end - t_start) FROM (") + adam + ") GROUP BY rank", &total) ||
      !reader.query(std::string("WITH a AS (") + adam +
                        "), c AS (SELECT rank, step, t_start, t_end, CASE WHEN name LIKE 'await update %' THEN -1 ELSE 1 "
                        "END AS sign FROM marker_v WHERE kind = 'phase' AND (name IN ('forward', 'loss', 'backward') OR "
                        "name LIKE 'await update %') AND t_end IS NOT NULL) SELECT a.rank, sum(c.sign * (min(a.t_end, "
                        "c.t_end) - max(a.t_start, c.t_start))) FROM a JOIN c ON c.rank = a.rank AND c.step = a.step + 1 "
                        "AND c.t_start < a.t_end AND a.t_start < c.t_end GROUP BY a.rank",
                    &hidden))
    return false;
  const auto adam_ns = first_two_by_rank(total), hidden_ns = first_two_by_rank(hidden);
  const AdamRate rate(reader);
  std::cout << (overlapped ? "overlapped update (AdamW of step s beside step s+1's forward, each module awaited at its "
                             "first use):\n"
                           : "delayed parameter update (AdamW of step s beside step s+1's forward and backward):\n");
  std::vector<std::vector<std::string>> rows;
  for (auto& r : applied.rows) {
    const double updates = number(r[1]), wait = number(r[2]);
    if (!(updates > 0)) continue;
    const double a = adam_ns.count(r[0]) ? adam_ns.at(r[0]) : 0.0, h = hidden_ns.count(r[0]) ? hidden_ns.at(r[0]) : 0.0;
    rows.push_back({r[0], r[1], format_duration_ns(a / updates), rate.text(r[0], a / updates),
                    a > 0 ? std::to_string(int(100.0 * h / a + 0.5)) + "%" : "-", format_duration_ns(wait / updates)});
  }
  print_table(std::cout,
              {"rank", "updates", "AdamW a step", "AdamW rate", "beside the next step",
               overlapped ? "awaited a step" : "apply a step"},
              rows, {true, true, true, true, true, true}, "  ");
  if (!overlapped) print_early_write_back(reader);
  return true;
}

// Host memory in words that mean something there: per rank, the peak of the resident set (the
// probe's and the trainer's host_rss samples) and, in a probed program, of its allocations at or
// above the probe's threshold (malloc, mmap). Nothing when the trace has neither.
// Which steps have full detail and which only aggregates (db/SCHEMA.md, "Aggregates").
void print_detail(const db::TraceSummary::Detail& d, int64_t run_start) {
  if (!d.aggregates) {
    std::cout << "detail: the whole run (a trace from before aggregates: schema version 2 or older)\n";
    return;
  }
  auto steps = [](std::optional<int64_t> a, std::optional<int64_t> b) {
    if (!a || !b) return std::string();
    return *a == *b ? "step " + std::to_string(*a) : "steps " + std::to_string(*a) + "-" + std::to_string(*b);
  };
  const std::string agg = "aggregates: " + std::to_string(d.steps) + " step" + (d.steps == 1 ? "" : "s") + " and " +
                          std::to_string(d.epoch_boundaries) + " epoch boundar" +
                          (d.epoch_boundaries == 1 ? "y" : "ies") + " (step_memory, epoch_live)";
  if (!d.t_end) {
    std::cout << "detail: the whole run; " << agg << "\n";
    if (!d.flight_recorder.empty()) std::cout << "flight recorder: " << d.flight_recorder << "\n";
    return;
  }
  if (d.spans.size() > 1) {  // windows (--detail), the flight recorder's ring
    std::cout << "detail: " << d.steps_with_detail << " of " << d.steps << " step" << (d.steps == 1 ? "" : "s");
    if (!d.detail_steps.empty()) {
      std::string list;
      size_t shown = 0;
      for (auto& [a, b] : d.detail_steps) {
        if (++shown > 12) {
          list += ", ...";
          break;
        }
        list += (list.empty() ? "" : ", ") + (a == b ? std::to_string(a) : std::to_string(a) + "-" + std::to_string(b));
      }
      std::cout << " (" << (d.steps_with_detail == 1 ? "step " : "steps ") << list << ")";
    }
    std::cout << " in " << d.spans.size() << " stretches, aggregates only elsewhere; " << agg << "\n";
    size_t shown = 0;
    for (auto& sp : d.spans) {
      if (sp.t_end && *sp.t_end == sp.t_start && sp.t_start == run_start && shown == 0 && d.spans.size() > 1) {
        std::cout << "  no detail at the start: " << sp.end_reason << "\n";
        continue;
      }
      if (++shown > 8) {
        std::cout << "  ... " << d.spans.size() - 8 << " more (zt db sql TRACE \"SELECT * FROM detail_span\")\n";
        break;
      }
      std::cout << "  " << format_duration_ns(double(sp.t_start - run_start)) << " to "
                << (sp.t_end ? format_duration_ns(double(*sp.t_end - run_start)) : std::string("the end"))
                << (sp.end_reason.empty() ? std::string() : ": " + sp.end_reason) << "\n";
    }
    if (!d.flight_recorder.empty()) std::cout << "flight recorder: " << d.flight_recorder << "\n";
    return;
  }
  if (*d.t_end <= run_start && d.spans.size() == 1) {
    std::cout << "detail: none (" << d.end_reason << "), aggregates only; " << agg << "\n";
    if (!d.flight_recorder.empty()) std::cout << "flight recorder: " << d.flight_recorder << "\n";
    return;
  }
  std::cout << "detail: until " << format_duration_ns(double(*d.t_end - run_start)) << " into the run";
  if (d.steps > 0) {
    std::cout << " (" << d.steps_with_detail << " of " << d.steps << " steps";
    if (d.last_detail_step) std::cout << ": " << steps(d.first_step, d.last_detail_step);
    std::cout << ")";
  }
  std::cout << ", then aggregates only";
  if (d.first_aggregate_step) std::cout << " (" << steps(d.first_aggregate_step, d.last_step) << ")";
  std::cout << ": " << (d.end_reason.empty() ? "the detail stopped" : d.end_reason) << "; " << agg << "\n";
  if (!d.flight_recorder.empty()) std::cout << "flight recorder: " << d.flight_recorder << "\n";
}

void print_host_memory(db::TraceReader& reader, const db::TraceSummary& sum) {
  db::QueryResult rss, thr;
  if (!reader.query("SELECT rank, max(value) FROM counter_v WHERE name = 'host_rss' GROUP BY rank ORDER BY rank", &rss))
    return;
  (void)reader.query("SELECT json_extract(config_json, '$.host_threshold') FROM run WHERE json_valid(config_json) AND "
                     "json_extract(config_json, '$.probe') IS NOT NULL LIMIT 1",
                     &thr);
  const bool probed = !thr.rows.empty() && thr.rows[0][0] != "NULL";
  const double threshold = probed ? number(thr.rows[0][0], -1.0) : -1.0;
  std::map<std::string, std::string> rss_by_rank;
  for (auto& r : rss.rows) rss_by_rank[r[0]] = r[1];
  for (auto& d : sum.devices) {
    if (d.device.kind != db::DeviceKind::Cpu) continue;
    const std::string rank = std::to_string(d.device.rank);
    const bool has_rss = rss_by_rank.count(rank) && number(rss_by_rank[rank], -1.0) >= 0;
    if (!has_rss && !(probed && d.peak_reserved > 0)) continue;
    // A launcher's or helper's key is not a rank (rank.role): its role and pid instead.
    std::string who = "rank " + rank;
    for (auto& r : sum.ranks)
      if (r.rank == d.device.rank && r.role != db::RankRole::Rank)
        who = std::string(db::to_string(r.role)) + " process " + std::to_string(r.pid) +
              (r.job_rank ? " of rank " + std::to_string(*r.job_rank) : "");
    std::cout << "host memory of " << who << ":";
    if (has_rss) std::cout << " resident set (RSS) peaked at " << format_bytes(number(rss_by_rank[rank]));
    if (probed && d.blocks == 0)
      std::cout << (has_rss ? ";" : "") << " allocations"
                << (threshold >= 0 ? " of " + format_bytes(threshold) + " or more" : std::string())
                << " (malloc, mmap) peaked at " << format_bytes(double(d.peak_reserved)) << ", "
                << format_bytes(double(d.reserved_at_end)) << " left at the end";
    std::cout << "\n";
  }
}

}  // namespace

int db_info(const std::string& path) {
  std::unique_ptr<db::TraceReader> reader;
  if (Status s = db::TraceReader::open(path, &reader); !s) return fail(s.message());
  db::TraceSummary sum;
  if (Status s = reader->summarize(&sum); !s) return fail(s.message());
  std::error_code ec;
  auto size = std::filesystem::file_size(path, ec);
  std::cout << "trace: " << path << " (schema " << reader->schema_version() << ", " << format_bytes(double(size)) << ")\n";
  for (auto& run : sum.runs) {
    std::cout << "run " << run.id << ": " << run.command_line << "\n";
    std::cout << "  zt " << run.tool_version << " on " << run.hostname << ", pid " << run.pid << ", started "
              << utc_time(run.wall_start_unix_ns);
    if (run.seed) std::cout << ", seed " << *run.seed;
    std::cout << "\n";
    if (run.status == db::RunStatus::Running) {
      std::cout << "  status: end unknown: the process stopped without closing the trace (killed, or still "
                   "running); everything up to its last commit is here\n";
    } else {
      std::cout << "  status: " << db::to_string(run.status);
      if (run.exit_code) std::cout << ", exit code " << *run.exit_code;
      if (!run.exit_detail.empty()) std::cout << " (" << run.exit_detail << ")";
      if (run.t_end) std::cout << ", ran " << format_duration_ns(double(*run.t_end - run.t_start));
      std::cout << "\n";
    }
    if (!run.source_file.empty()) std::cout << "  merged from: " << run.source_file << "\n";
  }
  // The world size the ranks recorded (the launcher's or the communicator's): a probed run's
  // process images (compiler checks, workers) are rows of their own, not ranks of the job.
  // Launchers and helpers (rank.role) are processes of the run, not ranks: listed apart, by pid.
  // A job's compiler workers can be dozens: the first few are named, the rest counted.
  int64_t n_ranks = 0, world = 0, n_processes = 0;
  constexpr int64_t kNamed = 4;
  std::string processes;
  for (auto& r : sum.ranks) {
    if (r.role == db::RankRole::Rank) {
      ++n_ranks;
      world = std::max(world, r.world_size);
      continue;
    }
    if (++n_processes > kNamed) continue;
    processes += (processes.empty() ? "" : ", ") + std::string(db::to_string(r.role)) + " " + std::to_string(r.pid) +
                 (r.role != db::RankRole::Launcher && r.job_rank ? " of rank " + std::to_string(*r.job_rank) : "") +
                 " (key " + std::to_string(r.rank) + ")";
  }
  if (n_processes > kNamed) processes += " and " + std::to_string(n_processes - kNamed) + " more";
  std::cout << "ranks: " << n_ranks;
  if (n_ranks > 0) std::cout << " (world size " << world << ")";
  if (!processes.empty()) std::cout << "; other processes: " << processes;
  std::cout << "\n";

  std::cout << "devices:\n";
  {
    std::vector<std::vector<std::string>> rows;
    bool unknown_allocated = false;
    for (auto& d : sum.devices) {
      // Without allocator blocks "allocated" is not known (not 0): "-".
      const bool blocks = d.blocks > 0 || d.peak_reserved == 0;
      unknown_allocated = unknown_allocated || !blocks;
      rows.push_back({std::to_string(d.device.rank), d.device.label, std::string(db::to_string(d.device.kind)),
                      d.device.name, d.device.capacity_bytes ? format_bytes(double(*d.device.capacity_bytes)) : "-",
                      blocks ? format_bytes(double(d.peak_allocated)) : "-", format_bytes(double(d.peak_reserved)),
                      blocks ? format_bytes(double(d.allocated_at_end)) : "-", format_bytes(double(d.reserved_at_end)),
                      std::to_string(d.allocations)});
    }
    print_table(std::cout, {"rank", "device", "kind", "name", "capacity", "peak allocated", "peak reserved",
                            "allocated at end", "reserved at end", "allocations"},
                rows, {true, false, false, false, true, true, true, true, true, true}, "  ");
    if (unknown_allocated)
      std::cout << "  (-: no allocator's blocks were recorded there; reserved is the memory taken from the device "
                   "or the OS: cudaMalloc, or malloc/mmap of the host threshold or more)\n";
  }
  print_host_memory(*reader, sum);
  for (auto& d : sum.devices)
    if (d.module_globals > 0)
      std::cout << "module globals on rank " << d.device.rank << " " << d.device.label << ": " << d.module_globals
                << " (" << format_bytes(double(d.module_global_bytes))
                << "), the __device__ variables of CUDA modules as they loaded; left out of the figures above\n";
  if (sum.driver) {
    const db::DriverRecords& d = *sum.driver;
    std::cout << "CUPTI's view: " << d.cupti_segments << " segments, " << d.paired
              << " of them the trainer's or PyTorch's own (counted once); outside those allocators: " << d.outside_count
              << " device segment" << (d.outside_count == 1 ? "" : "s") << " (peak "
              << format_bytes(double(d.outside_peak_bytes))
              << ", " << format_bytes(double(d.outside_live_at_end)) << " live at the end)";
    if (d.api_unpaired)
      std::cout << "; " << d.api_unpaired << " of the allocators' segments have no CUPTI record (see dropped)";
    std::cout << "\n";
  }
  std::cout << "rows:";
  for (auto& [t, n] : sum.rows_per_table) std::cout << " " << t << "=" << n;
  std::cout << "\n";
  int64_t run_start = sum.runs.empty() ? sum.t_first : sum.runs.front().t_start;
  if (sum.t_last > sum.t_first)
    std::cout << "time span: " << format_duration_ns(double(sum.t_last - sum.t_first)) << " (first event "
              << format_duration_ns(double(sum.t_first - run_start)) << " after the run started)\n";
  else
    std::cout << "time span: no timed events\n";
  std::cout << "steps: " << sum.steps;
  if (sum.steps_unfinished > 0)
    std::cout << " (and " << sum.steps_unfinished << (sum.steps_unfinished == 1 ? " that" : " that each")
              << " began and never ended)";
  std::cout << ", epochs: " << sum.epochs;
  {
    // The set-up before the first step (the initial weights, every model state allocated and filled):
    // at the large presets a cost of its own.
    db::QueryResult q;
    // min() is NULL where no marker reads as a step through the file's enum table.
    if (sum.steps > 0 && !sum.runs.empty() && reader->query("SELECT min(t_start) FROM marker_v WHERE kind = 'step'", &q) &&
        !q.rows.empty() && number(q.rows[0][0], -1.0) >= 0)
      std::cout << "; the first began " << format_duration_ns(number(q.rows[0][0]) - double(run_start))
                << " after the run started (its set-up)";
  }
  std::cout << "\n";
  print_detail(sum.detail, run_start);
  if (!sum.transfers.empty()) {
    std::cout << "transfers:\n";
    std::vector<std::vector<std::string>> rows;
    for (auto& t : sum.transfers) {
      double secs = double(t.busy_ns) / 1e9;
      rows.push_back({t.kind, std::to_string(t.count), format_bytes(double(t.bytes)), format_duration_ns(double(t.busy_ns)),
                      secs > 0 ? format_bytes(double(t.bytes) / secs) + "/s" : "-"});
    }
    print_table(std::cout, {"kind", "count", "bytes", "busy", "rate"}, rows, {false, true, true, true, true}, "  ");
  } else {
    // Nothing moved: no per-step table of zeros (a CPU job's).
    std::cout << "transfers: none (no copies between host and device, no collectives)\n";
  }
  bool step_bytes = false;
  for (auto& s : sum.step_traffic) step_bytes = step_bytes || s.h2d > 0 || s.d2h > 0 || s.collective > 0;
  if (!sum.transfers.empty() && !sum.step_traffic.empty() && !step_bytes)
    std::cout << "per step: no bytes moved during the optimizer steps (the transfers above ran outside them)\n";
  if (step_bytes) {
    std::cout << "per step (mean bytes moved by each rank during its optimizer steps"
              << (sum.detail.t_end ? ", the steps with detail" : "") << "):\n";
    std::vector<std::vector<std::string>> rows;
    for (auto& s : sum.step_traffic)
      rows.push_back({std::to_string(s.rank), std::to_string(s.steps), format_bytes(s.h2d), format_bytes(s.d2h),
                      format_bytes(s.collective)});
    print_table(std::cout, {"rank", "steps", "H2D", "D2H", "collective"}, rows, {true, true, true, true, true}, "  ");
  }
  if (!print_background_update(*reader)) print_adamw(*reader);
  print_partial_offload(*reader);
  std::cout << "dropped events: " << sum.dropped_events << (sum.dropped_events ? " (see the dropped table)" : "")
            << "\n";
  std::cout << "faults: " << (sum.faults.empty() ? "none" : std::to_string(sum.faults.size()) + " (times from the run's start)")
            << "\n";
  for (size_t i = 0; i < sum.faults.size() && i < 20; ++i) {
    auto& f = sum.faults[i];
    std::cout << "  +" << format_duration_ns(double(f.t - run_start)) << " rank " << f.rank;
    if (f.step) std::cout << " step " << *f.step;
    std::cout << ": " << f.name << (f.trigger.empty() ? "" : " [" + f.trigger + "]")
              << (f.details.empty() ? "" : " " + f.details) << "\n";
  }
  // A merged trace holds one run per process, and each may have said the same ("CUDA tracing was
  // off"): said once, with how many said it.
  {
    std::vector<std::pair<std::string, int>> notes;
    for (auto& n : sum.notes) {
      auto it = std::find_if(notes.begin(), notes.end(), [&](auto& x) { return x.first == n; });
      if (it == notes.end()) notes.emplace_back(n, 1);
      else ++it->second;
    }
    for (auto& [n, times] : notes)
      std::cout << "note: " << n << (times > 1 ? " (said by " + std::to_string(times) + " of the trace's " +
                                                     std::to_string(sum.runs.size()) + " runs)"
                                               : std::string())
                << "\n";
  }
  std::cout << "errors: " << (sum.errors.empty() ? "none" : std::to_string(sum.errors.size()) + " (times from the run's start)")
            << "\n";
  for (size_t i = 0; i < sum.errors.size() && i < 20; ++i) {
    auto& e = sum.errors[i];
    std::cout << "  +" << format_duration_ns(double(e.t - run_start)) << " rank " << e.rank;
    if (e.step) std::cout << " step " << *e.step;
    if (!e.site.empty()) std::cout << " in " << e.site;
    std::cout << ": " << (e.kind.empty() ? "error" : e.kind) << ": " << e.message << "\n";
  }
  return kExitOk;
}

int db_background_update(const std::string& path) {
  std::unique_ptr<db::TraceReader> reader;
  if (Status s = db::TraceReader::open(path, &reader); !s) return fail(s.message());
  if (!print_background_update(*reader)) std::cout << path << ": no delayed or overlapped update in this trace\n";
  return kExitOk;
}

int db_partial_offload(const std::string& path) {
  std::unique_ptr<db::TraceReader> reader;
  if (Status s = db::TraceReader::open(path, &reader); !s) return fail(s.message());
  print_partial_offload(*reader);
  return kExitOk;
}

namespace {
volatile std::sig_atomic_t sql_interrupted = 0;
void on_sql_interrupt(int) { sql_interrupted = 1; }
}  // namespace

int db_sql(const std::string& path, const std::string& sql, bool csv, int64_t max_rows, double timeout_s) {
  std::unique_ptr<db::TraceReader> reader;
  // Values unchecked: SQL is how a damaged trace is looked at as it is.
  if (Status s = db::TraceReader::open(path, &reader, db::TraceReader::Checks::None); !s) return fail(s.message());
  db::QueryResult result;
  db::QueryLimits limits;
  limits.max_rows = max_rows;
  limits.timeout_ms = int64_t(timeout_s * 1000);
  limits.interrupted = &sql_interrupted;
  // Ctrl-C stops the query (SQLite checks the flag every few thousand steps), then zt exits 130.
  struct sigaction sa{}, old{};
  sa.sa_handler = on_sql_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old);
  Status queried = reader->query(sql, &result, limits);
  sigaction(SIGINT, &old, nullptr);
  if (result.stopped == db::QueryResult::Stopped::Interrupted) {
    std::cerr << "zt: " << queried.message() << "\n";
    return 130;
  }
  if (!queried && result.stopped != db::QueryResult::Stopped::RowLimit) return fail(queried.message());
  if (csv) {
    for (size_t c = 0; c < result.columns.size(); ++c)
      std::cout << (c ? "," : "") << csv_field(result.columns[c]);
    std::cout << "\n";
    for (auto& r : result.rows) {
      for (size_t c = 0; c < r.size(); ++c) std::cout << (c ? "," : "") << csv_field(r[c]);
      std::cout << "\n";
    }
  } else {
    print_table(std::cout, result.columns, result.rows, result.numeric);
    std::cout << "(" << result.rows.size() << " row" << (result.rows.size() == 1 ? "" : "s") << ")\n";
  }
  // The rows up to the limit are printed; the exit code and the last line say they are not all.
  if (!queried) {
    std::cout.flush();
    return fail(queried.message());
  }
  return kExitOk;
}

// zt db kernels: the GPU's time by kernel name, and its idle time by what the host was doing.
int db_kernels(const std::string& path, const db::KernelSummaryOptions& opt, size_t top) {
  std::unique_ptr<db::TraceReader> reader;
  if (Status s = db::TraceReader::open(path, &reader); !s) return fail(s.message());
  db::KernelSummary k;
  if (Status s = db::summarize_kernels(*reader, opt, &k); !s) return fail(s.message());
  auto pct = [](double part, double whole) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
    return std::string(b);
  };
  const double window = double(k.window_ns());
  std::cout << "kernels of rank " << k.rank << " on " << k.devices << ", ";
  if (k.first_step >= 0) {
    const int64_t n = k.steps;
    std::cout << (n == 1 ? "step " + std::to_string(k.first_step)
                         : "steps " + std::to_string(k.first_step) + "-" + std::to_string(k.last_step))
              << " (" << (k.last_step - k.first_step + 1 != n ? std::to_string(n) + " finished, " : "")
              << format_duration_ns(window) << (n > 1 ? ", " + format_duration_ns(window / double(n)) + " a step" : "")
              << ")";
  } else {
    std::cout << "the kernels' span (" << format_duration_ns(window) << "; the trace has no steps)";
  }
  std::cout << ": " << k.kernels << " kernels, " << format_duration_ns(double(k.kernel_ns)) << " of kernel time\n";
  std::cout << "GPU busy " << format_duration_ns(double(k.busy_ns)) << " (" << pct(double(k.busy_ns), window)
            << " of the window), idle " << format_duration_ns(window - double(k.busy_ns)) << " in " << k.gaps << " gap"
            << (k.gaps == 1 ? "" : "s") << "\n\n";
  std::vector<std::vector<std::string>> rows;
  int64_t rest_ns = 0, rest_calls = 0;
  for (size_t i = 0; i < k.by_name.size(); ++i) {
    const db::KernelStat& s = k.by_name[i];
    if (i >= top) {
      rest_ns += s.total_ns;
      rest_calls += s.calls;
      continue;
    }
    rows.push_back({format_duration_ns(double(s.total_ns)), pct(double(s.total_ns), double(k.kernel_ns)),
                    std::to_string(s.calls), format_duration_ns(double(s.total_ns) / double(s.calls)),
                    format_duration_ns(double(s.min_ns)), format_duration_ns(double(s.max_ns)), s.name});
  }
  if (rest_calls > 0)
    rows.push_back({format_duration_ns(double(rest_ns)), pct(double(rest_ns), double(k.kernel_ns)),
                    std::to_string(rest_calls), "", "", "",
                    "(" + std::to_string(k.by_name.size() - top) + " more kernel names)"});
  print_table(std::cout, {"time", "share", "calls", "avg", "min", "max", "kernel"}, rows,
              {true, true, true, true, true, true, false}, "  ");
  std::cout << "\nGPU idle by host phase (the rank thread's innermost phase at each gap's midpoint; digits shown as N):\n";
  rows.clear();
  for (const db::IdleByPhase& p : k.idle_by_phase)
    rows.push_back({format_duration_ns(double(p.ns)), pct(double(p.ns), window), std::to_string(p.gaps), p.phase});
  print_table(std::cout, {"idle", "of window", "gaps", "host phase"}, rows, {true, true, true, false}, "  ");
  if (!k.longest.empty()) {
    std::cout << "\nlongest idle gaps (at: from the window's start"
              << (k.first_step >= 0 ? ", the start of step " + std::to_string(k.first_step) : std::string()) << "):\n";
    rows.clear();
    for (const db::IdleGap& g : k.longest)
      rows.push_back({format_duration_ns(double(g.t_end - g.t_start)),
                      "+" + format_duration_ns(double(g.t_start - k.t_start)), g.step >= 0 ? std::to_string(g.step) : "-",
                      g.phase});
    print_table(std::cout, {"idle", "at", "step", "host phase"}, rows, {true, true, true, false}, "  ");
  }
  return kExitOk;
}

// zt db top: the allocation sites that hold the most (see zt/db/sites.h and docs/db-top.md).
int db_top(const std::string& path, const db::TopOptions& o) {
  std::unique_ptr<db::TraceReader> reader;
  if (Status s = db::TraceReader::open(path, &reader); !s) return fail(s.message());
  std::vector<db::DeviceTop> devices;
  if (Status s = db::top_sites(*reader, o, &devices); !s) return fail(s.message());
  auto pct = [](double part, double whole) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
    return std::string(b);
  };
  const bool epochs = o.when == db::TopWhen::Epochs;
  std::cout << path << ": allocation sites by " << db::to_string(o.by) << ", ";
  switch (o.when) {
    case db::TopWhen::Peak: std::cout << "at the peak of each device\n"; break;
    case db::TopWhen::End: std::cout << "at the end (never freed)\n"; break;
    case db::TopWhen::Time: std::cout << "at " << format_duration_ns(double(o.t_ns)) << " since the trace began\n"; break;
    case db::TopWhen::Epochs: std::cout << "grown per epoch (held at each epoch's end)\n"; break;
  }
  if (devices.empty()) std::cout << "no allocations" << (o.device.empty() ? "" : " on " + o.device) << "\n";
  bool many_ranks = false;
  for (auto& d : devices) many_ranks = many_ranks || d.rank != devices.front().rank;
  // A launcher's, helper's or forked worker's key is not a rank (rank.role): its role and pid instead, as
  // zt db info and zt check name it ("cpu of worker process 4251 of rank 0", not "cpu of rank 1").
  std::vector<db::RankRow> ranks;
  if (many_ranks)
    if (Status s = reader->read(&ranks); !s) return fail(s.message());
  auto who = [&](int64_t key) {
    for (auto& r : ranks)
      if (r.rank == key && r.role != db::RankRole::Rank)
        return std::string(db::to_string(r.role)) + " process " + std::to_string(r.pid) +
               (r.role != db::RankRole::Launcher && r.job_rank ? " of rank " + std::to_string(*r.job_rank) : "");
    return "rank " + std::to_string(key);
  };
  for (auto& d : devices) {
    std::cout << "\n" << d.device.label << (many_ranks ? " of " + who(d.rank) : "") << ": ";
    // A capped trace: where these figures come from (the aggregates), or what the detail leaves out.
    const std::string source = d.source.empty() ? "" : "  " + d.source + "\n";
    if (!d.note.empty()) {
      std::cout << d.note << "\n" << source;
      continue;
    }
    const std::string counted = d.blocks ? "tensor blocks" : "segments";
    if (epochs) {
      const size_t n = d.epochs.size();
      std::cout << (n == 1 ? "epoch " + std::to_string(d.epochs[0])
                           : "epochs " + std::to_string(d.epochs.front()) + "-" + std::to_string(d.epochs.back()))
                << ", " << format_bytes(double(d.total)) << " of " << counted << " held at epoch " << d.epochs.back()
                << "'s end in " << d.sites << " site" << (d.sites == 1 ? "" : "s")
                << (n >= 3 ? " (growth counted from epoch " + std::to_string(d.epochs[1]) + ": epoch " +
                                 std::to_string(d.epochs[0]) + " is warm-up)"
                           : n == 1 ? " (one epoch: nothing to compare)" : "")
                << "\n";
    } else {
      std::cout << format_bytes(double(d.total)) << " of " << counted << " held";
      if (o.when != db::TopWhen::End) std::cout << " at " << format_duration_ns(double(d.t));
      std::cout << " in " << d.sites << " site" << (d.sites == 1 ? "" : "s") << "\n";
    }
    std::cout << source;
    std::vector<std::vector<std::string>> rows;
    // A site with sampled rows (the probe's byte sampler) holds an estimate: "~", and its error.
    auto held = [](const db::SiteBytes& s) {
      if (s.sampled == 0) return format_bytes(double(s.bytes));
      return "~" + format_bytes(double(s.bytes)) + " ±" + format_bytes(s.stderr_bytes);
    };
    auto count = [](const db::SiteBytes& s) {
      return std::to_string(s.allocations) + (s.sampled ? " (" + std::to_string(s.sampled) + " sampled)" : "");
    };
    bool sampled = false;
    for (auto& s : d.top) sampled = sampled || s.sampled > 0;
    for (auto& s : d.top) {
      if (epochs) {
        std::string series = format_bytes(double(s.series[0]));
        for (size_t i = 1; i < s.series.size(); ++i) {
          const int64_t delta = s.series[i] - s.series[i - 1];
          series += (delta < 0 ? ", -" : ", +") + format_bytes(double(delta < 0 ? -delta : delta));
        }
        rows.push_back({(s.grew_per_epoch < 0 ? "-" : "") + format_bytes(s.grew_per_epoch < 0 ? -s.grew_per_epoch : s.grew_per_epoch),
                        held(s), count(s), s.site, series});
      } else {
        rows.push_back({held(s), pct(double(s.bytes), double(d.total)), count(s), s.site});
      }
    }
    if (d.other_bytes > 0 && !epochs)
      rows.push_back({format_bytes(double(d.other_bytes)), pct(double(d.other_bytes), double(d.total)), "",
                      "(" + std::to_string(d.sites - int64_t(d.top.size())) + " more site" +
                          (d.sites - int64_t(d.top.size()) == 1 ? ")" : "s)")});
    if (epochs)
      print_table(std::cout, {"grew/epoch", "held at end", "allocations", "site", "at each epoch's end"}, rows,
                  {true, true, true, false, false}, "  ");
    else
      print_table(std::cout, {"held", "share", "allocations", "site"}, rows, {true, true, true, false}, "  ");
    if (sampled)
      std::cout << "  ~: estimated from allocations sampled by bytes (the probe's --sample-interval), ± one standard "
                   "error (docs/check.md)\n";
  }
  return kExitOk;
}

namespace {

int synth(const std::string& out, const probe::SyntheticOptions& opt, const std::string& command, bool quiet,
          int64_t max_trace = 0, const probe::DetailPolicy& detail = {},
          const probe::FlightRecorder& flight = {0, 0, probe::kDefaultFlightBytes}) {
  probe::RecorderOptions ro;
  ro.path = out;
  ro.max_trace_bytes = max_trace;
  ro.detail = detail;
  ro.flight = flight;
  ro.command_line = command;
  ro.seed = static_cast<int64_t>(opt.seed);
  ro.config_json = "{\"workload\":\"synthetic\",\"ranks\":" + std::to_string(opt.ranks) +
                   ",\"epochs\":" + std::to_string(opt.epochs) + ",\"steps_per_epoch\":" +
                   std::to_string(opt.steps_per_epoch) + ",\"layers\":" + std::to_string(opt.layers) + "}";
  std::unique_ptr<probe::Recorder> rec;
  if (Status s = probe::Recorder::open(ro, &rec); !s) return fail(s.message());
  int64_t t0 = probe::now_ns();
  int64_t events = probe::record_synthetic(*rec, opt);
  if (Status s = rec->close(db::RunStatus::Ok, 0); !s) return fail(s.message());
  double secs = double(probe::now_ns() - t0) / 1e9;
  if (!quiet)
    std::cout << "recorded " << events << " synthetic events (" << opt.ranks << " ranks, " << opt.epochs
              << " epochs x " << opt.steps_per_epoch << " steps, " << opt.layers << " layers) into " << out
              << ", written in " << format_duration_ns(secs * 1e9) << " (" << format_count(double(events) / std::max(secs, 1e-9))
              << " events/s)\n";
  return kExitOk;
}

}  // namespace

void add_db_commands(CLI::App& app, Action& action) {
  auto* dbc = app.add_subcommand("db", "Inspect, query and merge trace files");
  dbc->require_subcommand(1);

  {
    auto* info = dbc->add_subcommand("info", "Summarize a trace: run, ranks, devices, peaks, transfers, faults, errors\n"
                                             "Example: zt db info run.db");
    auto path = std::make_shared<std::string>();
    info->add_option("TRACE", *path, "trace file")->required();
    info->callback([&action, path] { action = [path] { return db_info(*path); }; });
  }
  {
    auto* sql = dbc->add_subcommand("sql", "Run read-only SQL on a trace\n"
                                           "Example: zt db sql run.db \"SELECT name, bytes FROM allocation_v LIMIT 5\"");
    auto path = std::make_shared<std::string>();
    auto query = std::make_shared<std::string>();
    auto csv = std::make_shared<bool>(false);
    auto max_rows = std::make_shared<int64_t>(1000000);
    auto timeout = std::make_shared<double>(300);
    sql->add_option("TRACE", *path, "trace file")->required();
    sql->add_option("SQL", *query, "one SELECT statement")->required();
    sql->add_flag("--csv", *csv, "print CSV instead of an aligned table");
    sql->add_option("--max-rows", *max_rows, "stop after this many rows, exit 2 (default 1000000; 0: no limit)")
        ->check(CLI::Range(int64_t(0), INT64_MAX));
    sql->add_option("--timeout", *timeout, "stop a query running longer, in seconds, exit 2 (default 300; 0: no limit)")
        ->check(CLI::Range(0.0, 1e7));
    sql->callback([&action, path, query, csv, max_rows, timeout] {
      action = [=] { return db_sql(*path, *query, *csv, *max_rows, *timeout); };
    });
  }
  {
    auto* kern = dbc->add_subcommand(
        "kernels",
        "The GPU's time by kernel (as nsys' cuda_gpu_kern_sum) and its idle time by what the host was doing, from the "
        "kernel rows CUPTI recorded (zt train --device cuda --cupti, zt probe) or the simulated GPU's model passes\n"
        "Example: zt db kernels run.db --steps 2-4");
    auto path = std::make_shared<std::string>();
    auto steps = std::make_shared<std::string>();
    auto rank = std::make_shared<int64_t>(-1);
    auto top = std::make_shared<size_t>(20);
    auto gaps = std::make_shared<size_t>(5);
    kern->add_option("TRACE", *path, "trace file")->required();
    kern->add_option("--steps", *steps, "steps N or A-B (default: every finished step but the first, the warm-up)");
    kern->add_option("--rank", *rank, "rank (default: the lowest with kernel rows)")->check(CLI::Range(int64_t(0), int64_t(1) << 20));
    kern->add_option("--top", *top, "kernel names to list (the rest in one line)")->check(CLI::Range(size_t(1), size_t(100000)));
    kern->add_option("--gaps", *gaps, "longest idle gaps to list")->check(CLI::Range(size_t(0), size_t(100000)));
    kern->callback([&action, path, steps, rank, top, gaps] {
      action = [=] {
        db::KernelSummaryOptions o;
        o.rank = *rank;
        o.longest_gaps = *gaps;
        if (!steps->empty()) {
          const size_t dash = steps->find('-');
          char* end = nullptr;
          const std::string a = steps->substr(0, dash), b = dash == std::string::npos ? a : steps->substr(dash + 1);
          errno = 0;
          o.first_step = std::strtoll(a.c_str(), &end, 10);
          const bool ok_a = !a.empty() && *end == 0 && errno == 0;
          o.last_step = std::strtoll(b.c_str(), &end, 10);
          if (!ok_a || b.empty() || *end || errno != 0 || o.first_step < 0 || o.last_step < 0)
            return fail("--steps '" + *steps + "': give a step (3) or a range (2-4) of steps counted from 0");
        }
        return db_kernels(*path, o, *top);
      };
    });
  }
  {
    auto* st = dbc->add_subcommand(
        "steps",
        "Derive a probed program's steps, epochs and phases from its ranges again (zt probe does it when the program "
        "ends): --step-range/--epoch-range, NVTX ranges 'epoch N'/'step N', DeepSpeed's own ranges, the HF Trainer's "
        "and Lightning's callbacks, the zerotrace module, in that order\n"
        "Example: zt db steps run.db --step-range 'DeepSpeedZeroOptimizer_Stage3.step'");
    auto path = std::make_shared<std::string>();
    auto rules = std::make_shared<db::StepRules>();
    st->add_option("TRACE", *path, "trace file (changed in place: the derived markers are replaced)")->required();
    st->add_option("--step-range", rules->step_range, "the range (a name or a regular expression) that is one step "
                                                       "(default: the one zt probe was given, if any)");
    st->add_option("--epoch-range", rules->epoch_range, "the range (a name or a regular expression) that is one epoch");
    st->callback([&action, path, rules] {
      action = [=] {
        db::DerivedMarkers d;
        if (Status s = db::derive_steps(*path, *rules, &d); !s) return fail(s.message());
        std::cout << *path << ": " << db::describe(d);
        if (d.phases) std::cout << ", " << d.phases << " phases";
        std::cout << "\n";
        for (auto& n : d.notes) std::cout << "  " << n << "\n";
        return kExitOk;
      };
    });
  }
  {
    auto* top = dbc->add_subcommand(
        "top",
        "The allocation sites that hold the most, by Python line, function or module (the innermost native frame "
        "that is not the allocator's when a stack has no Python frame): at each device's peak, at the end, at a time, "
        "or grown per epoch\n"
        "Example: zt db top run.db\n"
        "         zt db top run.db --by function --at end\n"
        "         zt db top run.db --per-epoch --device cpu");
    auto path = std::make_shared<std::string>();
    auto by = std::make_shared<std::string>("line");
    auto at = std::make_shared<std::string>("peak");
    auto per_epoch = std::make_shared<bool>(false);
    auto n = std::make_shared<size_t>(10);
    auto device = std::make_shared<std::string>();
    top->add_option("TRACE", *path, "trace file")->required();
    top->add_option("--by", *by, "line, function or module (default line)");
    auto* at_opt = top->add_option("--at", *at, "peak (default), end, or a time since the trace began: 1.5s, 250ms");
    top->add_flag("--per-epoch", *per_epoch, "held at each epoch's end and grown per epoch (epoch markers)")->excludes(at_opt);
    top->add_option("--top", *n, "sites listed per device (default 10)")->check(CLI::Range(size_t(1), size_t(100000)));
    top->add_option("--device", *device, "only this device (cuda:0, cpu)");
    top->callback([&action, path, by, at, per_epoch, n, device] {
      action = [=] {
        db::TopOptions o;
        auto level = db::parse_site_level(*by);
        if (!level) return fail("--by '" + *by + "': give line, function or module");
        o.by = *level;
        o.top = *n;
        o.device = *device;
        if (*per_epoch) o.when = db::TopWhen::Epochs;
        else if (*at == "peak") o.when = db::TopWhen::Peak;
        else if (*at == "end") o.when = db::TopWhen::End;
        else if (auto t = parse_duration_ns(*at); t && *t >= 0) o.when = db::TopWhen::Time, o.t_ns = *t;
        else return fail("--at '" + *at + "': give peak, end, or a time since the trace began (1.5s, 250ms, 40us)");
        return db_top(*path, o);
      };
    });
  }
  {
    auto* merge = dbc->add_subcommand("merge", "Merge per-rank traces into one (clocks kept, ranks kept apart)\n"
                                               "Example: zt db merge run.db rank0.db rank1.db");
    auto out = std::make_shared<std::string>();
    auto inputs = std::make_shared<std::vector<std::string>>();
    auto force = std::make_shared<bool>(false);
    merge->add_option("OUT", *out, "merged trace to write")->required();
    merge->add_option("INPUTS", *inputs, "per-rank trace files")->required();
    merge->add_flag("--force", *force, "replace OUT if it exists");
    merge->callback([&action, out, inputs, force] {
      action = [=] {
        if (Status s = check_output_path(*out, *inputs); !s) return fail(s.message());
        if (Status s = db::merge_traces(*out, *inputs, *force); !s) return fail(s.message());
        std::cout << "merged " << inputs->size() << " traces into " << *out << "\n";
        return kExitOk;
      };
    });
  }
  {
    auto* exp = app.add_subcommand("export", "Export a trace to another format\n"
                                             "Example: zt export run.db --chrome run.json   (open in Perfetto)\n"
                                             "         zt export run.db --torch-snapshot run.pickle   (open in "
                                             "pytorch.org/memory_viz)");
    auto path = std::make_shared<std::string>();
    auto chrome = std::make_shared<std::string>();
    auto torch = std::make_shared<std::string>();
    exp->add_option("TRACE", *path, "trace file")->required();
    exp->add_option("--chrome", *chrome, "write Chrome trace-event JSON here");
    exp->add_option("--torch-snapshot", *torch,
                    "write the device memory as a PyTorch memory snapshot (pickle) here");
    exp->callback([&action, path, chrome, torch] {
      action = [=] {
        if (chrome->empty() && torch->empty()) return fail("export: give --chrome FILE or --torch-snapshot FILE");
        if (Status s = check_output_if_given(*chrome, {*path}); !s) return fail(s.message());
        if (Status s = check_output_if_given(*torch, {*path}); !s) return fail(s.message());
        if (!chrome->empty() && !torch->empty() && same_file(*chrome, *torch))
          return fail(*torch + ": --chrome and --torch-snapshot name the same file");
        if (!chrome->empty()) {
          db::ExportStats st;
          if (Status s = db::export_chrome(*path, *chrome, &st); !s) return fail(s.message());
          std::cout << "wrote " << st.events << " trace events (" << format_bytes(double(st.bytes)) << ") to "
                    << *chrome << "\n";
        }
        if (!torch->empty()) {
          db::TorchExportStats st;
          if (Status s = db::export_torch_snapshot(*path, *torch, &st); !s) return fail(s.message());
          std::cout << "wrote a PyTorch memory snapshot (" << format_bytes(double(st.bytes)) << ") to " << *torch
                    << ": " << st.segments << " segments, " << st.blocks << " blocks, " << st.events
                    << " history entries";
          if (st.device_map.find(',') != std::string::npos) std::cout << "; devices: " << st.device_map;
          std::cout << "\n";
          if (st.left_out)
            std::cout << "note: " << st.left_out
                      << " allocations left out: their address is 2^63 or more, which a snapshot cannot hold\n";
        }
        return kExitOk;
      };
    });
  }
  auto add_synth_options = [](CLI::App* sub, probe::SyntheticOptions& o, std::string& leak) {
    sub->add_option("--ranks", o.ranks, "ranks (one thread each)")->check(CLI::Range(1, 1024));
    sub->add_option("--epochs", o.epochs, "epochs")->check(CLI::Range(1, 1000000));
    sub->add_option("--steps", o.steps_per_epoch, "steps per epoch")->check(CLI::Range(1, 100000000));
    sub->add_option("--layers", o.layers, "layers")->check(CLI::Range(1, 100000));
    sub->add_option("--leak-per-epoch", leak, "pinned host bytes leaked at each epoch end, e.g. 1GiB");
    sub->add_option("--seed", o.seed, "seed");
  };
  {
    auto* sy = app.add_subcommand("synth", "Record a synthetic ZeRO-3-shaped workload (for demos, benchmarks and the viewer)\n"
                                           "Example: zt synth -o big.db --ranks 8 --epochs 10 --steps 100");
    auto out = std::make_shared<std::string>("synthetic.db");
    auto opt = std::make_shared<probe::SyntheticOptions>();
    auto leak = std::make_shared<std::string>();
    auto max_trace = std::make_shared<std::string>("none");
    sy->add_option("-o,--out", *out, "trace to write");
    add_synth_options(sy, *opt, *leak);
    sy->add_option("--max-trace", *max_trace,
                   "the trace's size cap, as zt train's and zt probe's: past it only the aggregates go on (default none)");
    // The detail windows and the flight recorder, as zt train's (default: all, and no ring).
    struct Recording {
      std::vector<std::string> detail;
      std::string flight = "off", flight_memory;
    };
    auto recording = std::make_shared<Recording>();
    sy->add_option("--detail", recording->detail, "which steps get full detail, as zt train's (default all)");
    sy->add_option("--flight-recorder", recording->flight,
                   "the flight recorder's last N steps (or 30s), as zt train's (default off)");
    sy->add_option("--flight-memory", recording->flight_memory, "the flight recorder's memory bound (default 256MiB)");
    sy->callback([&action, sy, out, opt, leak, max_trace, recording] {
      // The command line as given (recorded in the run row), not a fixed text.
      std::string command = "zt synth";
      for (auto* o : sy->get_options())
        if (o->count() > 0)
          for (auto& r : o->results()) command += " " + o->get_name() + (o->get_expected() == 0 ? "" : " " + r);
      action = [=] {
        if (!leak->empty()) {
          std::string why;
          auto b = parse_size_i64(*leak, &why);
          if (!b) return fail("--leak-per-epoch: '" + *leak + "' " + why + " (try 512MiB or 1GiB)");
          opt->leak_bytes_per_epoch = *b;
        }
        const auto cap = probe::parse_max_trace(*max_trace);
        if (!cap) return fail("--max-trace: '" + *max_trace + "' is not a size (examples: 512MiB, 2GiB; 0 or none = no cap)");
        probe::DetailPolicy detail;
        probe::FlightRecorder flight;
        if (Status s = probe::parse_recording_policy(recording->detail, recording->flight, recording->flight_memory,
                                                     &detail, &flight);
            !s)
          return fail(s.message());
        return synth(*out, *opt, command, false, *cap, detail, flight);
      };
    });
  }

}

}  // namespace zt::cli
