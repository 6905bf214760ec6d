// zt/probe/synthetic.h: a synthetic ZeRO-3-shaped workload recorded through the normal
// probe API. It exists for the demo before the trainer lands, for benchmarks, and to make
// large traces for the viewer. Every row it writes has source = 'synthetic'; nothing
// here pretends to be a measurement.
#pragma once

#include <cstdint>

#include "zt/common/status.h"
#include "zt/probe/recorder.h"

namespace zt::probe {

struct SyntheticOptions {
  int ranks = 2;
  int epochs = 2;
  int steps_per_epoch = 4;
  int layers = 4;
  int64_t layer_bytes = 64ll << 20;       // one layer's full fp16 parameters
  int64_t activation_bytes = 32ll << 20;  // per layer per micro-step
  int64_t device_capacity = 80ll << 30;
  int64_t leak_bytes_per_epoch = 0;  // pinned host bytes never freed at each epoch end
  uint64_t seed = 1;
};

// Records the workload on one thread per rank, with virtual timestamps that advance like a
// training step (fetch, forward, backward, reduce, optimizer). Returns the number of events.
int64_t record_synthetic(Recorder& rec, const SyntheticOptions& opt);

}  // namespace zt::probe
