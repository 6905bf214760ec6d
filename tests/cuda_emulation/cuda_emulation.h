// tests/cuda_emulation/cuda_emulation.h: just enough of CUDA, on CPU threads, to run the text of a
// kernel header (trainer/cuda/flash_attention_kernels.cuh) without a GPU and check its logic:
// indexing, masks, the placement of barriers, shuffles, and WMMA fragment layouts as the CUDA
// documentation defines them. Not its speed, and not the hardware's own summation order.
//
//  - launch(grid, threads, dynamic_bytes, f): the blocks one after another; each block's threads
//    are real std::threads, so a missing barrier is a real data race (and usually a wrong result);
//    __shared__ variables are function statics (one block runs at a time), dynamic_shared() a
//    buffer allocated per launch (filled with NaN bytes, so an unwritten read shows);
//  - __syncthreads / __syncwarp: std::barrier over the block / the 32 threads of a warp;
//    __shfl_xor_sync: through a per-warp exchange slot between two warp barriers;
//  - nvcuda::wmma: each thread holds the whole 16x16 tile of a fragment (as a float); load and
//    mma are computed by every lane, store is done by lane 0 (the kernel must __syncwarp before
//    other lanes read it, as on a GPU). mma accumulates k in order, in fp32, from the
//    accumulator's value. load/store check that the pointer is 32-byte aligned and that ldm is a
//    multiple of 16 bytes, as the CUDA documentation requires;
//  - float4 / make_float4; __nv_bfloat16 with __float2bfloat16_rn (core/dtype_bits.h's rounding) and __bfloat162float; atomicAdd on float
//    under a mutex; __fmul_rn / __fadd_rn as plain float operations (no FMA on this build);
//  - __trap aborts. __CUDA_ARCH__ is defined as 800 so guarded kernel bodies are compiled.
#pragma once

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/dtype_bits.h"

#define __CUDA_ARCH__ 800
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

namespace cuda_emulation {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// The launch in progress (one block at a time) and this thread's place in it.
struct Block {
  Dim3 grid, block_dim, block_idx;
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> exchange;  // __shfl_xor_sync's slots, one per thread
  std::vector<unsigned char> dynamic;
};
inline Block* g_block = nullptr;
inline thread_local Dim3 t_thread_idx;
inline std::mutex g_atomic_mu;

inline void fail(const std::string& what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what.c_str());
  std::abort();
}

// Runs kernel() on every thread of every block of `grid` (blocks in x, then y order).
inline void launch(Dim3 grid, unsigned threads, size_t dynamic_bytes, const std::function<void()>& kernel) {
  if (threads % 32 != 0) fail("a block must be whole warps");
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      Block b;
      b.grid = grid;
      b.block_dim = {threads, 1, 1};
      b.block_idx = {bx, by, 0};
      b.all = std::make_unique<std::barrier<>>(threads);
      for (unsigned w = 0; w < threads / 32; ++w) b.warps.push_back(std::make_unique<std::barrier<>>(32));
      b.exchange.assign(threads, 0.0f);
      b.dynamic.assign(dynamic_bytes + 64, 0xFF);  // NaN bytes until written
      g_block = &b;
      std::vector<std::thread> team;
      for (unsigned t = 0; t < threads; ++t)
        team.emplace_back([t, &kernel] {
          t_thread_idx = {t, 0, 0};
          kernel();
        });
      for (auto& th : team) th.join();
      g_block = nullptr;
    }
}

}  // namespace cuda_emulation

#define threadIdx (::cuda_emulation::t_thread_idx)
#define blockIdx (::cuda_emulation::g_block->block_idx)
#define gridDim (::cuda_emulation::g_block->grid)
#define blockDim (::cuda_emulation::g_block->block_dim)

inline void __syncthreads() { cuda_emulation::g_block->all->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  cuda_emulation::g_block->warps[threadIdx.x / 32]->arrive_and_wait();
}
inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  if (mask != 0xffffffffu) cuda_emulation::fail("__shfl_xor_sync: only full-warp masks are emulated");
  auto& slots = cuda_emulation::g_block->exchange;
  const unsigned me = threadIdx.x, warp0 = me / 32 * 32;
  slots[me] = v;
  __syncwarp();
  const float other = slots[warp0 + ((me - warp0) ^ unsigned(lane_mask))];
  __syncwarp();  // nobody overwrites a slot before its partner read it
  return other;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float atomicAdd(float* p, float v) {
  std::lock_guard lock(cuda_emulation::g_atomic_mu);
  const float old = *p;
  *p = old + v;
  return old;
}
[[noreturn]] inline void __trap() { cuda_emulation::fail("__trap()"); }

struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

struct __nv_bfloat16 {
  uint16_t bits;
  operator float() const { return zt::trainer::bits::bf16_to_float(bits); }
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return {zt::trainer::bits::float_to_bf16(f)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return zt::trainer::bits::bf16_to_float(h.bits); }

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "only 16x16x16 is emulated");
  float x[16][16];  // [row][col] of the tile: A (m, k), B (k, n), C (m, n)
};

inline void check_pointer(const void* p, unsigned ldm, size_t element_bytes, const char* op) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) cuda_emulation::fail(std::string(op) + ": pointer not 32-byte aligned");
  if ((ldm * element_bytes) % 16 != 0) cuda_emulation::fail(std::string(op) + ": ldm not a multiple of 16 bytes");
}

template <typename Use, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, __nv_bfloat16, Layout>& f, const __nv_bfloat16* p, unsigned ldm) {
  check_pointer(p, ldm, 2, "load_matrix_sync");
  constexpr bool col = std::is_same_v<Layout, col_major>;
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) f.x[i][j] = col ? float(p[j * ldm + i]) : float(p[i * ldm + j]);
}

template <typename T>
void fill_fragment(fragment<accumulator, 16, 16, 16, T>& f, float v) {
  for (auto& row : f.x)
    for (float& e : row) e = v;
}

template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  fragment<accumulator, 16, 16, 16, float> out;
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float acc = c.x[m][n];
      for (int k = 0; k < 16; ++k) acc += a.x[m][k] * b.x[k][n];
      out.x[m][n] = acc;
    }
  d = out;
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t layout) {
  check_pointer(p, ldm, 4, "store_matrix_sync");
  if (threadIdx.x % 32 != 0) return;  // lane 0 writes; the others must wait for it (__syncwarp)
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) {
      if (layout == mem_row_major) p[i * ldm + j] = f.x[i][j];
      else p[j * ldm + i] = f.x[i][j];
    }
}

}  // namespace nvcuda::wmma
