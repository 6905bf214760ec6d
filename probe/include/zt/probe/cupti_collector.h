// zt/probe/cupti_collector.h: CUDA tracing through CUPTI into a Recorder (library
// zt_cupti_collect, built only where a CUDA toolkit with CUPTI is found; the header itself needs
// no CUDA).
//
// Two users, one collector per process:
//  - libzt_probe.so (`zt probe`): started from InitializeInjection (the driver's cuInit, so the
//    driver is loaded), stopped at exit, exec or _exit, just before the trace is closed.
//  - `zt train --cupti`: started in-process right after the trace is opened and before any CUDA
//    call (so the caching allocator's first cudaMalloc is seen); stopped after training, before
//    Recorder::close. Without a driver start() only returns why.
//
// Owns: the CUPTI subscription (Callback API, for stacks at allocation and copy entry), the
// Activity API configuration, the pool of activity buffers, and the decoder thread that turns
// completed buffers into rows through a cupti::Decoder (zt/probe/cupti_decoder.h); rows carry
// source cupti.
//
// Threads: CUPTI calls the buffer callbacks on its own threads; both only move a pointer through
// a mutex-protected queue and return. One decoder thread (ours) decodes; it is the only thread
// that writes rows. The Callback API runs on the application's threads at API entry and takes a
// backtrace.
//
// Lifetime: the recorder must stay open from start() until stop() returns. stop() leaves nothing
// behind that touches it: the activities are disabled, the callbacks unsubscribed, and the
// decoder thread has written its last row (and exited) before it returns. A fatal signal while
// running force-flushes CUPTI into the recorder before the recorder's own crash handler runs.
#pragma once

#include <string>

#include "zt/probe/recorder.h"

namespace zt::probe::cupti {

struct CollectorOptions {
  Recorder* recorder = nullptr;
  DeviceId host_device = 0;  // the trace's device for host endpoints (pinned memory, copies' host side)
  bool stacks = true;        // a backtrace at the entry of allocation and copy calls
  int stack_depth = 32;
  int rank = 0;  // the rank of every row (CUPTI sees a process, not the rank threads inside it)
};

// Starts CUDA tracing; returns "" on success, else why CUDA tracing is off (one line: no driver,
// another profiler holds CUPTI, ...). A failed start leaves nothing behind and may be retried.
// Once started and stopped, a process cannot start again (it says so).
std::string start(const CollectorOptions& options);
// Stops: force-flushes CUPTI's buffers, decodes everything (the decoder thread writes its last
// rows and the dropped-record count, then exits), then disables the activities and unsubscribes.
// Idempotent; safe when start() failed or never ran, and from atexit after an explicit call.
void stop();
// In a forked child: never decode, never touch the parent's recorder.
void child_after_fork();
// The file libcupti was loaded from (for NVTX_INJECTION64_PATH), or nullptr.
const char* library_path();

}  // namespace zt::probe::cupti
