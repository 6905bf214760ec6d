#include "zero/communicator.h"

#include "core/backend.h"

#include "zt/fail/failpoint.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

namespace zt::trainer {

// What a rank is waiting in, for the watchdog's line.
struct Collective {
  const char* op = "";  // NCCL's OpType: ALLGATHER, REDUCE_SCATTER, ALLREDUCE, BROADCAST, BARRIER
  int64_t seq = 0;
  int64_t numel_in = 0, numel_out = 0;
};

struct InProcessGroup::State {
  State(int w, int64_t timeout) : world(w), represented(w), timeout_ms(timeout), send(size_t(w)), recv(size_t(w)) {}
  int world;        // rank threads taking part
  int represented;  // the world size reported (virtual mode: more than the threads)
  int64_t timeout_ms;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string abort_reason;
  std::vector<const void*> send;
  std::vector<void*> recv;

  void barrier(int rank, const Collective& c, probe::Recorder* rec) {
    std::unique_lock lock(mu);
    if (aborted) throw CommAborted(abort_reason);
    uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (!cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return generation != gen || aborted; }))
      watchdog(lock, rank, c, rec, t0);
    if (generation == gen) throw CommAborted(abort_reason);
  }

  // The wait ran past the timeout: the watchdog's line, an error row, and the group aborted.
  [[noreturn]] void watchdog(std::unique_lock<std::mutex>& lock, int rank, const Collective& c, probe::Recorder* rec,
                             std::chrono::steady_clock::time_point t0) {
    const auto ran =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    const std::string line = "[Rank " + std::to_string(rank) +
                             "] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=" + std::to_string(c.seq) +
                             ", OpType=" + c.op + ", NumelIn=" + std::to_string(c.numel_in) +
                             ", NumelOut=" + std::to_string(c.numel_out) + ", Timeout(ms)=" + std::to_string(timeout_ms) +
                             ") ran for " + std::to_string(ran) + " milliseconds before timing out.";
    if (!aborted) {
      aborted = true;
      abort_reason = line;
    }
    cv.notify_all();
    lock.unlock();
    if (rec) {
      db::ErrorRow row;
      row.rank = rank;
      const fail::Context& pos = fail::thread_position();
      if (pos.step >= 0) row.step = pos.step;
      row.kind = "watchdog_timeout";
      row.site = std::string("collective ") + c.op;
      row.message = line;
      rec->error(row);
    }
    throw CommTimeout(line);
  }
};

namespace {

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup::State> s, int rank, probe::Recorder* rec, probe::DeviceId dev,
                        DeviceOps* ops)
      : s_(std::move(s)), rank_(rank), rec_(rec), dev_(dev), ops_(ops ? ops : &host_ops()) {}
  int rank() const override { return rank_; }
  int world_size() const override { return s_->represented; }

  void all_gather(const void* send, void* recv, size_t bytes, const std::string& what) override {
    enter("ALLGATHER", int64_t(bytes), int64_t(bytes) * s_->represented);
    int64_t t0 = probe::now_ns();
    if (alone()) {
      if (recv && send && recv != send) ops_->copy_ordered(recv, send, bytes);
      record("all_gather", bytes, what, t0);
      return;
    }
    s_->send[size_t(rank_)] = send;
    wait();
    if (recv)
      for (int r = 0; r < s_->world; ++r)
        if (s_->send[size_t(r)]) ops_->copy(static_cast<char*>(recv) + size_t(r) * bytes, s_->send[size_t(r)], bytes);
    wait();
    record("all_gather", bytes * size_t(s_->represented), what, t0);
  }

  void reduce_scatter(const float* send, float* recv, size_t count, float scale, const std::string& what) override {
    enter("REDUCE_SCATTER", int64_t(count) * s_->represented, int64_t(count));
    int64_t t0 = probe::now_ns();
    if (alone() && scale == 1.0f) {  // (a scale would be a kernel: on a host buffer, the general path)
      if (recv && send && recv != send) ops_->copy_ordered(recv, send, count * sizeof(float));
      record("reduce_scatter", count * sizeof(float), what, t0);
      return;
    }
    s_->send[size_t(rank_)] = send;
    wait();
    if (recv && send && !ops_->host_addressable()) {
      // On a GPU: recv = send[0] + send[1] + ... in rank order, then scaled (the loop's order).
      const size_t base = size_t(rank_) * count;
      ops_->copy(recv, static_cast<const float*>(s_->send[0]) + base, count * sizeof(float));
      for (int r = 1; r < s_->world; ++r)
        ops_->add(recv, DType::F32, static_cast<const float*>(s_->send[size_t(r)]) + base, int64_t(count));
      if (scale != 1.0f) ops_->scale(recv, int64_t(count), scale);
    } else if (recv && send) {
      const size_t base = size_t(rank_) * count;
      for (size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int r = 0; r < s_->world; ++r) sum += static_cast<const float*>(s_->send[size_t(r)])[base + i];
        recv[i] = sum * scale;
      }
    }
    wait();
    record("reduce_scatter", count * size_t(s_->represented) * sizeof(float), what, t0);
  }

  void all_reduce(float* data, size_t count, float scale, const std::string& what) override {
    enter("ALLREDUCE", int64_t(count), int64_t(count));
    int64_t t0 = probe::now_ns();
    if (alone() && scale == 1.0f) {
      record("all_reduce", count * sizeof(float), what, t0);
      return;
    }
    std::vector<float> out(data ? count : 0);
    s_->send[size_t(rank_)] = data;
    wait();
    // On a GPU the inputs are staged through the host (the NCCL communicator is the fast path).
    const bool staged = !ops_->host_addressable();
    std::vector<float> in(data && staged ? count : 0);
    if (data)
      for (int r = 0; r < s_->world; ++r) {
        const float* x = static_cast<const float*>(s_->send[size_t(r)]);
        if (staged) {
          ops_->copy(in.data(), x, count * sizeof(float));
          x = in.data();
        }
        for (size_t i = 0; i < count; ++i) out[i] = r == 0 ? x[i] : out[i] + x[i];
      }
    for (float& v : out) v *= scale;
    wait();  // everyone has read everyone's input before anyone overwrites its own
    if (data) ops_->copy(data, out.data(), count * sizeof(float));
    record("all_reduce", count * sizeof(float), what, t0);
  }

  void all_reduce(double* data, size_t count, const std::string& what) override {
    enter("ALLREDUCE", int64_t(count), int64_t(count));
    int64_t t0 = probe::now_ns();
    std::vector<double> out(count);
    s_->send[size_t(rank_)] = data;
    wait();
    for (size_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int r = 0; r < s_->world; ++r) sum += static_cast<const double*>(s_->send[size_t(r)])[i];
      out[i] = sum;
    }
    wait();
    std::memcpy(data, out.data(), count * sizeof(double));
    record("all_reduce", count * sizeof(double), what, t0);
  }

  void broadcast(void* data, size_t bytes, int root, const std::string& what) override {
    enter("BROADCAST", int64_t(bytes), int64_t(bytes));
    int64_t t0 = probe::now_ns();
    s_->send[size_t(rank_)] = data;
    wait();
    if (rank_ != root && data && s_->send[size_t(root)]) ops_->copy(data, s_->send[size_t(root)], bytes);
    wait();
    record("broadcast", bytes, what, t0);
  }

  void barrier() override {
    enter("BARRIER", 1, 1);
    wait();
  }

  void abort(const std::string& why) override {
    std::lock_guard lock(s_->mu);
    if (!s_->aborted) {
      s_->aborted = true;
      s_->abort_reason = "rank " + std::to_string(rank_) + " failed: " + why;
    }
    s_->cv.notify_all();
  }

 private:
  // A world of one rank on a device the host cannot address (a GPU): nobody else reads this
  // rank's buffers, so a collective (unscaled: 1/W is 1) is a copy queued on its device, without the two
  // stream synchronizations of wait() that would stall the host's queueing of the next module.
  // The host and the simulated GPU keep the general path (its results bit for bit, no stall).
  bool alone() const { return s_->world == 1 && s_->represented == 1 && !ops_->host_addressable(); }

  // Whatever this rank queued on its device is finished before others read it, and what it
  // read is finished before others overwrite it.
  void wait() {
    ops_->synchronize();
    s_->barrier(rank_, current_, rec_);
  }

  // The start of a collective: its sequence number, and the faults that act there.
  void enter(const char* op, int64_t numel_in, int64_t numel_out) {
    current_ = Collective{op, ++seq_, numel_in, numel_out};
    if (!fail::any_configured()) return;
    const std::string where = std::string(op) + " SeqNum=" + std::to_string(seq_);
    if (fail::eval("comm.rank_exit", fail::Context{rank_, -1, -1, -1, rec_}, "exits before " + where))
      throw RankExited("rank " + std::to_string(rank_) + " exited before " + where + " (fault comm.rank_exit)");
    if (fail::eval("comm.hang", fail::Context{rank_, -1, -1, -1, rec_}, "hangs in " + where)) {
      // Stuck inside the collective: never arrives; held until the group is aborted (by a
      // watchdog) or its own watchdog fires.
      std::unique_lock lock(s_->mu);
      const auto t0 = std::chrono::steady_clock::now();
      if (!s_->cv.wait_for(lock, std::chrono::milliseconds(s_->timeout_ms), [&] { return s_->aborted; }))
        s_->watchdog(lock, rank_, current_, rec_, t0);
      throw CommAborted(s_->abort_reason);
    }
  }

  void record(const char* op, size_t bytes, const std::string& what, int64_t t0) {
    if (!rec_) return;
    probe::TransferEvent e;
    e.rank = rank_;
    e.kind = probe::TransferKind::Collective;
    e.bytes = static_cast<int64_t>(bytes);
    e.src = e.dst = dev_;
    e.t_start = t0;
    e.t_end = probe::now_ns();
    e.op = rec_->intern(op);
    e.name = rec_->intern(what);
    e.participants = s_->represented;
    rec_->transfer(e);
  }

  std::shared_ptr<InProcessGroup::State> s_;
  int rank_;
  probe::Recorder* rec_;
  probe::DeviceId dev_;
  DeviceOps* ops_;
  int64_t seq_ = 0;
  Collective current_;
};

}  // namespace

InProcessGroup::InProcessGroup(int world_size, int64_t timeout_ms)
    : state_(std::make_shared<State>(world_size, timeout_ms)) {}

InProcessGroup InProcessGroup::representative(int represented_world, int64_t timeout_ms) {
  InProcessGroup g(1, timeout_ms);
  g.state_->represented = represented_world;
  return g;
}
InProcessGroup::~InProcessGroup() = default;

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank, probe::Recorder* rec, probe::DeviceId device,
                                                          DeviceOps* ops) {
  return std::make_unique<InProcessCommunicator>(state_, rank, rec, device, ops);
}

}  // namespace zt::trainer
