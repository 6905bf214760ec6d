// trainer/cuda/nccl_communicator.cpp: see nccl_communicator.h.
#include "cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "cuda/kernels.h"
#include "zt/fail/failpoint.h"

namespace zt::cuda {

using trainer::CommAborted;
using trainer::CommTimeout;
using trainer::LaunchError;
using trainer::LaunchInfo;
using trainer::RendezvousMethod;
using trainer::RendezvousPlan;

// What a collective is, for the watchdog's line (NCCL's OpType names, as PyTorch prints them).
struct NcclCommunicator::Op {
  const char* type = "";
  int64_t seq = 0;
  int64_t numel_in = 0, numel_out = 0;
  int64_t t0_ns = 0;
  std::chrono::steady_clock::time_point start;
  // Staged outputs to copy back to the host once the collective is done.
  void* host_out = nullptr;
  const void* dev_out = nullptr;
  size_t out_bytes = 0;
};

namespace {

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += std::string(" (") + last + ")";
  return s;
}

int choose_device(const LaunchInfo& launch, const NcclOptions& o) {
  std::string why;
  if (!cuda_available(&why)) throw LaunchError("NCCL communicator: no usable GPU: " + why);
  const int n = device_count();
  if (o.device >= 0) {
    if (o.device >= n)
      throw LaunchError("NCCL communicator: GPU " + std::to_string(o.device) + " asked for, but this process sees " +
                        std::to_string(n));
    return o.device;
  }
  if (launch.local_rank < n) return launch.local_rank;
  if (n == 1) return 0;  // each process sees only its own GPU
  const char* vis = std::getenv("CUDA_VISIBLE_DEVICES");
  throw LaunchError("local rank " + std::to_string(launch.local_rank) + " (" + launch.describe() +
                    ") has no GPU of its own: this process sees " + std::to_string(n) +
                    " GPUs (CUDA_VISIBLE_DEVICES=" + (vis ? vis : "unset") +
                    "); start one process per GPU, no more processes per node than GPUs");
}

int64_t ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::unique_ptr<NcclCommunicator> NcclCommunicator::from_environment(const NcclOptions& options,
                                                                     const trainer::EnvLookup& env) {
  const LaunchInfo launch = trainer::read_launch_info(env);
  const RendezvousPlan plan = trainer::plan_rendezvous(env, launch);
  return std::make_unique<NcclCommunicator>(launch, plan, options);
}

NcclCommunicator::NcclCommunicator(const LaunchInfo& launch, const RendezvousPlan& plan, const NcclOptions& options)
    : launch_(launch), plan_(plan), options_(options) {
  device_ = choose_device(launch_, options_);
  DeviceGuard guard(device_);

  // NCCL reads NCCL_COMM_ID from the process environment itself; keep the two in agreement.
  const char* env_id = std::getenv("NCCL_COMM_ID");
  if (plan_.method == RendezvousMethod::NcclCommId) {
    if (!env_id || plan_.comm_id != env_id) ::setenv("NCCL_COMM_ID", plan_.comm_id.c_str(), 1);
  } else if (env_id) {
    throw LaunchError(std::string("NCCL_COMM_ID=") + env_id + " is set in the environment, so NCCL would use it, but "
                      "the rendezvous chosen was " + plan_.describe() + "; unset NCCL_COMM_ID or use it");
  }

  if (options_.stream) {
    stream_ = options_.stream;
  } else {
    int least = 0, greatest = 0;
    check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest), "cudaStreamCreateWithPriority");
    own_stream_ = true;
  }
  try {
    join();
  } catch (...) {
    if (own_stream_) (void)cudaStreamDestroy(stream_);
    stream_ = nullptr;
    throw;
  }
}

// Exchanges the NCCL id and initializes the communicator (the constructor's second half).
void NcclCommunicator::join() {
  barrier_buf_ = DeviceBuffer(sizeof(float));

  // The id: from NCCL_COMM_ID (every rank computes the same), from rank 0 through the file, or
  // made here for a single process.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  trainer::RendezvousFile file;
  file.path = plan_.file;
  file.origin = plan_.origin;
  file.world_size = launch_.world_size;
  file.job_id = launch_.job_id;
  file.timeout = plan_.timeout;
  if (plan_.method == RendezvousMethod::File && launch_.rank != 0) {
    std::vector<uint8_t> blob = trainer::wait_for_rendezvous(file, sizeof id, launch_.rank);
    std::memcpy(&id, blob.data(), sizeof id);
  } else {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      throw CommAborted("ncclGetUniqueId failed on rank " + std::to_string(launch_.rank) + ": " + nccl_text(r, nullptr) +
                        (plan_.method == RendezvousMethod::NcclCommId ? " (NCCL_COMM_ID=" + plan_.comm_id + ")" : ""));
    if (plan_.method == RendezvousMethod::File) trainer::publish_rendezvous(file, &id, sizeof id);
  }

  // Non-blocking: the init is polled, so a rank that never comes ends in an error, not a hang.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "zerotrace";
  ncclResult_t r = ncclCommInitRankConfig(&comm_, launch_.world_size, id, launch_.rank, &config);
  const auto t0 = std::chrono::steady_clock::now();
  while (r == ncclInProgress) {
    if (ms_since(t0) > plan_.timeout.count()) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
      throw LaunchError("rank " + std::to_string(launch_.rank) + ": ncclCommInitRank did not complete within " +
                        std::to_string(plan_.timeout.count() / 1000) + " s (world size " +
                        std::to_string(launch_.world_size) + ", rendezvous " + plan_.describe() +
                        "): not every rank joined; check that all " + std::to_string(launch_.world_size) +
                        " processes started and can reach rank 0's host");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
  }
  if (r != ncclSuccess) {
    std::string text = nccl_text(r, comm_);
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    throw CommAborted("ncclCommInitRank failed on rank " + std::to_string(launch_.rank) + " of " +
                      std::to_string(launch_.world_size) + ": " + text);
  }
  // Every rank has joined, hence read the file: it may go (so the next run cannot mistake it).
  if (plan_.method == RendezvousMethod::File && launch_.rank == 0) trainer::remove_rendezvous(file);
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) {
    DeviceGuard guard(device_);
    if (aborted_) {
      (void)ncclCommAbort(comm_);
    } else {
      // Finalize flushes queued work; bounded by the timeout, then abort rather than hang.
      ncclResult_t r = ncclCommFinalize(comm_);
      const auto t0 = std::chrono::steady_clock::now();
      while (r == ncclInProgress && ms_since(t0) < options_.timeout_ms) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
      }
      if (r == ncclSuccess)
        (void)ncclCommDestroy(comm_);
      else
        (void)ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  if (own_stream_ && stream_) {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
}

std::string NcclCommunicator::describe() const {
  int v = 0;
  ncclGetVersion(&v);
  std::string version = std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
  return "NCCL " + version + ", " + launch_.describe() + ", on GPU " + std::to_string(device_) + " (" +
         describe_device(device_) + "), rendezvous " + plan_.describe();
}

// The faults comm.rank_exit and comm.hang, at the start of every collective, as the in-process
// transport has them: an exit leaves the peers to their watchdog; a hang never enqueues the
// collective, so this rank's own watchdog fires when the timeout has passed (or it is aborted).
void NcclCommunicator::faults(const Op& op) {
  if (!fail::any_configured()) return;
  const std::string where = std::string(op.type) + " SeqNum=" + std::to_string(op.seq);
  const fail::Context ctx{launch_.rank, -1, -1, -1, options_.recorder};
  if (fail::eval("comm.rank_exit", ctx, "exits before " + where))
    throw trainer::RankExited("rank " + std::to_string(launch_.rank) + " exited before " + where + " (fault comm.rank_exit)");
  if (fail::eval("comm.hang", ctx, "hangs in " + where)) {
    while (!aborted_ && ms_since(op.start) <= options_.timeout_ms) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (aborted_) throw CommAborted(abort_reason_);
    watchdog(op);
  }
}

void NcclCommunicator::ensure_usable() {
  if (aborted_) throw CommAborted(abort_reason_);
  if (!comm_) throw CommAborted("the NCCL communicator of rank " + std::to_string(launch_.rank) + " is gone");
}

// A device pointer for `p`: itself when it is device memory, else a slice of the staging buffer
// at `offset` (filled from the host when copy_in). Callers size the staging buffer first.
void* NcclCommunicator::stage(const void* p, size_t bytes, size_t offset, bool copy_in) {
  if (is_device_memory(p)) return const_cast<void*>(p);
  void* dev = static_cast<char*>(staging_.get()) + offset;
  if (copy_in && bytes)
    check(cudaMemcpyAsync(dev, p, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (NCCL staging in)");
  return dev;
}

void NcclCommunicator::unstage(void* host, const void* dev, size_t bytes) {
  if (host == dev || bytes == 0) return;
  check(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync (NCCL staging out)");
}

void NcclCommunicator::check_nccl(int result, const char* call) {
  ncclResult_t r = ncclResult_t(result);
  // Non-blocking communicator: the call may still be enqueueing; wait for that (bounded).
  const auto t0 = std::chrono::steady_clock::now();
  while (r == ncclInProgress && ms_since(t0) < options_.timeout_ms) {
    std::this_thread::yield();
    if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
  }
  if (r == ncclSuccess) return;
  const std::string text = std::string(call) + " failed on rank " + std::to_string(launch_.rank) + ": " +
                           (r == ncclInProgress ? std::string("still in progress after the timeout") : nccl_text(r, comm_));
  abort(text);
  throw CommAborted(abort_reason_);
}

// Polls the stream (not cudaStreamSynchronize, which could block forever on a dead peer), and
// NCCL's asynchronous error, until the collective is done or the watchdog fires.
void NcclCommunicator::wait_done(const Op& op) {
  for (;;) {
    cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      (void)cudaGetLastError();
      abort(std::string("CUDA error during collective ") + op.type + ": " + cudaGetErrorName(e) + ": " +
            cudaGetErrorString(e));
      throw CommAborted(abort_reason_);
    }
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      abort(std::string("NCCL error during collective ") + op.type + " (SeqNum=" + std::to_string(op.seq) +
            "): " + nccl_text(async, comm_));
      throw CommAborted(abort_reason_);
    }
    if (ms_since(op.start) > options_.timeout_ms) watchdog(op);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclCommunicator::watchdog(const Op& op) {
  const std::string line = "[Rank " + std::to_string(launch_.rank) +
                           "] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=" + std::to_string(op.seq) +
                           ", OpType=" + op.type + ", NumelIn=" + std::to_string(op.numel_in) +
                           ", NumelOut=" + std::to_string(op.numel_out) + ", Timeout(ms)=" +
                           std::to_string(options_.timeout_ms) + ") ran for " + std::to_string(ms_since(op.start)) +
                           " milliseconds before timing out.";
  if (probe::Recorder* rec = options_.recorder) {
    db::ErrorRow row;
    row.rank = launch_.rank;
    row.kind = "watchdog_timeout";
    row.site = std::string("collective ") + op.type;
    row.message = line;
    row.device_id = options_.trace_device;
    rec->error(row);
  }
  abort(line);
  throw CommTimeout(line);
}

void NcclCommunicator::finish(Op& op, const char* name, size_t bytes, const std::string& what) {
  // Wait under the watchdog first: a copy into pageable host memory blocks the host until the
  // stream reaches it, which would put a hung collective beyond the watchdog's reach.
  wait_done(op);
  if (op.host_out) {
    unstage(op.host_out, op.dev_out, op.out_bytes);
    check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (NCCL staging out)");
  }
  probe::Recorder* rec = options_.recorder;
  if (!rec) return;
  probe::TransferEvent e;
  e.rank = launch_.rank;
  e.kind = probe::TransferKind::Collective;
  e.bytes = int64_t(bytes);
  e.src = e.dst = options_.trace_device;
  e.t_start = op.t0_ns;
  e.t_end = probe::now_ns();
  e.op = rec->intern(name);
  e.name = rec->intern(what);
  e.participants = launch_.world_size;
  rec->transfer(e);
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t bytes, const std::string& what) {
  ensure_usable();
  const size_t world = size_t(launch_.world_size);
  Op op{"ALLGATHER", ++seq_, int64_t(bytes), int64_t(bytes * world), probe::now_ns(), std::chrono::steady_clock::now()};
  faults(op);
  if (bytes == 0) return finish(op, "all_gather", 0, what);
  if (!send || !recv) throw std::invalid_argument("all_gather: null buffer for '" + what + "'");
  DeviceGuard guard(device_);
  if (staging_.bytes() < bytes * (world + 1)) staging_ = DeviceBuffer(bytes * (world + 1));
  const void* dsend = stage(send, bytes, 0, true);
  void* drecv = stage(recv, bytes * world, bytes, false);
  check_nccl(ncclAllGather(dsend, drecv, bytes, ncclUint8, comm_, stream_), "ncclAllGather");
  if (drecv != recv) op.host_out = recv, op.dev_out = drecv, op.out_bytes = bytes * world;
  finish(op, "all_gather", bytes * world, what);
}

void NcclCommunicator::reduce_scatter(const float* send, float* recv, size_t count, float scale,
                                      const std::string& what) {
  ensure_usable();
  const size_t world = size_t(launch_.world_size);
  Op op{"REDUCE_SCATTER", ++seq_, int64_t(count * world), int64_t(count), probe::now_ns(),
        std::chrono::steady_clock::now()};
  faults(op);
  const size_t in_bytes = count * world * sizeof(float), out_bytes = count * sizeof(float);
  if (count == 0) return finish(op, "reduce_scatter", 0, what);
  if (!send || !recv) throw std::invalid_argument("reduce_scatter: null buffer for '" + what + "'");
  DeviceGuard guard(device_);
  if (staging_.bytes() < in_bytes + out_bytes) staging_ = DeviceBuffer(in_bytes + out_bytes);
  const void* dsend = stage(send, in_bytes, 0, true);
  void* drecv = stage(recv, out_bytes, in_bytes, false);
  check_nccl(ncclReduceScatter(dsend, drecv, count, ncclFloat32, ncclSum, comm_, stream_), "ncclReduceScatter");
  if (scale != 1.0f) scale_inplace(drecv, DType::F32, int64_t(count), scale, stream_);
  if (drecv != recv) op.host_out = recv, op.dev_out = drecv, op.out_bytes = out_bytes;
  finish(op, "reduce_scatter", in_bytes, what);
}

void NcclCommunicator::all_reduce(float* data, size_t count, float scale, const std::string& what) {
  ensure_usable();
  Op op{"ALLREDUCE", ++seq_, int64_t(count), int64_t(count), probe::now_ns(), std::chrono::steady_clock::now()};
  faults(op);
  const size_t bytes = count * sizeof(float);
  if (count == 0) return finish(op, "all_reduce", 0, what);
  if (!data) throw std::invalid_argument("all_reduce: null buffer for '" + what + "'");
  DeviceGuard guard(device_);
  if (staging_.bytes() < bytes) staging_ = DeviceBuffer(bytes);
  void* d = stage(data, bytes, 0, true);
  check_nccl(ncclAllReduce(d, d, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  if (scale != 1.0f) scale_inplace(d, DType::F32, int64_t(count), scale, stream_);
  if (d != data) op.host_out = data, op.dev_out = d, op.out_bytes = bytes;
  finish(op, "all_reduce", bytes, what);
}

void NcclCommunicator::all_reduce(double* data, size_t count, const std::string& what) {
  ensure_usable();
  Op op{"ALLREDUCE", ++seq_, int64_t(count), int64_t(count), probe::now_ns(), std::chrono::steady_clock::now()};
  faults(op);
  const size_t bytes = count * sizeof(double);
  if (count == 0) return finish(op, "all_reduce", 0, what);
  if (!data) throw std::invalid_argument("all_reduce: null buffer for '" + what + "'");
  DeviceGuard guard(device_);
  if (staging_.bytes() < bytes) staging_ = DeviceBuffer(bytes);
  void* d = stage(data, bytes, 0, true);
  check_nccl(ncclAllReduce(d, d, count, ncclFloat64, ncclSum, comm_, stream_), "ncclAllReduce");
  if (d != data) op.host_out = data, op.dev_out = d, op.out_bytes = bytes;
  finish(op, "all_reduce", bytes, what);
}

void NcclCommunicator::broadcast(void* data, size_t bytes, int root, const std::string& what) {
  ensure_usable();
  if (root < 0 || root >= launch_.world_size)
    throw std::invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank of a world of " +
                                std::to_string(launch_.world_size));
  Op op{"BROADCAST", ++seq_, int64_t(bytes), int64_t(bytes), probe::now_ns(), std::chrono::steady_clock::now()};
  faults(op);
  if (bytes == 0) return finish(op, "broadcast", 0, what);
  if (!data) throw std::invalid_argument("broadcast: null buffer for '" + what + "'");
  DeviceGuard guard(device_);
  if (staging_.bytes() < bytes) staging_ = DeviceBuffer(bytes);
  void* d = stage(data, bytes, 0, launch_.rank == root);
  check_nccl(ncclBroadcast(d, d, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast");
  if (d != data && launch_.rank != root) op.host_out = data, op.dev_out = d, op.out_bytes = bytes;
  finish(op, "broadcast", bytes, what);
}

void NcclCommunicator::barrier() {
  ensure_usable();
  Op op{"BARRIER", ++seq_, 1, 1, probe::now_ns(), std::chrono::steady_clock::now()};
  faults(op);
  DeviceGuard guard(device_);
  check_nccl(ncclAllReduce(barrier_buf_.get(), barrier_buf_.get(), 1, ncclFloat32, ncclSum, comm_, stream_),
             "ncclAllReduce (barrier)");
  wait_done(op);  // not recorded, as the in-process barrier is not
}

void NcclCommunicator::abort(const std::string& why) {
  if (aborted_) return;
  aborted_ = true;
  abort_reason_ = "rank " + std::to_string(launch_.rank) + " failed: " + why;
  if (comm_) {
    DeviceGuard guard(device_);
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
}

}  // namespace zt::cuda
