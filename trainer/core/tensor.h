// trainer/core/tensor.h: named tensors on devices, the copy engine and the device guard.
//
// Owns: Tensor (name, shape, dtype, device, storage), the copy engine that moves bytes
// between devices and records each transfer (H2D, D2H, D2D, H2H; pinned or pageable; its
// time), and the device guard that every op combining tensors passes first.
// Invariants:
//  - Every tensor creation, move and free is a placement row; every storage is an
//    allocation row made by its device's allocator, named after the tensor.
//  - An op never combines tensors on different devices: check_same_device() throws
//    PyTorch's message first ("Expected all tensors to be on the same device, but found at
//    least two devices, cuda:1 and cpu!") and records it as an error row.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "dtype.h"
#include "device.h"

namespace zt::trainer {

class DeviceOps;  // core/backend.h

class Storage {
 public:
  Storage(Device& device, StorageAllocator& allocator, MemoryBlock block, std::string name, bool pinned);
  ~Storage();  // returns the block to its allocator and records the free placement
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return backed_ ? block_.ptr : nullptr; }
  size_t bytes() const { return block_.bytes; }
  Device& device() const { return device_; }
  bool pinned() const { return pinned_; }
  probe::AllocId trace_id() const { return block_.trace_id; }

 private:
  Device& device_;
  StorageAllocator& allocator_;
  MemoryBlock block_;
  std::string name_;
  bool pinned_;
  bool backed_ = true;  // false in virtual mode: data() is null
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates on `device` (pinned host memory when `pinned` and the device is the host).
  static Tensor empty(std::string name, std::vector<int64_t> shape, DType dtype, Device& device, bool pinned = false);
  static Tensor zeros(std::string name, std::vector<int64_t> shape, DType dtype, Device& device, bool pinned = false);
  // On a stream of an accelerator's caching allocator (its blocks kept apart from the default
  // stream's, as PyTorch keeps a side stream's).
  static Tensor empty_on_stream(std::string name, std::vector<int64_t> shape, DType dtype, Device& device, int64_t stream);

  bool defined() const { return storage_ != nullptr; }
  const std::string& name() const { return name_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device& device() const { return storage_->device(); }
  bool pinned() const { return storage_->pinned(); }
  int64_t numel() const { return numel_; }
  size_t bytes() const { return size_t(numel_) * dtype_size(dtype_); }
  void* raw() const { return storage_->data(); }
  template <typename T>
  T* data() const { return static_cast<T*>(storage_->data()); }
  float* f32() const;  // checks dtype == fp32
  std::string describe() const;  // "block0.shard [768, 2304] bf16 on cuda:0"

  // Frees the storage now (if this is its last reference), e.g. to release a gathered buffer.
  void reset() { storage_.reset(); }

 private:
  static Tensor make(std::string name, std::vector<int64_t> shape, DType dtype, Device& device, bool pinned,
                     int64_t stream);
  std::string name_;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::F32;
  int64_t numel_ = 0;
  std::shared_ptr<Storage> storage_;
};

// --- the copy engine ---
// A new tensor on `dst` holding src's values (converted to `dtype` when given), recorded as a
// transfer and a "moved" placement of `name` (default: src's name).
Tensor copy_to(const Tensor& src, Device& dst, bool pinned = false, std::string name = "",
               std::optional<DType> dtype = std::nullopt);
// dst := src, element for element (dtypes may differ; shapes must hold the same numel).
void copy_into(Tensor& dst, const Tensor& src);

// An asynchronous copy (copy_into_async), finished by wait() or the destructor; it keeps both
// tensors alive until then. Moves, not copies.
class PendingCopy {
 public:
  PendingCopy() = default;
  PendingCopy(PendingCopy&& o) noexcept { *this = std::move(o); }
  PendingCopy& operator=(PendingCopy&& o) noexcept;
  ~PendingCopy();  // wait(), an error swallowed (it runs while unwinding too)
  // The copy is finished for its consumer (core/backend.h, DeviceOps::wait); then both tensors
  // are released from here. On a GPU an H2D copy's wait orders the device's later work after
  // the copy, without blocking the host: the host must not write its source again before the
  // device is synchronized (DeviceOps::synchronize; collectives of several ranks do it, those of a
  // one-rank world on a GPU do not).
  void wait();
  bool pending() const { return ops_ != nullptr; }

 private:
  friend PendingCopy copy_into_async(Tensor& dst, const Tensor& src);
  Tensor src_, dst_;
  DeviceOps* ops_ = nullptr;
  uint64_t fence_ = 0;
};
// dst := src, the same dtype and numel, between the host and an accelerator, on the
// accelerator's H2D or D2H copy lane: it overlaps the rank's later work until wait(). Neither
// tensor may be touched until then. Recorded as a transfer (its real start and end) when it
// finishes. A copy within one side is done at once (synchronously).
PendingCopy copy_into_async(Tensor& dst, const Tensor& src);

// --- the device guard ---
class DeviceMismatchError : public std::runtime_error {
 public:
  DeviceMismatchError(const std::string& message, std::vector<std::string> tensors)
      : std::runtime_error(message), tensors(std::move(tensors)) {}
  std::vector<std::string> tensors;
};
// Throws DeviceMismatchError naming the first two distinct devices, in argument order,
// after recording an error row (kind "device_mismatch") with the tensors involved.
void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors, int64_t step = -1);
// The guard of kernels that run only on the accelerator (bitsandbytes' 8-bit and paged
// optimizers): throws DeviceMismatchError "Expected a cuda device, but got: cpu" for the
// first tensor on the host, after recording an error row (kind "device_mismatch").
void require_accelerator(const char* op, std::initializer_list<const Tensor*> tensors, int64_t step = -1);

}  // namespace zt::trainer
