#include "tensor.h"

#include <cstring>
#include <sstream>
#include <vector>

#include "core/backend.h"
#include "zt/db/rows.h"

namespace zt::trainer {

Storage::Storage(Device& device, StorageAllocator& allocator, MemoryBlock block, std::string name, bool pinned)
    : device_(device), allocator_(allocator), block_(block), name_(std::move(name)), pinned_(pinned),
      backed_(allocator.backed()) {}

Storage::~Storage() {
  if (probe::Recorder* rec = device_.recorder())
    rec->placement(device_.rank(), rec->intern(name_), device_.trace_id(), probe::PlacementWhy::Freed,
                   static_cast<int64_t>(block_.bytes), block_.trace_id);
  allocator_.release(block_);
}

Tensor Tensor::empty(std::string name, std::vector<int64_t> shape, DType dtype, Device& device, bool pinned) {
  return make(std::move(name), std::move(shape), dtype, device, pinned, -1);
}

Tensor Tensor::empty_on_stream(std::string name, std::vector<int64_t> shape, DType dtype, Device& device, int64_t stream) {
  return make(std::move(name), std::move(shape), dtype, device, false, stream);
}

Tensor Tensor::make(std::string name, std::vector<int64_t> shape, DType dtype, Device& device, bool pinned,
                    int64_t stream) {
  Tensor t;
  t.numel_ = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::invalid_argument("tensor " + name + ": negative dimension");
    t.numel_ *= d;
  }
  t.name_ = std::move(name);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  bool use_pinned = pinned && device.is_host() && device.pinned() != nullptr;
  StorageAllocator& alloc = use_pinned ? *device.pinned() : device.memory();
  size_t bytes = size_t(t.numel_) * dtype_size(dtype);
  MemoryBlock block = stream < 0 ? alloc.allocate(bytes, t.name_) : alloc.allocate_on_stream(bytes, t.name_, stream);
  t.storage_ = std::make_shared<Storage>(device, alloc, block, t.name_, use_pinned);
  if (probe::Recorder* rec = device.recorder())
    rec->placement(device.rank(), rec->intern(t.name_), device.trace_id(), probe::PlacementWhy::Created,
                   static_cast<int64_t>(bytes), block.trace_id);
  return t;
}

Tensor Tensor::zeros(std::string name, std::vector<int64_t> shape, DType dtype, Device& device, bool pinned) {
  Tensor t = empty(std::move(name), std::move(shape), dtype, device, pinned);
  if (t.raw()) device.ops().zero(t.raw(), t.bytes());
  return t;
}

float* Tensor::f32() const {
  if (dtype_ != DType::F32) throw std::logic_error("tensor " + name_ + " is " + std::string(dtype_name(dtype_)) + ", not fp32");
  return data<float>();
}

std::string Tensor::describe() const {
  std::ostringstream s;
  s << name_ << " [";
  for (size_t i = 0; i < shape_.size(); ++i) s << (i ? ", " : "") << shape_[i];
  s << "] " << dtype_name(dtype_);
  if (storage_) s << " on " << device().label() << (pinned() ? " (pinned)" : "");
  return s.str();
}

namespace {
probe::TransferKind kind_of(const Device& src, const Device& dst) {
  if (src.is_host() && dst.is_host()) return probe::TransferKind::H2H;
  if (src.is_host()) return probe::TransferKind::H2D;
  if (dst.is_host()) return probe::TransferKind::D2H;
  return probe::TransferKind::D2D;
}

// Host-addressable memory on both sides (the host, a simulated GPU): CPU loops. A real GPU on
// either side: that device's copy, with any dtype conversion done on the host side of it (or on
// the GPU itself for a copy within one GPU).
void move_bytes(const Tensor& src, Tensor& dst) {
  if (!src.raw() || !dst.raw()) return;  // virtual memory: sizes only, nothing to move
  DeviceOps& so = src.device().ops();
  DeviceOps& dop = dst.device().ops();
  if (so.host_addressable() && dop.host_addressable()) {
    host_ops().convert(dst.raw(), dst.dtype(), src.raw(), src.dtype(), src.numel());
    return;
  }
  DeviceOps& gpu = dop.host_addressable() ? so : dop;
  if (src.dtype() == dst.dtype()) {
    gpu.copy(dst.raw(), src.raw(), src.bytes());
  } else if (&so == &dop) {
    dop.convert(dst.raw(), dst.dtype(), src.raw(), src.dtype(), src.numel());
  } else if (so.host_addressable()) {  // convert on the host, then one copy up
    std::vector<char> tmp(dst.bytes());
    host_ops().convert(tmp.data(), dst.dtype(), src.raw(), src.dtype(), src.numel());
    dop.copy(dst.raw(), tmp.data(), tmp.size());
  } else {  // one copy down, then convert on the host (or on the way between two GPUs)
    std::vector<char> tmp(src.bytes());
    so.copy(tmp.data(), src.raw(), tmp.size());
    if (dop.host_addressable()) {
      host_ops().convert(dst.raw(), dst.dtype(), tmp.data(), src.dtype(), src.numel());
    } else {
      std::vector<char> conv(dst.bytes());
      host_ops().convert(conv.data(), dst.dtype(), tmp.data(), src.dtype(), src.numel());
      dop.copy(dst.raw(), conv.data(), conv.size());
    }
  }
}

// The transfer row of src -> dst, all but its times; null recorder: none.
probe::Recorder* transfer_event(const Tensor& src, const Tensor& dst, probe::TransferEvent* e) {
  probe::Recorder* rec = src.device().recorder();
  if (!rec) rec = dst.device().recorder();
  if (!rec) return nullptr;
  e->rank = src.device().is_host() ? dst.device().rank() : src.device().rank();
  e->kind = kind_of(src.device(), dst.device());
  e->bytes = static_cast<int64_t>(src.bytes());
  e->src = src.device().trace_id();
  e->dst = dst.device().trace_id();
  if (e->kind == probe::TransferKind::H2D) e->pinned = src.pinned() ? 1 : 0;
  else if (e->kind == probe::TransferKind::D2H) e->pinned = dst.pinned() ? 1 : 0;
  e->name = rec->intern(dst.name());
  return rec;
}

void record_transfer(const Tensor& src, const Tensor& dst, int64_t t0, int64_t t1) {
  probe::TransferEvent e;
  probe::Recorder* rec = transfer_event(src, dst, &e);
  if (!rec) return;
  e.t_start = t0;
  e.t_end = t1;
  rec->transfer(e);
}
}  // namespace

Tensor copy_to(const Tensor& src, Device& dst, bool pinned, std::string name, std::optional<DType> dtype) {
  Tensor out = Tensor::empty(name.empty() ? src.name() : std::move(name), src.shape(), dtype.value_or(src.dtype()),
                             dst, pinned);
  int64_t t0 = probe::now_ns();
  move_bytes(src, out);
  record_transfer(src, out, t0, probe::now_ns());
  if (probe::Recorder* rec = dst.recorder())
    rec->placement(dst.rank(), rec->intern(out.name()), dst.trace_id(), probe::PlacementWhy::Moved,
                   static_cast<int64_t>(out.bytes()));
  return out;
}

void copy_into(Tensor& dst, const Tensor& src) {
  if (dst.numel() != src.numel())
    throw std::invalid_argument("copy " + src.describe() + " into " + dst.describe() + ": sizes differ");
  int64_t t0 = probe::now_ns();
  move_bytes(src, dst);
  if (&src.device() != &dst.device() || src.device().is_host() != dst.device().is_host())
    record_transfer(src, dst, t0, probe::now_ns());
}

PendingCopy::~PendingCopy() {
  try {
    wait();
  } catch (const std::exception&) {
    // A device error while unwinding: the run already failed, and says why elsewhere.
  }
}

PendingCopy& PendingCopy::operator=(PendingCopy&& o) noexcept {
  if (this != &o) {
    try {
      wait();
    } catch (const std::exception&) {
    }
    src_ = std::move(o.src_);
    dst_ = std::move(o.dst_);
    ops_ = o.ops_;
    fence_ = o.fence_;
    o.ops_ = nullptr;
    o.fence_ = 0;
  }
  return *this;
}

void PendingCopy::wait() {
  if (!ops_) return;
  DeviceOps* ops = ops_;
  ops_ = nullptr;
  ops->wait(fence_);
  src_.reset();
  dst_.reset();
}

PendingCopy copy_into_async(Tensor& dst, const Tensor& src) {
  if (dst.numel() != src.numel() || dst.dtype() != src.dtype())
    throw std::invalid_argument("async copy " + src.describe() + " into " + dst.describe() +
                                ": sizes or dtypes differ");
  PendingCopy p;
  const bool h2d = src.device().is_host() && !dst.device().is_host();
  const bool d2h = !src.device().is_host() && dst.device().is_host();
  if ((!h2d && !d2h) || !src.raw() || !dst.raw()) {
    copy_into(dst, src);  // within one side, or virtual memory (nothing moves)
    return p;
  }
  DeviceOps& ops = (h2d ? dst : src).device().ops();
  p.src_ = src;
  p.dst_ = dst;
  p.ops_ = &ops;
  // The callback may run on another thread, even after wait() (an H2D copy's wait only orders the
  // device's later work): it holds the row, never a tensor, so it can never free one.
  probe::TransferEvent e;
  probe::Recorder* rec = transfer_event(src, dst, &e);
  DeviceOps::CopyDone done;
  if (rec)
    done = [rec, e](int64_t t0, int64_t t1) mutable {
      e.t_start = t0;
      e.t_end = t1;
      rec->transfer(e);
    };
  p.fence_ = ops.copy_async(dst.raw(), src.raw(), src.bytes(), h2d ? DeviceOps::Lane::H2D : DeviceOps::Lane::D2H, done);
  return p;
}

namespace {
void record_guard_error(const Device& d, const char* op, const std::string& message,
                        std::initializer_list<const Tensor*> tensors, int64_t step) {
  probe::Recorder* rec = d.recorder();
  if (!rec) return;
  std::string json = "[";
  for (const Tensor* x : tensors) json += (json.size() > 1 ? ",\"" : "\"") + x->name() + "@" + x->device().label() + "\"";
  json += "]";
  db::ErrorRow row;
  row.rank = d.rank();
  if (step >= 0) row.step = step;
  row.kind = "device_mismatch";
  row.site = op;
  row.message = message;
  row.tensors = json;
  row.device_id = d.trace_id();
  rec->error(row);
}
}  // namespace

void require_accelerator(const char* op, std::initializer_list<const Tensor*> tensors, int64_t step) {
  for (const Tensor* t : tensors) {
    if (!t->device().is_host()) continue;
    const std::string message = "Expected a cuda device, but got: " + t->device().label();
    record_guard_error(t->device(), op, message, tensors, step);
    std::vector<std::string> names;
    for (const Tensor* x : tensors) names.push_back(x->name());
    throw DeviceMismatchError(message, std::move(names));
  }
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors, int64_t step) {
  const Device* first = nullptr;
  for (const Tensor* t : tensors) {
    const Device& d = t->device();
    // PyTorch's TensorIterator lets a 0-dim CPU tensor (a "CPU scalar") meet tensors on any
    // device: `cuda_grad.mul_(1. / cpu_scalar)` runs. A 0-dim tensor on an accelerator gets no
    // such pass against host tensors (R2/R5: the norm left on the GPU).
    if (t->shape().empty() && d.is_host()) continue;
    if (!first) {
      first = &d;
      continue;
    }
    if (d.label() == first->label() && d.rank() == first->rank()) continue;
    // The accelerator first, as PyTorch's TensorIterator names them ("cuda:1 and cpu!" in both
    // R2's and R5's reports, whichever operand was on the host).
    const Device& a = first->is_host() && !d.is_host() ? d : *first;
    const Device& b = &a == &d ? *first : d;
    const std::string message = "Expected all tensors to be on the same device, but found at least two devices, " +
                                a.label() + " and " + b.label() + "!";
    record_guard_error(d.recorder() ? d : *first, op, message, tensors, step);
    std::vector<std::string> names;
    for (const Tensor* x : tensors) names.push_back(x->name());
    throw DeviceMismatchError(message, std::move(names));
  }
}

}  // namespace zt::trainer
