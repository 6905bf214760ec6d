// Runs the zt binary as a child with its output in a file, and measures it: exit code, wall time
// and peak resident memory (wait4's rusage). Shared by the repro CLI tests.
#pragma once

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <vector>

extern char** environ;

namespace zt::test {

struct Measured {
  int code = -1;  // -1: zt could not be started
  double seconds = 0;
  long max_rss_kib = 0;
};

// zt ARGS, stdout and stderr into `log`.
inline Measured measure_zt(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {std::string(ZT_BINARY_DIR) + "/zt"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  Measured m;
  pid_t pid = 0;
  const auto t0 = std::chrono::steady_clock::now();
  if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) == 0) {
    int status = 0;
    struct rusage ru {};
    wait4(pid, &status, 0, &ru);
    m.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    m.max_rss_kib = ru.ru_maxrss;
  }
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  posix_spawn_file_actions_destroy(&fa);
  return m;
}

}  // namespace zt::test
