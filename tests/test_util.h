// tests/test_util.h: a scratch directory per test, removed afterwards; an environment variable set
// for a scope; running a command; reading a file; seeded random inputs.
#pragma once

#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace zt::test {

// How much longer a run takes under AddressSanitizer (scripts/test-sanitize: -O1, shadow memory): time
// limits in tests are multiplied by it.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr double kSanitizerSlowdown = 3;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr double kSanitizerSlowdown = 3;
#else
inline constexpr double kSanitizerSlowdown = 1;
#endif
#else
inline constexpr double kSanitizerSlowdown = 1;
#endif

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/zt-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An environment variable set while this lives, unset after (the knobs tests set, ZT_..., are unset
// unless a test sets them).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_.c_str()); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
};

struct CommandResult {
  int code = -1;
  std::string out;  // stdout and stderr together
};

// Runs `command` through the shell (append " 2>&1" to capture stderr); the exit code, or
// 128 + the signal that ended it.
inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* p = popen(command.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// The whole file as bytes ("" when it cannot be read).
inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Runs `command` (no single quotes in it) under `xvfb-run -a`: the command's own exit code and
// output (stdout and stderr together), not xvfb-run's, whose clean-up of its temporary directory
// sometimes fails after the command has exited (exit 5). `scratch`: a directory for two files.
// Code -1 and xvfb-run's output when the command never ran.
inline CommandResult run_under_xvfb(const std::string& command, const std::string& scratch,
                                    const std::string& server_args = "") {
  const std::string code = scratch + "/xvfb-command.code", out = scratch + "/xvfb-command.out";
  std::remove(code.c_str());
  CommandResult x = run_command("xvfb-run -a " + (server_args.empty() ? "" : "-s \"" + server_args + "\" ") + "sh -c '" +
                                command + " >" + out + " 2>&1; echo $? >" + code + "' 2>&1");
  const std::string c = read_file(code);
  if (c.empty()) return x;
  CommandResult r;
  r.code = std::atoi(c.c_str());
  r.out = read_file(out);
  return r;
}

// n values ~ N(mean, stddev^2) from std::mt19937_64(seed), the same on every platform and run.
inline std::vector<float> normal_values(size_t n, uint64_t seed, float stddev = 1.0f, float mean = 0.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

}  // namespace zt::test
