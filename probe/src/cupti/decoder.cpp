// CUPTI activity record decoding (see zt/probe/cupti_decoder.h for the mapping and invariants).
#include "zt/probe/cupti_decoder.h"

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "zt/db/trace_values.h"

namespace zt::probe::cupti {

MemoryKind memory_kind_from_cupti(uint32_t k) {
  // CUPTI: 0 unknown, 1 pageable, 2 pinned, 3 device, 4 array, 5 managed, 6 device static,
  // 7 managed static. Ours: 1 device, 2 pinned_host, 3 pageable_host, 4 managed, 5 module_global.
  switch (k) {
    case CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE: return MemoryKind::PageableHost;
    case CUPTI_ACTIVITY_MEMORY_KIND_PINNED: return MemoryKind::PinnedHost;
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE: return MemoryKind::Device;
    case CUPTI_ACTIVITY_MEMORY_KIND_ARRAY: return MemoryKind::Device;          // CUDA arrays live on the device
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED: return MemoryKind::Managed;
    // A loaded module's __device__ and __managed__ variables: not the program's allocations.
    case CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC:
    case CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC: return MemoryKind::ModuleGlobal;
    default: return MemoryKind::Unknown;
  }
}

std::optional<TransferKind> transfer_kind_from_cupti(uint32_t k) {
  switch (k) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOA: return TransferKind::H2D;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOH: return TransferKind::D2H;
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOA:
    case CUPTI_ACTIVITY_MEMCPY_KIND_ATOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOA:
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return TransferKind::D2D;
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return TransferKind::H2H;
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return TransferKind::P2P;
    default: return std::nullopt;
  }
}

std::string api_name_without_version(std::string_view n) {
  // CUPTI names end in "_v<digits>" (the API version that introduced the entry point).
  size_t pos = n.rfind("_v");
  if (pos != std::string_view::npos && pos + 2 < n.size()) {
    bool digits = true;
    for (size_t i = pos + 2; i < n.size(); ++i) digits = digits && n[i] >= '0' && n[i] <= '9';
    if (digits) n = n.substr(0, pos);
  }
  return std::string(n);
}

static bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

bool api_wants_stack(std::string_view n) {
  // Allocations and frees (allocation.stack_id) and copies (transfer.stack_id).
  return starts_with(n, "cudaMalloc") || starts_with(n, "cudaFree") || starts_with(n, "cudaHostAlloc") ||
         starts_with(n, "cudaMemcpy");
}

bool api_is_query(std::string_view n) {
  static constexpr std::string_view kQueries[] = {
      "cudaGetDevice",          "cudaGetDeviceCount",  "cudaGetLastError",     "cudaPeekAtLastError",
      "cudaStreamIsCapturing",  "cudaDeviceGetAttribute", "cudaGetDeviceProperties", "cudaPointerGetAttributes",
      "cudaFuncGetAttributes",  "cudaDriverGetVersion", "cudaRuntimeGetVersion", "cudaStreamGetCaptureInfo",
      "cudaGetErrorString",     "cudaGetErrorName",    "cudaThreadExchangeStreamCaptureMode",
      "cudaStreamQuery",        "cudaEventQuery",      "cudaGetDriverEntryPoint", "cudaGetDriverEntryPointByVersion"};
  std::string_view base = n;
  // "_ptsz"/"_ptds" variants are the same call on the per-thread default stream.
  for (std::string_view suffix : {"_ptsz", "_ptds"})
    if (base.size() > suffix.size() && base.substr(base.size() - suffix.size()) == suffix)
      base = base.substr(0, base.size() - suffix.size());
  for (auto q : kQueries)
    if (base == q) return true;
  return false;
}

namespace {
int pinned_of(uint32_t cupti_memory_kind) {
  if (cupti_memory_kind == CUPTI_ACTIVITY_MEMORY_KIND_PINNED) return 1;
  if (cupti_memory_kind == CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE) return 0;
  return -1;
}
bool is_host(MemoryKind k) { return k == MemoryKind::PinnedHost || k == MemoryKind::PageableHost; }

const char* cuda_error_name(uint32_t code) {
  switch (code) {
    case 1: return "cudaErrorInvalidValue";
    case 2: return "cudaErrorMemoryAllocation (out of memory)";
    case 3: return "cudaErrorInitializationError";
    case 35: return "cudaErrorInsufficientDriver";
    case 100: return "cudaErrorNoDevice";
    case 101: return "cudaErrorInvalidDevice";
    case 400: return "cudaErrorInvalidResourceHandle";
    case 700: return "cudaErrorIllegalAddress";
    default: return nullptr;
  }
}
constexpr uint32_t kCudaErrorMemoryAllocation = 2;
constexpr uint32_t kCudaErrorNotReady = 600;  // stream/event queries: an answer, not a failure

// A record's values within what a trace holds (zt/db/trace_values.h): a record outside (an end
// before its start, a time of 0 or past 2^62 ns, a size past 2^53 bytes, a device index past 2^20) is
// counted and dropped, never written, or every reader would refuse the whole trace for it.
// A time of 0 is none (an incomplete record's end), and the Recorder reads 0 as "now".
bool time_ok(uint64_t t) { return t > 0 && t <= uint64_t(db::kMaxTraceTime); }
bool span_ok(uint64_t start, uint64_t end) { return time_ok(start) && start <= end && time_ok(end); }
bool size_ok(uint64_t bytes) { return bytes <= uint64_t(db::kMaxTraceBytes); }
bool device_ok(uint32_t ordinal) { return ordinal <= uint32_t(db::kMaxTraceRank); }

// An enum field's value as it is in the record: a CUPTI newer than these headers may hold codes
// they do not name, and loading such an enum object is undefined (UBSan: -fsanitize=enum).
template <typename E>
uint32_t raw(const E& field) {
  static_assert(sizeof(E) == sizeof(uint32_t));
  uint32_t v;
  std::memcpy(&v, &field, sizeof v);
  return v;
}
}  // namespace

Decoder::Decoder(Recorder& rec, DeviceId host_device, DecoderHooks hooks, int rank)
    : rec_(rec), host_device_(host_device), hooks_(std::move(hooks)), rank_(rank) {}

NameId Decoder::name(const std::string& text) {
  auto it = names_.find(text);
  if (it != names_.end()) return it->second;
  NameId id = rec_.intern(text);
  names_.emplace(text, id);
  return id;
}

DeviceId Decoder::cuda_device(uint32_t ordinal) {
  auto it = cuda_devices_.find(ordinal);
  if (it != cuda_devices_.end()) return it->second;
  DeviceInfo info;
  if (hooks_.device_info) info = hooks_.device_info(ordinal);
  if (info.name.empty()) info.name = "CUDA device";
  DeviceId id = rec_.add_device(rank_, DeviceKind::Cuda, static_cast<int>(ordinal), "cuda:" + std::to_string(ordinal),
                                info.name, info.capacity_bytes, false);
  cuda_devices_.emplace(ordinal, id);
  return id;
}

void Decoder::decode(const CUpti_Activity* r) {
  switch (r->kind) {
    case CUPTI_ACTIVITY_KIND_MEMORY2: memory(*reinterpret_cast<const CUpti_ActivityMemory4*>(r)); break;
    case CUPTI_ACTIVITY_KIND_MEMORY_POOL: memory_pool(*reinterpret_cast<const CUpti_ActivityMemoryPool3*>(r)); break;
    case CUPTI_ACTIVITY_KIND_MEMCPY: memcpy(*reinterpret_cast<const CUpti_ActivityMemcpy6*>(r)); break;
    case CUPTI_ACTIVITY_KIND_MEMCPY2: memcpy_p2p(*reinterpret_cast<const CUpti_ActivityMemcpyPtoP4*>(r)); break;
    case CUPTI_ACTIVITY_KIND_MEMSET: memset(*reinterpret_cast<const CUpti_ActivityMemset4*>(r)); break;
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: kernel(*reinterpret_cast<const CUpti_ActivityKernel10*>(r)); break;
    case CUPTI_ACTIVITY_KIND_RUNTIME: runtime(*reinterpret_cast<const CUpti_ActivityAPI*>(r)); break;
    case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION:
      synchronization(*reinterpret_cast<const CUpti_ActivitySynchronization2*>(r));
      break;
    case CUPTI_ACTIVITY_KIND_MARKER: marker(*reinterpret_cast<const CUpti_ActivityMarker2*>(r)); break;
    case CUPTI_ACTIVITY_KIND_MARKER_DATA: marker_data(*reinterpret_cast<const CUpti_ActivityMarkerData2*>(r)); break;
    default: ++stats_.unhandled; break;
  }
}

void Decoder::memory(const CUpti_ActivityMemory4& r) {
  if (!time_ok(r.timestamp) || !size_ok(r.bytes) || !device_ok(r.deviceId)) {
    ++stats_.out_of_range;
    return;
  }
  MemoryKind kind = memory_kind_from_cupti(raw(r.memoryKind));
  DeviceId dev = is_host(kind) ? host_device_ : cuda_device(r.deviceId);
  StackId stack = hooks_.take_stack ? hooks_.take_stack(r.correlationId) : 0;
  auto key = std::make_pair(dev, static_cast<uint64_t>(r.address));
  int64_t t = static_cast<int64_t>(r.timestamp);
  const uint32_t op = raw(r.memoryOperationType);
  if (op == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION) {
    ++stats_.allocations;
    AllocEvent e;
    e.rank = rank_;
    e.device = dev;
    e.memory_kind = kind;
    // Memory handed out by a stream-ordered pool (cudaMallocAsync) is a piece of the pool's
    // reservation: a block. Everything else came from the driver itself: a segment.
    e.level = raw(r.memoryPoolConfig.memoryPoolType) != CUPTI_ACTIVITY_MEMORY_POOL_TYPE_INVALID ? AllocLevel::Block
                                                                                           : AllocLevel::Segment;
    e.address = r.address;
    e.bytes = static_cast<int64_t>(r.bytes);
    e.source = Source::Cupti;
    e.stack = stack;
    e.stream = r.isAsync ? stream_of(r.streamId) : -1;
    e.t = t;
    if (r.name && *r.name) e.name = name(r.name);
    const AllocId id = rec_.alloc(e);
    // A release that arrived first (records are not in order) closes it at once.
    auto range = early_frees_.equal_range(key);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second >= t) {
        rec_.free(id, it->second);
        early_frees_.erase(it);
        --stats_.frees_waiting;
        return;
      }
    }
    live_[key] = {id, t};
  } else if (op == CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE) {
    ++stats_.frees;
    auto it = live_.find(key);
    if (it != live_.end() && t < it->second.second) {
      ++stats_.out_of_range;  // freed before it was allocated: the allocation stays live
    } else if (it != live_.end()) {
      rec_.free(it->second.first, t);
      live_.erase(it);
    } else {
      early_frees_.emplace(key, t);
      ++stats_.frees_waiting;
    }
  } else {
    ++stats_.unhandled;
  }
}

void Decoder::memory_pool(const CUpti_ActivityMemoryPool3& r) {
  if (!time_ok(r.timestamp) || !device_ok(r.deviceId)) {
    ++stats_.out_of_range;
    return;
  }
  ++stats_.pool_events;
  DeviceId dev = cuda_device(r.deviceId);
  bool destroyed = raw(r.memoryPoolOperationType) == CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_DESTROYED;
  int64_t t = static_cast<int64_t>(r.timestamp);
  rec_.counter(rank_, dev, name("mempool_size"), destroyed ? 0.0 : double(r.size), t);
  rec_.counter(rank_, dev, name("mempool_used"), destroyed ? 0.0 : double(r.utilizedSize), t);
}

// What every copy record has alike: its time, stream, correlation id and the stack taken at
// the cudaMemcpy* that started it.
void Decoder::emit_copy(TransferEvent& e, uint64_t start, uint64_t end, uint32_t stream, uint32_t correlation_id) {
  e.t_start = static_cast<int64_t>(start);
  e.t_end = static_cast<int64_t>(end);
  e.stream = stream_of(stream);
  e.correlation_id = correlation_id;
  e.source = Source::Cupti;
  e.stack = hooks_.take_stack ? hooks_.take_stack(correlation_id) : 0;
  rec_.transfer(e);
}

void Decoder::memcpy(const CUpti_ActivityMemcpy6& r) {
  auto kind = transfer_kind_from_cupti(r.copyKind);
  if (!kind) {
    ++stats_.unhandled;
    return;
  }
  if (!span_ok(r.start, r.end) || !size_ok(r.bytes) || !device_ok(r.deviceId)) {
    ++stats_.out_of_range;
    return;
  }
  ++stats_.transfers;
  DeviceId dev = cuda_device(r.deviceId);
  TransferEvent e;
  e.rank = rank_;
  e.kind = *kind;
  e.bytes = static_cast<int64_t>(r.bytes);
  switch (*kind) {
    case TransferKind::H2D: e.src = host_device_, e.dst = dev, e.pinned = pinned_of(r.srcKind); break;
    case TransferKind::D2H: e.src = dev, e.dst = host_device_, e.pinned = pinned_of(r.dstKind); break;
    case TransferKind::H2H:
      e.src = e.dst = host_device_;
      e.pinned = (pinned_of(r.srcKind) == 1 || pinned_of(r.dstKind) == 1) ? 1 : pinned_of(r.srcKind);
      break;
    default: e.src = e.dst = dev; break;  // D2D; a P2P reported here names one device only
  }
  emit_copy(e, r.start, r.end, r.streamId, r.correlationId);
}

void Decoder::memcpy_p2p(const CUpti_ActivityMemcpyPtoP4& r) {
  if (!span_ok(r.start, r.end) || !size_ok(r.bytes) || !device_ok(r.srcDeviceId) || !device_ok(r.dstDeviceId)) {
    ++stats_.out_of_range;
    return;
  }
  auto kind = transfer_kind_from_cupti(r.copyKind);
  ++stats_.transfers;
  TransferEvent e;
  e.rank = rank_;
  e.kind = kind.value_or(TransferKind::P2P);
  if (e.kind != TransferKind::D2D) e.kind = TransferKind::P2P;
  e.bytes = static_cast<int64_t>(r.bytes);
  e.src = cuda_device(r.srcDeviceId);
  e.dst = cuda_device(r.dstDeviceId);
  emit_copy(e, r.start, r.end, r.streamId, r.correlationId);
}

void Decoder::memset(const CUpti_ActivityMemset4& r) {
  if (!span_ok(r.start, r.end) || !device_ok(r.deviceId)) {
    ++stats_.out_of_range;
    return;
  }
  ++stats_.memsets;
  KernelEvent k;
  k.rank = rank_;
  k.device = cuda_device(r.deviceId);
  k.name = name("memset " + std::to_string(r.bytes) + " B");
  k.t_start = static_cast<int64_t>(r.start);
  k.t_end = static_cast<int64_t>(r.end);
  k.stream = stream_of(r.streamId);
  k.correlation_id = r.correlationId;
  k.source = Source::Cupti;
  rec_.kernel(k);
}

void Decoder::kernel(const CUpti_ActivityKernel10& r) {
  // An incomplete record's end is 0.
  if (!span_ok(r.start, r.end) || !device_ok(r.deviceId)) {
    ++stats_.out_of_range;
    return;
  }
  ++stats_.kernels;
  NameId n = 0;
  if (r.name) {
    auto it = kernel_names_.find(r.name);
    if (it != kernel_names_.end()) {
      n = it->second;
    } else {
      int st = 0;
      char* dem = abi::__cxa_demangle(r.name, nullptr, nullptr, &st);
      n = name(st == 0 && dem ? dem : r.name);
      std::free(dem);
      kernel_names_.emplace(r.name, n);
    }
  }
  KernelEvent k;
  k.rank = rank_;
  k.device = cuda_device(r.deviceId);
  k.name = n;
  k.t_start = static_cast<int64_t>(r.start);
  k.t_end = static_cast<int64_t>(r.end);
  k.stream = stream_of(r.streamId);
  k.correlation_id = r.correlationId;
  k.grid[0] = static_cast<uint32_t>(r.gridX), k.grid[1] = static_cast<uint32_t>(r.gridY),
  k.grid[2] = static_cast<uint32_t>(r.gridZ);
  k.block[0] = static_cast<uint32_t>(r.blockX), k.block[1] = static_cast<uint32_t>(r.blockY),
  k.block[2] = static_cast<uint32_t>(r.blockZ);
  k.source = Source::Cupti;
  rec_.kernel(k);
}

void Decoder::runtime(const CUpti_ActivityAPI& r) {
  ++stats_.runtime_calls;
  auto it = api_names_.find(r.cbid);
  if (it == api_names_.end()) {
    std::string raw = hooks_.runtime_api_name ? hooks_.runtime_api_name(r.cbid) : std::string();
    if (raw.empty()) raw = "cuda_api_" + std::to_string(r.cbid);
    it = api_names_.emplace(r.cbid, api_name_without_version(raw)).first;
  }
  const std::string& api = it->second;
  if (api_is_query(api)) return;
  if (!span_ok(r.start, r.end)) {
    ++stats_.out_of_range;
    return;
  }
  ++stats_.runtime_written;
  MarkerEvent m;
  m.rank = rank_;
  m.kind = MarkerKind::Range;
  m.name = name(api);
  m.t = static_cast<int64_t>(r.start);
  MarkerId id = rec_.marker_begin(m);
  rec_.marker_end(id, r.correlationId, static_cast<int64_t>(r.end));
  if (r.returnValue != 0 && r.returnValue != kCudaErrorNotReady) {
    ++stats_.runtime_errors;
    db::ErrorRow e;
    e.rank = rank_;
    e.t = static_cast<int64_t>(r.end);
    e.kind = r.returnValue == kCudaErrorMemoryAllocation ? "oom" : "cuda_error";
    e.site = api;
    const char* en = cuda_error_name(r.returnValue);
    e.message = api + " failed with CUDA error " + std::to_string(r.returnValue) + (en ? std::string(" ") + en : "") +
                " (correlation id " + std::to_string(r.correlationId) + ")";
    rec_.error(e);
  }
}

void Decoder::synchronization(const CUpti_ActivitySynchronization2& r) {
  if (!span_ok(r.start, r.end)) {
    ++stats_.out_of_range;
    return;
  }
  ++stats_.synchronizations;
  const char* what = "sync:unknown";
  switch (raw(r.type)) {
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE: what = "sync:event"; break;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT: what = "sync:stream_wait_event"; break;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE: what = "sync:stream"; break;
    case CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE: what = "sync:context"; break;
    default: break;
  }
  MarkerEvent m;
  m.rank = rank_;
  m.kind = MarkerKind::Range;
  m.name = name(what);
  m.t = static_cast<int64_t>(r.start);
  MarkerId id = rec_.marker_begin(m);
  rec_.marker_end(id, r.correlationId, static_cast<int64_t>(r.end));
}

void Decoder::marker(const CUpti_ActivityMarker2& r) {
  if (!time_ok(r.timestamp)) {
    ++stats_.out_of_range;
    return;
  }
  uint32_t f = raw(r.flags);
  int64_t t = static_cast<int64_t>(r.timestamp);
  std::string n;
  if (r.name) n = (r.domain && *r.domain) ? std::string(r.domain) + "::" + r.name : std::string(r.name);
  if (f & CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS) {
    ++stats_.nvtx_marks;
    Range& g = ranges_[r.id];
    g.t_start = g.t_end = t;
    g.name = n;
    emit_range(r.id);
  } else if (f & CUPTI_ACTIVITY_FLAG_MARKER_START) {
    ++stats_.nvtx_ranges;
    Range& g = ranges_[r.id];
    g.t_start = t;
    g.name = n;
    if (g.t_end) emit_range(r.id);
  } else if (f & CUPTI_ACTIVITY_FLAG_MARKER_END) {
    Range& g = ranges_[r.id];
    g.t_end = t;
    if (g.t_start) emit_range(r.id);
  } else {
    ++stats_.unhandled;  // nvtxDomainSync* acquire/release: not a range
  }
}

void Decoder::marker_data(const CUpti_ActivityMarkerData2& r) {
  ++stats_.nvtx_data;
  std::optional<int64_t> v;
  switch (raw(r.payloadKind)) {
    case CUPTI_METRIC_VALUE_KIND_UINT64: v = static_cast<int64_t>(r.payload.metricValueUint64); break;
    case CUPTI_METRIC_VALUE_KIND_INT64: v = r.payload.metricValueInt64; break;
    case CUPTI_METRIC_VALUE_KIND_DOUBLE: {
      // A double outside int64 (or NaN) has no integer value: converting it is undefined.
      const double d = r.payload.metricValueDouble;
      if (d >= -9.2e18 && d <= 9.2e18) v = static_cast<int64_t>(d);
      break;
    }
    default: break;
  }
  if (!v) return;
  auto it = ranges_.find(r.id);
  if (it == ranges_.end()) ranges_[r.id].value = v;  // data before its range: held until the range is written
  else it->second.value = v;
}

void Decoder::emit_range(uint32_t id) {
  auto it = ranges_.find(id);
  if (it == ranges_.end()) return;
  Range& g = it->second;
  if (*g.t_end < *g.t_start) {  // an NVTX end before its start
    ++stats_.out_of_range;
    ranges_.erase(it);
    return;
  }
  MarkerEvent m;
  m.rank = rank_;
  m.kind = MarkerKind::Range;
  m.name = name(g.name.empty() ? "nvtx" : g.name);
  m.t = *g.t_start;
  MarkerId mid = rec_.marker_begin(m);
  rec_.marker_end(mid, g.value.value_or(INT64_MIN), *g.t_end);
  ranges_.erase(it);
}

void Decoder::finish() {
  if (!early_frees_.empty())
    rec_.dropped(static_cast<int64_t>(early_frees_.size()),
                 "CUPTI memory release whose allocation is not in the trace (made before tracing began?)", rank_);
  early_frees_.clear();
  int64_t orphan_ends = 0;
  for (auto& [id, g] : ranges_) {
    if (g.t_start) {
      MarkerEvent m;
      m.rank = rank_;
      m.kind = MarkerKind::Range;
      m.name = name(g.name.empty() ? "nvtx" : g.name);
      m.t = *g.t_start;
      rec_.marker_begin(m);  // never ended: t_end stays NULL
    } else if (g.t_end) {
      ++orphan_ends;
    }
  }
  ranges_.clear();
  if (orphan_ends) rec_.dropped(orphan_ends, "NVTX range end whose start CUPTI never delivered", rank_);
  if (stats_.out_of_range > out_of_range_written_) {
    rec_.dropped(stats_.out_of_range - out_of_range_written_,
                 "CUPTI records with a value out of range (an end before its start, a time past 2^62 ns, a size past "
                 "2^53 bytes, a device index past 2^20)",
                 rank_);
    out_of_range_written_ = stats_.out_of_range;
  }
}

}  // namespace zt::probe::cupti
