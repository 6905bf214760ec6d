// trainer/ckpt/checkpoint.h: sharded, atomic, verified checkpoints of a ZeRO run (issue 5).
//
// Owns: the on-disk layout of a checkpoint directory, writing it so that a crash at any
// point leaves either the previous state or a complete new checkpoint, and choosing what to
// resume from (refusing torn or partial checkpoints, falling back to the newest complete).
// May call: the ZeRO engine's state export/import (zero/engine.h), the communicator (the
// ranks save together), the train config (its JSON goes into the manifest).
// Called by: the training run (train/trainer.cpp); later `zt ckpt info`.
//
// Layout of DIR (the --checkpoint-dir):
//   DIR/step000004/           one checkpoint, named by its tag: the steps completed, 6 digits
//     rank00000.zts           rank 0's shard   (binary, format below)
//     rank00001.zts           rank 1's shard
//     manifest.json           written last by rank 0: the checkpoint is complete when it is there
//   DIR/latest                one line: the tag of the newest checkpoint committed
//   DIR/.tmp-step000006/      a save in progress (or one interrupted by a crash: ignored, and
//                             removed by the next save of the same tag)
//
// The order of writes (every rank saves at the same step; `comm` keeps them in lockstep):
//   1. rank 0 creates DIR if needed (fsyncing its parent), removes a stale DIR/.tmp-TAG and
//      creates it afresh; barrier.
//   2. each rank writes its shard into DIR/.tmp-TAG, fsyncs it, and closes it; the ranks
//      all-gather (size, checksum) of their shards.
//   3. rank 0 writes manifest.json (sizes and checksums of every shard), fsyncs it, fsyncs
//      DIR/.tmp-TAG, renames it to DIR/TAG (an older DIR/TAG is moved aside first and
//      removed after), fsyncs DIR; then writes DIR/latest.tmp, fsyncs it, renames it to
//      DIR/latest, fsyncs DIR. `latest` moves last. Barrier.
//
// Shard file format, version 1 (little-endian), fixed 128-byte header:
//   0   magic "ZTCKSHRD" (8 bytes)      8   u32 version = 1      12  u32 header bytes = 128
//   16  u32 rank                        20  u32 world size       24  u32 ZeRO stage
//   28  u32 module count                32  i64 global step (steps completed)
//   40  i64 epoch of the next step      48  i64 step-in-epoch of the next step
//   56  i64 Adam step count             64  f64 loss scale       72  i64 good steps (fp16 scaler)
//   80  i64 hysteresis left             88  u64 seed             96  32 bytes reserved (zero)
// then per module, in module order: u32 name length, the name, i64 numel, padded, shard,
// opt_lo, opt_n, then fp32 master[opt_n], Adam m[opt_n], Adam v[opt_n];
// then a 16-byte trailer: u64 FNV-1a 64 of every byte before it, magic "ZTCKEND\0".
//
// Checksums: 64-bit FNV-1a (offset basis 0xcbf29ce484222325, prime 0x100000001b3) of a file's
// bytes, written in the manifest as 16 lowercase hex digits.
//
// Manifest (JSON): format "zerotrace-checkpoint", version, tag, checksum "fnv1a64",
// world_size, zero_stage, global_step, epoch, step_in_epoch, seed, config (the run's JSON),
// modules [{index, name, numel, padded, shard}], files [{name, rank, bytes, fnv1a64}].
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/train_config.h"
#include "zero/communicator.h"
#include "zero/engine.h"
#include "zt/common/status.h"

namespace zt::trainer::ckpt {

constexpr uint32_t kFormatVersion = 1;

// A save or a load that failed part way; the message names the file and the cause.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where the run is: global_step steps are done; the next one is (epoch, step_in_epoch).
struct Position {
  int64_t global_step = 0;
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
};

// "step000004" for 4 completed steps.
std::string tag_for_step(int64_t global_step);

// Every rank calls it at the same step. Returns the bytes this rank wrote (rank 0: its shard,
// the manifest and `latest`). Throws CheckpointError (the caller aborts the other ranks).
int64_t save(const std::string& dir, const TrainConfig& cfg, const Position& pos, ZeroEngine& engine,
             Communicator& comm);

// What a checkpoint's manifest says.
struct Manifest {
  std::string tag;
  int world_size = 0, stage = 0;
  Position pos;
  uint64_t seed = 0;
  std::string model;  // from the config
  struct File {
    std::string name;
    int rank = 0;
    int64_t bytes = 0;
    uint64_t fnv1a64 = 0;
  };
  std::vector<File> files;
  int64_t total_bytes() const;
};

// Checks DIR/TAG: the manifest parses and has this format version; every shard named in it
// is there with its size and checksum. The message names the bad file.
Status verify_checkpoint(const std::string& dir, const std::string& tag, Manifest* out);

// What to resume from: `latest` when it verifies, else the newest complete checkpoint.
struct Selected {
  std::string dir;
  Manifest manifest;
  std::string notes;  // one line per refused candidate ("... refused: ...; falling back to ..."), or empty
};
// Errors when DIR has no complete checkpoint (listing what was refused and why).
Status select_checkpoint(const std::string& dir, Selected* out);

// Reads this rank's shard of `sel` into the engine (collective: every rank together) and
// returns where to go on. Throws CheckpointError naming the file.
Position load(const Selected& sel, int rank, ZeroEngine& engine);

// A listing of DIR: each checkpoint (and interrupted save) with its step, size and whether
// it is complete (or why not), and what `latest` points to.
Status describe_checkpoints(const std::string& dir, std::string* text);

}  // namespace zt::trainer::ckpt
