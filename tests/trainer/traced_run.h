// tests/trainer/traced_run.h: train with a trace, then open it. The boilerplate of the
// trainer's trace tests, in one place.
#pragma once

#include <memory>
#include <string>

#include "train/trainer.h"
#include "zt/db/trace_reader.h"

namespace zt::test {

// The small run most trainer tests start from: GPT-2 tiny, 2 sequences of 32 tokens, seed 3.
inline trainer::TrainConfig tiny_run(int64_t steps) {
  trainer::TrainConfig c;
  c.model = "tiny";
  c.steps = steps;
  c.micro_batch = 2;
  c.seq_len = 32;
  c.seed = 3;
  return c;
}

struct TracedRun {
  Status status;                              // what train() returned
  trainer::TrainSummary summary;
  std::unique_ptr<db::TraceReader> reader;    // null when the trace could not be opened
};

inline TracedRun train_traced(const trainer::TrainConfig& cfg, const std::string& path) {
  TracedRun run;
  probe::RecorderOptions o;
  o.path = path;
  o.crash_handlers = false;
  std::unique_ptr<probe::Recorder> rec;
  if (Status s = probe::Recorder::open(o, &rec); !s) {
    run.status = s;
    return run;
  }
  run.status = trainer::train(cfg, rec.get(), nullptr, &run.summary);
  Status closed = run.status ? rec->close() : rec->close(db::RunStatus::Failed, 1, run.status.message());
  if (!closed) {
    run.status = closed;
    return run;
  }
  (void)db::TraceReader::open(path, &run.reader);
  return run;
}

}  // namespace zt::test
