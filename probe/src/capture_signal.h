// probe/src/capture_signal.h: SIGUSR1 as a request for detail (`--detail signal:K`). Installed only
// when the policy asks for it (a program may use SIGUSR1 itself): the handler counts the signal
// (one atomic add: async-signal-safe) and hands it on to the handler the program had installed
// before, if any; a program that had none or ignored it is not ended by it (its default action).
// The writer thread polls the count once a cycle. A program that installs its own SIGUSR1
// handler after the probe's replaces it: the signal is then the program's alone.
#pragma once

#include <cstdint>

namespace zt::probe::capture_signal {
void install();           // once per process; later calls do nothing
uint64_t requests();      // SIGUSR1s received so far
}  // namespace zt::probe::capture_signal
