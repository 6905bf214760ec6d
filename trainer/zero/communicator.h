// trainer/zero/communicator.h: collectives between the ranks of one job.
//
// Owns: the interface every transport implements (the in-process one here; NCCL with the
// CUDA backend) and the in-process transport between rank threads that serves the
// simulated GPU. Every collective is recorded as a transfer row of kind `collective`
// (op, bytes of this rank's full buffer, participants, its time).
// The faults comm.hang and comm.rank_exit act at the start of every collective.
// Invariants: reductions add in rank order, so every rank gets bit-identical results and a
// run repeats exactly; a failed rank aborts the group, and every rank waiting in a
// collective then throws CommAborted instead of hanging.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>

#include "zt/probe/recorder.h"

namespace zt::trainer {

class DeviceOps;  // core/backend.h

class CommAborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A collective waited longer than the group's timeout: the watchdog's line (PyTorch's
// ProcessGroupNCCL text) is the message, and the group is aborted.
class CommTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// This rank left the job before a collective (the fault comm.rank_exit): the group is NOT
// aborted, as when a process exits; the other ranks wait until their watchdog fires.
class RankExited : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // recv gets every rank's `bytes` in rank order (world * bytes).
  virtual void all_gather(const void* send, void* recv, size_t bytes, const std::string& what) = 0;
  // send holds world * count floats; recv gets this rank's `count` of their sum over ranks, times scale.
  virtual void reduce_scatter(const float* send, float* recv, size_t count, float scale, const std::string& what) = 0;
  // In place: data := scale * sum over ranks.
  virtual void all_reduce(float* data, size_t count, float scale, const std::string& what) = 0;
  virtual void all_reduce(double* data, size_t count, const std::string& what) = 0;
  virtual void broadcast(void* data, size_t bytes, int root, const std::string& what) = 0;
  virtual void barrier() = 0;
  // Marks the whole group failed (this rank could not go on); others' collectives throw.
  virtual void abort(const std::string& why) = 0;
};

// Rank threads of one process. Thread-safe; each rank uses its own Communicator.
class InProcessGroup {
 public:
  // A collective that waits more than `timeout_ms` for the other ranks ends the run with the
  // watchdog's line (PyTorch's default is 10 minutes).
  explicit InProcessGroup(int world_size, int64_t timeout_ms = 600000);
  // Virtual mode: one rank thread stands for `represented_world` symmetric ranks. Its
  // communicator reports that world size, records collectives with that many participants
  // and their full byte counts, and moves no data between ranks (there is one).
  static InProcessGroup representative(int represented_world, int64_t timeout_ms);
  ~InProcessGroup();
  // `device` is the rank's accelerator in the trace (the collectives' endpoint); `ops` copies and
  // reduces its buffers (null: host memory; a real GPU's ops when the ranks share GPUs).
  std::unique_ptr<Communicator> communicator(int rank, probe::Recorder* rec, probe::DeviceId device,
                                             DeviceOps* ops = nullptr);
  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace zt::trainer
