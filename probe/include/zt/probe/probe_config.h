// zt/probe/probe_config.h: how `zt probe` talks to libzt_probe.so inside the probed program.
//
// The injected library cannot take arguments: everything arrives as ZT_PROBE_* environment
// variables, set by `zt probe` (or by hand). This header is the one list of those variables,
// their defaults, and the rule that names each process's trace file, so that the command and
// the library never disagree. Plain code: no CUDA, no hooks, testable anywhere.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "zt/common/status.h"
#include "zt/probe/detail_policy.h"
#include "zt/db/schema.h"

namespace zt::probe {

inline constexpr const char* kEnvOutput = "ZT_PROBE_OUTPUT";                // trace file of the root process
inline constexpr const char* kEnvHostThreshold = "ZT_PROBE_HOST_THRESHOLD";  // "1MiB": recorded one by one from this size
// Host allocations under the threshold are sampled by bytes: a Poisson sample of mean interval
// "512KiB" (0: off), each sampled allocation a row standing for its expected bytes.
inline constexpr const char* kEnvSampleInterval = "ZT_PROBE_SAMPLE_INTERVAL";
// A number that makes the sample the same in every run of the same program (tests); unset or 0: random.
inline constexpr const char* kEnvSampleSeed = "ZT_PROBE_SAMPLE_SEED";
inline constexpr const char* kEnvStacks = "ZT_PROBE_STACKS";                // 0: no call stacks
inline constexpr const char* kEnvStackDepth = "ZT_PROBE_STACK_DEPTH";       // frames per stack (1..128)
inline constexpr const char* kEnvHost = "ZT_PROBE_HOST";                    // 0: host allocations not recorded
inline constexpr const char* kEnvCuda = "ZT_PROBE_CUDA";                    // 0: CUPTI not started
inline constexpr const char* kEnvRssMs = "ZT_PROBE_RSS_MS";                 // RSS sampling period, 0 = off
inline constexpr const char* kEnvQuiet = "ZT_PROBE_QUIET";                  // 1: no lines on stderr
inline constexpr const char* kEnvForks = "ZT_PROBE_FORKS";                  // 0: a child forked without exec records nothing
inline constexpr const char* kEnvCommand = "ZT_PROBE_COMMAND";              // the command line as the user typed it
// The trace's size cap (a size; "0" or "none": no cap; default kDefaultMaxTrace): past it the
// detail stops and the aggregates go on (zt/probe/recorder.h, RecorderOptions::max_trace_bytes).
inline constexpr const char* kEnvMaxTrace = "ZT_PROBE_MAX_TRACE";
// 768 MiB (805 MB), the detail's rows with the indexes built for them at close. A day of one GPU
// then stays under 1 GB: what goes on after the cap (the aggregates, step markers, RSS samples
// every 100 ms) is about 70 MB a day (docs/probe.md, "Long jobs").
inline constexpr int64_t kDefaultMaxTrace = int64_t(768) << 20;
// "--max-trace" / ZT_PROBE_MAX_TRACE: a size (512MiB, 2GiB, 1073741824), or 0 / "none" for no cap
// (returned as 0). nullopt: not a size up to 8 PiB.
std::optional<int64_t> parse_max_trace(const std::string& text);
// Python frames in stacks: "1" (default) a thread's own frames, with or without the GIL; "gil"
// only while it holds the GIL; "0" none (probe/src/python/python_frames.h).
inline constexpr const char* kEnvPython = "ZT_PROBE_PYTHON";
// A token naming one `zt probe` run ([A-Za-z0-9._-], at most 64 characters). Every process of
// the run writes it into its trace's run row (config_json "run_id"), so that `zt probe` finds
// exactly the traces of this run, never an older file at the same path.
inline constexpr const char* kEnvRunId = "ZT_PROBE_RUN_ID";
// Read by the zerotrace Python hook for PyTorch (python/zerotrace/hooks/torch_memory.py): "0"
// leaves PyTorch's allocator history off; ZT_PROBE_TORCH_ENTRIES bounds it (its ring buffer,
// default 1000000 entries). The hook writes torch_history_path() below.
inline constexpr const char* kEnvTorch = "ZT_PROBE_TORCH";
inline constexpr const char* kEnvTorchEntries = "ZT_PROBE_TORCH_ENTRIES";
// Set by the library itself once a process has claimed ZT_PROBE_OUTPUT (value: its pid).
// Every later process of the run (children that exec, an exec'd image of the root) finds it
// and writes its own per-process file instead of overwriting the root's trace.
inline constexpr const char* kEnvClaimed = "ZT_PROBE_CLAIMED";

// Set by the library in a process that holds a rank (the launcher's variables name one), and in
// the root of the run: "<host> <pid> <launcher> <rank> <world>" (launcher "-" without a rank,
// world 0 when not known). Its children inherit it with the variables, and so tell a helper that
// inherited its rank (same variables, started by it) from a rank a launcher started.
inline constexpr const char* kEnvRankOwner = "ZT_PROBE_RANK_OWNER";

enum class PythonFrames : uint8_t { Off, Gil, Own };

// ---- which process of the job this is (rank.role, db/SCHEMA.md) ----
// What the launcher's variables say of a process (trainer/zero/launcher_env.h's read_job_rank).
struct RankClaim {
  bool has_rank = false;
  std::string launcher;  // "torchrun", ...; "" without a rank
  int rank = 0;
  int world_size = 0;  // 0: not known
  bool same(const RankClaim& o) const {
    return has_rank == o.has_rank && (!has_rank || (launcher == o.launcher && rank == o.rank && world_size == o.world_size));
  }
};
struct RankOwner {
  std::string host;
  int64_t pid = 0;
  RankClaim claim;
};
std::string format_rank_owner(const RankOwner& o);
std::optional<RankOwner> parse_rank_owner(const std::string& text);  // nullopt: not an owner line

// What a process records itself as, at load. The rules (docs/probe.md, "Ranks"):
//  - variables naming a rank: the rank, unless the owner it inherited holds the same claim and is
//    its ancestor (then a helper of that rank: a subprocess of the rank); an owner that is this
//    very process is an earlier image of it (exec), so still the rank. A rank whose owner is some
//    other process (a launcher with no rank, srun's batch shell that is task 0, an outer launcher)
//    names it in `launched_by` (where it runs on this host): zt probe records that process as the
//    launcher.
//  - no rank variables: the root of the run (or an exec'd image of it) is the one rank of a run
//    without a launcher (job rank unknown) until zt probe finds ranks; any other process is a
//    helper, of the owner's rank where it inherited one.
// `owns`: this process becomes the owner its children inherit.
struct ProcessRole {
  db::RankRole role = db::RankRole::Rank;
  std::optional<int> job_rank;
  int64_t launched_by = 0;  // 0: none
  bool owns = false;
};
ProcessRole decide_process_role(const RankClaim& self, bool root, const std::optional<RankOwner>& owner,
                                bool owner_here, bool owner_is_self, bool owner_is_ancestor);

struct ProbeConfig {
  std::string output = "zt-probe.db";
  uint64_t host_threshold = 1ull << 20;
  // 512 KiB, as Go's heap profiler (runtime.MemProfileRate): about two sampled rows per MiB
  // allocated under the threshold, which keeps a Python job's cost near 1% (docs/probe.md).
  uint64_t sample_interval = 512ull << 10;
  uint64_t sample_seed = 0;
  bool stacks = true;
  int stack_depth = 32;
  PythonFrames python = PythonFrames::Own;
  bool host = true;
  bool cuda = true;
  int rss_interval_ms = 100;
  bool quiet = false;
  bool forks = true;  // a child forked without exec (a DataLoader worker) records its own trace
  std::string command_line;  // empty: the library reads /proc/self/cmdline
  std::string run_id;        // empty: not started by zt probe
  int64_t max_trace = kDefaultMaxTrace;  // 0: no cap
  // ZT_PROBE_DETAIL, ZT_PROBE_FLIGHT_RECORDER, ZT_PROBE_FLIGHT_MEMORY (zt/probe/detail_policy.h):
  // the detail windows (default all) and the flight recorder (default the last 20 steps, 256 MiB).
  DetailPolicy detail;
  FlightRecorder flight;
};

// Reads the ZT_PROBE_* variables through `getenv` (tests pass a map). A malformed value is an
// error naming the variable and the value; unset variables keep the defaults above.
Status probe_config_from_env(const std::function<const char*(const char*)>& getenv, ProbeConfig* out);

// The file a process writes: the root writes `main`; any other process of the run writes
// "<main without .db>.pid<PID>.db" ("-2", "-3"... appended by the caller when it exists).
std::string per_process_trace_path(const std::string& main, int pid);
// `main` without its ".db" (the stem of the per-process traces and of zt probe's merged one).
std::string trace_stem(const std::string& main);
// Where process PID of a run writes PyTorch's memory snapshot for zt probe to add to its trace:
// "<main without .db>.torch.pid<PID>.pickle" (the Python hook spells the same rule).
std::string torch_history_path(const std::string& main, int64_t pid);

// One word as a POSIX shell needs it to read it back as that word: unchanged when it is made
// only of characters no shell treats specially (letters, digits, and _ @ % + = : , . / -),
// otherwise in single quotes, an embedded ' written as '\'' ("" becomes '').
std::string shell_quote(const std::string& word);
// Words joined by spaces, each through shell_quote: `sh -c "set -- LINE"` gives the words back.
std::string shell_quote_command(const std::vector<std::string>& words);

}  // namespace zt::probe
