// trainer/cuda/streams.h: one rank's CUDA streams and the events that order them.
//
// Owns: four non-blocking streams on one device: compute (kernels and GEMMs), h2d and d2h (the
// offload copies, so they overlap compute), comm (NCCL), and the events created through it.
// The ZeRO pattern they serve: a fetch copies a shard H2D and all-gathers it on comm, records an
// event, and compute waits on that event before the module's forward; a gradient bucket is
// reduce-scattered on comm after an event recorded on compute, and copied D2H after that.
// Invariants: a stream is used only on its device; an Event is recorded before anyone waits on
// it (waiting on a never-recorded event is a no-op in CUDA and would order nothing, so wait()
// refuses it); destruction synchronizes the streams first, so no queued work outlives them.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace zt::cuda {

enum class StreamKind { Compute = 0, H2D = 1, D2H = 2, Comm = 3 };
const char* stream_name(StreamKind k);  // "compute", "h2d", "d2h", "comm"

class Event {
 public:
  // timing: true for an event elapsed_ms() can measure (costs a little more to record).
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);
  bool recorded() const { return recorded_; }
  bool done() const;        // cudaEventQuery: true when the work before it has finished
  void synchronize() const;  // host waits
  // Milliseconds from `start` to this event; both recorded with timing on, both done.
  float elapsed_ms(const Event& start) const;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

class StreamSet {
 public:
  // Creates the four streams on `device` (cudaStreamNonBlocking: no implicit sync with the legacy
  // default stream). Comm gets the highest priority the device offers, as NCCL's streams usually
  // do, so collectives are not starved by long compute kernels.
  explicit StreamSet(int device);
  ~StreamSet();
  StreamSet(const StreamSet&) = delete;
  StreamSet& operator=(const StreamSet&) = delete;

  int device() const { return device_; }
  cudaStream_t get(StreamKind k) const { return streams_[int(k)]; }
  cudaStream_t compute() const { return get(StreamKind::Compute); }
  cudaStream_t h2d() const { return get(StreamKind::H2D); }
  cudaStream_t d2h() const { return get(StreamKind::D2H); }
  cudaStream_t comm() const { return get(StreamKind::Comm); }

  // An event recorded on `on` now.
  Event record(StreamKind on, bool timing = false) const;
  // `waiter` does not start later work until `e` has happened (cudaStreamWaitEvent; the host does
  // not block). Throws std::logic_error for an event never recorded.
  void wait(StreamKind waiter, const Event& e) const;
  // `waiter` waits for everything queued on `on` so far.
  void wait(StreamKind waiter, StreamKind on) const;
  void synchronize(StreamKind k) const;
  void synchronize_all() const;

 private:
  int device_;
  cudaStream_t streams_[4] = {nullptr, nullptr, nullptr, nullptr};
};

}  // namespace zt::cuda
