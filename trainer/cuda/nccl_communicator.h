// trainer/cuda/nccl_communicator.h: the Communicator of trainer/zero/communicator.h on NCCL, for
// multi-process runs with one GPU per process (torchrun, mpirun, srun).
//
// Owns: one NCCL communicator (non-blocking mode, so that every wait is bounded), the stream its
// collectives run on (or uses the caller's comm stream), a device staging buffer.
// May call: NCCL, the CUDA runtime, kernels.h (scaling), launcher_env.h (who we are, the
// rendezvous), the probe. Called by: whoever builds a rank's runtime for --device cuda.
//
// Behaviour, matching the in-process transport where it can:
//  - every collective is synchronous for the caller (it returns with the result in place), runs
//    on the comm stream, and is recorded as a transfer row of kind `collective` with the same op
//    names, byte counts and participants as the in-process transport records;
//  - buffers may be device memory (used directly) or host memory (staged through a device buffer:
//    copied in, reduced, copied back), so the engine's offloaded partitions work unchanged;
//  - `scale` is applied after the sum (a kernel on the comm stream), as the in-process transport
//    multiplies the sum, not each term;
//  - a collective that does not finish within the timeout ends with PyTorch's watchdog line
//    ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=...") as a
//    CommTimeout and an error row (kind `watchdog_timeout`), and the NCCL communicator is aborted;
//    an asynchronous NCCL error (a peer died, a network failure) aborts it and throws CommAborted;
//  - abort() aborts this rank's NCCL communicator: later calls here throw CommAborted; the other
//    processes find out through their own watchdog, as with PyTorch.
// Differences from the in-process transport: sums are in NCCL's order (ring or tree), not rank
// order, so results are identical on every rank but not bit-equal to the in-process sums; the
// faults comm.hang and comm.rank_exit are not wired here.
// Device choice: options.device if set, else the local rank; a process that sees exactly one GPU
// (CUDA_VISIBLE_DEVICES or Slurm's --gpus-per-task) uses it whatever its local rank.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cuda/runtime.h"
#include "zero/communicator.h"
#include "zero/launcher_env.h"

typedef struct ncclComm* ncclComm_t;

namespace zt::cuda {

struct NcclOptions {
  int device = -1;              // -1: from the local rank (above)
  int64_t timeout_ms = 600000;  // the collectives' watchdog (PyTorch's default, 10 minutes)
  probe::Recorder* recorder = nullptr;
  probe::DeviceId trace_device = 0;  // this rank's GPU in the trace: the collectives' endpoint
  cudaStream_t stream = nullptr;     // run collectives here (e.g. StreamSet::comm()); null: an own stream
};

class NcclCommunicator final : public trainer::Communicator {
 public:
  // Reads the launcher's variables and the rendezvous settings from `env` (see launcher_env.h),
  // exchanges the NCCL id and joins the group. Throws trainer::LaunchError for missing or
  // inconsistent settings, a rendezvous timeout, or a GPU the local rank does not have;
  // CommAborted when NCCL fails to initialize (its error text included).
  static std::unique_ptr<NcclCommunicator> from_environment(
      const NcclOptions& options, const trainer::EnvLookup& env = trainer::process_environment());
  // The same with the launch and rendezvous already decided (tests; world 1 needs neither).
  NcclCommunicator(const trainer::LaunchInfo& launch, const trainer::RendezvousPlan& plan, const NcclOptions& options);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return launch_.rank; }
  int world_size() const override { return launch_.world_size; }
  void all_gather(const void* send, void* recv, size_t bytes, const std::string& what) override;
  void reduce_scatter(const float* send, float* recv, size_t count, float scale, const std::string& what) override;
  void all_reduce(float* data, size_t count, float scale, const std::string& what) override;
  void all_reduce(double* data, size_t count, const std::string& what) override;
  void broadcast(void* data, size_t bytes, int root, const std::string& what) override;
  void barrier() override;
  void abort(const std::string& why) override;

  const trainer::LaunchInfo& launch() const { return launch_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  // "NCCL 2.28.9, rank 1 of 4 on GPU 1 (NVIDIA H100 ...), rendezvous: file /shared/id (ZT_NCCL_ID_FILE)"
  std::string describe() const;

 private:
  struct Op;
  void join();
  void* stage(const void* p, size_t bytes, size_t offset, bool copy_in);
  void unstage(void* host, const void* dev, size_t bytes);
  void check_nccl(int result, const char* call);
  void wait_done(const Op& op);
  void finish(Op& op, const char* name, size_t bytes, const std::string& what);
  [[noreturn]] void watchdog(const Op& op);
  void ensure_usable();
  void faults(const Op& op);

  trainer::LaunchInfo launch_;
  trainer::RendezvousPlan plan_;
  NcclOptions options_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  ncclComm_t comm_ = nullptr;
  DeviceBuffer staging_;
  DeviceBuffer barrier_buf_;
  int64_t seq_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
};

}  // namespace zt::cuda
