#include "zero/background.h"

#include <omp.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <stdexcept>

namespace zt::trainer {

BackgroundThread::BackgroundThread(int omp_threads, int waited_threads, int owner_beside, int nice)
    : omp_threads_(omp_threads < 1 ? 1 : omp_threads),
      waited_threads_(waited_threads < 1 ? omp_threads_ : waited_threads),
      owner_beside_(owner_beside < 1 ? 0 : owner_beside),
      nice_(nice < 0 ? 0 : nice > 19 ? 19 : nice) {}

namespace {
// Linux: a thread's own niceness (PRIO_PROCESS with a thread id names that thread alone). Raising it
// needs no privilege; a failure leaves the thread as it was.
void nice_this_thread(int nice) { setpriority(PRIO_PROCESS, id_t(syscall(SYS_gettid)), nice); }
}  // namespace

BackgroundThread::Beside::Beside(const BackgroundThread& t) {
  if (t.owner_beside_ > 0 && t.busy_.load()) {
    before_ = omp_get_max_threads();
    omp_set_num_threads(t.owner_beside_);
  }
}

BackgroundThread::Beside::~Beside() {
  if (before_ > 0) omp_set_num_threads(before_);
}

int BackgroundThread::refresh_width(int64_t piece) {
  const int n = piece <= waited_upto_.load() ? waited_threads_ : omp_threads_;
  omp_set_num_threads(n);
  if (nice_ > 0 && n > niced_width_) {
    // The OpenMP runtime keeps this thread's team in a pool: a team at least this wide is niced once.
#pragma omp parallel num_threads(n)
    nice_this_thread(nice_);
    niced_width_ = n;
  }
  return n;
}

BackgroundThread::~BackgroundThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BackgroundThread::submit(std::function<void()> job) {
  if (pending_) throw std::logic_error("BackgroundThread::submit: the previous job was not waited for");
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    job_ = std::move(job);
    error_ = nullptr;
    busy_ = true;
  }
  pending_ = true;
  cv_.notify_all();
}

void BackgroundThread::wait() {
  if (!pending_) return;
  Waiting waiting(*this, INT64_MAX);  // every piece
  std::exception_ptr err;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !job_ && !running_; });
    err = error_;
    error_ = nullptr;
  }
  pending_ = false;
  if (err) std::rethrow_exception(err);
}

void BackgroundThread::run() {
  omp_set_num_threads(omp_threads_);
  if (nice_ > 0) nice_this_thread(nice_);
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || job_; });
    if (stop_) return;  // a job handed over but not started is dropped
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    running_ = true;
    lock.unlock();
    std::exception_ptr err;
    try {
      job();
    } catch (...) {
      err = std::current_exception();
    }
    job = nullptr;  // what it holds is released before the waiter goes on
    lock.lock();
    running_ = false;
    busy_ = false;
    error_ = err;
    cv_.notify_all();
  }
}

}  // namespace zt::trainer
