// probe/src/crash.h: the process-wide part of post-mortem recording.
// Live recorders register here; fatal signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT,
// SIGTERM, SIGINT, SIGHUP) and std::terminate make every live recorder write what it has
// and mark its run, then the signal takes its normal course (the default action re-raised),
// so the exit status the parent sees is unchanged. SIGINT can be left out (see
// RecorderOptions::crash_on_interrupt).
#pragma once

namespace zt::probe {
class Recorder;
namespace crash {
// The first registration installs the handlers; `interrupts` false leaves SIGINT alone.
void register_recorder(Recorder* r, bool interrupts = true);
void unregister_recorder(Recorder* r);
}  // namespace crash
}  // namespace zt::probe
