// A program for the issue-40 tests of losses in the host recording path, run under
// libzt_probe.so. Usage: zt_probe_edge_workload sigwait N | unseen-free
//   sigwait N    blocks SIGUSR1 in main, waits for it on a thread of its own (sigwait), and
//                sends it to its own process N times: a probe thread that left SIGUSR1
//                unblocked takes one now and then, and its default action ends the program.
//   unseen-free  maps 2 MiB + 4 KiB, unmaps it by a raw syscall (no hook sees it), maps the same
//                address again and unmaps that normally: one free the probe never saw.
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

std::atomic<bool> g_stop{false};
std::atomic<long> g_received{0};

void* waiter(void*) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  while (!g_stop.load()) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0 && sig == SIGUSR1) g_received.fetch_add(1);
    // Busy between waits: a signal sent now finds no thread of the program waiting for it.
    for (int spin = 0; spin < 2000; ++spin) asm volatile("" ::: "memory");
  }
  return nullptr;
}

int sigwait_mode(int n) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  if (pthread_sigmask(SIG_BLOCK, &set, nullptr) != 0) return 3;  // inherited by the waiter
  pthread_t t;
  if (pthread_create(&t, nullptr, waiter, nullptr) != 0) return 3;
  for (int i = 0; i < n; ++i) {
    kill(getpid(), SIGUSR1);
    if (i % 64 == 0) usleep(200);
  }
  g_stop.store(true);
  // The waiter may be in sigwait: wake it until it has gone.
  for (;;) {
    kill(getpid(), SIGUSR1);
    usleep(1000);
    if (pthread_tryjoin_np(t, nullptr) == 0) break;
  }
  fprintf(stderr, "received %ld\n", g_received.load());
  return g_received.load() > 0 ? 0 : 4;
}

int unseen_free_mode() {
  const size_t len = (2u << 20) + 4096;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 3;
  memset(p, 1, len);
  if (syscall(SYS_munmap, p, len) != 0) return 3;  // past the hooks
  void* q = mmap(p, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (q != p) {
    fprintf(stderr, "the address did not come back (%p, then %p)\n", p, q);
    return 5;
  }
  memset(q, 2, len);
  munmap(q, len);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "sigwait" && argc == 3) return sigwait_mode(atoi(argv[2]));
  if (mode == "unseen-free") return unseen_free_mode();
  fprintf(stderr, "usage: %s sigwait N | unseen-free\n", argv[0]);
  return 2;
}
