// probe/src/cupti/collector.h: the CUPTI side of libzt_probe.so (compiled only with CUDA).
//
// Owns: the CUPTI subscription (Callback API, for stacks at allocation entry), the Activity API
// configuration, the pool of activity buffers, and the decoder thread that turns completed
// buffers into rows through a cupti::Decoder.
//
// Threads: CUPTI calls buffer_requested / buffer_completed on its own threads; both only move
// a pointer through a mutex-protected queue and return. One decoder thread (ours) decodes.
// The Callback API runs on the application's threads at API entry and takes a backtrace.
#pragma once

#include <string>

#include "zt/probe/recorder.h"

namespace zt::probe::cupti {

struct CollectorOptions {
  Recorder* recorder = nullptr;
  DeviceId host_device = 0;
  bool stacks = true;
  int stack_depth = 32;
  int rank = 0;
};

// Starts CUDA tracing; returns "" on success, else why CUDA tracing is off (one line).
std::string start(const CollectorOptions& options);
// Stops: disables activities, force-flushes CUPTI's buffers, decodes everything, writes the
// dropped-record count. Idempotent; safe when start() failed or never ran.
void stop();
// In a forked child: never decode, never touch the parent's recorder.
void child_after_fork();
// The file libcupti was loaded from (for NVTX_INJECTION64_PATH), or nullptr.
const char* library_path();

}  // namespace zt::probe::cupti
