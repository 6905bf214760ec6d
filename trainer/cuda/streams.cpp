// trainer/cuda/streams.cpp: see streams.h.
#include "cuda/streams.h"

#include <stdexcept>

#include "cuda/runtime.h"

namespace zt::cuda {

const char* stream_name(StreamKind k) {
  switch (k) {
    case StreamKind::Compute: return "compute";
    case StreamKind::H2D: return "h2d";
    case StreamKind::D2H: return "d2h";
    case StreamKind::Comm: return "comm";
  }
  return "?";
}

Event::Event(bool timing) {
  check(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate");
}

Event::~Event() {
  if (event_) (void)cudaEventDestroy(event_);
}

Event::Event(Event&& o) noexcept : event_(o.event_), recorded_(o.recorded_) {
  o.event_ = nullptr;
  o.recorded_ = false;
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (event_) (void)cudaEventDestroy(event_);
    event_ = o.event_;
    recorded_ = o.recorded_;
    o.event_ = nullptr;
    o.recorded_ = false;
  }
  return *this;
}

void Event::record(cudaStream_t stream) {
  check(cudaEventRecord(event_, stream), "cudaEventRecord");
  recorded_ = true;
}

bool Event::done() const {
  cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaEventQuery");
  return true;
}

void Event::synchronize() const { check(cudaEventSynchronize(event_), "cudaEventSynchronize"); }

float Event::elapsed_ms(const Event& start) const {
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start.event_, event_), "cudaEventElapsedTime");
  return ms;
}

StreamSet::StreamSet(int device) : device_(device) {
  DeviceGuard guard(device);
  int least = 0, greatest = 0;  // numerically: greatest priority is the lowest number
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  try {
    for (int k = 0; k < 4; ++k) {
      const int priority = StreamKind(k) == StreamKind::Comm ? greatest : least;
      check(cudaStreamCreateWithPriority(&streams_[k], cudaStreamNonBlocking, priority), "cudaStreamCreateWithPriority");
    }
  } catch (...) {
    for (cudaStream_t& s : streams_)
      if (s) (void)cudaStreamDestroy(s);
    throw;
  }
}

StreamSet::~StreamSet() {
  for (cudaStream_t& s : streams_) {
    if (!s) continue;
    (void)cudaStreamSynchronize(s);
    (void)cudaStreamDestroy(s);
  }
}

Event StreamSet::record(StreamKind on, bool timing) const {
  Event e(timing);
  e.record(get(on));
  return e;
}

void StreamSet::wait(StreamKind waiter, const Event& e) const {
  if (!e.recorded())
    throw std::logic_error(std::string("StreamSet::wait: the ") + stream_name(waiter) +
                           " stream was asked to wait on an event that was never recorded");
  check(cudaStreamWaitEvent(get(waiter), e.get(), 0), "cudaStreamWaitEvent");
}

void StreamSet::wait(StreamKind waiter, StreamKind on) const {
  if (waiter == on) return;
  Event e = record(on);
  wait(waiter, e);  // the event may be destroyed right after: CUDA keeps the dependency
}

void StreamSet::synchronize(StreamKind k) const { check(cudaStreamSynchronize(get(k)), "cudaStreamSynchronize"); }

void StreamSet::synchronize_all() const {
  for (int k = 0; k < 4; ++k) synchronize(StreamKind(k));
}

}  // namespace zt::cuda
