// trainer/zero/background.h: one thread that runs the jobs handed to it, one at a time, beside
// the thread that hands them over. The engine's delayed parameter update (engine.h) runs a
// step's CPU AdamW on it while the rank thread queues the next step's forward and backward.
//
// Owns: the thread and its OpenMP width (OpenMP's thread count is a per-thread setting, and the
// rank thread keeps its own). Two widths: one while the owner goes on beside the job (the cores are
// shared), a wider one while the owner only waits for it (wait(), or a wait of its own for the
// job's pieces up to some index, marked with Waiting): a job made of numbered pieces calls
// refresh_width(piece) before each to take the one for that piece. Optionally a third, the owner's
// own width for host work it does while a job runs beside it (Beside). A job's
// exception is kept and thrown by the wait() that follows it. May call: nothing of the trainer's.
// Called by: zero/engine.cpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace zt::trainer {

class BackgroundThread {
 public:
  // The thread starts with the first job; its OpenMP regions use `omp_threads` threads, and, from
  // a job's refresh_width() on, `waited_threads` while the owner waits for it (0: omp_threads).
  // `owner_beside`: the owner's width under a Beside mark while a job is under way (0: its own).
  // `nice` (0-19): the thread and the OpenMP threads of its regions run at that niceness, so that the
  // owner's thread (on a GPU: the one that queues the device's work) wins a contended core (0: as is).
  explicit BackgroundThread(int omp_threads, int waited_threads = 0, int owner_beside = 0, int nice = 0);
  // Lets the job under way finish (its exception, if any, is dropped; one handed over but not
  // started is not run), then stops the thread.
  ~BackgroundThread();
  BackgroundThread(const BackgroundThread&) = delete;
  BackgroundThread& operator=(const BackgroundThread&) = delete;

  // Hands over a job. One at a time: a job still unwaited-for is a logic error (throws).
  void submit(std::function<void()> job);
  // Returns when the job handed over last has finished (at once when there is none); throws
  // what it threw.
  void wait();
  // True from submit() until the wait() that follows it.
  bool pending() const { return pending_; }

  // Marks a wait of the owner's own for the job's pieces 0..`upto` (wait() waits for all of them):
  // while it lives, refresh_width(piece) gives those pieces the waited width, and not the pieces
  // after them (the owner goes back to work once `upto` is done, perhaps before the mark is gone).
  // The owner's thread only; marks nest.
  class Waiting {
   public:
    Waiting(BackgroundThread& t, int64_t upto) : t_(t), before_(t.waited_upto_.load()) {
      t_.waited_upto_.store(std::max(before_, upto));
    }
    ~Waiting() { t_.waited_upto_.store(before_); }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;

   private:
    BackgroundThread& t_;
    const int64_t before_;
  };
  // On the job's thread only: sets its OpenMP width for the regions that follow to the one for
  // piece `piece` (waited for or not) and returns it.
  int refresh_width(int64_t piece);

  // Marks host work of the owner's own (on a GPU: a landed gradient partition's widening and sum of
  // squares) that may run while the job does: while it lives, the owner's parallel regions take the
  // constructor's `owner_beside` threads if a job is under way now, so that the two teams together
  // fit the cores instead of sharing them; its own width again after. Nothing without owner_beside.
  // The owner's thread only.
  class Beside {
   public:
    explicit Beside(const BackgroundThread& t);
    ~Beside();
    Beside(const Beside&) = delete;
    Beside& operator=(const Beside&) = delete;

   private:
    int before_ = 0;  // the owner's width to restore; 0: left as it was
  };

 private:
  void run();
  const int omp_threads_, waited_threads_, owner_beside_, nice_;
  int niced_width_ = 0;  // the job's thread only: its regions' threads of up to this width are niced
  std::atomic<bool> busy_{false};  // from submit() until the job has finished
  std::atomic<int64_t> waited_upto_{-1};  // the last piece the owner waits for now (-1: none)
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;  // handed over, not yet started
  bool running_ = false;       // a job has been taken and has not finished
  bool pending_ = false;       // submitted and not yet waited for (the owner's thread only)
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace zt::trainer
