#include "crash.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <typeinfo>

#include <cxxabi.h>

#include "zt/probe/recorder.h"

namespace zt::probe::crash {
namespace {
constexpr int kSlots = 32;
std::atomic<Recorder*> g_live[kSlots];
constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTERM, SIGINT, SIGHUP};
struct sigaction g_previous[sizeof kSignals / sizeof kSignals[0]];
std::once_flag g_install_once;
std::terminate_handler g_previous_terminate = nullptr;
std::atomic<int> g_in_handler{0};

void finalize_all(RunStatus status, const char* detail) {
  for (auto& slot : g_live) {
    Recorder* r = slot.load();
    if (r) r->crash_finalize(status, detail, 3000);
  }
}

void on_signal(int sig, siginfo_t*, void*) {
  if (g_in_handler.fetch_add(1) == 0) {
    char detail[64];
    const char* name = sigabbrev_np(sig);
    std::snprintf(detail, sizeof detail, "killed by SIG%s (signal %d)", name ? name : "?", sig);
    finalize_all(RunStatus::Signal, detail);
  }
  // Hand the signal on: the previous handler if there was one, else the default action.
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) {
    if (kSignals[i] != sig) continue;
    struct sigaction prev = g_previous[i];
    if ((prev.sa_flags & SA_SIGINFO) == 0 && prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
      prev.sa_handler(sig);
      return;
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void on_terminate() {
  std::string what = "std::terminate called";
  if (auto ex = std::current_exception()) {
    const std::type_info* type = abi::__cxa_current_exception_type();
    int st = 0;
    char* dem = type ? abi::__cxa_demangle(type->name(), nullptr, nullptr, &st) : nullptr;
    what = std::string("terminate called after throwing an instance of '") + (dem ? dem : "?") + "'";
    std::free(dem);
    try {
      std::rethrow_exception(ex);
    } catch (const std::exception& e) {
      what += ": " + std::string(e.what());
    } catch (...) {
    }
  }
  if (g_in_handler.fetch_add(1) == 0) {
    for (auto& slot : g_live) {
      Recorder* r = slot.load();
      if (!r) continue;
      db::ErrorRow e;
      e.kind = "uncaught_exception";
      e.message = what;
      r->error(e);
      r->crash_finalize(RunStatus::Terminated, what.c_str(), 3000);
    }
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

void install(bool interrupts) {
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) {
    if (kSignals[i] == SIGINT && !interrupts) {
      sigaction(SIGINT, nullptr, &g_previous[i]);  // on_signal never sees it; kept for symmetry
      continue;
    }
    struct sigaction sa{};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(kSignals[i], &sa, &g_previous[i]);
    // Respect a program that chose to ignore a signal.
    if (!(g_previous[i].sa_flags & SA_SIGINFO) && g_previous[i].sa_handler == SIG_IGN)
      sigaction(kSignals[i], &g_previous[i], nullptr);
  }
  g_previous_terminate = std::set_terminate(on_terminate);
}
}  // namespace

void register_recorder(Recorder* r, bool interrupts) {
  std::call_once(g_install_once, install, interrupts);
  for (auto& slot : g_live) {
    Recorder* expected = nullptr;
    if (slot.compare_exchange_strong(expected, r)) return;
  }
}

void unregister_recorder(Recorder* r) {
  for (auto& slot : g_live) {
    Recorder* expected = r;
    if (slot.compare_exchange_strong(expected, nullptr)) return;
  }
}

}  // namespace zt::probe::crash
