// zt probe: run any program with libzt_probe.so loaded and say where its trace is.
//
// The command only sets the environment up (LD_PRELOAD for the host interposer,
// CUDA_INJECTION64_PATH for CUPTI, ZT_PROBE_* for the settings; see zt/probe/probe_config.h),
// runs the program, passes its exit code through (128+N when signal N killed it), writes that
// code into the run row of the trace (the library cannot know it), and prints a summary.
// Bad usage (no command, a command that does not exist, the library missing) exits 2 before
// anything runs.
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "zt/common/units.h"
#include "zt/db/trace_reader.h"
#include "zt/probe/probe_config.h"

namespace zt::cli {
namespace {

namespace fs = std::filesystem;

struct ProbeArgs {
  std::string output = "zt-probe.db";
  std::string host_threshold = "1MiB";
  bool no_stacks = false;
  int stack_depth = 32;
  bool no_host = false;
  bool no_cuda = false;
  int rss_ms = 100;
  std::vector<std::string> command;
};

std::string find_library() {
  if (const char* v = std::getenv("ZT_PROBE_LIBRARY"); v && *v) return v;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : (exe.parent_path() / "libzt_probe.so").string();
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

std::string quote_command(const std::vector<std::string>& words) {
  std::string out;
  for (auto& w : words) {
    if (!out.empty()) out += ' ';
    bool plain = !w.empty() && w.find_first_of(" \t\"'\\$`") == std::string::npos;
    out += plain ? w : "'" + w + "'";
  }
  return out;
}

// The traces this run wrote: the root's, and the per-process ones modified since the start.
std::vector<std::string> traces_of_run(const std::string& main, fs::file_time_type since) {
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::exists(main, ec)) out.push_back(main);
  std::string stem = fs::path(main).filename().string();
  if (stem.size() > 3 && stem.substr(stem.size() - 3) == ".db") stem.resize(stem.size() - 3);
  fs::path dir = fs::path(main).parent_path();
  std::vector<std::string> others;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    std::string n = e.path().filename().string();
    if (n.rfind(stem + ".pid", 0) != 0 || n.size() < 3 || n.substr(n.size() - 3) != ".db") continue;
    if (e.last_write_time(ec) >= since) others.push_back(e.path().string());
  }
  std::sort(others.begin(), others.end());
  out.insert(out.end(), others.begin(), others.end());
  return out;
}

// The library ends each run as "ok" without an exit code; the code belongs to the last image of
// the child's pid (earlier images ended by exec and say so).
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
  std::string cuda_off;  // the cuda_tracing_off message, if any
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
               "(SELECT message FROM error WHERE kind = 'cuda_tracing_off' LIMIT 1)",
               &q) && !q.rows.empty()) {
    auto& row = q.rows[0];
    c.allocations = std::stoll(row[0]);
    c.live = std::stoll(row[1]);
    c.transfers = std::stoll(row[2]);
    c.kernels = std::stoll(row[3]);
    c.dropped = std::stoll(row[4]);
    if (row[5] != "NULL") c.cuda_off = row[5];
    c.ok = true;
  }
  return c;
}

pid_t g_child = 0;
void forward_signal(int sig) {
  if (g_child > 0) ::kill(g_child, sig);
}

int run_probe(const ProbeArgs& a) {
  if (a.command.empty())
    return fail("probe: no command given; example: zt probe -o out.db -- python train.py");
  std::string program = resolve_command(a.command[0]);
  if (program.empty()) return fail("probe: " + a.command[0] + ": command not found (or not executable)");
  std::string lib = find_library();
  if (lib.empty() || ::access(lib.c_str(), R_OK) != 0)
    return fail("probe: " + (lib.empty() ? std::string("libzt_probe.so") : lib) +
                " not found; it is built beside the zt executable (or set ZT_PROBE_LIBRARY)");
  auto threshold = parse_bytes(a.host_threshold);
  if (!threshold) return fail("probe: --host-threshold " + a.host_threshold + ": not a size (examples: 1MiB, 65536)");
  if (a.stack_depth < 1 || a.stack_depth > 128) return fail("probe: --stack-depth must be 1 to 128");
  if (a.rss_ms < 0) return fail("probe: --rss-interval-ms must be 0 (off) or more");

  std::error_code ec;
  fs::path out = fs::absolute(a.output, ec);
  if (ec || !fs::is_directory(out.parent_path(), ec))
    return fail("probe: " + a.output + ": directory " + out.parent_path().string() + " does not exist");
  auto started = fs::file_time_type::clock::now() - std::chrono::seconds(1);

  std::vector<char*> argv;
  for (auto& w : a.command) argv.push_back(const_cast<char*>(w.c_str()));
  argv.push_back(nullptr);
  std::string preload = lib;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) preload += std::string(":") + old;

  pid_t child = ::fork();
  if (child < 0) return fail(std::string("probe: fork failed: ") + std::strerror(errno));
  if (child == 0) {
    setenv("LD_PRELOAD", preload.c_str(), 1);
    setenv("CUDA_INJECTION64_PATH", lib.c_str(), 1);
    setenv(probe::kEnvOutput, out.c_str(), 1);
    setenv(probe::kEnvHostThreshold, std::to_string(*threshold).c_str(), 1);
    setenv(probe::kEnvStacks, a.no_stacks ? "0" : "1", 1);
    setenv(probe::kEnvStackDepth, std::to_string(a.stack_depth).c_str(), 1);
    setenv(probe::kEnvHost, a.no_host ? "0" : "1", 1);
    setenv(probe::kEnvCuda, a.no_cuda ? "0" : "1", 1);
    setenv(probe::kEnvRssMs, std::to_string(a.rss_ms).c_str(), 1);
    setenv(probe::kEnvQuiet, "1", 1);  // this command prints the summary instead
    setenv(probe::kEnvCommand, quote_command(a.command).c_str(), 1);
    unsetenv(probe::kEnvClaimed);      // a fresh run, even when zt itself runs under a probe
    ::execv(program.c_str(), argv.data());
    std::fprintf(stderr, "zt: probe: cannot run %s: %s\n", program.c_str(), std::strerror(errno));
    _exit(kExitBadInput);
  }
  // Ctrl-C reaches the child through the terminal's process group; the parent outlives it to
  // report. A SIGTERM sent to zt alone is passed on.
  g_child = child;
  signal(SIGINT, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  signal(SIGTERM, forward_signal);
  signal(SIGHUP, forward_signal);
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
  int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;

  std::vector<std::string> traces = traces_of_run(out.string(), started);
  for (auto& t : traces) write_exit_code(t, child, code, sig);
  if (traces.empty()) {
    std::fprintf(stderr, "zt probe: no trace was written (%s); the program exited with %d\n", out.c_str(), code);
    return code;
  }
  std::string cuda_off;
  bool any_cuda_on = false;
  for (size_t i = 0; i < traces.size(); ++i) {
    TraceCounts c = count(traces[i]);
    if (!c.ok) continue;
    if (c.cuda_off.empty()) any_cuda_on = true;
    else cuda_off = c.cuda_off;
    if (i == 0 || c.allocations + c.transfers + c.kernels > 0) {
      std::fprintf(stderr, "zt probe: %s %s: %lld allocations (%lld live at exit), %lld transfers, %lld kernels%s\n",
                   i == 0 ? "trace written to" : "child process trace", traces[i].c_str(), (long long)c.allocations,
                   (long long)c.live, (long long)c.transfers, (long long)c.kernels,
                   c.dropped ? (", " + std::to_string(c.dropped) + " events dropped").c_str() : "");
    }
  }
  if (!any_cuda_on && !cuda_off.empty()) std::fprintf(stderr, "zt probe: %s\n", cuda_off.c_str());
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
                  "host allocations this large or larger are recorded with a stack; smaller ones are summed "
                  "(default 1MiB)");
  sub->add_flag("--no-stacks", a->no_stacks, "no call stacks (cheaper)");
  sub->add_option("--stack-depth", a->stack_depth, "frames per stack (default 32)");
  sub->add_flag("--no-host", a->no_host, "do not record host allocations");
  sub->add_flag("--no-cuda", a->no_cuda, "do not start CUPTI");
  sub->add_option("--rss-interval-ms", a->rss_ms, "resident set size sampling period, 0 = off (default 100)");
  sub->add_option("command", a->command, "the program and its arguments, after --")->expected(-1);
  sub->callback([&action, a] { action = [a] { return run_probe(*a); }; });
}

}  // namespace zt::cli
