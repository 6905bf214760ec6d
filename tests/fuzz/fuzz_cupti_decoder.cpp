// fuzz_cupti_decoder: the CUPTI record decoder (`zt probe`, `zt train --cupti`) fed records
// built from the input: any kind it handles, every field any value (times backwards or past
// 2^62, sizes near 2^64, unknown memory and copy kinds, releases before allocations, NVTX ends
// without starts), names from a fixed set (CUPTI's pointers are valid). The property: nothing
// crashes, and the trace it writes is one every reader accepts (TraceReader::open checks every
// value), or the run's recording would be lost to its own readers. A trace (a Recorder, its
// writer thread, an SQLite file) costs milliseconds to open and close, so one serves 1024 inputs
// (each its own Decoder, as a process is) and is then closed and checked; a check that fails
// names the trace; ZT_FUZZ_CHECK_EVERY=1 checks after every input, to find the culprit.
#include <cupti_activity.h>

#include "fuzz_input.h"
#include "zt/db/trace_reader.h"
#include "zt/probe/cupti_decoder.h"
#include "zt/probe/recorder.h"

namespace {
using namespace zt;
using namespace zt::probe;

const char* pick_name(uint8_t b) {
  static const char* names[] = {nullptr, "", "cudaMalloc", "_Z6kernelPfi", "_ZN3foo3barEv", "nccl:AllReduce",
                                "\x1b[31mred", "a very long name of a kernel that goes on and on"};
  return names[b % (sizeof names / sizeof names[0])];
}

template <typename T>
void fill(T& r, fuzz::Input& in, CUpti_ActivityKind kind) {
  auto* p = reinterpret_cast<uint8_t*>(&r);
  for (size_t i = 0; i < sizeof r; ++i) p[i] = in.byte();
  r.kind = kind;
}

// Closes the trace and checks that its readers accept it.
void close_and_check(std::unique_ptr<Recorder>& rec, const std::string& path) {
  if (!rec) return;
  if (Status s = rec->close(db::RunStatus::Ok, 0); !s) std::abort();
  rec.reset();
  std::unique_ptr<db::TraceReader> r;
  if (Status s = db::TraceReader::open(path, &r); !s) {
    std::fprintf(stderr, "fuzz_cupti_decoder: the decoder wrote a trace its readers refuse: %s\n", s.message().c_str());
    std::abort();
  }
}

std::unique_ptr<Recorder> g_rec;
int g_inputs = 0;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const std::string path = fuzz::scratch_dir() + "/decoded.db";
  // ZT_FUZZ_CHECK_EVERY=1: a trace per input, to find which input a failed check came from.
  static const int every = std::max(1, std::getenv("ZT_FUZZ_CHECK_EVERY") ? std::atoi(std::getenv("ZT_FUZZ_CHECK_EVERY")) : 1024);
  if (g_rec && g_inputs % every == 0) close_and_check(g_rec, path);
  ++g_inputs;
  if (!g_rec) {
    RecorderOptions o;
    o.path = path;
    o.crash_handlers = false;
    if (!Recorder::open(o, &g_rec)) std::abort();
    std::atexit([] { close_and_check(g_rec, fuzz::scratch_dir() + "/decoded.db"); });
  }
  Recorder* rec = g_rec.get();
  const DeviceId host = rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);
  cupti::DecoderHooks h;
  h.device_info = [](uint32_t ordinal) { return cupti::DeviceInfo{"Fake GPU " + std::to_string(ordinal), 80ll << 30}; };
  h.runtime_api_name = [](uint32_t cbid) -> std::string { return cbid % 3 ? "cudaMalloc_v3020" : ""; };
  h.take_stack = [](uint32_t) { return StackId(0); };
  {
    cupti::Decoder dec(*rec, host, std::move(h));
    for (int n = 0; !in.empty() && n < 64; ++n) {
      switch (in.byte() % 10) {
        case 0: {
          CUpti_ActivityMemory4 r;
          fill(r, in, CUPTI_ACTIVITY_KIND_MEMORY2);
          r.name = pick_name(in.byte());
          r.source = pick_name(in.byte());
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
        case 1: {
          CUpti_ActivityMemoryPool3 r;
          fill(r, in, CUPTI_ACTIVITY_KIND_MEMORY_POOL);
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
        case 2: {
          CUpti_ActivityMemcpy6 r;
          fill(r, in, CUPTI_ACTIVITY_KIND_MEMCPY);
          r.reserved0 = nullptr;
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
        case 3: {
          CUpti_ActivityMemcpyPtoP4 r;
          fill(r, in, CUPTI_ACTIVITY_KIND_MEMCPY2);
          r.reserved0 = nullptr;
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
        case 4: {
          CUpti_ActivityMemset4 r;
          fill(r, in, CUPTI_ACTIVITY_KIND_MEMSET);
          r.reserved0 = nullptr;
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
        case 5: {
          CUpti_ActivityKernel10 r;
          fill(r, in, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
          r.name = pick_name(in.byte());
          r.reserved0 = nullptr;
          r.pAccessPolicyWindow = nullptr;
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
        case 6: {
          CUpti_ActivityAPI r;
          fill(r, in, CUPTI_ACTIVITY_KIND_RUNTIME);
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
        case 7: {
          CUpti_ActivitySynchronization2 r;
          fill(r, in, CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
        case 8: {
          CUpti_ActivityMarker2 r;
          fill(r, in, CUPTI_ACTIVITY_KIND_MARKER);
          r.name = pick_name(in.byte());
          r.domain = pick_name(in.byte());
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
        default: {
          CUpti_ActivityMarkerData2 r;
          fill(r, in, CUPTI_ACTIVITY_KIND_MARKER_DATA);
          dec.decode(reinterpret_cast<CUpti_Activity*>(&r));
          break;
        }
      }
    }
    dec.finish();
  }
  return 0;
}
