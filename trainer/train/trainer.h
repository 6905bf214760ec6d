// trainer/train/trainer.h: the training run: rank threads, each with its own simulated GPU (or
// a real one through the CUDA backend) and ZeRO engine (zero/engine.h), joined by the
// in-process transport; or, under a launcher with --device cuda, one rank per process joined
// by NCCL.
//
// Owns: the run from a TrainConfig to a finished (or failed) training: the data plan, the
// rank's devices, the model state as named tensors on the accelerator (params, grads,
// adam.m, adam.v, and for bf16/fp16 the low-precision copy), the micro-step loop with
// gradient accumulation, AdamW, and the trace of it all: markers for epoch, step,
// micro-step and the forward/backward/optimizer phases, counters for loss, throughput and
// memory. A failure (out of memory, device mismatch) is recorded and returned, not thrown.
#pragma once

#include <ostream>

#include "data/corpus.h"
#include "train/train_config.h"
#include "zt/common/status.h"
#include "zt/probe/recorder.h"

namespace zt::trainer {

struct TrainSummary {
  int64_t steps = 0;           // optimizer steps completed
  int64_t epochs_started = 0;
  double first_loss = 0, last_loss = 0;
  std::vector<double> losses;  // mean loss of each step
  int64_t tokens = 0;          // tokens trained on
  double seconds = 0;
  Corpus corpus_accounting;    // documents, truncated, dropped (tokens cleared)
  DataPlan plan;
  int64_t samples_used = 0;
  int64_t peak_allocated = 0, peak_reserved = 0;  // rank 0's accelerator bytes
  int64_t model_state_bytes = 0;                  // rank 0's params, grads and optimizer state
  int64_t skipped_steps = 0;                      // fp16 overflows
  std::string failure;          // set when the run failed (also returned as the Status)
  // Checkpoints (issue 5). With resume, `losses` and `first_loss` cover the steps run here.
  int64_t resumed_from_step = -1;   // steps completed by the checkpoint resumed from; -1: fresh start
  std::string resumed_from;         // its directory
  std::string resume_notes;         // checkpoints refused on the way (torn, partial), one per line
  int64_t checkpoints_saved = 0;
  int64_t checkpoint_peak_temp_device_bytes = 0;  // rank 0's consolidated-weights gathers, the largest
};

// Loads the data named by the config (text, token file, or the synthetic corpus).
Status load_corpus(const TrainConfig& cfg, Corpus* out);

class Backend;  // core/backend.h

// The checks train() makes before anything runs, that need no data, device or trace: the settings
// (validate), the model and batch shape, the fault specs, that the data file is a readable file,
// the checkpoint settings and, with --resume, that a complete checkpoint is there. A caller runs them before it opens the trace, so that bad input never
// replaces a trace the user already had. train() makes them again itself. A data file is read and
// checked too (not empty, text or tokens, at least one global batch); `corpus`, when not null,
// receives it for train() to take instead of reading the file again.
Status check_inputs(const TrainConfig& cfg, Corpus* corpus = nullptr);

// Runs the whole training. `progress`, when not null, gets one line per step. `backend`, when not
// null, is the accelerator of every rank instead of the one cfg.device names (tests drive the
// GPU code path with a backend of their own through it); cfg.device must then be "cuda".
// `loaded`, when not null, is the data check_inputs read for this config (moved from, not read again).
Status train(const TrainConfig& cfg, probe::Recorder* rec, std::ostream* progress, TrainSummary* summary,
             Backend* backend = nullptr, Corpus* loaded = nullptr);

}  // namespace zt::trainer
