// trainer/cuda/runtime.h: the CUDA runtime as zt_cuda uses it: whether a usable GPU is here,
// errors as exceptions that name the call, and a device buffer that frees itself.
//
// Owns: nothing global but a cached answer of cuda_available().
// Invariant: cuda_available() never crashes and never throws, with or without a driver: on a
// machine without one every CUDA runtime call fails with cudaErrorInsufficientDriver ("CUDA
// driver version is insufficient for CUDA runtime version") and the answer is false with that
// reason. Everything else in zt_cuda may assume cuda_available() was true.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace zt::cuda {

// A CUDA runtime call failed: what() is "<call>: <cudaGetErrorName>: <cudaGetErrorString>".
class CudaError : public std::runtime_error {
 public:
  CudaError(const std::string& call, cudaError_t code);
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

// How host threads wait for `device` (cudaSetDeviceFlags: cudaDeviceScheduleAuto, Spin, Yield or
// BlockingSync, by `schedule`), set before the device's first use in this process. Throws CudaError.
void set_device_schedule(int device, unsigned schedule);

// Throws CudaError when `e` is not cudaSuccess. `call` names what was called ("cudaMalloc").
void check(cudaError_t e, const char* call);
// After a kernel launch: throws CudaError naming `kernel` for a launch error (bad configuration,
// no kernel image for this GPU).
void check_launch(const char* kernel);

// True when at least one GPU is visible, its compute capability is 8.0 or newer and zt_cuda's
// kernels have an image for it (sm_80 and sm_90 SASS, plus PTX the driver can JIT for newer
// GPUs). Otherwise false, and *why (when not null) says which: no driver, a driver too old for
// this runtime, no device, compute capability too low, no kernel image. The answer is computed
// once per process.
bool cuda_available(std::string* why = nullptr);

int device_count();  // 0 when cuda_available() is false
// True for memory a GPU kernel or a device-to-device copy may use as device memory (cudaMalloc'd
// or managed); false for host memory, pinned or not (and for anything CUDA does not know).
bool is_device_memory(const void* p);
// "NVIDIA H100 80GB HBM3, compute capability 9.0, 79.10 GiB"
std::string describe_device(int device);
// The runtime and driver versions, "CUDA runtime 13.0, driver 13.0" (driver "none" without one).
std::string versions();

// Sets the current device for the calling thread until destroyed, then restores the previous.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

// Plain device memory from cudaMalloc, freed on destruction. For tests, scratch and staging;
// the trainer's tensors go through the caching allocator (memory_sources.h) instead.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

  // Synchronous copies of the first `bytes`.
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  template <typename T>
  static DeviceBuffer from(const std::vector<T>& v) {
    DeviceBuffer b(v.size() * sizeof(T));
    b.upload(v.data(), v.size() * sizeof(T));
    return b;
  }
  template <typename T>
  std::vector<T> to_vector(size_t count) const {
    std::vector<T> v(count);
    download(v.data(), count * sizeof(T));
    return v;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace zt::cuda
