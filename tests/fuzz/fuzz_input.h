// tests/fuzz/fuzz_input.h: what the fuzz targets share: reading a fuzzer's bytes as a sequence
// of choices, a scratch directory (in /dev/shm where there is one: the targets write files
// per input), and silencing what the code under test prints.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

namespace zt::fuzz {

// The input as choices: each read takes bytes from the front; past the end, zeros. Take at most one
// read per full expression: the order of two reads in one (function arguments, the operands of +)
// is the compiler's choice, and an input found by clang must mean the same in the g++ replay.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool empty() const { return p_ >= end_; }
  size_t left() const { return size_t(end_ - p_); }
  uint8_t byte() { return p_ < end_ ? *p_++ : 0; }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return v;
  }
  // Up to `most` bytes, the length taken from the input first.
  std::string text(size_t most) {
    const size_t want = byte() % (most + 1);
    const size_t n = std::min(want, left());
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  std::string rest() {
    std::string s(reinterpret_cast<const char*>(p_), left());
    p_ = end_;
    return s;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// A directory of this process's own, made once: /dev/shm (memory) when it exists, else TMPDIR.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : tmp ? tmp : "/tmp";
    std::string d = base + "/zt-fuzz-" + std::to_string(::getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// While alive, std::cout and std::cerr go nowhere (a million inputs of reports would be the
// slowest part of a run).
class Quiet {
 public:
  Quiet() : out_(std::cout.rdbuf(&sink_)), err_(std::cerr.rdbuf(&sink_)) {}
  ~Quiet() {
    std::cout.rdbuf(out_);
    std::cerr.rdbuf(err_);
  }

 private:
  struct Sink : std::streambuf {
    int overflow(int c) override { return c; }
    std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
  } sink_;
  std::streambuf* out_;
  std::streambuf* err_;
};

}  // namespace zt::fuzz
