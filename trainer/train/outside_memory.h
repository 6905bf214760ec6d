// train/outside_memory.h: the device memory a CUDA job holds outside PyTorch's caching allocator
// (issue 41): the CUDA context with the kernels it loads, and NCCL's buffers. PyTorch's OOM message
// reads "free" from the device (cudaMemGetInfo) and "this process has X memory in use" from the
// driver, so both count these bytes; "allocated" and "reserved" do not.
//
// Owns: the documented sizes of each term and the rule that turns a run's settings into terms.
// Invariants: the terms are charged on the simulated GPU's memory source once, when the rank's
// runtime is made, before anything else, and given back when it ends; a real GPU (--device cuda)
// has its own and is never charged. Nothing here is fitted to a report: each size is a documented
// or measured value, named in `where`.
// May call: train_config.h. Called by: the trainer (rank runtime), zt repro (scenario keys).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/train_config.h"

namespace zt::trainer {

// The CUDA context a PyTorch process makes at its first CUDA call, measured by PyTorch's pull request
// 86509 (PyTorch 1.13, torch.cuda.init()): 287,047,680 bytes with CUDA_MODULE_LOADING=LAZY (the default
// PyTorch 1.13 sets, CUDA runtime 11.7 and later), 666,632,192 bytes eager (every kernel of every module
// loaded at start: CUDA before 11.7, or a driver without lazy loading).
inline constexpr uint64_t kCudaContextLazyBytes = 287047680;
inline constexpr uint64_t kCudaContextEagerBytes = 666632192;
// NCCL's buffers for one connection of one channel, one of each protocol (NCCL's init.cc defaults):
// LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB, LL128 120 x 640 x 8 x 8 B = 4,915,200 B,
// Simple NCCL_BUFFSIZE 4 MiB. A ring channel holds one such set on each GPU (its receive side).
inline constexpr uint64_t kNcclChannelBytes = 524288 + 4915200 + 4194304;
inline constexpr int64_t kNcclMaxChannels = 64;  // NCCL's MAXCHANNELS

struct OutsideTerm {
  std::string name;   // "cuda_context", "nccl_buffers"
  uint64_t bytes = 0;
  std::string where;  // what makes it and where the size comes from
};

// The bytes of a cuda_context setting: none (0), lazy, eager, or a size ("1.2GiB"). nullopt with *why
// when it is none of these.
std::optional<uint64_t> cuda_context_bytes(const std::string& spec, std::string* why = nullptr);

// The terms a run charges: the CUDA context (cuda_context), NCCL's ring buffers (nccl_channels x
// kNcclChannelBytes, world_size > 1 only). Empty on --device cpu and cuda.
std::vector<OutsideTerm> outside_allocator_terms(const TrainConfig& c);
uint64_t outside_allocator_bytes(const TrainConfig& c);
// One line: "CUDA context 273.75 MiB (lazy) + NCCL buffers 18.38 MiB (2 channels)"; "" when none.
std::string describe_outside(const TrainConfig& c);

}  // namespace zt::trainer
