// probe/src/interpose/guard.h: which threads the host hooks pass straight through.
//
// Owns: one byte of state per thread (t_state, defined in guard.cpp), ScopedGuard and
// mark_probe_thread. It lives apart from hooks.cpp (which exports malloc & co and so may only
// ever be linked into libzt_probe.so) so that code the hooks must never record, the CUPTI
// collector above all, can also be linked into `zt` itself (zt_cupti_collect); there the state
// is written and nobody reads it.
//
// Cost: t_state is a constinit, initial-exec thread-local, so reading it is one %fs-relative
// load (its offset from the GOT in libzt_probe.so, direct in an executable), as when it was a
// thread-local of hooks.cpp: no TLS wrapper call, no __tls_get_addr (which may allocate and so
// recurse into the hooks). ScopedGuard is inline, as it was inside hooks.cpp.
#pragma once

#include <cstdint>

namespace zt::probe::interpose {

// kUnknown: not yet classified (the first hook on a thread asks the Recorder whether this is its
// writer). kApp: record. kProbeThread: never record. kGuardBit set: inside a ScopedGuard.
enum ThreadState : uint8_t { kUnknown = 0, kApp = 1, kProbeThread = 2, kGuardBit = 0x80 };

extern thread_local constinit uint8_t t_state __attribute__((tls_model("initial-exec")));

// Marks the calling thread as inside the probe while alive: its allocations pass through.
class ScopedGuard {
 public:
  ScopedGuard() : saved_(t_state) { t_state = static_cast<uint8_t>(saved_ | kGuardBit); }
  ~ScopedGuard() { t_state = saved_; }
  ScopedGuard(const ScopedGuard&) = delete;
  ScopedGuard& operator=(const ScopedGuard&) = delete;

 private:
  uint8_t saved_;
};
// For the probe's own long-lived threads (RSS sampler, CUPTI decoder): never record them.
void mark_probe_thread();

}  // namespace zt::probe::interpose
