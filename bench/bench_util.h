// bench/bench_util.h: what the CPU-side benchmarks need alike: 64-byte aligned host arrays, a
// first-touch fill (on the OpenMP threads that will use the pages) with values that keep AdamW
// finite, and strict command-line options.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace zt::bench {

struct HostArray {
  // Throws std::runtime_error "out of memory (N bytes)" when the allocation fails.
  explicit HostArray(size_t bytes) : ptr(std::aligned_alloc(64, (bytes + 63) / 64 * 64)) {
    if (!ptr) throw std::runtime_error("out of memory (" + std::to_string(bytes) + " bytes)");
  }
  ~HostArray() { std::free(ptr); }
  HostArray(const HostArray&) = delete;
  HostArray& operator=(const HostArray&) = delete;
  float* f() const { return static_cast<float*>(ptr); }
  void* ptr;
};

inline void fill(float* x, int64_t n, float scale, uint32_t seed) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) {
    uint32_t h = uint32_t(i) * 2654435761u + seed;
    h ^= h >> 15;
    x[i] = scale * (float(h & 0xffff) / 65536.0f - 0.5f);
  }
}

// "--name VALUE" options and "--flag"s, read strictly: an unknown option, a missing value or a
// value that is not a whole number in range ends the program with one line naming it and the usage
// (exit 2), never a silent default. -h/--help prints the usage (exit 0). Read every option, then
// call done(), which refuses whatever was not read.
class Options {
 public:
  Options(int argc, char** argv, std::string usage) : usage_(std::move(usage)) {
    for (int i = 1; i < argc; ++i) args_.push_back(argv[i]);
    used_.assign(args_.size(), false);
    for (const std::string& a : args_)
      if (a == "-h" || a == "--help") {
        std::printf("usage: %s\n", usage_.c_str());
        std::exit(0);
      }
  }
  int64_t integer(const char* name, int64_t fallback, int64_t min = 0, int64_t max = INT64_MAX) {
    const std::string* v = value(name);
    if (!v) return fallback;
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v->c_str(), &end, 10);
    if (v->empty() || *end || errno != 0 || x < min || x > max)
      fail(std::string(name) + " '" + *v + "': a whole number from " + std::to_string(min) +
           (max == INT64_MAX ? " up" : " to " + std::to_string(max)));
    return x;
  }
  std::string text(const char* name, std::string fallback, const std::vector<std::string>& allowed = {}) {
    const std::string* v = value(name);
    if (!v) return fallback;
    if (!allowed.empty()) {
      bool ok = false;
      std::string list;
      for (const std::string& a : allowed) ok = ok || a == *v, list += (list.empty() ? "" : ", ") + a;
      if (!ok) fail(std::string(name) + " '" + *v + "': one of " + list);
    }
    return *v;
  }
  bool flag(const char* name) {
    bool seen = false;
    for (size_t i = 0; i < args_.size(); ++i)
      if (args_[i] == name) used_[i] = true, seen = true;
    return seen;
  }
  void done() const {
    for (size_t i = 0; i < args_.size(); ++i)
      if (!used_[i]) fail("'" + args_[i] + "': not an option of this benchmark");
  }

 private:
  const std::string* value(const char* name) {
    const std::string* found = nullptr;
    for (size_t i = 0; i < args_.size(); ++i) {
      if (args_[i] != name) continue;
      if (i + 1 >= args_.size()) fail(std::string(name) + ": give it a value");
      used_[i] = used_[i + 1] = true;
      found = &args_[i + 1];
    }
    return found;
  }
  [[noreturn]] void fail(const std::string& what) const {
    std::fprintf(stderr, "%s\nusage: %s\n", what.c_str(), usage_.c_str());
    std::exit(2);
  }
  std::string usage_;
  std::vector<std::string> args_;
  std::vector<bool> used_;
};

}  // namespace zt::bench
