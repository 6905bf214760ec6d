#include "capture_signal.h"

#include <signal.h>

#include <atomic>
#include <mutex>

namespace zt::probe::capture_signal {
namespace {
std::atomic<uint64_t> g_requests{0};
struct sigaction g_previous{};
std::once_flag g_once;

void on_usr1(int sig, siginfo_t* info, void* ctx) {
  g_requests.fetch_add(1, std::memory_order_relaxed);
  if (g_previous.sa_flags & SA_SIGINFO) {
    if (g_previous.sa_sigaction) g_previous.sa_sigaction(sig, info, ctx);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  }
}
}  // namespace

void install() {
  std::call_once(g_once, [] {
    struct sigaction sa{};
    sa.sa_sigaction = on_usr1;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, &g_previous);
  });
}

uint64_t requests() { return g_requests.load(std::memory_order_relaxed); }
}  // namespace zt::probe::capture_signal
