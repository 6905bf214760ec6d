// trainer/ckpt/checkpoint.h: sharded, atomic, verified checkpoints of a ZeRO run (issue 5),
// with the consolidated weights as safetensors in Hugging Face's GPT-2 layout.
//
// Owns: the on-disk layout of a checkpoint directory, writing it so that a crash at any
// point leaves either the previous state or a complete new checkpoint, choosing what to
// resume from (refusing torn, partial and weights-only checkpoints, falling back to the
// newest complete one that `latest` committed), resuming with the same or a different world
// size, and consolidating a checkpoint into one safetensors file offline.
// May call: the ZeRO engine's state export/import and weights gather (zero/engine.h), the
// communicator (the ranks save together), the train config (its JSON goes into the
// manifest), the failpoints ckpt.between_writes, ckpt.torn_write, ckpt.gather_on_device.
// Called by: the training run (train/trainer.cpp); `zt ckpt info|consolidate`.
//
// Layout of DIR (the --checkpoint-dir):
//   DIR/step000004/           one checkpoint, named by its tag: the steps completed, 6 digits
//     model.safetensors       the consolidated weights (with --save-safetensors, DeepSpeed's
//     config.json             stage3_gather_16bit_weights_on_model_save, or save_only_model):
//                             Hugging Face GPT-2 names and shapes, the run's compute dtype;
//                             config.json for transformers' GPT2LMHeadModel
//     rank00000.zts           rank 0's shard   (binary, format below; none with save_only_model)
//     rank00001.zts           rank 1's shard
//     manifest.json           written last by rank 0: the checkpoint is complete when it is there
//   DIR/latest                one line: the tag of the newest checkpoint committed
//   DIR/.tmp-step000006/      a save in progress (or one interrupted by a crash: ignored, and
//                             removed by the next save of the same tag)
//
// The order of writes (every rank saves at the same step; `comm` keeps them in lockstep);
// the failpoint ckpt.between_writes is evaluated at every boundary between two of them:
//   1. rank 0 creates DIR if needed (fsyncing its parent), removes a stale DIR/.tmp-TAG and
//      creates it afresh; barrier.
//   2. with consolidated weights: every rank gathers each module's compute-dtype weights on
//      its device (collective): `streamed` one module at a time, copied to the host and freed
//      (temporary device memory: the largest module), `device` every module kept on the device
//      until all are gathered (the whole model: R4's out-of-memory). Rank 0 writes
//      model.safetensors as the modules arrive, fsyncs it, then config.json.
//   3. each rank writes its shard into DIR/.tmp-TAG, fsyncs it, and closes it; the ranks
//      all-gather (size, checksum, fault) of their shards. ckpt.torn_write stops every rank
//      here: the directory is left torn and the save throws.
//   4. rank 0 writes manifest.json (sizes and checksums of every file), fsyncs it, fsyncs
//      DIR/.tmp-TAG, renames it to DIR/TAG (an older DIR/TAG is moved aside first and
//      removed after), fsyncs DIR; then writes DIR/latest.tmp, fsyncs it, renames it to
//      DIR/latest, fsyncs DIR. `latest` moves last: it is the commit. Barrier.
// A crash before `latest` moves leaves the previous checkpoint as the one resumed from, even
// when the new directory was already renamed into place (it is complete but not committed).
// In virtual mode (sizes only) a save performs the gathers and the device-to-host staging,
// with their allocations and transfers, and writes no file.
//
// Shard file format, version 2 (little-endian), fixed 128-byte header:
//   0   magic "ZTCKSHRD" (8 bytes)      8   u32 version = 2      12  u32 header bytes = 128
//   16  u32 rank                        20  u32 world size       24  u32 ZeRO stage
//   28  u32 module count                32  i64 global step (steps completed)
//   40  i64 epoch of the next step      48  i64 step-in-epoch of the next step
//   56  i64 Adam step count             64  f64 loss scale       72  i64 good steps (fp16 scaler)
//   80  i64 hysteresis left             88  u64 seed             96  32 bytes reserved (zero)
// then per module, in module order: u32 name length, the name, i64 numel, padded, shard,
// opt_lo, opt_n, then fp32 master[opt_n], Adam m[opt_n], Adam v[opt_n];
// then a 16-byte trailer: u64 checksum of every byte before it, magic "ZTCKEND\0".
// Version 1 (read, no longer written) is the same with an FNV-1a 64 trailer.
//
// Checksums: XXH64 (seed 0) of a file's bytes, written in the manifest as 16 lowercase hex
// digits under the key named by "checksum" ("xxh64"; version-1 manifests: "fnv1a64").
//
// Manifest (JSON): format "zerotrace-checkpoint", version 2, tag, checksum "xxh64",
// world_size, zero_stage, global_step, epoch, step_in_epoch, seed, save_only_model,
// config (the run's JSON), model_config {vocab, context, layers, heads, width},
// modules [{index, name, numel, padded, shard}],
// files [{name, rank, bytes, xxh64}] (the shards, none when save_only_model),
// model_files [{name, bytes, xxh64}] (model.safetensors and config.json, when written),
// weights {dtype, gather, peak_temp_device_bytes} (when written).
//
// Resuming with a different world size (or ZeRO stage 0 against 1-3): each new rank reads
// every old shard, module by module, rebuilds the module's fp32 master weights and Adam
// moments over its unpadded numel from the old ranks' ranges, and keeps its own new range.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/file_io.h"
#include "core/dtype.h"
#include "model/config.h"
#include "train/train_config.h"
#include "zero/communicator.h"
#include "zero/engine.h"
#include "zt/common/status.h"
#include "zt/probe/recorder.h"

namespace zt::trainer::ckpt {

constexpr uint32_t kFormatVersion = 2;
constexpr const char* kWeightsFile = "model.safetensors";
constexpr const char* kHfConfigFile = "config.json";

// Where the run is: global_step steps are done; the next one is (epoch, step_in_epoch).
struct Position {
  int64_t global_step = 0;
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
};

// "step000004" for 4 completed steps.
std::string tag_for_step(int64_t global_step);

// Where a save happens, for markers and failpoint contexts: the 0-based index of the step
// just completed and its epoch; the recorder of this rank (may be null).
struct SaveOptions {
  int64_t step = -1, epoch = -1;
  probe::Recorder* rec = nullptr;
};
// What a save did, on this rank.
struct SaveReport {
  int64_t bytes = 0;                   // bytes this rank wrote (what save() returns)
  bool weights = false;                // the consolidated weights were gathered
  bool optimizer_state = true;         // false: save_only_model
  std::string gather;                  // "streamed" or "device" (empty without weights)
  bool gather_forced_by_fault = false; // ckpt.gather_on_device fired
  int64_t peak_temp_device_bytes = 0;  // the gather's temporary device memory, at its peak
  int64_t gathered_modules = 0;        // modules that needed a gather (0: all whole on the device)
  int64_t weights_bytes = 0;           // rank 0: model.safetensors
  bool files_written = true;           // false in virtual mode
};

// Every rank calls it at the same step. What it writes comes from the config:
// save_only_model, save_safetensors, zero.gather_16bit_weights_on_model_save,
// checkpoint_gather, virtual_mode. Returns the bytes this rank wrote (rank 0: also the
// weights, the manifest and `latest`). Throws CheckpointError (the caller aborts the other
// ranks); the device gather's out-of-memory error passes through as it is.
int64_t save(const std::string& dir, const TrainConfig& cfg, const Position& pos, ZeroEngine& engine,
             Communicator& comm, const SaveOptions& options = {}, SaveReport* report = nullptr);

// What a checkpoint's manifest says.
struct Manifest {
  std::string tag;
  uint32_t version = 0;
  int world_size = 0, stage = 0;
  Position pos;
  uint64_t seed = 0;
  std::string model;  // from the config
  std::optional<model::Config> model_config;  // the GPT-2 shape (version 2)
  int64_t micro_batch = 0, grad_accum = 0;  // from the config (0 when absent)
  bool model_only = false;  // save_only_model: weights, no optimizer state
  ChecksumKind checksum = ChecksumKind::Xxh64;
  struct Module {
    std::string name;
    int64_t numel = 0, padded = 0, shard = 0;
  };
  std::vector<Module> modules;
  struct File {
    std::string name;
    int rank = -1;  // shards; -1 for model files
    int64_t bytes = 0;
    uint64_t sum = 0;
  };
  std::vector<File> files;        // the shards
  std::vector<File> model_files;  // model.safetensors, config.json
  std::string weights_dtype;      // "bf16", ... when model files were written
  int64_t total_bytes() const;
  int64_t global_batch() const { return micro_batch * grad_accum * world_size; }
};

// Checks DIR/TAG: the manifest parses and has a known format version; every file named in it
// is there with its size and checksum. The message names the bad file.
Status verify_checkpoint(const std::string& dir, const std::string& tag, Manifest* out);

// What to resume from: `latest` when it verifies, else the newest complete checkpoint.
struct Selected {
  std::string dir;
  Manifest manifest;
  std::string notes;  // one line per refused candidate ("... refused: ...; falling back to ..."), or empty
};
// Errors when DIR has no complete checkpoint (listing what was refused and why). With
// `need_optimizer_state` (resuming), weights-only checkpoints (save_only_model) are refused
// too, saying they cannot be resumed from.
Status select_checkpoint(const std::string& dir, Selected* out, bool need_optimizer_state = true);

// Reads this rank's part of `sel` into the engine (collective: every rank together) and
// returns where to go on. With the world size it was saved with, each rank reads its own
// shard; otherwise every old shard is read and re-split (see the top of this file).
// Throws CheckpointError naming the file.
Position load(const Selected& sel, int rank, ZeroEngine& engine);

// A listing of DIR: each checkpoint (and interrupted save) with its step, size and whether
// it is complete (or why not), whether it holds consolidated weights or only them, and what
// `latest` points to.
Status describe_checkpoints(const std::string& dir, std::string* text);

// `zt ckpt consolidate`: one safetensors file of the whole model, Hugging Face GPT-2 names and
// shapes, in `dtype`, from DIR/TAG (empty tag: what a resume would pick, weights-only
// checkpoints included): from the shards' fp32 master weights, or from a weights-only
// checkpoint's model.safetensors. Writes `out` atomically and config.json beside it.
struct ConsolidateReport {
  std::string checkpoint;  // DIR/TAG used
  std::string source;      // "fp32 master weights of N shards" or "model.safetensors (bf16)"
  std::string config_path;
  int64_t bytes = 0, tensors = 0, params = 0;
  std::string notes;  // checkpoints refused on the way
};
Status consolidate(const std::string& dir, const std::string& tag, const std::string& out, DType dtype,
                   ConsolidateReport* report);

}  // namespace zt::trainer::ckpt
