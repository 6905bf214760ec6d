// A child process for the crash tests: records, flushes, says "ready N" on stdout, then
// dies the way the first argument says. N is how many events were committed by then.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "zt/probe/recorder.h"

using namespace zt::probe;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: zt_crash_child abort|segv|sigbus|throw|sigterm|sigint|sigkill|exit TRACE\n");
    return 2;
  }
  std::string mode = argv[1];
  RecorderOptions o;
  o.path = argv[2];
  o.command_line = "zt_crash_child " + mode;
  o.commit_interval_ms = 20;
  std::unique_ptr<Recorder> rec;
  if (zt::Status s = Recorder::open(o, &rec); !s) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 2;
  }
  rec->add_rank(0, 1);
  DeviceId gpu = rec->add_device(0, DeviceKind::Sim, 0, "cuda:0", "sim", 1 << 30, true);
  NameId name = rec->intern("block0.gathered");
  NameId step_name = rec->intern("step");
  int64_t n = 0;
  auto record_step = [&](int64_t step) {
    MarkerId m = rec->marker_begin({0, MarkerKind::Step, step_name, step, -1, 0, 0});
    for (int i = 0; i < 100; ++i) {
      AllocEvent a;
      a.device = gpu;
      a.bytes = 4096;
      a.name = name;
      rec->alloc(a);
    }
    rec->marker_end(m);
    n += 102;
  };
  for (int s = 0; s < 10; ++s) record_step(s);
  rec->flush();
  std::printf("ready %lld\n", static_cast<long long>(n));
  std::fflush(stdout);
  if (mode == "abort") std::abort();
  if (mode == "segv") {
    volatile int* p = nullptr;
    *p = 1;
  }
  if (mode == "sigbus") raise(SIGBUS);
  if (mode == "throw") throw std::runtime_error("boom: optimizer state on the wrong device");
  if (mode == "exit") return 0;  // without close(): the destructor still ends the run
  // sigterm / sigint / sigkill: keep writing until the parent's signal arrives.
  for (int64_t s = 10;; ++s) {
    record_step(s);
    usleep(100);
  }
}
