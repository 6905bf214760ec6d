// trainer/cuda/flash_attention.cu: see flash_attention.h. The kernels are in
// flash_attention_kernels.cuh (which says how they work); this file launches them.
// model/flash_attention.cpp is the same algorithm written as plain loops (the GPU tests compare
// the two; tests/cuda_emulation runs the kernels' own text on the CPU against it).
#include "cuda/flash_attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <climits>
#include <cstdint>
#include <initializer_list>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda/runtime.h"

namespace zt::cuda {

namespace {

// The block's dynamic shared memory (the backward's tiles), for the kernels' header.
__device__ __forceinline__ unsigned char* dynamic_shared() {
  extern __shared__ __align__(32) unsigned char shared_raw[];
  return shared_raw;
}

#include "cuda/flash_attention_kernels.cuh"

// Calls f(std::integral_constant<int, D>) for the head size, which must be supported.
template <typename F>
void with_head_size(int64_t hs, F&& f) {
  switch (hs) {
    case 16: f(std::integral_constant<int, 16>{}); return;
    case 32: f(std::integral_constant<int, 32>{}); return;
    case 64: f(std::integral_constant<int, 64>{}); return;
    default: throw std::logic_error("flash attention: head size " + std::to_string(hs) + " slipped past the check");
  }
}

// The shape, and the 16-byte alignment the kernels' four-float loads need (cudaMalloc and the
// passes' buffers give 256).
void require_supported(const char* op, int64_t B, int64_t T, int64_t C, int64_t H,
                       std::initializer_list<const void*> loaded) {
  if (std::string why = flash_attention_unsupported(B, T, C, H); !why.empty())
    throw std::invalid_argument(std::string(op) + ": " + why);
  for (const void* p : loaded)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
      throw std::invalid_argument(std::string(op) + ": qkv and dout must be 16-byte aligned (four-float loads)");
}

}  // namespace

std::string flash_attention_unsupported(int64_t B, int64_t T, int64_t C, int64_t H) {
  if (B < 1 || T < 1 || C < 1 || H < 1 || C % H != 0)
    return "needs B, T, C, H >= 1 with C a multiple of H (B=" + std::to_string(B) + " T=" + std::to_string(T) +
           " C=" + std::to_string(C) + " H=" + std::to_string(H) + ")";
  const int64_t hs = C / H;
  if (hs != 16 && hs != 32 && hs != 64)
    return "head size C / H = " + std::to_string(hs) + "; the flash attention kernels take 16, 32 or 64";
  if (B * H > INT32_MAX) return "B * H = " + std::to_string(B * H) + " exceeds CUDA's grid (2^31 - 1 blocks)";
  if ((T + kTile - 1) / kTile > 65535) return "T = " + std::to_string(T) + " is more than 65535 tiles of 64";
  if (T * 3 * C > INT32_MAX) return "a sequence of qkv (T * 3C) must have fewer than 2^31 elements";
  return "";
}

void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                             cudaStream_t stream) {
  require_supported("flash_attention_forward", B, T, C, H, {qkv});
  const dim3 grid(unsigned(B * H), unsigned((T + kTile - 1) / kTile));
  const float scale = 1.0f / std::sqrt(float(C / H));
  with_head_size(C / H, [&](auto d) {
    flash_forward_kernel<decltype(d)::value><<<grid, kThreads, 0, stream>>>(out, lse, qkv, int(T), int(C), int(H),
                                                                            scale);
  });
  check_launch("flash_forward_kernel");
}

void flash_attention_backward(float* dqkv, float* dsum, const float* dout, const float* qkv, const float* out,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t H, cudaStream_t stream) {
  require_supported("flash_attention_backward", B, T, C, H, {qkv, dout});
  const int64_t hs = C / H, rows = B * H * T;
  const float scale = 1.0f / std::sqrt(float(hs));
  check(cudaMemsetAsync(dqkv, 0, size_t(B * T * 3 * C) * sizeof(float), stream), "cudaMemsetAsync (flash dQ)");
  const unsigned dsum_blocks = unsigned((rows + kThreads / 32 - 1) / (kThreads / 32));
  flash_dsum_kernel<<<dsum_blocks, kThreads, 0, stream>>>(dsum, dout, out, int(T), int(C), int(H), int(hs), rows);
  check_launch("flash_dsum_kernel");
  const dim3 grid(unsigned(B * H), unsigned((T + kTile - 1) / kTile));
  with_head_size(hs, [&](auto d) {
    constexpr int kD = decltype(d)::value;
    auto* kernel = flash_backward_kernel<kD>;
    const int bytes = int(sizeof(BackwardShared<kD>));
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
          "cudaFuncSetAttribute (flash backward shared memory)");
    kernel<<<grid, kThreads, bytes, stream>>>(dqkv, dout, qkv, lse, dsum, int(T), int(C), int(H), scale);
  });
  check_launch("flash_backward_kernel");
}

}  // namespace zt::cuda
