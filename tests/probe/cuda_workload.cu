// A CUDA program with known allocations, copies, memsets, kernels and NVTX ranges, for the
// GPU test of the probe (tests/probe/gpu_test.cpp). Everything it allocates it frees, so the
// trace's counts do not depend on what CUDA does at context teardown.
// Exit codes: 0 done, 77 no CUDA device (the test skips), 1 a CUDA call failed.
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x)                                                               \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));           \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

__global__ void zt_scale(float* x, int n, float a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

constexpr size_t MiB = 1 << 20;

extern "C" __attribute__((noinline)) void* zt_cuda_allocate(size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes));
  return p;
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "no CUDA device\n");
    return 77;
  }
  // Device segments: 1, 2 and 4 MiB.
  void* d1 = zt_cuda_allocate(1 * MiB);
  void* d2 = zt_cuda_allocate(2 * MiB);
  void* d4 = zt_cuda_allocate(4 * MiB);
  // Pinned host: 1 MiB by cudaMallocHost, 2 MiB by cudaHostAlloc. Managed: 1 MiB.
  void* pinned1 = nullptr;
  void* pinned2 = nullptr;
  void* managed = nullptr;
  CHECK(cudaMallocHost(&pinned1, 1 * MiB));
  CHECK(cudaHostAlloc(&pinned2, 2 * MiB, cudaHostAllocDefault));
  CHECK(cudaMallocManaged(&managed, 1 * MiB));
  void* pageable = std::malloc(1 * MiB);
  std::memset(pageable, 1, 1 * MiB);
  std::memset(pinned1, 1, 1 * MiB);

  nvtxRangePushA("zt_phase_copies");
  CHECK(cudaMemcpy(d1, pageable, 1 * MiB, cudaMemcpyHostToDevice));   // H2D pageable
  CHECK(cudaMemcpy(d2, pinned1, 1 * MiB, cudaMemcpyHostToDevice));    // H2D pinned
  CHECK(cudaMemcpy(pageable, d1, 1 * MiB, cudaMemcpyDeviceToHost));   // D2H pageable
  CHECK(cudaMemcpy(pinned2, d2, 2 * MiB, cudaMemcpyDeviceToHost));    // D2H pinned
  CHECK(cudaMemcpy(d4, d2, 512 * 1024, cudaMemcpyDeviceToDevice));    // D2D
  nvtxRangePop();

  nvtxRangePushA("zt_phase_compute");
  CHECK(cudaMemset(d1, 0, 1 * MiB));
  CHECK(cudaMemset(d4, 0, 2 * MiB));
  for (int i = 0; i < 3; ++i) zt_scale<<<256, 256>>>(static_cast<float*>(d4), 65536, 2.0f);
  CHECK(cudaGetLastError());
  nvtxMarkA("zt_mark");
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  void* block = nullptr;
  CHECK(cudaMallocAsync(&block, 256 * 1024, s));
  CHECK(cudaFreeAsync(block, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaDeviceSynchronize());
  nvtxRangePop();

  CHECK(cudaFree(d1));
  CHECK(cudaFree(d2));
  CHECK(cudaFree(d4));
  CHECK(cudaFreeHost(pinned1));
  CHECK(cudaFreeHost(pinned2));
  CHECK(cudaFree(managed));
  std::free(pageable);
  return 0;
}
