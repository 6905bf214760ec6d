// zt/probe/cupti_decoder.h: CUPTI activity records -> trace rows, through the Recorder.
//
// Plain code: it never calls CUPTI or CUDA, so unit tests feed it hand-built records (CI has
// no GPU). The collector (probe/src/cupti/collector.cpp) owns the CUPTI side and calls decode()
// for every record of every completed buffer, on one thread.
//
// What becomes what (CUDA 13 record versions):
//  MEMORY2 (CUpti_ActivityMemory4)      allocation rows; a RELEASE closes the live row at the same
//                                      (device, address). cudaMalloc & co are segments; memory from
//                                      a stream-ordered pool (cudaMallocAsync) are blocks.
//  MEMORY_POOL (CUpti_ActivityMemoryPool3)  counters mempool_size / mempool_used per device.
//  MEMCPY (CUpti_ActivityMemcpy6), MEMCPY2 (CUpti_ActivityMemcpyPtoP4)  transfer rows.
//  MEMSET (CUpti_ActivityMemset4)       kernel rows named "memset <bytes> B" (schema v1 has no
//                                      memset table; the name keeps the bytes).
//  CONCURRENT_KERNEL (CUpti_ActivityKernel10)  kernel rows (names demangled once each).
//  RUNTIME (CUpti_ActivityAPI)          range markers named by the API ("cudaMalloc"), value = the
//                                      correlation id, so transfer.correlation_id joins them; a
//                                      failed call (other than "not ready") also gives an error row.
//                                      Cheap queries (cudaGetDevice, ...) are counted, not written.
//  SYNCHRONIZATION (CUpti_ActivitySynchronization2)  range markers "sync:stream" etc., value =
//                                      correlation id.
//  MARKER / MARKER_DATA (CUpti_ActivityMarker2 / MarkerData2)  NVTX ranges and marks -> range
//                                      markers; a numeric payload becomes the marker's value.
// Memory kinds are translated explicitly into OUR codes (db::MemoryKind), never cast.
//
// Invariants:
//  - Records are not assumed to be in time order, nor within a buffer nor across buffers: a
//    release seen before its allocation waits for it; an NVTX end seen before its start waits;
//    finish() writes what never matched (counted in `dropped`, or a marker left open).
//  - A record with a value no trace holds (zt/db/trace_values.h: an end before its start, a
//    time past 2^62 ns, ...) is dropped and counted, so the trace stays readable (the Recorder
//    drops what would pass a table's sums).
//  - Every timestamp is already on our clock (the collector registers now_ns() with
//    cuptiActivityRegisterTimestampCallback); the decoder never rescales time.
//  - Single-threaded: one decoder, one thread.
#pragma once

#include <cupti_activity.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "zt/probe/recorder.h"

namespace zt::probe::cupti {

// Our codes for CUPTI's memory kinds; nullopt for CUPTI_ACTIVITY_MEMORY_KIND_UNKNOWN and
// values this build does not know.
MemoryKind memory_kind_from_cupti(uint32_t cupti_memory_kind);
// Our transfer kind for a CUpti_ActivityMemcpyKind (arrays count as device memory).
std::optional<TransferKind> transfer_kind_from_cupti(uint32_t cupti_copy_kind);
// "cudaMalloc_v3020" -> "cudaMalloc", "cudaMemcpyAsync_ptsz_v7000" -> "cudaMemcpyAsync_ptsz".
std::string api_name_without_version(std::string_view cupti_name);
// The runtime APIs whose entry takes a stack: the allocation and free calls (cudaMalloc*,
// cudaFree*, cudaHostAlloc, cudaMallocHost, cudaMallocAsync, cudaMallocManaged, ...) and the
// copies (cudaMemcpy*, whose stack lands in transfer.stack_id).
bool api_wants_stack(std::string_view api_name);
// Frequent queries that carry no memory story (cudaGetDevice, cudaGetLastError, ...).
bool api_is_query(std::string_view api_name);

struct DeviceInfo {
  std::string name;
  std::optional<int64_t> capacity_bytes;
};

struct DecoderHooks {
  // Name and memory of CUDA device `ordinal`; empty: "CUDA device" and unknown capacity.
  std::function<DeviceInfo(uint32_t ordinal)> device_info;
  // CUPTI's name of a runtime callback id ("cudaMalloc_v3020"); empty: "cuda_api_<cbid>".
  std::function<std::string(uint32_t cbid)> runtime_api_name;
  // The stack taken at the API entry that carries this correlation id (0 if none); the
  // decoder asks exactly once per allocation or free record, so the owner can forget it.
  std::function<StackId(uint32_t correlation_id)> take_stack;
};

struct DecodeStats {
  int64_t allocations = 0, frees = 0, frees_waiting = 0;
  int64_t transfers = 0, memsets = 0, kernels = 0;
  int64_t runtime_calls = 0, runtime_written = 0, runtime_errors = 0;
  int64_t synchronizations = 0, nvtx_ranges = 0, nvtx_marks = 0, nvtx_data = 0, pool_events = 0;
  int64_t unhandled = 0;  // kinds this decoder does not turn into rows
  int64_t out_of_range = 0;  // records dropped for a value no trace holds (written to `dropped` by finish())
};

class Decoder {
 public:
  Decoder(Recorder& rec, DeviceId host_device, DecoderHooks hooks, int rank = 0);

  void decode(const CUpti_Activity* record);
  // End of recording: releases that never met their allocation are counted as dropped, NVTX
  // ranges that never ended stay open (t_end NULL, as for a process that died inside them).
  void finish();
  const DecodeStats& stats() const { return stats_; }

  // The trace's device for CUDA ordinal `ordinal` (added on first use).
  DeviceId cuda_device(uint32_t ordinal);

 private:
  void memory(const CUpti_ActivityMemory4& r);
  void memory_pool(const CUpti_ActivityMemoryPool3& r);
  void memcpy(const CUpti_ActivityMemcpy6& r);
  void memcpy_p2p(const CUpti_ActivityMemcpyPtoP4& r);
  void emit_copy(TransferEvent& e, uint64_t start, uint64_t end, uint32_t stream, uint32_t correlation_id);
  void memset(const CUpti_ActivityMemset4& r);
  void kernel(const CUpti_ActivityKernel10& r);
  void runtime(const CUpti_ActivityAPI& r);
  void synchronization(const CUpti_ActivitySynchronization2& r);
  void marker(const CUpti_ActivityMarker2& r);
  void marker_data(const CUpti_ActivityMarkerData2& r);
  void emit_range(uint32_t id);
  NameId name(const std::string& text);
  int64_t stream_of(uint32_t stream_id) const { return static_cast<int64_t>(stream_id); }

  Recorder& rec_;
  DeviceId host_device_;
  DecoderHooks hooks_;
  int rank_;
  DecodeStats stats_;
  std::unordered_map<uint32_t, DeviceId> cuda_devices_;
  std::unordered_map<std::string, NameId> names_;
  std::unordered_map<const char*, NameId> kernel_names_;  // CUPTI's name pointers are stable
  std::unordered_map<uint32_t, std::string> api_names_;
  // Live allocations by (device, address); releases that arrived first, by the same key.
  std::map<std::pair<DeviceId, uint64_t>, std::pair<AllocId, int64_t>> live_;  // (id, t_alloc)
  std::multimap<std::pair<DeviceId, uint64_t>, int64_t> early_frees_;
  // NVTX: a range is written when both halves are known.
  struct Range {
    std::optional<int64_t> t_start, t_end;
    std::string name;
    std::optional<int64_t> value;
  };
  std::unordered_map<uint32_t, Range> ranges_;
  int64_t out_of_range_written_ = 0;
};

}  // namespace zt::probe::cupti
