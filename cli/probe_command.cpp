// zt probe: run any program with libzt_probe.so loaded and say where its trace is.
//
// The command only sets the environment up (LD_PRELOAD for the host interposer,
// CUDA_INJECTION64_PATH for CUPTI, ZT_PROBE_* for the settings; see zt/probe/probe_config.h),
// runs the program, passes its exit code through (128+N when signal N killed it), writes that
// code into the run row of the trace (the library cannot know it), and prints a summary.
// Bad usage (no command, a command that does not exist, the library missing, an -o file that is
// not a trace) exits 2 before anything runs; a program that cannot be executed exits 126 (127 when
// the kernel says "no such file", e.g. a missing interpreter), as a shell does, with nothing
// recorded and any trace already at -o untouched.
//
// Which traces are this run's: every process of the run writes ZT_PROBE_RUN_ID, a token new for
// each run, into its run row, so an older file at the same path is never reported as this run's.
// A run whose processes exec or start probed children leaves one trace per process image; the
// command gives each file the job's rank its process holds, or records it as the launcher or a
// helper process (assign_ranks below; docs/probe.md, "Ranks"), so that `zt db merge` joins them
// with the job's numbers, and says so. Each keeps the world size its process recorded (the
// launcher's or its communicator's): process images are not ranks of a job.
//
// Python programs: zt probe puts python/zt_bootstrap (a sitecustomize that installs the zerotrace
// hooks and chains to the program's own) and the zerotrace package's directory first on
// PYTHONPATH. When the program has ended, each trace gets the steps, epochs and phases its ranges
// say (zt/db/derive_steps.h: --step-range/--epoch-range first), and the summary says where they
// came from.
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <map>
#include <random>
#include <set>

#include "commands.h"
#include "probe_torch.h"
#include "zt/common/units.h"
#include "zt/db/derive_steps.h"
#include "zt/db/trace_file.h"
#include "zt/db/trace_reader.h"
#include "zt/probe/detail_policy.h"
#include "zt/probe/probe_config.h"

namespace zt::cli {
namespace {

namespace fs = std::filesystem;

struct ProbeArgs {
  std::string output = "zt-probe.db";
  std::string host_threshold = "1MiB";
  std::string sample_interval = "512KiB";
  std::string max_trace = "768MiB";
  std::vector<std::string> detail;
  std::string flight_recorder, flight_memory;
  bool no_stacks = false;
  int stack_depth = 32;
  bool no_host = false;
  bool no_cuda = false;
  int rss_ms = 100;
  std::string step_range, epoch_range;
  bool python_path = false;
  std::vector<std::string> command;
};

// The directory of the zerotrace Python package (and of zt_bootstrap beside it): where `cmake
// --install` puts it (share/zerotrace/python beside bin/), else the source tree's python/ (a
// build tree). "" when neither exists.
std::string find_python_dir() {
  std::error_code ec;
  for (const std::string& dir : {beside_executable(ZT_INSTALLED_PYTHON_DIR), std::string(ZT_SOURCE_DIR) + "/python"})
    if (!dir.empty() && fs::is_regular_file(dir + "/zerotrace/__init__.py", ec)) return dir;
  return "";
}

// ZT_PROBE_LIBRARY, else beside the zt executable (a build tree), else where `cmake --install`
// puts it (lib/zerotrace beside bin/). The first candidate when none exists, for the error.
std::string find_library() {
  if (const char* v = std::getenv("ZT_PROBE_LIBRARY"); v && *v) return v;
  const std::string beside = beside_executable("libzt_probe.so");
  if (beside.empty()) return beside;
  const std::string installed = beside_executable(std::string(ZT_INSTALLED_PROBE_DIR) + "/libzt_probe.so");
  std::error_code ec;
  if (!fs::exists(beside, ec) && fs::exists(installed, ec)) return installed;
  return beside;
}

// The program as execvp would find it, or "" (so a typo is a usage error, not exit 127).
std::string resolve_command(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string dir = p.substr(start, end - start);
    std::string cand = (dir.empty() ? "." : dir) + "/" + name;
    struct stat st;
    if (::stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return "";
}

// A token that names this run in every trace it writes (see kEnvRunId).
std::string make_run_id() {
  std::random_device rd;
  const uint64_t r = (uint64_t(rd()) << 32) ^ rd() ^
                     uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  char buf[48];
  std::snprintf(buf, sizeof buf, "%d-%016llx", int(::getpid()), (unsigned long long)r);
  return buf;
}

// One trace of this run, from its run row.
struct RunTrace {
  std::string path;
  int64_t pid = 0;
  int64_t t_start = 0;
  int status = 0;
  std::string exit_detail;
  // What the process recorded itself as (rank.role, rank.job_rank; probe_config.h's
  // decide_process_role), and the process it names as its launcher (config_json "launched_by").
  db::RankRole role = db::RankRole::Rank;
  std::optional<int64_t> job_rank;
  int64_t world_size = 1;
  int64_t launched_by = 0;
  int64_t forked_from = 0;  // a worker: the process that forked it (config_json "forked_from")
};

constexpr const char* kExecDetail = "process image replaced by exec of ";

// The run row of `path` when this run (run_id) wrote it; nullopt for any other file.
std::optional<RunTrace> read_run_trace(const std::string& path, const std::string& run_id) {
  db::TraceFileInfo info;
  if (!db::inspect_trace_file(path, &info) || !info.exists || !info.is_sqlite) return std::nullopt;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return std::nullopt;
  }
  sqlite3_busy_timeout(db, 2000);
  std::optional<RunTrace> out;
  sqlite3_stmt* st = nullptr;
  const std::string needle = "\"run_id\":\"" + run_id + "\"";
  if (sqlite3_prepare_v2(db,
                         "SELECT pid, t_start, status, coalesce(exit_detail, ''), "
                         "CASE WHEN json_valid(config_json) THEN json_extract(config_json, '$.launched_by') END, "
                         "CASE WHEN json_valid(config_json) THEN json_extract(config_json, '$.forked_from') END FROM run "
                         "WHERE instr(coalesce(config_json, ''), ?1) > 0 ORDER BY id LIMIT 1",
                         -1, &st, nullptr) == SQLITE_OK) {
    sqlite3_bind_text(st, 1, needle.c_str(), -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW) {
      RunTrace t;
      t.path = path;
      t.pid = sqlite3_column_int64(st, 0);
      t.t_start = sqlite3_column_int64(st, 1);
      t.status = sqlite3_column_int(st, 2);
      t.exit_detail = reinterpret_cast<const char*>(sqlite3_column_text(st, 3));
      if (sqlite3_column_type(st, 4) == SQLITE_INTEGER) t.launched_by = sqlite3_column_int64(st, 4);
      if (sqlite3_column_type(st, 5) == SQLITE_INTEGER) t.forked_from = sqlite3_column_int64(st, 5);
      out = t;
    }
  }
  sqlite3_finalize(st);
  st = nullptr;
  // The rank row the process wrote (one, key 0); files of a probe before rank roles have none.
  if (out && sqlite3_prepare_v2(db, "SELECT role, job_rank, world_size FROM rank ORDER BY rank LIMIT 1", -1, &st,
                                nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    const int64_t role = sqlite3_column_int64(st, 0);
    if (role >= 0 && role <= 3) out->role = db::RankRole(role);
    if (sqlite3_column_type(st, 1) == SQLITE_INTEGER) out->job_rank = sqlite3_column_int64(st, 1);
    out->world_size = std::max<int64_t>(1, sqlite3_column_int64(st, 2));
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return out;
}

// The traces this run wrote: the root's (`main`), then the per-process ones
// ("<main without .db>.pidPID[-N].db") in the order their processes started.
std::vector<RunTrace> traces_of_run(const std::string& main, const std::string& run_id, fs::file_time_type since) {
  std::vector<RunTrace> out;
  if (auto t = read_run_trace(main, run_id)) out.push_back(*t);
  const std::string stem = probe::trace_stem(fs::path(main).filename().string());
  fs::path dir = fs::path(main).parent_path();
  std::vector<RunTrace> others;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(stem + ".pid", 0) != 0 || n.size() < 3 || n.substr(n.size() - 3) != ".db") continue;
    if (e.last_write_time(ec) < since) continue;  // cheap: older files cannot be this run's
    if (auto t = read_run_trace(e.path().string(), run_id)) others.push_back(*t);
  }
  std::sort(others.begin(), others.end(), [](const RunTrace& a, const RunTrace& b) {
    return a.t_start != b.t_start ? a.t_start < b.t_start : a.path < b.path;
  });
  out.insert(out.end(), others.begin(), others.end());
  return out;
}

// The job's ranks (docs/probe.md, "Ranks"). Each process recorded what it knew at its start
// (key 0, its role and job rank); with every trace of the run in hand:
//  - a process a rank names as its launcher (`launched_by`) is the launcher;
//  - where some process holds a rank the launcher's variables or the communicator named, the root
//    that named none (the one rank of a run without a launcher, so far) is the launcher;
//  - of several images of one process (exec), the last is the rank, the earlier ones helpers;
//  - two processes that claim the same rank: the first started keeps it, the other is a helper
//    of it, and the summary says so;
//  - a worker (forked without exec, `forked_from`) is of the rank its parent ends up with: the
//    parent's job rank, or the rank its parent is a helper or worker of (none under a launcher).
// Keys: a rank's is its job rank (0 for the one process of a run without a launcher); launchers'
// and helpers' come after every rank and world size, in the order of `traces` (the order zt db
// merge gets them in, so that it gives them the same keys).
struct Assigned {
  int64_t key = 0;
  db::RankRole role = db::RankRole::Rank;
  std::optional<int64_t> job_rank;
  std::string note;
};
std::vector<Assigned> assign_ranks(const std::vector<RunTrace>& traces) {
  std::vector<Assigned> out(traces.size());
  std::set<int64_t> launchers;
  bool named_ranks = false;
  for (size_t i = 0; i < traces.size(); ++i) {
    out[i].role = traces[i].role;
    out[i].job_rank = traces[i].job_rank;
    if (traces[i].role == db::RankRole::Rank && traces[i].launched_by > 0) launchers.insert(traces[i].launched_by);
  }
  for (size_t i = 0; i < traces.size(); ++i)
    if (out[i].role == db::RankRole::Rank && launchers.count(traces[i].pid)) {
      out[i].role = db::RankRole::Launcher;
      out[i].job_rank.reset();
    }
  for (auto& a : out) named_ranks = named_ranks || (a.role == db::RankRole::Rank && a.job_rank);
  for (auto& a : out)
    if (a.role == db::RankRole::Rank && !a.job_rank && named_ranks) a.role = db::RankRole::Launcher;
  // Images of one process: all but the last (by start) are helpers of its rank.
  for (size_t i = 0; i < traces.size(); ++i) {
    if (out[i].role != db::RankRole::Rank) continue;
    for (size_t j = 0; j < traces.size(); ++j)
      if (j != i && traces[j].pid == traces[i].pid && out[j].role == db::RankRole::Rank &&
          traces[j].t_start > traces[i].t_start) {
        out[i].role = db::RankRole::Helper;
        break;
      }
  }
  // One process per rank: the first started keeps it.
  std::map<int64_t, size_t> holder;
  std::vector<size_t> order(traces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return traces[a].t_start < traces[b].t_start; });
  for (size_t i : order) {
    if (out[i].role != db::RankRole::Rank) continue;
    const int64_t r = out[i].job_rank.value_or(0);
    auto [it, fresh] = holder.emplace(r, i);
    if (!fresh) {
      out[i].role = db::RankRole::Helper;
      out[i].note = "process " + std::to_string(traces[it->second].pid) + " also claims rank " + std::to_string(r) +
                    " and started first: this one is recorded as a helper of that rank";
    }
  }
  int64_t next = 0;
  for (size_t i = 0; i < traces.size(); ++i)
    if (out[i].role == db::RankRole::Rank) {
      out[i].key = out[i].job_rank.value_or(0);
      next = std::max({next, out[i].key + 1, traces[i].world_size});
    }
  // Workers, in start order (a worker's worker after its parent): the parent's rank, where the
  // parent's trace is among them (the image of that pid that started last before the worker).
  for (size_t i : order) {
    if (out[i].role != db::RankRole::Worker || traces[i].forked_from <= 0) continue;
    std::optional<size_t> parent;
    for (size_t j : order)
      if (j != i && traces[j].pid == traces[i].forked_from && traces[j].t_start <= traces[i].t_start) parent = j;
    if (!parent) continue;
    const Assigned& p = out[*parent];
    out[i].job_rank = p.role == db::RankRole::Rank       ? std::optional<int64_t>(p.job_rank.value_or(0))
                      : p.role == db::RankRole::Launcher ? std::nullopt
                                                         : p.job_rank;
  }
  for (auto& a : out)
    if (a.role != db::RankRole::Rank) a.key = next++;
  return out;
}

// Each probed process writes its own trace as key 0. Here it gets its key, role and job rank
// (assign_ranks), so that `zt db merge` keeps ranks apart. A trace whose process is still
// running (a daemon the program left behind) is left as it is: its writer would go on with 0.
bool set_rank(const RunTrace& t, const Assigned& a) {
  if (t.status == int(db::RunStatus::Running) && t.pid > 0 && (::kill(pid_t(t.pid), 0) == 0 || errno == EPERM))
    return false;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(t.path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return false;
  }
  sqlite3_busy_timeout(db, 2000);
  std::vector<std::string> tables;
  sqlite3_stmt* st = nullptr;
  bool single = false;
  if (sqlite3_prepare_v2(db, "SELECT count(*) FROM rank", -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW)
    single = sqlite3_column_int64(st, 0) == 1;
  sqlite3_finalize(st);
  st = nullptr;
  if (single && sqlite3_prepare_v2(db,
                                   "SELECT m.name FROM sqlite_master m JOIN pragma_table_info(m.name) p "
                                   "WHERE m.type = 'table' AND p.name = 'rank' ORDER BY m.name",
                                   -1, &st, nullptr) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) tables.push_back(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)));
  }
  sqlite3_finalize(st);
  bool ok = single && !tables.empty() && sqlite3_exec(db, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) == SQLITE_OK;
  if (ok) {
    for (auto& table : tables) {
      // Rows already under their key (the one process of a run without a launcher: 0) are not rewritten.
      std::string sql = "UPDATE \"" + table + "\" SET rank = " + std::to_string(a.key) +
                        " WHERE rank IS NOT NULL AND rank <> " + std::to_string(a.key);
      ok = ok && sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK;
    }
    const std::string roles = "UPDATE rank SET role = " + std::to_string(int(a.role)) +
                              ", job_rank = " + (a.job_rank ? std::to_string(*a.job_rank) : std::string("NULL"));
    const bool has_roles = sqlite3_exec(db, "SELECT role, job_rank FROM rank LIMIT 0", nullptr, nullptr, nullptr) == SQLITE_OK;
    if (has_roles) ok = ok && sqlite3_exec(db, roles.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK;
    ok = sqlite3_exec(db, ok ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr) == SQLITE_OK && ok;
  }
  sqlite3_close(db);
  return ok;
}

// A name for the merged trace that is not taken: "<main without .db>.merged.db" (or -2, -3...).
std::string merged_name(const std::string& main) {
  const std::string stem = probe::trace_stem(main);
  std::string name = stem + ".merged.db";
  for (int n = 2; ::access(name.c_str(), F_OK) == 0 && n < 1000; ++n)
    name = stem + ".merged-" + std::to_string(n) + ".db";
  return name;
}

// The library ends each run with the exit code where the process knew it (main's return, exit,
// _exit); where it did not (a death by signal, an exit path nothing hooks) the code belongs to the
// last image of the child's pid (earlier images ended by exec and say so).
void write_exit_code(const std::string& path, pid_t pid, int code, int sig) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return;
  }
  sqlite3_busy_timeout(db, 2000);
  const char* sql =
      "UPDATE run SET exit_code = ?1, "
      "status = CASE WHEN status IN (3, 4) THEN status WHEN ?2 > 0 THEN 3 WHEN ?1 <> 0 THEN 2 ELSE 1 END, "
      // A process killed where nothing caught the signal (SIGINT is left to the program) never
      // wrote its end: its last recorded event stands for it, so the run has a span (zt check
      // --budget and zt export end its memory there).
      "t_end = coalesce(t_end, (SELECT max(t) FROM (SELECT max(t_alloc) AS t FROM allocation UNION ALL "
      "SELECT max(t_free) FROM allocation UNION ALL SELECT max(t_start) FROM marker UNION ALL "
      "SELECT max(t_end) FROM marker UNION ALL SELECT max(t) FROM counter UNION ALL SELECT max(t_end) FROM transfer "
      "UNION ALL SELECT max(t_end) FROM kernel)), t_start), "
      "exit_detail = CASE WHEN ?2 > 0 AND (exit_detail IS NULL OR exit_detail = '') THEN ?3 ELSE exit_detail END "
      "WHERE pid = ?4 AND exit_code IS NULL AND "
      "(exit_detail IS NULL OR exit_detail NOT LIKE 'process image replaced by exec%')";
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) == SQLITE_OK) {
    std::string detail = sig > 0 ? "killed by SIG" + std::string(sigabbrev_np(sig) ? sigabbrev_np(sig) : "?") +
                                       " (signal " + std::to_string(sig) + ")"
                                 : "";
    sqlite3_bind_int(st, 1, code);
    sqlite3_bind_int(st, 2, sig);
    sqlite3_bind_text(st, 3, detail.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 4, pid);
    sqlite3_step(st);
  }
  sqlite3_finalize(st);
  // A process that ended without closing its trace (killed, or it skipped every exit path)
  // leaves a -wal file beside it: fold it back so the trace is one file again.
  sqlite3_exec(db, "PRAGMA journal_mode=DELETE", nullptr, nullptr, nullptr);
  sqlite3_close(db);
}

struct TraceCounts {
  int64_t allocations = 0, live = 0, transfers = 0, kernels = 0, dropped = 0;
  int64_t sampled = 0, sampled_live = 0;  // of allocations (and live): sampled rows, under the threshold
  std::string cuda_off;  // the "CUDA tracing was off" note, if any
  bool ok = false;
};

TraceCounts count(const std::string& path) {
  TraceCounts c;
  std::unique_ptr<db::TraceReader> r;
  if (!db::TraceReader::open(path, &r)) return c;
  db::QueryResult q;
  if (r->query("SELECT (SELECT count(*) FROM allocation), (SELECT count(*) FROM allocation WHERE t_free IS NULL), "
               "(SELECT count(*) FROM transfer), (SELECT count(*) FROM kernel), "
               "(SELECT coalesce(sum(events),0) FROM dropped), "
               "(SELECT j.value FROM run, json_each(run.config_json, '$.notes') j WHERE json_valid(run.config_json) "
               "AND j.value LIKE 'CUDA tracing was off%' LIMIT 1), "
               "(SELECT count(*) FROM allocation WHERE " + std::string(r->sampled_sql()) + "), "
               "(SELECT count(*) FROM allocation WHERE t_free IS NULL AND " + r->sampled_sql() + ")",
               &q) && !q.rows.empty()) {
    auto& row = q.rows[0];
    c.allocations = std::stoll(row[0]);
    c.live = std::stoll(row[1]);
    c.transfers = std::stoll(row[2]);
    c.kernels = std::stoll(row[3]);
    c.dropped = std::stoll(row[4]);
    if (row[5] != "NULL") c.cuda_off = row[5];
    c.sampled = std::stoll(row[6]);
    c.sampled_live = std::stoll(row[7]);
    c.allocations -= c.sampled;
    c.live -= c.sampled_live;
    c.ok = true;
  }
  return c;
}

pid_t g_child = 0;
void forward_signal(int sig) {
  if (g_child > 0) ::kill(g_child, sig);
}

int run_probe(const ProbeArgs& a) {
  const std::string python_dir = find_python_dir();
  if (a.python_path) {
    if (python_dir.empty()) return fail("probe: the zerotrace Python package was not found (not installed?)");
    std::cout << python_dir << "\n";
    return kExitOk;
  }
  if (a.command.empty())
    return fail("probe: no command given; example: zt probe -o out.db -- python train.py");
  // Bad patterns are refused before anything runs.
  if (!a.step_range.empty())
    if (Status s = db::check_range_pattern(a.step_range, "--step-range"); !s) return fail("probe: " + s.message());
  if (!a.epoch_range.empty())
    if (Status s = db::check_range_pattern(a.epoch_range, "--epoch-range"); !s) return fail("probe: " + s.message());
  std::string program = resolve_command(a.command[0]);
  if (program.empty()) return fail("probe: " + a.command[0] + ": command not found (or not executable)");
  std::string lib = find_library();
  if (lib.empty() || ::access(lib.c_str(), R_OK) != 0)
    return fail("probe: " + (lib.empty() ? std::string("libzt_probe.so") : lib) +
                " not found; it is built beside the zt executable and installed in lib/zerotrace (or set "
                "ZT_PROBE_LIBRARY)");
  auto threshold = parse_bytes(a.host_threshold);
  if (!threshold) return fail("probe: --host-threshold " + a.host_threshold + ": not a size (examples: 1MiB, 65536)");
  auto interval = parse_bytes(a.sample_interval);
  if (!interval || *interval > (1ull << 40))
    return fail("probe: --sample-interval " + a.sample_interval + ": not a size up to 1TiB (examples: 512KiB, 65536; 0 = off)");
  auto max_trace = probe::parse_max_trace(a.max_trace);
  if (!max_trace) return fail("probe: --max-trace " + a.max_trace + ": not a size (examples: 512MiB, 2GiB; 0 or none = no cap)");
  probe::DetailPolicy detail_policy;
  probe::FlightRecorder flight;
  if (Status s = probe::parse_recording_policy(a.detail, a.flight_recorder, a.flight_memory, &detail_policy, &flight); !s)
    return fail("probe: " + s.message());
  if (a.stack_depth < 1 || a.stack_depth > 128) return fail("probe: --stack-depth must be 1 to 128");
  if (a.rss_ms < 0) return fail("probe: --rss-interval-ms must be 0 (off) or more");

  std::error_code ec;
  fs::path out = fs::absolute(a.output, ec);
  if (ec) return fail("probe: " + a.output + ": " + ec.message());
  // The library would refuse to replace a file that is not a trace (TraceWriter::create's own
  // check), and the program would run unrecorded: refuse here, before anything runs.
  if (Status s = db::check_trace_destination(out.string()); !s) return fail("probe: " + s.message());
  auto started = fs::file_time_type::clock::now() - std::chrono::seconds(2);
  const std::string run_id = make_run_id();

  std::vector<char*> argv;
  for (auto& w : a.command) argv.push_back(const_cast<char*>(w.c_str()));
  argv.push_back(nullptr);
  std::string preload = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;

  // A failed exec comes back through this pipe (its errno); a successful one closes it.
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0) return fail(std::string("probe: pipe failed: ") + std::strerror(errno));
  pid_t child = ::fork();
  if (child < 0) return fail(std::string("probe: fork failed: ") + std::strerror(errno));
  if (child == 0) {
    ::close(exec_pipe[0]);
    setenv("LD_PRELOAD", preload.c_str(), 1);
    setenv("CUDA_INJECTION64_PATH", lib.c_str(), 1);
    setenv(probe::kEnvOutput, out.c_str(), 1);
    setenv(probe::kEnvHostThreshold, std::to_string(*threshold).c_str(), 1);
    setenv(probe::kEnvSampleInterval, std::to_string(*interval).c_str(), 1);
    setenv(probe::kEnvMaxTrace, std::to_string(*max_trace).c_str(), 1);
    if (!a.detail.empty()) setenv(probe::kEnvDetail, detail_policy.text.c_str(), 1);
    if (!a.flight_recorder.empty()) setenv(probe::kEnvFlightRecorder, a.flight_recorder.c_str(), 1);
    if (!a.flight_memory.empty()) setenv(probe::kEnvFlightMemory, std::to_string(flight.max_bytes).c_str(), 1);
    setenv(probe::kEnvStacks, a.no_stacks ? "0" : "1", 1);
    setenv(probe::kEnvStackDepth, std::to_string(a.stack_depth).c_str(), 1);
    setenv(probe::kEnvHost, a.no_host ? "0" : "1", 1);
    setenv(probe::kEnvCuda, a.no_cuda ? "0" : "1", 1);
    setenv(probe::kEnvRssMs, std::to_string(a.rss_ms).c_str(), 1);
    setenv(probe::kEnvQuiet, "1", 1);  // this command prints the summary instead
    setenv(probe::kEnvCommand, probe::shell_quote_command(a.command).c_str(), 1);
    setenv(probe::kEnvRunId, run_id.c_str(), 1);
    unsetenv(probe::kEnvClaimed);      // a fresh run, even when zt itself runs under a probe
    unsetenv(probe::kEnvRankOwner);
    if (!python_dir.empty()) {
      // The bootstrap first (its sitecustomize shadows the program's, which it then imports),
      // then the zerotrace package, then what the program had.
      std::string pp = python_dir + "/zt_bootstrap:" + python_dir;
      if (const char* old = std::getenv("PYTHONPATH"); old && *old) pp += std::string(":") + old;
      setenv("PYTHONPATH", pp.c_str(), 1);
    }
    ::execv(program.c_str(), argv.data());
    int err = errno;
    (void)!::write(exec_pipe[1], &err, sizeof err);
    _exit(127);
  }
  ::close(exec_pipe[1]);
  // Ctrl-C reaches the child through the terminal's process group; the parent outlives it to
  // report. A SIGTERM sent to zt alone is passed on.
  g_child = child;
  signal(SIGINT, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  signal(SIGTERM, forward_signal);
  signal(SIGHUP, forward_signal);
  int exec_errno = 0;
  ssize_t got;
  while ((got = ::read(exec_pipe[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
  }
  ::close(exec_pipe[0]);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (got == static_cast<ssize_t>(sizeof exec_errno)) {
    // Nothing ran, so nothing was recorded, and a trace already at -o was not touched. Exit codes
    // as a shell's: 127 when the kernel found no file (a missing interpreter), 126 otherwise.
    std::string why = exec_errno == EACCES && fs::is_directory(program, ec) ? "is a directory"
                                                                             : std::strerror(exec_errno);
    std::fprintf(stderr, "zt: probe: cannot run %s: %s; nothing was recorded\n", a.command[0].c_str(), why.c_str());
    return exec_errno == ENOENT ? 127 : 126;
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;

  std::vector<RunTrace> traces = traces_of_run(out.string(), run_id, started);
  for (auto& t : traces) write_exit_code(t.path, child, code, sig);
  {
    // PyTorch programs: each process's allocator history into its trace (cli/probe_torch.h).
    std::vector<std::pair<std::string, int64_t>> paths;
    for (auto& t : traces) paths.emplace_back(t.path, t.pid);
    merge_torch_histories(out.string(), run_id, paths);
  }
  if (traces.empty()) {
    std::fprintf(stderr,
                 "zt probe: no trace was written to %s (a statically linked program, or one that clears LD_PRELOAD, "
                 "is not recorded); the program exited with %d\n",
                 out.c_str(), code);
    return code;
  }
  // One trace per process image: each gets its job rank, or is a launcher or a helper (mergeable:
  // ranks kept apart); then say where they are.
  const std::vector<Assigned> assigned = assign_ranks(traces);
  std::vector<bool> renumbered(traces.size(), true);
  for (size_t i = 0; i < traces.size(); ++i) renumbered[i] = set_rank(traces[i], assigned[i]);
  std::string cuda_off;
  bool any_cuda_on = false;
  bool any_marks = false;  // steps or epochs in some trace (the program's own or derived)
  for (size_t i = 0; i < traces.size(); ++i) {
    const RunTrace& t = traces[i];
    TraceCounts c = count(t.path);
    if (!c.ok) continue;
    if (c.cuda_off.empty()) any_cuda_on = true;
    else cuda_off = c.cuda_off;
    // Who it is (by its job rank; a launcher or helper by its pid), then where it went.
    const Assigned& as = assigned[i];
    std::string who;
    if (as.role == db::RankRole::Rank) {
      if (traces.size() > 1 || as.job_rank) who = "rank " + std::to_string(as.job_rank.value_or(0));
    } else if (as.role == db::RankRole::Launcher) {
      who = "launcher process " + std::to_string(t.pid);
    } else {
      who = std::string(db::to_string(as.role)) + " process " + std::to_string(t.pid) +
            (as.job_rank ? " of rank " + std::to_string(*as.job_rank) : "");
    }
    std::string where = t.path == out.string() ? "trace written to " + t.path
                        : t.pid == child       ? "after exec, process " + std::to_string(t.pid) + ": trace " + t.path
                                               : "child process " + std::to_string(t.pid) + ": trace " + t.path;
    // "launcher process 12, child process 12" says the pid twice: the first is enough.
    if (as.role != db::RankRole::Rank && t.path != out.string()) where = "trace " + t.path;
    std::string what = who.empty() ? where : who + (t.path == out.string() || as.role != db::RankRole::Rank ? ": " : ", ") + where;
    std::string then;
    if (t.exit_detail.rfind(kExecDetail, 0) == 0) {
      // This image ended in an exec; the next image of the same pid (if it was recorded) follows.
      bool next_recorded = false;
      for (size_t j = i + 1; j < traces.size(); ++j) next_recorded = next_recorded || traces[j].pid == t.pid;
      then = " (recorded until it exec'd " + t.exit_detail.substr(std::strlen(kExecDetail)) +
             (next_recorded ? ")" : ", which left no trace)");
    }
    if (!renumbered[i]) then += " (its process is still running: not renumbered for zt db merge)";
    // Steps and epochs from the ranges (a trace whose process still runs is left alone).
    std::string steps;
    std::vector<std::string> notes;
    if (renumbered[i]) {
      db::DerivedMarkers d;
      if (Status s = db::derive_steps(t.path, db::StepRules{a.step_range, a.epoch_range}, &d); !s) {
        notes.push_back(s.message());
      } else {
        steps = ", " + db::describe(d);
        notes = d.notes;
        any_marks = any_marks || d.steps || d.epochs || d.own_steps || d.own_epochs;
      }
    }
    // Rows recorded one by one, then the sampled ones (allocations under the threshold).
    const std::string sampled = c.sampled ? ", " + std::to_string(c.sampled) + " sampled (" +
                                                std::to_string(c.sampled_live) + " live)"
                                          : std::string();
    std::fprintf(stderr, "zt probe: %s: %lld allocations (%lld live at exit)%s, %lld transfers, %lld kernels%s%s%s\n",
                 what.c_str(), (long long)c.allocations, (long long)c.live, sampled.c_str(), (long long)c.transfers,
                 (long long)c.kernels, c.dropped ? (", " + std::to_string(c.dropped) + " events dropped").c_str() : "",
                 steps.c_str(), then.c_str());
    if (!as.note.empty()) notes.insert(notes.begin(), as.note);
    for (auto& n : notes) std::fprintf(stderr, "zt probe:   %s\n", n.c_str());
  }
  if (!any_cuda_on && !cuda_off.empty()) std::fprintf(stderr, "zt probe: %s\n", cuda_off.c_str());
  if (!any_marks)
    std::fprintf(stderr,
                 "zt probe: no steps or epochs found; to mark them: the zerotrace module in Python (with "
                 "zerotrace.epoch(e): / with zerotrace.step(n):), NVTX ranges named 'epoch N' / 'step N', the HF "
                 "Trainer or Lightning (marked for you), or --step-range / --epoch-range naming a range of the "
                 "program's (docs/python-jobs.md); without them zt check --leaks compares windows of time\n");
  if (traces.size() > 1) {
    // Only the renumbered traces merge (a trace whose process still runs keeps key 0).
    std::vector<std::string> merge{"zt", "db", "merge", merged_name(out.string())};
    size_t mergeable = 0;
    for (size_t i = 0; i < traces.size(); ++i)
      if (renumbered[i]) {
        merge.push_back(traces[i].path);
        ++mergeable;
      }
    std::fprintf(stderr, "zt probe: this run's data is in %zu traces, one per process image", traces.size());
    if (mergeable > 1)
      std::fprintf(stderr, "; one trace of the %zu finished ones: %s", mergeable, probe::shell_quote_command(merge).c_str());
    std::fprintf(stderr, "\n");
  }
  return code;
}

}  // namespace

void add_probe_command(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand(
      "probe",
      "Record any program's allocations, copies and kernels (CUPTI on CUDA; host allocations anywhere)\n"
      "Example: zt probe -o train.db -- python train.py --epochs 2");
  auto a = std::make_shared<ProbeArgs>();
  sub->add_option("-o,--output", a->output, "trace file to write (default zt-probe.db; other processes of the "
                                            "run write NAME.pidPID.db beside it)");
  sub->add_option("--host-threshold", a->host_threshold,
                  "host allocations this large or larger are recorded one by one with a stack; smaller ones are "
                  "sampled by bytes (default 1MiB)");
  sub->add_option("--sample-interval", a->sample_interval,
                  "host allocations under the threshold: one sampled (with its stack, standing for its expected "
                  "bytes) per this many bytes allocated, on average; 0 = off (default 512KiB)");
  sub->add_option("--max-trace", a->max_trace,
                  "the trace's size cap: past it allocations, copies, kernels and ranges are no longer recorded one "
                  "by one, and the per-step and per-epoch aggregates go on (default 768MiB, the rows and their indexes; 0 or none = no cap)");
  sub->add_option("--detail", a->detail,
                  "which steps get full detail (repeatable; default all, until --max-trace): first:N, every:N, "
                  "steps:A,B-C, time:A-B, range:REGEX (while such an NVTX or DeepSpeed range is open), signal:K "
                  "(SIGUSR1 captures the next K steps), none; outside them only the aggregates");
  sub->add_option("--flight-recorder", a->flight_recorder,
                  "keep the last N steps (20, 20steps) or seconds (30s) of the detail not written in memory, and "
                  "write them when the program ends in any way (default 20 steps; off)");
  sub->add_option("--flight-memory", a->flight_memory,
                  "the flight recorder's memory bound (default 256MiB; at most half the machine's memory)");
  sub->add_flag("--no-stacks", a->no_stacks, "no call stacks (cheaper)");
  sub->add_option("--stack-depth", a->stack_depth, "frames per stack (default 32)");
  sub->add_flag("--no-host", a->no_host, "do not record host allocations");
  sub->add_flag("--no-cuda", a->no_cuda, "do not start CUPTI");
  sub->add_option("--rss-interval-ms", a->rss_ms, "resident set size sampling period, 0 = off (default 100)");
  sub->add_option("--step-range", a->step_range,
                  "the NVTX range (a name, or a regular expression) that is one training step; first of every source "
                  "of steps (probe/README.md)");
  sub->add_option("--epoch-range", a->epoch_range, "the NVTX range (a name or a regular expression) that is one epoch");
  sub->add_flag("--python-path", a->python_path,
                "print the directory of the zerotrace Python package (for PYTHONPATH outside zt probe) and exit");
  sub->add_option("command", a->command, "the program and its arguments, after --")->expected(-1);
  sub->callback([&action, a] { action = [a] { return run_probe(*a); }; });
}

}  // namespace zt::cli
