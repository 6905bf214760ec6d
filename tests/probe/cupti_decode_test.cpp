// CUPTI decoding without a GPU: hand-built CUDA 13 activity records of every kind the
// collector enables, decoded into a real trace, then read back.
#include <gtest/gtest.h>

#include <cstring>

#include "../test_util.h"
#include "cupti/correlation_stacks.h"
#include "probe_run_util.h"
#include "zt/probe/cupti_decoder.h"

#include <cupti_runtime_cbid.h>

using namespace zt;
using namespace zt::probe;
using namespace zt::probe::cupti;

namespace {

template <typename T>
T blank(CUpti_ActivityKind kind) {
  T r;
  std::memset(&r, 0, sizeof r);
  r.kind = kind;
  return r;
}

CUpti_ActivityMemory4 mem(uint32_t op, uint32_t kind, uint64_t addr, uint64_t bytes, uint64_t t, uint32_t corr,
                          uint32_t device = 0) {
  auto r = blank<CUpti_ActivityMemory4>(CUPTI_ACTIVITY_KIND_MEMORY2);
  r.memoryOperationType = CUpti_ActivityMemoryOperationType(op);
  r.memoryKind = CUpti_ActivityMemoryKind(kind);
  r.address = addr;
  r.bytes = bytes;
  r.timestamp = t;
  r.correlationId = corr;
  r.deviceId = device;
  return r;
}
constexpr uint32_t kAlloc = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_ALLOCATION;
constexpr uint32_t kRelease = CUPTI_ACTIVITY_MEMORY_OPERATION_TYPE_RELEASE;

CUpti_ActivityMemcpy6 copy(uint8_t copy_kind, uint8_t src, uint8_t dst, uint64_t bytes, uint64_t t, uint32_t corr) {
  auto r = blank<CUpti_ActivityMemcpy6>(CUPTI_ACTIVITY_KIND_MEMCPY);
  r.copyKind = copy_kind;
  r.srcKind = src;
  r.dstKind = dst;
  r.bytes = bytes;
  r.start = t;
  r.end = t + 100;
  r.correlationId = corr;
  r.streamId = 7;
  return r;
}

struct Fixture {
  test::TempDir dir;
  std::string path = dir.file("decode.db");
  std::unique_ptr<Recorder> rec;
  CorrelationStacks stacks;
  std::unique_ptr<Decoder> dec;
  DeviceId host = 0;
  Fixture() {
    RecorderOptions o;
    o.path = path;
    o.crash_handlers = false;
    EXPECT_TRUE(Recorder::open(o, &rec));
    host = rec->add_device(0, DeviceKind::Cpu, 0, "cpu", "host memory", std::nullopt, false);
    DecoderHooks h;
    h.device_info = [](uint32_t ordinal) { return DeviceInfo{"Fake GPU " + std::to_string(ordinal), 80ll << 30}; };
    h.runtime_api_name = [](uint32_t cbid) -> std::string {
      switch (cbid) {
        case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020: return "cudaMalloc_v3020";
        case CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020: return "cudaGetDevice_v3020";
        case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020: return "cudaMemcpyAsync_v3020";
        default: return "";
      }
    };
    h.take_stack = [this](uint32_t corr) { return stacks.take(corr); };
    dec = std::make_unique<Decoder>(*rec, host, std::move(h));
  }
  template <typename T>
  void feed(const T& r) {
    dec->decode(reinterpret_cast<const CUpti_Activity*>(&r));
  }
  void close() {
    dec->finish();
    ASSERT_TRUE(rec->close());
  }
  int64_t n(const std::string& q) { return test::sql_int(path, q); }
};

}  // namespace

TEST(CuptiDecode, KindTranslationIsExplicit) {
  EXPECT_EQ(memory_kind_from_cupti(CUPTI_ACTIVITY_MEMORY_KIND_UNKNOWN), MemoryKind::Unknown);
  EXPECT_EQ(memory_kind_from_cupti(CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE), MemoryKind::PageableHost);
  EXPECT_EQ(memory_kind_from_cupti(CUPTI_ACTIVITY_MEMORY_KIND_PINNED), MemoryKind::PinnedHost);
  EXPECT_EQ(memory_kind_from_cupti(CUPTI_ACTIVITY_MEMORY_KIND_DEVICE), MemoryKind::Device);
  EXPECT_EQ(memory_kind_from_cupti(CUPTI_ACTIVITY_MEMORY_KIND_ARRAY), MemoryKind::Device);
  EXPECT_EQ(memory_kind_from_cupti(CUPTI_ACTIVITY_MEMORY_KIND_MANAGED), MemoryKind::Managed);
  EXPECT_EQ(memory_kind_from_cupti(CUPTI_ACTIVITY_MEMORY_KIND_DEVICE_STATIC), MemoryKind::ModuleGlobal);
  EXPECT_EQ(memory_kind_from_cupti(CUPTI_ACTIVITY_MEMORY_KIND_MANAGED_STATIC), MemoryKind::ModuleGlobal);
  EXPECT_EQ(memory_kind_from_cupti(99), MemoryKind::Unknown);
  // Our codes are not CUPTI's: pageable is 1 there, 3 here.
  EXPECT_EQ(int(memory_kind_from_cupti(1)), 3);
  EXPECT_EQ(transfer_kind_from_cupti(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD), TransferKind::H2D);
  EXPECT_EQ(transfer_kind_from_cupti(CUPTI_ACTIVITY_MEMCPY_KIND_DTOH), TransferKind::D2H);
  EXPECT_EQ(transfer_kind_from_cupti(CUPTI_ACTIVITY_MEMCPY_KIND_DTOD), TransferKind::D2D);
  EXPECT_EQ(transfer_kind_from_cupti(CUPTI_ACTIVITY_MEMCPY_KIND_HTOH), TransferKind::H2H);
  EXPECT_EQ(transfer_kind_from_cupti(CUPTI_ACTIVITY_MEMCPY_KIND_PTOP), TransferKind::P2P);
  EXPECT_EQ(transfer_kind_from_cupti(CUPTI_ACTIVITY_MEMCPY_KIND_HTOA), TransferKind::H2D);
  EXPECT_FALSE(transfer_kind_from_cupti(CUPTI_ACTIVITY_MEMCPY_KIND_UNKNOWN).has_value());
  EXPECT_EQ(api_name_without_version("cudaMalloc_v3020"), "cudaMalloc");
  EXPECT_EQ(api_name_without_version("cudaMemcpyAsync_ptsz_v7000"), "cudaMemcpyAsync_ptsz");
  EXPECT_EQ(api_name_without_version("cuda_vector"), "cuda_vector");
  for (const char* a : {"cudaMalloc", "cudaFree", "cudaMallocHost", "cudaHostAlloc", "cudaMallocAsync",
                        "cudaMallocAsync_ptsz", "cudaFreeHost", "cudaFreeAsync"})
    EXPECT_TRUE(api_wants_stack(a)) << a;
  EXPECT_FALSE(api_wants_stack("cudaLaunchKernel"));
  EXPECT_TRUE(api_wants_stack("cudaMemcpyAsync"));  // transfer.stack_id
  EXPECT_TRUE(api_wants_stack("cudaMemcpy2D"));
  EXPECT_TRUE(api_is_query("cudaGetDevice"));
  EXPECT_TRUE(api_is_query("cudaStreamQuery_ptsz"));
  EXPECT_FALSE(api_is_query("cudaMalloc"));
}

TEST(CuptiDecode, Memory2AllocationsAndFreesOfEveryKind) {
  Fixture f;
  uint64_t ips[3] = {0x1000, 0x2000, 0x3000};
  StackId s = f.rec->intern_stack(ips, 3);
  f.stacks.put(11, s);
  f.stacks.put(12, f.rec->intern_stack(ips, 3));  // the same stack again: the same id
  EXPECT_EQ(f.rec->intern_stack(ips, 3), s);
  f.feed(mem(kAlloc, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, 0xd000, 1 << 20, 1000, 11, 0));
  f.feed(mem(kAlloc, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, 0xe000, 2 << 20, 1100, 12, 1));
  f.feed(mem(kAlloc, CUPTI_ACTIVITY_MEMORY_KIND_PINNED, 0xa000, 4 << 20, 1200, 13));
  f.feed(mem(kAlloc, CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE, 0xb000, 8 << 20, 1300, 14));
  f.feed(mem(kAlloc, CUPTI_ACTIVITY_MEMORY_KIND_MANAGED, 0xc000, 16 << 20, 1400, 15));
  auto pool = mem(kAlloc, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, 0xf000, 512, 1500, 16);
  pool.memoryPoolConfig.memoryPoolType = CUPTI_ACTIVITY_MEMORY_POOL_TYPE_LOCAL;
  pool.isAsync = 1;
  pool.streamId = 5;
  f.feed(pool);
  f.feed(mem(kRelease, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, 0xd000, 1 << 20, 2000, 20, 0));
  f.feed(mem(kRelease, CUPTI_ACTIVITY_MEMORY_KIND_PINNED, 0xa000, 4 << 20, 2100, 21));
  // Out of order: the release of 0x9000 arrives before its allocation.
  f.feed(mem(kRelease, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, 0x9000, 64, 3000, 31, 0));
  f.feed(mem(kAlloc, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, 0x9000, 64, 2500, 30, 0));
  // A release with no allocation ever: counted as dropped at the end.
  f.feed(mem(kRelease, CUPTI_ACTIVITY_MEMORY_KIND_DEVICE, 0x7777, 64, 3100, 32, 0));
  EXPECT_EQ(f.stacks.size(), 0u);  // each stack was taken once
  f.close();
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation WHERE source = 1"), 7);
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation_v WHERE memory_kind = 'device' AND level = 'segment'"), 3);
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation_v WHERE memory_kind = 'device' AND level = 'block' AND stream = 5"), 1);
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation_v WHERE memory_kind = 'pinned_host' AND device = 'cpu'"), 1);
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation_v WHERE memory_kind = 'pageable_host' AND device = 'cpu'"), 1);
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation_v WHERE memory_kind = 'managed' AND device = 'cuda:0'"), 1);
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation_v WHERE device = 'cuda:1' AND bytes = 2097152"), 1);
  EXPECT_EQ(f.n("SELECT t_free FROM allocation WHERE address = 53248"), 2000);  // 0xd000
  EXPECT_EQ(f.n("SELECT t_free FROM allocation WHERE address = 40960"), 2100);  // 0xa000
  EXPECT_EQ(f.n("SELECT t_free FROM allocation WHERE address = 36864"), 3000);  // 0x9000, out of order
  EXPECT_EQ(f.n("SELECT t_alloc FROM allocation WHERE address = 36864"), 2500);
  EXPECT_EQ(f.n("SELECT count(*) FROM allocation WHERE stack_id = " + std::to_string(s)), 2);
  EXPECT_EQ(f.n("SELECT sum(events) FROM dropped WHERE reason LIKE 'CUPTI memory release%'"), 1);
  EXPECT_EQ(f.n("SELECT count(*) FROM device WHERE kind = 1 AND name = 'Fake GPU 1' AND capacity_bytes = " +
                std::to_string(80ll << 30)),
            1);
  EXPECT_EQ(f.dec->stats().allocations, 7);
}

TEST(CuptiDecode, CopiesInEveryDirectionPinnedOrPageable) {
  Fixture f;
  constexpr uint8_t P = CUPTI_ACTIVITY_MEMORY_KIND_PINNED, G = CUPTI_ACTIVITY_MEMORY_KIND_PAGEABLE,
                    D = CUPTI_ACTIVITY_MEMORY_KIND_DEVICE;
  // The stack taken at the cudaMemcpy entry of correlation 2 and of the peer copy 7.
  const uint64_t ips[] = {0x7000, 0x7100};
  const StackId copy_stack = f.rec->intern_stack(ips, 2);
  f.stacks.put(2, copy_stack);
  f.stacks.put(7, copy_stack);
  f.feed(copy(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, G, D, 100, 1000, 1));
  f.feed(copy(CUPTI_ACTIVITY_MEMCPY_KIND_HTOD, P, D, 200, 2000, 2));
  f.feed(copy(CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, D, P, 300, 3000, 3));
  f.feed(copy(CUPTI_ACTIVITY_MEMCPY_KIND_DTOH, D, G, 400, 4000, 4));
  f.feed(copy(CUPTI_ACTIVITY_MEMCPY_KIND_DTOD, D, D, 500, 5000, 5));
  f.feed(copy(CUPTI_ACTIVITY_MEMCPY_KIND_HTOH, P, G, 600, 6000, 6));
  auto p2p = blank<CUpti_ActivityMemcpyPtoP4>(CUPTI_ACTIVITY_KIND_MEMCPY2);
  p2p.copyKind = CUPTI_ACTIVITY_MEMCPY_KIND_PTOP;
  p2p.bytes = 700;
  p2p.start = 7000;
  p2p.end = 7100;
  p2p.srcDeviceId = 0;
  p2p.dstDeviceId = 1;
  p2p.correlationId = 7;
  f.feed(p2p);
  f.close();
  EXPECT_EQ(f.n("SELECT count(*) FROM transfer WHERE source = 1"), 7);
  auto rows = test::sql(f.path,
                        "SELECT kind, bytes, src_device, dst_device, coalesce(pinned, -1), correlation_id, stream, "
                        "t_start, t_end FROM transfer_v ORDER BY t_start");
  ASSERT_EQ(rows.size(), 7u);
  auto expect = [&](size_t i, const char* kind, const char* bytes, const char* src, const char* dst,
                    const char* pinned) {
    EXPECT_EQ(rows[i][0], kind) << i;
    EXPECT_EQ(rows[i][1], bytes) << i;
    EXPECT_EQ(rows[i][2], src) << i;
    EXPECT_EQ(rows[i][3], dst) << i;
    EXPECT_EQ(rows[i][4], pinned) << i;
    EXPECT_EQ(rows[i][5], std::to_string(i + 1)) << i;
  };
  expect(0, "H2D", "100", "cpu", "cuda:0", "0");
  expect(1, "H2D", "200", "cpu", "cuda:0", "1");
  expect(2, "D2H", "300", "cuda:0", "cpu", "1");
  expect(3, "D2H", "400", "cuda:0", "cpu", "0");
  expect(4, "D2D", "500", "cuda:0", "cuda:0", "-1");
  expect(5, "H2H", "600", "cpu", "cpu", "1");
  expect(6, "P2P", "700", "cuda:0", "cuda:1", "-1");
  EXPECT_EQ(rows[0][6], "7");
  EXPECT_EQ(rows[0][7], "1000");
  EXPECT_EQ(rows[0][8], "1100");
  EXPECT_EQ(f.n("SELECT count(*) FROM transfer WHERE stack_id = " + std::to_string(copy_stack)), 2);
  EXPECT_EQ(f.n("SELECT count(*) FROM transfer WHERE stack_id IS NULL"), 5);
}

TEST(CuptiDecode, MemsetsKernelsRuntimeAndSynchronization) {
  Fixture f;
  auto ms = blank<CUpti_ActivityMemset4>(CUPTI_ACTIVITY_KIND_MEMSET);
  ms.bytes = 4096;
  ms.start = 100;
  ms.end = 150;
  ms.correlationId = 9;
  f.feed(ms);
  auto k = blank<CUpti_ActivityKernel10>(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  k.name = "_Z3addPfi";
  k.start = 200;
  k.end = 300;
  k.gridX = 128, k.gridY = 1, k.gridZ = 1, k.blockX = 256, k.blockY = 1, k.blockZ = 1;
  k.streamId = 3;
  k.correlationId = 10;
  f.feed(k);
  k.start = 400, k.end = 500, k.correlationId = 11;
  f.feed(k);
  auto api = blank<CUpti_ActivityAPI>(CUPTI_ACTIVITY_KIND_RUNTIME);
  api.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020;
  api.start = 10, api.end = 20, api.correlationId = 11;
  f.feed(api);
  api.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020;  // a query: counted, not written
  api.correlationId = 12;
  f.feed(api);
  api.cbid = CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020;  // out of memory
  api.start = 30, api.end = 40, api.correlationId = 13, api.returnValue = 2;
  f.feed(api);
  auto sync = blank<CUpti_ActivitySynchronization2>(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
  sync.type = CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE;
  sync.start = 600, sync.end = 700, sync.correlationId = 14;
  f.feed(sync);
  auto pool = blank<CUpti_ActivityMemoryPool3>(CUPTI_ACTIVITY_KIND_MEMORY_POOL);
  pool.memoryPoolOperationType = CUPTI_ACTIVITY_MEMORY_POOL_OPERATION_TYPE_CREATED;
  pool.size = 1 << 20, pool.utilizedSize = 4096, pool.timestamp = 50;
  f.feed(pool);
  auto other = blank<CUpti_ActivityAPI>(CUPTI_ACTIVITY_KIND_DRIVER);
  f.feed(other);
  f.close();
  EXPECT_EQ(f.n("SELECT count(*) FROM kernel_v WHERE name = 'memset 4096 B' AND t_end - t_start = 50"), 1);
  EXPECT_EQ(f.n("SELECT count(*) FROM kernel k JOIN string s ON s.id = k.name_id WHERE s.text = 'add(float*, int)' "
                "AND k.grid = '128,1,1' AND k.block = '256,1,1' AND k.stream = 3 AND k.source = 1"),
            2);
  EXPECT_EQ(f.n("SELECT count(*) FROM marker_v WHERE name = 'cudaMalloc' AND kind = 'range'"), 2);
  EXPECT_EQ(f.n("SELECT value FROM marker_v WHERE name = 'cudaMalloc' AND t_start = 10"), 11);  // correlation id
  EXPECT_EQ(f.n("SELECT count(*) FROM marker_v WHERE name = 'cudaGetDevice'"), 0);
  EXPECT_EQ(f.n("SELECT count(*) FROM error WHERE kind = 'oom' AND site = 'cudaMalloc' AND message LIKE "
                "'cudaMalloc failed with CUDA error 2 cudaErrorMemoryAllocation%'"),
            1);
  EXPECT_EQ(f.n("SELECT value FROM marker_v WHERE name = 'sync:stream' AND t_end = 700"), 14);
  EXPECT_EQ(f.n("SELECT value FROM counter_v WHERE name = 'mempool_size' AND t = 50"), 1 << 20);
  EXPECT_EQ(f.n("SELECT value FROM counter_v WHERE name = 'mempool_used' AND t = 50"), 4096);
  EXPECT_EQ(f.dec->stats().runtime_calls, 3);
  EXPECT_EQ(f.dec->stats().runtime_written, 2);
  EXPECT_EQ(f.dec->stats().unhandled, 1);
}

TEST(CuptiDecode, NvtxRangesMarksAndPayloadsInAnyOrder) {
  Fixture f;
  auto m = blank<CUpti_ActivityMarker2>(CUPTI_ACTIVITY_KIND_MARKER);
  // Range 1: its end arrives before its start.
  m.flags = CUPTI_ACTIVITY_FLAG_MARKER_END, m.id = 1, m.timestamp = 900;
  f.feed(m);
  m.flags = CUPTI_ACTIVITY_FLAG_MARKER_START, m.id = 1, m.timestamp = 100, m.name = "forward", m.domain = nullptr;
  f.feed(m);
  // Range 2 with a payload, in a domain.
  m.flags = CUPTI_ACTIVITY_FLAG_MARKER_START, m.id = 2, m.timestamp = 200, m.name = "step", m.domain = "train";
  f.feed(m);
  auto d = blank<CUpti_ActivityMarkerData2>(CUPTI_ACTIVITY_KIND_MARKER_DATA);
  d.id = 2;
  d.payloadKind = CUPTI_METRIC_VALUE_KIND_UINT64;
  d.payload.metricValueUint64 = 42;
  f.feed(d);
  m.flags = CUPTI_ACTIVITY_FLAG_MARKER_END, m.id = 2, m.timestamp = 300, m.name = nullptr, m.domain = nullptr;
  f.feed(m);
  // An instantaneous mark, a range that never ends, an end whose start never comes.
  m.flags = CUPTI_ACTIVITY_FLAG_MARKER_INSTANTANEOUS, m.id = 3, m.timestamp = 400, m.name = "checkpoint";
  f.feed(m);
  m.flags = CUPTI_ACTIVITY_FLAG_MARKER_START, m.id = 4, m.timestamp = 500, m.name = "backward";
  f.feed(m);
  m.flags = CUPTI_ACTIVITY_FLAG_MARKER_END, m.id = 5, m.timestamp = 600, m.name = nullptr;
  f.feed(m);
  f.close();
  EXPECT_EQ(f.n("SELECT t_end FROM marker_v WHERE name = 'forward' AND t_start = 100 AND kind = 'range'"), 900);
  EXPECT_EQ(f.n("SELECT value FROM marker_v WHERE name = 'train::step' AND t_end = 300"), 42);
  EXPECT_EQ(f.n("SELECT t_end FROM marker_v WHERE name = 'checkpoint' AND t_start = 400"), 400);
  EXPECT_EQ(f.n("SELECT count(*) FROM marker_v WHERE name = 'backward' AND t_end IS NULL"), 1);
  EXPECT_EQ(f.n("SELECT sum(events) FROM dropped WHERE reason LIKE 'NVTX range end%'"), 1);
}

TEST(CuptiDecode, CorrelationStacksAreBounded) {
  CorrelationStacks s(4);
  for (uint32_t i = 1; i <= 10; ++i) s.put(i, StackId(i * 10));
  EXPECT_EQ(s.size(), 4u);
  EXPECT_EQ(s.take(1), 0);   // forgotten: too old
  EXPECT_EQ(s.take(10), 100);
  EXPECT_EQ(s.take(10), 0);  // taken once
  s.put(11, 0);              // no stack: nothing kept
  EXPECT_EQ(s.take(11), 0);
}
