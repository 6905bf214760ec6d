// tests/probe/probe_run_util.h: run a program under libzt_probe.so and read what it wrote.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "zt/db/trace_reader.h"

namespace zt::test {

inline std::string probe_library() { return std::string(ZT_BINARY_DIR) + "/libzt_probe.so"; }

// Debian's python3 (what CI runs), else the first python3 on PATH that is a real executable
// (not a shim script); empty when there is none.
inline std::string python3() {
  if (access("/usr/bin/python3", X_OK) == 0) return "/usr/bin/python3";
  const char* path = getenv("PATH");
  std::string p = path ? path : "";
  for (size_t a = 0; a <= p.size();) {
    size_t b = p.find(':', a);
    if (b == std::string::npos) b = p.size();
    std::string f = p.substr(a, b - a) + "/python3";
    if (access(f.c_str(), X_OK) == 0) return f;
    a = b + 1;
  }
  return "";
}

struct RunResult {
  int code = -1;  // exit code, or 128+signal
  std::string err;  // stderr
};

// Runs argv with the current environment plus `env` (a value of nullptr removes the variable).
inline RunResult run_program(const std::vector<std::string>& argv, const std::map<std::string, const char*>& env) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string k = kv.substr(0, kv.find('='));
    if (env.count(k) || k == "ZT_PROBE_CLAIMED") continue;
    envs.push_back(kv);
  }
  for (auto& [k, v] : env)
    if (v) envs.push_back(k + "=" + v);
  int pipefd[2];
  if (pipe(pipefd) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 2);
    close(pipefd[0]);
    close(pipefd[1]);
    std::vector<char*> a, e;
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    for (auto& s : envs) e.push_back(const_cast<char*>(s.c_str()));
    e.push_back(nullptr);
    execve(a[0], a.data(), e.data());
    _exit(126);
  }
  close(pipefd[1]);
  RunResult r;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) r.err.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

// One query, rows of text.
inline std::vector<std::vector<std::string>> sql(const std::string& path, const std::string& query) {
  std::unique_ptr<db::TraceReader> r;
  Status s = db::TraceReader::open(path, &r);
  if (!s) return {{"open failed: " + s.message()}};
  db::QueryResult q;
  Status qs = r->query(query, &q);
  if (!qs) return {{"query failed: " + qs.message()}};
  return q.rows;
}
inline int64_t sql_int(const std::string& path, const std::string& query) {
  auto rows = sql(path, query);
  if (rows.empty() || rows[0].empty()) return -1;
  try {
    return std::stoll(rows[0][0]);
  } catch (...) {
    return -999;
  }
}

// Allocation ids whose stack names `function`.
inline std::vector<int64_t> allocations_in(const std::string& path, const std::string& function,
                                           const std::string& where = "1") {
  std::unique_ptr<db::TraceReader> r;
  std::vector<int64_t> out;
  if (!db::TraceReader::open(path, &r)) return out;
  db::QueryResult q;
  if (!r->query("SELECT id, coalesce(stack_id, 0) FROM allocation WHERE " + where, &q)) return out;
  for (auto& row : q.rows) {
    int64_t sid = std::stoll(row[1]);
    if (sid == 0) continue;
    std::vector<std::string> lines;
    if (!r->stack_text(sid, &lines)) continue;
    for (auto& l : lines)
      if (l.find(function) != std::string::npos) {
        out.push_back(std::stoll(row[0]));
        break;
      }
  }
  return out;
}

}  // namespace zt::test
