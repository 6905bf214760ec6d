// The per-thread "inside the probe" state (see guard.h). Linked into libzt_probe.so and into
// zt (through zt_cupti_collect); it defines no hook.
#include "guard.h"

namespace zt::probe::interpose {

thread_local constinit uint8_t t_state __attribute__((tls_model("initial-exec"))) = kUnknown;

void mark_probe_thread() { t_state = kProbeThread; }

}  // namespace zt::probe::interpose
