// bench/bench_util.h: what the CPU-side benchmarks need alike: 64-byte aligned host arrays, and a
// first-touch fill (on the OpenMP threads that will use the pages) with values that keep AdamW finite.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

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

}  // namespace zt::bench
