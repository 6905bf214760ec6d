// A program for the interposer tests: known host allocations in named functions. It is linked
// with exported symbols (-rdynamic) so that the trace's stacks name these functions.
// Usage: zt_probe_workload leak N BYTES | fork | forks N | threads T K | api | exec SELF N BYTES
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

extern "C" {
// Touch every page so the memory is real, and keep the compiler from eliding the call.
__attribute__((noinline)) void* zt_test_touch(void* p, size_t n) {
  if (p) memset(p, 0x5a, n);
  return p;
}

std::vector<void*>* g_keep = nullptr;  // leaked buffers stay reachable: a leak in the trace, not in ASan's eyes

__attribute__((noinline)) void zt_test_leak_buffers(int n, size_t bytes) {
  for (int i = 0; i < n; ++i) g_keep->push_back(zt_test_touch(malloc(bytes), bytes));
}

__attribute__((noinline)) void zt_test_temporary_buffers(int n, size_t bytes) {
  for (int i = 0; i < n; ++i) free(zt_test_touch(malloc(bytes), bytes));
}

__attribute__((noinline)) void zt_test_before_main() { g_keep->push_back(zt_test_touch(malloc(2 << 20), 2 << 20)); }

__attribute__((noinline)) void zt_test_parent_alloc() { g_keep->push_back(zt_test_touch(malloc(2 << 20), 2 << 20)); }
__attribute__((noinline)) void zt_test_child_alloc() {
  for (int i = 0; i < 2; ++i) g_keep->push_back(zt_test_touch(malloc(3 << 20), 3 << 20));
}

__attribute__((noinline)) void zt_test_thread_leak() { g_keep->push_back(zt_test_touch(malloc(1 << 20), 1 << 20)); }
}

// Allocation before main: a global constructor of the program itself.
namespace {
struct BeforeMain {
  BeforeMain() {
    g_keep = new std::vector<void*>();
    g_keep->reserve(4096);
    zt_test_before_main();
  }
} before_main;

pthread_mutex_t g_keep_mu = PTHREAD_MUTEX_INITIALIZER;
int g_iters = 0;

void* thread_main(void*) {
  for (int i = 0; i < g_iters; ++i) {
    for (int j = 0; j < 100; ++j) free(zt_test_touch(malloc(64 + j), 8));
    free(zt_test_touch(malloc(3 << 19), 3 << 19));  // 1.5 MiB, recorded and freed
  }
  pthread_mutex_lock(&g_keep_mu);
  zt_test_thread_leak();
  pthread_mutex_unlock(&g_keep_mu);
  return nullptr;
}
}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "leak" && argc == 4) {
    zt_test_leak_buffers(atoi(argv[2]), strtoull(argv[3], nullptr, 10));
    zt_test_temporary_buffers(5, strtoull(argv[3], nullptr, 10));
    return 0;
  }
  if (mode == "fork") {
    zt_test_parent_alloc();
    pid_t pid = fork();
    if (pid == 0) {
      zt_test_child_alloc();
      exit(0);  // runs atexit handlers in the child: they must leave the parent's trace alone
    }
    int st = 0;
    waitpid(pid, &st, 0);
    zt_test_parent_alloc();
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 3;
  }
  if (mode == "forks" && argc == 3) {
    // N children forked without exec while 4 threads allocate and free recorded blocks (the hooks'
    // table lock, the rings and the writer all busy at the forks); each child allocates and _exits.
    const int n = atoi(argv[2]);
    g_iters = 200;
    pthread_t ths[4];
    for (auto& th : ths) pthread_create(&th, nullptr, thread_main, nullptr);
    int bad = 0;
    for (int i = 0; i < n; ++i) {
      pid_t pid = fork();
      if (pid == 0) {
        zt_test_child_alloc();
        _exit(0);
      }
      // A deadlocked child is killed after 20 s and counted (an alarm in the child would not do:
      // the probe blocks signals while it records, and it hung there).
      int st = 0;
      for (int waited_ms = 0; waitpid(pid, &st, WNOHANG) == 0; waited_ms += 10) {
        if (waited_ms == 20000) kill(pid, SIGKILL);
        usleep(10000);
      }
      bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    for (auto& th : ths) pthread_join(th, nullptr);
    return bad == 0 ? 0 : 5;
  }
  if (mode == "threads" && argc == 4) {
    int t = atoi(argv[2]);
    g_iters = atoi(argv[3]);
    std::vector<pthread_t> ths(t);
    for (auto& th : ths) pthread_create(&th, nullptr, thread_main, nullptr);
    for (auto& th : ths) pthread_join(th, nullptr);
    return 0;
  }
  if (mode == "api") {
    size_t m = 2 << 20;
    g_keep->push_back(zt_test_touch(calloc(1, m), m));
    void* p = nullptr;
    if (posix_memalign(&p, 64, m) != 0) return 4;
    g_keep->push_back(zt_test_touch(p, m));
    g_keep->push_back(zt_test_touch(aligned_alloc(4096, m), m));
    g_keep->push_back(zt_test_touch(realloc(malloc(100), 3 << 20), 3 << 20));
    void* keep = mmap(nullptr, m, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    zt_test_touch(keep, m);
    void* gone = mmap(nullptr, 4 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    zt_test_touch(gone, 4 << 20);
    munmap(gone, 4 << 20);
    // A reservation (PROT_NONE) is address space, not memory: never recorded.
    void* reserve = mmap(nullptr, 64 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    munmap(reserve, 64 << 20);
    return 0;
  }
  if (mode == "exec" && argc == 5) {
    zt_test_parent_alloc();
    char* args[] = {argv[2], const_cast<char*>("leak"), argv[3], argv[4], nullptr};
    execv(argv[2], args);
    perror("execv");
    return 5;
  }
  if (mode == "execl" && argc == 5) {  // the list form, at once after the allocation
    zt_test_parent_alloc();
    execl(argv[2], argv[2], "leak", argv[3], argv[4], static_cast<char*>(nullptr));
    perror("execl");
    return 5;
  }
  if (mode == "return" && argc == 3) {  // main returns the code, which only libc's own exit sees
    zt_test_parent_alloc();
    return atoi(argv[2]);
  }
  if (mode == "exit" && argc == 3) {
    zt_test_parent_alloc();
    exit(atoi(argv[2]));
  }
  if (mode == "sigint") {  // what an interpreter finds before it installs its own handler
    struct sigaction sa {};
    sigaction(SIGINT, nullptr, &sa);
    const bool is_default = !(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_DFL;
    fprintf(stderr, "SIGINT %s\n", is_default ? "default" : "taken");
    return 0;
  }
  fprintf(stderr, "usage: %s leak N BYTES | fork | threads T K | api | exec SELF N BYTES | execl SELF N BYTES | "
                  "return CODE | exit CODE | sigint\n", argv[0]);
  return 2;
}
