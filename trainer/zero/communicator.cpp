#include "zero/communicator.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

namespace zt::trainer {

struct InProcessGroup::State {
  explicit State(int w) : world(w), send(size_t(w)), recv(size_t(w)) {}
  int world;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::string abort_reason;
  std::vector<const void*> send;
  std::vector<void*> recv;

  void barrier() {
    std::unique_lock lock(mu);
    if (aborted) throw CommAborted(abort_reason);
    uint64_t gen = generation;
    if (++arrived == world) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    if (generation == gen) throw CommAborted(abort_reason);
  }
};

namespace {

class InProcessCommunicator : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup::State> s, int rank, probe::Recorder* rec, probe::DeviceId dev)
      : s_(std::move(s)), rank_(rank), rec_(rec), dev_(dev) {}
  int rank() const override { return rank_; }
  int world_size() const override { return s_->world; }

  void all_gather(const void* send, void* recv, size_t bytes, const std::string& what) override {
    int64_t t0 = probe::now_ns();
    s_->send[size_t(rank_)] = send;
    s_->barrier();
    if (recv)
      for (int r = 0; r < s_->world; ++r)
        if (s_->send[size_t(r)]) std::memcpy(static_cast<char*>(recv) + size_t(r) * bytes, s_->send[size_t(r)], bytes);
    s_->barrier();
    record("all_gather", bytes * size_t(s_->world), what, t0);
  }

  void reduce_scatter(const float* send, float* recv, size_t count, float scale, const std::string& what) override {
    int64_t t0 = probe::now_ns();
    s_->send[size_t(rank_)] = send;
    s_->barrier();
    if (recv && send) {
      const size_t base = size_t(rank_) * count;
      for (size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int r = 0; r < s_->world; ++r) sum += static_cast<const float*>(s_->send[size_t(r)])[base + i];
        recv[i] = sum * scale;
      }
    }
    s_->barrier();
    record("reduce_scatter", count * size_t(s_->world) * sizeof(float), what, t0);
  }

  void all_reduce(float* data, size_t count, float scale, const std::string& what) override {
    int64_t t0 = probe::now_ns();
    std::vector<float> out(data ? count : 0);
    s_->send[size_t(rank_)] = data;
    s_->barrier();
    if (data)
      for (size_t i = 0; i < count; ++i) {
        float sum = 0;
        for (int r = 0; r < s_->world; ++r) sum += static_cast<const float*>(s_->send[size_t(r)])[i];
        out[i] = sum * scale;
      }
    s_->barrier();  // everyone has read everyone's input before anyone overwrites its own
    if (data) std::memcpy(data, out.data(), count * sizeof(float));
    record("all_reduce", count * sizeof(float), what, t0);
  }

  void all_reduce(double* data, size_t count, const std::string& what) override {
    int64_t t0 = probe::now_ns();
    std::vector<double> out(count);
    s_->send[size_t(rank_)] = data;
    s_->barrier();
    for (size_t i = 0; i < count; ++i) {
      double sum = 0;
      for (int r = 0; r < s_->world; ++r) sum += static_cast<const double*>(s_->send[size_t(r)])[i];
      out[i] = sum;
    }
    s_->barrier();
    std::memcpy(data, out.data(), count * sizeof(double));
    record("all_reduce", count * sizeof(double), what, t0);
  }

  void broadcast(void* data, size_t bytes, int root, const std::string& what) override {
    int64_t t0 = probe::now_ns();
    s_->send[size_t(rank_)] = data;
    s_->barrier();
    if (rank_ != root && data && s_->send[size_t(root)]) std::memcpy(data, s_->send[size_t(root)], bytes);
    s_->barrier();
    record("broadcast", bytes, what, t0);
  }

  void barrier() override { s_->barrier(); }

  void abort(const std::string& why) override {
    std::lock_guard lock(s_->mu);
    if (!s_->aborted) {
      s_->aborted = true;
      s_->abort_reason = "rank " + std::to_string(rank_) + " failed: " + why;
    }
    s_->cv.notify_all();
  }

 private:
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
    e.participants = s_->world;
    rec_->transfer(e);
  }

  std::shared_ptr<InProcessGroup::State> s_;
  int rank_;
  probe::Recorder* rec_;
  probe::DeviceId dev_;
};

}  // namespace

InProcessGroup::InProcessGroup(int world_size) : state_(std::make_shared<State>(world_size)) {}
InProcessGroup::~InProcessGroup() = default;

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank, probe::Recorder* rec, probe::DeviceId device) {
  return std::make_unique<InProcessCommunicator>(state_, rank, rec, device);
}

}  // namespace zt::trainer
