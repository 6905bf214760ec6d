// trainer/cuda/runtime.cu: see runtime.h. A .cu file because the availability check asks the
// runtime for the attributes of one of our own kernels: that is how "no kernel image for this
// GPU" shows up before any real work is launched.
#include "cuda/runtime.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <mutex>

namespace zt::cuda {

namespace {

__global__ void zt_probe_kernel(int* p) {
  if (p) *p = 1;
}

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

std::string version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

struct Availability {
  bool ok = false;
  std::string why;
  int devices = 0;
};

Availability probe() {
  Availability a;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: nothing else in this process should see it
    a.why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + " (" +
            versions() + ")";
    return a;
  }
  if (n == 0) {
    a.why = "the CUDA driver sees no device (CUDA_VISIBLE_DEVICES?)";
    return a;
  }
  cudaDeviceProp prop{};
  if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) {
    (void)cudaGetLastError();
    a.why = std::string("cudaGetDeviceProperties(0): ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
    return a;
  }
  if (prop.major < 8) {
    a.why = std::string("GPU 0 (") + prop.name + ") has compute capability " + std::to_string(prop.major) + "." +
            std::to_string(prop.minor) + "; zt_cuda is built for 8.0 (sm_80) and newer";
    return a;
  }
  cudaFuncAttributes attr{};
  if ((e = cudaFuncGetAttributes(&attr, zt_probe_kernel)) != cudaSuccess) {
    (void)cudaGetLastError();
    a.why = std::string("zt_cuda's kernels cannot run on GPU 0 (") + prop.name + "): " + cudaGetErrorName(e) + ": " +
            cudaGetErrorString(e);
    return a;
  }
  a.ok = true;
  a.devices = n;
  return a;
}

const Availability& availability() {
  static std::once_flag once;
  static Availability a;
  std::call_once(once, [] {
    try {
      a = probe();
    } catch (const std::exception& ex) {  // std::string allocation; nothing CUDA throws
      a = Availability{};
      a.why = ex.what();
    }
  });
  return a;
}

}  // namespace

CudaError::CudaError(const std::string& call, cudaError_t code)
    : std::runtime_error(call + ": " + cudaGetErrorName(code) + ": " + cudaGetErrorString(code)), code_(code) {}

void check(cudaError_t e, const char* call) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(call, e);
  }
}

void check_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw CudaError(std::string("launching ") + kernel, e);
}

bool cuda_available(std::string* why) {
  const Availability& a = availability();
  if (why) *why = a.ok ? std::string() : a.why;
  return a.ok;
}

int device_count() { return availability().ok ? availability().devices : 0; }

bool is_device_memory(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

std::string describe_device(int device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  return std::string(prop.name) + ", compute capability " + std::to_string(prop.major) + "." +
         std::to_string(prop.minor) + ", " + gib(prop.totalGlobalMem);
}

std::string versions() {
  int rt = 0, drv = 0;
  std::string s = "CUDA runtime ";
  s += cudaRuntimeGetVersion(&rt) == cudaSuccess ? version_text(rt) : std::string("?");
  s += ", driver ";
  s += cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0 ? version_text(drv) : std::string("none");
  (void)cudaGetLastError();
  return s;
}

void set_device_schedule(int device, unsigned schedule) {
  DeviceGuard g(device);
  check(cudaSetDeviceFlags(schedule), "cudaSetDeviceFlags");
}

DeviceGuard::DeviceGuard(int device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice");
  if (previous_ != device) {
    check(cudaSetDevice(device), "cudaSetDevice");
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) (void)cudaSetDevice(previous_);
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes) check(cudaMalloc(&ptr_, bytes), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) (void)cudaFree(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) (void)cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes > bytes_) throw std::invalid_argument("DeviceBuffer::upload: more bytes than the buffer holds");
  if (bytes) check(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (H2D)");
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > bytes_) throw std::invalid_argument("DeviceBuffer::download: more bytes than the buffer holds");
  if (bytes) check(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (D2H)");
}

}  // namespace zt::cuda
